"""swiglu.analysis (recorded runs, derived tables) and swiglu.reproduce's pure logic."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from bench_fixtures import FACTORS, write_synthetic_run
from swiglu import CASES, analysis, reproduce, roofline


def test_roofline_table_agrees_with_roofline_module():
    table = analysis.roofline_table()
    assert len(table) == len(CASES) * 5
    for _, r in table.sample(20, random_state=0).iterrows():
        hw = analysis.hardware_table()[r["hardware"]]
        assert math.isclose(r["sol_ms"], roofline.sol_time_s(r["tokens"], hw) * 1e3, rel_tol=1e-12)
        assert r["bound"] == roofline.bound(r["tokens"], hw)
        assert math.isclose(r["flop_per_byte"], roofline.arithmetic_intensity(r["tokens"]), rel_tol=1e-12)
    h200 = table[table["hardware"] == "H200-SXM"]
    assert math.isclose(roofline.geometric_mean(h200["sol_ms"]), 22.16, rel_tol=1e-3)  # the spec's figure


@pytest.mark.parametrize(
    "meta, expected",
    [
        ({"ceilings": {"copy_tbps": 4.1, "gemm_tflops": 700}}, (4.1, 700.0)),
        ({"ceilings": {"d2d_copy_gbps": 4100.0, "gemm_bf16_tflops": 700}}, (4.1, 700.0)),
        ({"copy_tbps": 4.1, "gemm_tflops": 700}, (4.1, 700.0)),
        ({"ceilings": {"copy_tbps": float("nan"), "gemm_tflops": 700}}, None),
        ({"ceilings": {"gemm_tflops": 700}}, None),
        ({}, None),
    ],
)
def test_measured_ceilings(meta, expected):
    got = analysis.measured_ceilings(meta)
    if expected is None:
        assert got is None
    else:
        assert (got["copy_tbps"], got["gemm_tflops"]) == pytest.approx(expected)


def test_load_run_picks_latest_of_a_protocol(tmp_path):
    assert analysis.load_run(tmp_path / "missing") is None
    write_synthetic_run(tmp_path, run_id="r1-full", utc="2026-12-01T00:00:00Z")
    write_synthetic_run(tmp_path, run_id="r2-full", utc="2026-12-02T00:00:00Z")
    write_synthetic_run(tmp_path, run_id="r3-quick", protocol="quick", utc="2026-12-03T00:00:00Z")
    assert analysis.load_run(tmp_path).run_id == "r2-full"
    assert analysis.load_run(tmp_path, protocol="quick").run_id == "r3-quick"
    assert analysis.load_run(tmp_path, protocol=None).run_id == "r3-quick"
    run = analysis.load_run(tmp_path, run_id="r1-full")
    assert run.run_id == "r1-full" and run.meta["gpu_name"] == "SYNTHETIC H200" and run.protocol == "full"
    with pytest.raises(ValueError, match="not recorded"):
        analysis.load_run(tmp_path, run_id="nope")
    assert list(analysis.list_runs(tmp_path)["run_id"]) == ["r1-full", "r2-full", "r3-quick"]
    # A run still being written (or killed) says complete=false: skipped unless asked for by id.
    write_synthetic_run(tmp_path, run_id="r4-partial", utc="2026-12-04T00:00:00Z")
    meta_path = tmp_path / "r4-partial.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "complete": False}))
    assert analysis.load_run(tmp_path).run_id == "r2-full"
    assert analysis.load_run(tmp_path, complete=False).run_id == "r4-partial"
    assert analysis.load_run(tmp_path, run_id="r4-partial").run_id == "r4-partial"


def test_latency_table_and_summary(tmp_path):
    write_synthetic_run(tmp_path)
    run = analysis.load_run(tmp_path)
    table = analysis.latency_table(run.rows, analysis.measured_ceilings(run.meta))
    assert list(table["tokens"]) == sorted(table["tokens"])
    t = table[table["impl"] == "triton"]
    assert t["sol_fraction"].to_numpy() == pytest.approx(1 / FACTORS["triton"])
    assert t["speedup_vs_eager"].to_numpy() == pytest.approx(FACTORS["eager"] / FACTORS["triton"])
    assert (t["sol_fraction_measured"] > t["sol_fraction"]).all()  # measured ceilings are lower
    summary = analysis.latency_summary(table).set_index("impl")
    assert summary.loc["triton", "gmean_ms"] == pytest.approx(22.157 * FACTORS["triton"], rel=1e-3)
    assert summary.loc["cublas-gemms", "all_correct"] is None or pd.isna(summary.loc["cublas-gemms", "all_correct"])
    assert summary.loc["triton", "all_correct"] == True  # noqa: E712 (numpy bool)
    # Without an eager row, speed-ups over eager are NaN, not an error.
    no_eager = analysis.latency_table(run.rows[run.rows["impl"] != "eager"])
    assert no_eager["speedup_vs_eager"].isna().all()
    with pytest.raises(ValueError, match="median_ms"):
        analysis.latency_table(run.rows.drop(columns="median_ms"))


def test_latency_table_uses_only_the_datasheet_of_the_hardware_the_run_was_made_on(tmp_path):
    write_synthetic_run(tmp_path)
    rows = analysis.load_run(tmp_path).rows
    h200 = analysis.latency_table(rows)
    h100 = analysis.latency_table(rows.assign(hardware="H100-SXM"))
    # Same 989 TFLOP/s, lower bandwidth: the memory-bound cases get the H100's longer SOL.
    assert (h100["sol_ms"] >= h200["sol_ms"]).all() and (h100["sol_ms"] > h200["sol_ms"]).any()
    cpu = analysis.latency_table(rows.assign(hardware=""))  # a CPU run: no GPU's SOL at all
    assert cpu["sol_ms"].isna().all() and cpu["sol_fraction"].isna().all()
    assert cpu["sol_fraction_measured"].isna().all()  # no ceilings measured: no spec H200 stand-in
    assert cpu["tflops"].notna().all()
    own = analysis.latency_table(rows.assign(hardware=""), {"copy_tbps": 0.02, "gemm_tflops": 1.0})
    assert (own["sol_fraction_measured"] > 0).all()  # the run's own measured ceilings still count


def test_run_history(tmp_path):
    assert analysis.run_history(tmp_path).empty
    write_synthetic_run(tmp_path, run_id="a", utc="2026-12-01T00:00:00Z", factors={"eager": 2.0, "triton": 1.5})
    write_synthetic_run(tmp_path, run_id="b", utc="2026-12-02T00:00:00Z")
    h = analysis.run_history(tmp_path)
    assert list(dict.fromkeys(h["run_id"])) == ["a", "b"]
    assert len(h) == 2 + len(FACTORS)


def test_run_footer_names_gpu_and_versions(tmp_path):
    write_synthetic_run(tmp_path)
    meta = json.loads(next(tmp_path.glob("*.json")).read_text())
    text = analysis.run_footer(meta)
    for part in ("SYNTHETIC H200", "CUDA 13.0", "torch 2.11.0", "triton 3.6.0", meta["run_id"]):
        assert part in text


def test_select_notebooks(tmp_path):
    folder = analysis.repo_root() / "notebooks"
    assert [p.stem for p in reproduce.select_notebooks(None, folder)] == list(reproduce.NOTEBOOKS)
    assert [p.stem for p in reproduce.select_notebooks("latency,01", folder)] == ["01_roofline", "03_latency"]
    with pytest.raises(ValueError, match="matches no notebook"):
        reproduce.select_notebooks("nope", folder)


def test_reproduce_refuses_live_without_gpu_and_bad_engine():
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            reproduce.run(live=True, progress=False)
    with pytest.raises(ValueError, match="engine"):
        reproduce.run(engine="bash", progress=False)


def test_tables_and_figures_survive_a_failed_implementation(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from swiglu import plots

    write_synthetic_run(tmp_path)
    rows = analysis.load_run(tmp_path).rows
    broken = rows["impl"] == "triton"
    rows.loc[broken, ["median_ms", "p20_ms", "p80_ms"]] = math.nan  # it raised: no timing
    rows.loc[broken, "correct"] = False
    table = analysis.latency_table(rows)
    summary = analysis.latency_summary(table).set_index("impl")
    assert math.isnan(summary.loc["triton", "gmean_ms"]) and summary.loc["triton", "all_correct"] == False  # noqa: E712
    assert summary.loc["eager", "gmean_ms"] == pytest.approx(22.157 * FACTORS["eager"], rel=1e-3)
    hw = analysis.hardware_table()
    points = table.assign(flop_per_byte=[roofline.arithmetic_intensity(t) for t in table["tokens"]])
    for name, fig in {
        "lat": plots.latency_plot(table, "f"), "sp": plots.speedup_plot(table, "f"),
        "sol": plots.sol_fraction_plot(table, "f"), "gm": plots.gmean_plot(summary.reset_index(), "f"),
        "roof": plots.roofline_plot(hw, analysis.roofline_table(hardware=hw), points, "f"),
    }.items():
        paths = plots.save(fig, name, tmp_path / "fig", formats=("png", "pdf"))
        assert all(p.stat().st_size > 1000 for p in paths)
    with pytest.raises(ValueError, match="format"):
        plots.save(plots.placeholder("t", "m"), "x", tmp_path, formats=("docx",))
