"""Notebooks: committed without outputs, and every one executes through papermill in the smoke
configuration (``python -m swiglu_lab.research.reproduce --smoke``), producing its figures and tables.

The smoke run fails when an implementation fails: every implementation the validation notebook
checks must pass (a Triton backward that raises shows up as rows with status "error ..." and
fails ``test_smoke_validation_table``), and each figure's content is checked, not its size: the
notebooks write what every figure drew (``fig.plotted``, via ``SWIGLU_PLOTTED_DIR``) and the
tests compare those series and values with the data the notebook was given.

The latency data here is a SYNTHETIC run written to tmp_path (tests/bench_fixtures.py).
"""

from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from bench_fixtures import FACTORS, FLUSH_J, GAPS_MS, IDLE_MS, LEAD_MS, POWER_W, write_synthetic_run, write_synthetic_tp_run
from swiglu import CASES, roofline
from swiglu_lab.research import plots, reproduce

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

EXPECTED_FIGURES = {
    "01_roofline": ["01_roofline", "01_sol_per_case"],
    "02_validation": ["02_validation_errors_cpu", "02_validation_ratio_cpu"],
    "03_latency": [
        "03_latency_per_case",
        "03_speedup",
        "03_sol_fraction",
        "03_gmean",
        "03_energy",
        "03_clock_power",
        "03_kernel_breakdown",
    ],
    "04_history": ["04_history"],
    "05_tensor_parallel": ["05_tp_measured", "05_tp_model"],
    "06_training_memory": ["06_training_memory", "06_hf_step"],
    "07_moe": ["07_moe"],
}


def test_every_notebook_is_run_by_reproduce():
    # A notebook waiting for its first recorded GPU run (reproduce.PENDING_NOTEBOOKS) is run only
    # when asked by name (tests/lab/test_moe_notebook.py runs 07_moe on a tiny CPU run).
    ready = [p.stem for p in NOTEBOOKS if p.stem not in reproduce.PENDING_NOTEBOOKS]
    assert ready == list(reproduce.NOTEBOOKS) == list(EXPECTED_FIGURES)
    assert not set(reproduce.PENDING_NOTEBOOKS) & set(reproduce.NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_has_no_outputs(path):
    book = json.loads(path.read_text())
    for k, cell in enumerate(book["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert cell["outputs"] == [], (
            f"{path.name} cell {k} has stored outputs: run `python -m swiglu_lab.research.reproduce --strip-outputs`"
        )
        assert cell["execution_count"] is None, f"{path.name} cell {k} has an execution count"
    assert "papermill" not in book["metadata"], f"{path.name} is an executed notebook (papermill metadata)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_declares_what_reproduce_passes(path):
    declared = reproduce.parameter_names(path)
    for name in ("figures_dir", "derived_dir", "figure_formats"):
        assert name in declared, f"{path.name} lacks parameter {name}"
    passed = reproduce.notebook_parameters(path.stem, smoke=True, live=True, declared=declared)
    assert set(passed) <= set(declared)
    assert {"figures_dir", "derived_dir"} <= set(passed)


def _outputs_text(notebook: Path) -> str:
    book = json.loads(notebook.read_text())
    parts = []
    for cell in book["cells"]:
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", f"{notebook.name}: {out.get('ename')}: {out.get('evalue')}"
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            parts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(parts)


@contextmanager
def plotted_into(folder: Path):
    """Make the notebooks write each figure's plotted data to ``folder`` (plots.finish)."""
    old = os.environ.get(plots.PLOTTED_DIR_ENV)
    os.environ[plots.PLOTTED_DIR_ENV] = str(folder)
    try:
        yield folder
    finally:
        if old is None:
            os.environ.pop(plots.PLOTTED_DIR_ENV, None)
        else:
            os.environ[plots.PLOTTED_DIR_ENV] = old


def plotted(folder: Path, name: str) -> pd.DataFrame:
    """What figure ``name`` drew (panel, series, x, y, lo, hi), as the notebook wrote it."""
    path = folder / f"{name}.csv"
    assert path.is_file(), f"figure {name} was not drawn (no {path.name})"
    return pd.read_csv(path)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    pytest.importorskip("papermill")
    tmp = tmp_path_factory.mktemp("smoke")
    write_synthetic_run(tmp / "bench", kernels=True)
    with plotted_into(tmp / "plotted"):
        results = reproduce.run(
            smoke=True,
            device="cpu",
            bench_dir=tmp / "bench",
            figures_dir=tmp / "figures",
            derived_dir=tmp / "derived",
            build_dir=tmp / "notebooks",
            engine="papermill",
            progress=False,
            tp_dir=tmp / "tp",  # no TP run recorded there (data/tp/ has real ones)
        )
    return tmp, results


def test_smoke_every_notebook_runs(smoke):
    tmp, results = smoke
    assert [r.name for r in results] == list(reproduce.NOTEBOOKS)
    for r in results:
        assert r.ok, f"{r.name} failed: {r.error}"
        _outputs_text(r.output)  # no error outputs


def test_smoke_every_figure_is_produced(smoke):
    tmp, _ = smoke
    for names in EXPECTED_FIGURES.values():
        for name in names:
            for ext in ("png", "svg"):
                assert (tmp / "figures" / f"{name}.{ext}").is_file(), f"missing figure {name}.{ext}"
            plotted(tmp / "plotted", name)  # and what it drew was recorded


def test_smoke_latency_figures_draw_the_recorded_run(smoke):
    tmp, _ = smoke
    sol = {c.name: roofline.sol_time_s(c.tokens, "H200-SXM") * 1e3 for c in CASES}
    per_case = plotted(tmp / "plotted", "03_latency_per_case")
    assert set(per_case["series"]) == set(FACTORS) and len(per_case) == len(CASES) * len(FACTORS)
    for _, r in per_case.iterrows():  # the synthetic medians, with their p20/p80 (0.99x, 1.01x)
        ms = sol[r["x"]] * FACTORS[r["series"]]
        assert (r["y"], r["lo"], r["hi"]) == pytest.approx((ms, 0.99 * ms, 1.01 * ms))
    gmean = plotted(tmp / "plotted", "03_gmean").set_index("series")
    for impl, factor in FACTORS.items():
        assert gmean.loc[impl, "y"] == pytest.approx(FACTORS["compile"] / factor)
    speedup = plotted(tmp / "plotted", "03_speedup")
    ours = speedup[(speedup["panel"] == "over compile") & (speedup["series"] == "triton")]
    assert len(ours) == len(CASES) and ours["y"].tolist() == pytest.approx([FACTORS["compile"] / FACTORS["triton"]] * len(CASES))
    history = plotted(tmp / "plotted", "04_history")
    assert set(history["series"]) == set(FACTORS) and history["x"].nunique() == 1
    assert plotted(tmp / "plotted", "03_energy").empty  # no power data: a placeholder, said in words


def test_smoke_kernel_breakdown_draws_the_recorded_kernels(smoke):
    tmp, _ = smoke
    drawn = plotted(tmp / "plotted", "03_kernel_breakdown")
    sol = {c.tokens: roofline.sol_time_s(c.tokens, "H200-SXM") * 1e3 for c in CASES}
    for tokens, ms in sol.items():
        bars = drawn[drawn["x"] == tokens]
        tops = bars.assign(impl=bars["series"].str.split(":").str[0]).groupby("impl")["y"].max()
        for impl, factor in FACTORS.items():  # no quack in the run: relative to the first impl, eager
            assert tops[impl] == pytest.approx(factor / FACTORS["eager"])
        rest = bars[bars["series"] == f"triton: {plots.IDLE}"]
        idle = bars[bars["series"] == f"triton: {plots.MEASURED_IDLE}"]
        assert idle["hi"].tolist() == pytest.approx([LEAD_MS + GAPS_MS]) and idle["lo"].tolist() == [0.0]
        assert rest["hi"].tolist() == pytest.approx([IDLE_MS - LEAD_MS - GAPS_MS])
    table = pd.read_csv(tmp / "derived" / "kernel_breakdown.csv")
    assert {"dSwiGLU GEMM", "weight-gradient GEMM", "grad_x GEMM", "idle_ms", "timed_minus_busy_ms"} <= set(table.columns)
    assert table["timed_minus_busy_ms"].tolist() == pytest.approx([IDLE_MS] * len(table))
    assert table["idle_ms"].tolist() == pytest.approx([LEAD_MS + GAPS_MS] * len(table))


def test_smoke_validation_figure_draws_every_implementation(smoke):
    tmp, _ = smoke
    ratio = plotted(tmp / "plotted", "02_validation_ratio_cpu")
    rows = pd.read_csv(tmp / "derived" / "validation_cpu.csv")
    for impl in ("reference", "triton"):
        drawn = ratio[ratio["series"] == impl]
        assert len(drawn) == 3 * 4, f"{impl}: {len(drawn)} of 12 shape x output points drawn"
        assert (drawn["y"] <= 2.0).all()
        expected = rows[rows["impl"] == impl].groupby(["output", "case"])["ratio"].max()
        assert drawn.set_index(["panel", "x"])["y"].to_dict() == pytest.approx(expected.to_dict())


def test_smoke_roofline_table(smoke):
    tmp, _ = smoke
    table = pd.read_csv(tmp / "derived" / "roofline_table.csv")
    assert len(table) == len(CASES) * 5  # H100, H200, B200 datasheet, B200 benchmark, H200 measured
    h200 = table[table["hardware"] == "H200-SXM"].set_index("case")
    assert h200.loc["s128_b1", "bound"] == "memory" and h200.loc["s128_b64", "bound"] == "compute"
    # The synthetic run's ceilings (4.2 TB/s, 750 TFLOP/s) feed the measured roof.
    measured = table[table["hardware"] == "H200-measured"].iloc[0]
    assert measured["peak_tbps"] == 4.2 and measured["peak_tflops"] == 750.0


def test_smoke_validation_table(smoke):
    tmp, _ = smoke
    rows = pd.read_csv(tmp / "derived" / "validation_cpu.csv")
    ref = rows[rows["impl"] == "reference"]
    assert len(ref) == 3 * 4  # 3 smoke shapes x 4 outputs
    assert (ref["status"] == "ok").all() and ref["passed"].all()
    assert (ref["rel_err"] > 0).all() and (ref["rel_err"] < 0.02).all()  # bf16-level, not zero
    # Ours must be checked and pass on every shape and output: an implementation that raises
    # (status "error: ...") or is not available fails here.
    triton = rows[rows["impl"] == "triton"]
    assert (triton["status"] == "ok").all(), triton["status"].unique().tolist()
    assert len(triton) == 12 and triton["passed"].all(), triton[["case", "output", "ratio", "match_fraction"]]
    assert (triton["ratio"] <= 2.0).all() and (triton["rel_err"] > 0).all()


def test_smoke_latency_tables_match_the_recorded_run(smoke):
    tmp, _ = smoke
    summary = pd.read_csv(tmp / "derived" / "latency_summary.csv").set_index("impl")
    assert list(summary.index) == ["eager", "compile", "cublas-gemms", "triton"]
    for impl, factor in FACTORS.items():  # tables keep 6 significant digits (analysis.write_table)
        assert math.isclose(summary.loc[impl, "sol_fraction"], 1 / factor, rel_tol=1e-5)
        assert math.isclose(summary.loc[impl, "gmean_speedup_vs_compile"], FACTORS["compile"] / factor, rel_tol=1e-5)
    per_case = pd.read_csv(tmp / "derived" / "latency_per_case.csv")
    assert len(per_case) == len(CASES) * len(FACTORS)
    history = pd.read_csv(tmp / "derived" / "history.csv")
    assert set(history["impl"]) == set(FACTORS) and history["run_id"].nunique() == 1


def test_smoke_run_without_power_data_says_so(smoke):
    tmp, results = smoke
    texts = {r.name: _outputs_text(r.output) for r in results}
    assert "no power data recorded in run" in texts["03_latency"]
    assert "no roof at the sustained SM clock" in texts["01_roofline"]
    assert not (tmp / "derived" / "power_per_case.csv").exists()


def test_power_notebooks_with_a_run_that_recorded_power(tmp_path):
    pytest.importorskip("papermill")
    write_synthetic_run(tmp_path / "bench", power=True)
    with plotted_into(tmp_path / "plotted"):
        results = reproduce.run(
            "01,03",
            smoke=True,
            device="cpu",
            bench_dir=tmp_path / "bench",
            figures_dir=tmp_path / "figures",
            derived_dir=tmp_path / "derived",
            build_dir=tmp_path / "notebooks",
            engine="papermill",
            progress=False,
        )
    assert [r.ok for r in results] == [True, True], [r.error for r in results]
    texts = {r.name: _outputs_text(r.output) for r in results}
    assert "at the sustained SM clock (1468 of 1980 MHz)" in texts["01_roofline"]  # mean of CLOCK_MHZ
    assert "no power data" not in texts["03_latency"]
    power = pd.read_csv(tmp_path / "derived" / "power_per_case.csv")
    assert len(power) == len(CASES) * len(FACTORS)
    r = power[(power["case"] == "s4096_b1") & (power["impl"] == "eager")].iloc[0]
    assert r["energy_per_backward_j"] == pytest.approx(r["energy_j"] - FLUSH_J)
    assert r["energy_per_backward_j"] == pytest.approx(POWER_W["eager"] * r["median_ms"] / 1e3)
    energy = plotted(tmp_path / "plotted", "03_energy")
    ratio = energy[energy["panel"] == "energy_vs_compile"].set_index(["series", "x"])["y"]
    expected = POWER_W["triton"] * FACTORS["triton"] / (POWER_W["compile"] * FACTORS["compile"])
    assert ratio.xs("triton").tolist() == pytest.approx([expected] * len(CASES))
    clock = plotted(tmp_path / "plotted", "03_clock_power")
    assert set(clock.loc[clock["panel"] == "power_w", "y"].round(6)) == set(POWER_W.values())
    roof = plotted(tmp_path / "plotted", "01_roofline")
    assert len(roof) == len(CASES) * len(FACTORS)


def test_latency_notebook_without_recorded_run(tmp_path):
    pytest.importorskip("papermill")
    (tmp_path / "bench").mkdir()
    write_synthetic_run(tmp_path / "bench", protocol="quick")  # a quick run is not a full-protocol run
    results = reproduce.run(
        "03",
        smoke=True,
        device="cpu",
        bench_dir=tmp_path / "bench",
        figures_dir=tmp_path / "figures",
        derived_dir=tmp_path / "derived",
        build_dir=tmp_path / "notebooks",
        engine="papermill",
        progress=False,
    )
    assert results[0].ok, results[0].error
    assert "No recorded H200 run" in _outputs_text(results[0].output)
    for name in EXPECTED_FIGURES["03_latency"]:
        assert (tmp_path / "figures" / f"{name}.png").is_file()
    assert not (tmp_path / "derived" / "latency_summary.csv").exists()


def test_smoke_tensor_parallel_without_a_tp_run(smoke):
    tmp, results = smoke
    text = _outputs_text(next(r.output for r in results if r.name == "05_tensor_parallel"))
    assert "No recorded tensor-parallel run" in text and "NO TP RUN" in text
    model = pd.read_csv(tmp / "derived" / "tp_model.csv")
    assert sorted(set(model["tp"])) == [2, 4, 8] and len(model) == 3 * len(CASES)
    assert not (tmp / "derived" / "tp_measured.csv").exists()


def test_tensor_parallel_notebook_with_a_recorded_run(tmp_path):
    pytest.importorskip("papermill")
    write_synthetic_run(tmp_path / "bench")
    write_synthetic_tp_run(tmp_path / "tp", bus_gbps=300.0, latency_ms=0.02, hidden=0.5)
    with plotted_into(tmp_path / "plotted"):
        results = reproduce.run(
            "05",
            smoke=True,
            device="cpu",
            bench_dir=tmp_path / "bench",
            tp_dir=tmp_path / "tp",
            figures_dir=tmp_path / "figures",
            derived_dir=tmp_path / "derived",
            build_dir=tmp_path / "notebooks",
            engine="papermill",
            progress=False,
        )
    assert results[0].ok, results[0].error
    text = _outputs_text(results[0].output)
    assert "72/72 outputs pass" in text and "measured in TP run" in text
    measured = pd.read_csv(tmp_path / "derived" / "tp_measured.csv")
    assert len(measured) == len(CASES)
    assert measured["overlap"].tolist() == pytest.approx([0.5] * len(CASES))
    assert (measured["efficiency"] < 1).all() and (measured["efficiency"] > 0.9).all()
    model = pd.read_csv(tmp_path / "derived" / "tp_model.csv")
    assert model["source"].str.startswith("measured").all()
    assert len(pd.read_csv(tmp_path / "derived" / "tp_overlap.csv")) == len(CASES)
    drawn = plotted(tmp_path / "plotted", "05_tp_measured")
    eff = drawn[(drawn["panel"] == "efficiency") & (drawn["series"] == "ours")].set_index("x")["y"]
    assert eff.to_dict() == pytest.approx(measured.set_index("case")["efficiency"].to_dict())
    drawn = plotted(tmp_path / "plotted", "05_tp_model")
    assert {"TP=2 serial", "TP=4 serial", "TP=8 serial", "TP=2 measured"} <= set(drawn["series"])


def test_python_engine_runs_a_notebook_without_jupyter(tmp_path):
    # The GPU machine has no papermill: the same notebooks run in-process there.
    write_synthetic_run(tmp_path / "bench")
    results = reproduce.run(
        "04",
        bench_dir=tmp_path / "bench",
        figures_dir=tmp_path / "figures",
        derived_dir=tmp_path / "derived",
        build_dir=tmp_path / "notebooks",
        engine="python",
        progress=False,
    )
    assert results[0].ok, results[0].error
    assert (tmp_path / "figures" / "04_history.svg").is_file()
    assert len(pd.read_csv(tmp_path / "derived" / "history.csv")) == len(FACTORS)
    executed = json.loads(results[0].output.read_text())
    assert any(c.get("outputs") for c in executed["cells"] if c["cell_type"] == "code")


def test_strip_outputs_restores_the_committed_form(tmp_path):
    src = NOTEBOOKS[0]
    book = json.loads(src.read_text())
    code = next(c for c in book["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"name": "stdout", "output_type": "stream", "text": "x\n"}]
    code["execution_count"] = 3
    book["metadata"]["papermill"] = {"duration": 1.0}
    dirty = tmp_path / src.name
    dirty.write_text(json.dumps(book))
    assert reproduce.strip_outputs([dirty]) == [dirty]
    assert dirty.read_text() == src.read_text()
    assert reproduce.strip_outputs([dirty]) == []


def test_tp_runs_recorded_by_two_commands_are_merged(tmp_path):
    from swiglu_lab.bench import tp_model
    from swiglu_lab.research import tp_report

    write_synthetic_tp_run(tmp_path, run_id="20261201T000000Z-first")
    csv = write_synthetic_tp_run(tmp_path, run_id="20261201T010000Z-second", hidden=1.0)
    second = pd.read_csv(csv)
    pd.concat([second[second["impl"] == "tp_ours"].assign(median_ms=1.0)]).to_csv(csv, index=False)
    run = tp_report.load_tp_run(tmp_path)
    assert run.run_id == "20261201T000000Z-first+20261201T010000Z-second"
    assert (run.rows[run.rows["impl"] == "tp_ours"]["median_ms"] == 1.0).all()  # the later run wins
    assert (run.rows["impl"] == "tp_allreduce").sum() == len(CASES)  # kept from the first
    # A later run of the check part alone (an empty timing CSV): its correctness records are the
    # latest, the timing rows stay numeric and come from the runs that timed.
    csv = write_synthetic_tp_run(tmp_path, run_id="20261201T020000Z-check")
    pd.read_csv(csv).iloc[:0].to_csv(csv, index=False)
    checks = pd.read_csv(tmp_path / "tp_20261201T020000Z-check_check.csv")
    checks.assign(max_abs_error=0.5).to_csv(tmp_path / "tp_20261201T020000Z-check_check.csv", index=False)
    merged = tp_report.load_tp_run(tmp_path)
    assert merged.run_id.endswith("+20261201T020000Z-check") and (merged.checks["max_abs_error"] == 0.5).all()
    assert merged.rows["median_ms"].dtype == float and len(merged.rows) == len(run.rows)
    tp_model.fit_allreduce(merged.rows)  # the notebook's fit (object columns broke it)
    for suffix in (".csv", "_check.csv", ".json"):
        (tmp_path / f"tp_20261201T020000Z-check{suffix}").unlink()
    only = tp_report.load_tp_run(tmp_path, "20261201T000000Z-first")
    assert (only.rows[only.rows["impl"] == "tp_ours"]["median_ms"] != 1.0).all()
    with pytest.raises(ValueError, match="no tensor-parallel run"):
        tp_report.load_tp_run(tmp_path, "nope")
    # Without a one-GPU timing in the TP run, the efficiency comes from the bench run, said so.
    no_single = tp_model.case_table(run.rows[run.rows["local_intermediate_size"] != run.rows["intermediate_size"]])
    table, source = tp_report.single_gpu_source(no_single, tmp_path / "none")
    assert "no one-GPU time" in source and table["single_ms"].isna().all()
    write_synthetic_run(tmp_path / "bench")
    table, source = tp_report.single_gpu_source(no_single, tmp_path / "bench")
    assert source.startswith("one-GPU time from bench run") and table["single_ms"].notna().all()
    assert table["efficiency"].tolist() == pytest.approx((table["single_ms"] / (2 * table["tp_ours_ms"])).tolist())


def test_papermill_kernels_run_without_the_unencrypted_tcp_warning(tmp_path, capfd):
    # Over TCP, ipykernel printed "Kernel is running over TCP without encryption" once per notebook.
    pytest.importorskip("papermill")
    book = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {"tags": ["parameters"]},
                "source": "x = 1",
                "outputs": [],
                "execution_count": None,
            },
            {"cell_type": "code", "metadata": {}, "source": "print(x + 1)", "outputs": [], "execution_count": None},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    src = tmp_path / "tiny.ipynb"
    src.write_text(json.dumps(book))
    reproduce.execute_papermill(src, tmp_path / "out.ipynb", {"x": 41}, tmp_path)
    captured = capfd.readouterr()
    assert "without encryption" not in captured.err + captured.out
    assert "42" in _outputs_text(tmp_path / "out.ipynb")
    assert set(tmp_path.iterdir()) == {src, tmp_path / "out.ipynb"}  # no socket files left behind


def test_importing_the_lab_in_a_kernel_prints_no_progress_bar_warning(tmp_path):
    # tqdm.auto, imported by the bench runner, printed "TqdmWarning: IProgress not found. Please
    # update jupyter and ipywidgets" in the first cell of notebooks 01 and 02 (kernels without ipywidgets).
    pytest.importorskip("papermill")
    code = "import swiglu_lab.bench, swiglu_lab.bench.cli\nfrom swiglu_lab.research import analysis, plots\nprint('imported')"
    book = {
        "cells": [
            {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": "", "outputs": [], "execution_count": None},
            {"cell_type": "code", "metadata": {}, "source": code, "outputs": [], "execution_count": None},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    src = tmp_path / "imports.ipynb"
    src.write_text(json.dumps(book))
    reproduce.execute_papermill(src, tmp_path / "out.ipynb", {}, tmp_path)
    text = _outputs_text(tmp_path / "out.ipynb")
    assert "imported" in text and "IProgress" not in text and "TqdmWarning" not in text, text


def test_a_tp_timeline_is_loaded_beside_its_run_and_drawn(tmp_path):
    from swiglu_lab.research import plots, tp_report

    write_synthetic_tp_run(tmp_path, run_id="20261201T000000Z-first")
    events = pd.DataFrame(
        [
            dict(case="s128_b1", tokens=128, variant=v, rank=r, name=n, kind=k, start_us=s, end_us=e)
            for v in ("tp_serial", "tp_sp_chunks2")
            for r in (0, 1)
            for n, k, s, e in (
                ("dswiglu_gemm_kernel", "compute", 0, 400),
                ("grad_x_kernel", "compute", 400, 900),
                ("ncclDevKernel_AllReduce", "comm", *((900, 1100) if v == "tp_serial" else (600, 900))),
            )
        ]
    )
    events.to_csv(tmp_path / "tp_20261201T000000Z-first_timeline.csv", index=False)
    run = tp_report.load_tp_run(tmp_path)
    assert run.run_id == "20261201T000000Z-first"  # the timeline file is not a timing run
    assert len(run.timeline) == len(events) and not run.rows["impl"].isna().any()
    fig = plots.tp_timeline_plot(run.timeline, "footer")
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left")]
    assert titles[0].startswith("tp_serial") and "not covered by compute 0.200 ms" in titles[0], titles
    assert "not covered by compute 0.000 ms" in titles[1], titles
