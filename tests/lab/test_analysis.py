"""swiglu_lab.research.analysis (recorded runs, derived tables) and swiglu_lab.research.reproduce's pure logic."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from bench_fixtures import CLOCK_MHZ, FACTORS, POWER_W, write_synthetic_run
from swiglu import CASES, roofline
from swiglu_lab.research import analysis
from swiglu_lab.research import reproduce


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
    # A later run of a few cases (the max-autotune peer) does not replace the last run of all 18.
    write_synthetic_run(tmp_path, run_id="r5-three-cases", utc="2026-12-05T00:00:00Z", cases=CASES[:3])
    assert analysis.load_run(tmp_path).run_id == "r2-full"
    assert analysis.load_run(tmp_path, run_id="r5-three-cases").run_id == "r5-three-cases"
    assert list(analysis.list_runs(tmp_path)["n_cases"]) == [len(CASES)] * 4 + [3]


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
    # Dirty only when the run recorded a dirty tree, not for an unknown state (SWIGLU_GIT_COMMIT).
    for dirty, suffix in ((True, "abc1234+dirty"), (False, "abc1234 "), ("unknown", "abc1234 "), (None, "abc1234 ")):
        assert suffix in analysis.run_footer({**meta, "git_commit": "abc1234", "git_dirty": dirty}) + " "


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
    from swiglu_lab.research import plots

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
        "lat": plots.latency_plot(table, "f"),
        "sp": plots.speedup_plot(table, "f"),
        "sol": plots.sol_fraction_plot(table, "f"),
        "gm": plots.gmean_plot(summary.reset_index(), "f"),
        "roof": plots.roofline_plot(hw, analysis.roofline_table(hardware=hw), points, "f"),
    }.items():
        paths = plots.save(fig, name, tmp_path / "fig", formats=("png", "pdf"))
        assert all(p.stat().st_size > 1000 for p in paths)
    with pytest.raises(ValueError, match="format"):
        plots.save(plots.placeholder("t", "m"), "x", tmp_path, formats=("docx",))


def test_power_table_energy_and_sustained_clock(tmp_path):
    write_synthetic_run(tmp_path, power=True)
    run = analysis.load_run(tmp_path)
    assert analysis.has_power_data(run.rows)
    table = analysis.power_table(run.rows)
    assert len(table) == len(CASES) * len(FACTORS)
    r = table[(table["case"] == "s128_b64") & (table["impl"] == "triton")].iloc[0]
    sol_ms = roofline.sol_time_s(8192) * 1e3
    assert r["energy_per_backward_j"] == pytest.approx(POWER_W["triton"] * sol_ms * FACTORS["triton"] / 1e3)
    assert r["gflop_per_j"] == pytest.approx(roofline.flops(8192) / 1e9 / r["energy_per_backward_j"])
    expected = (POWER_W["triton"] * FACTORS["triton"]) / (POWER_W["compile"] * FACTORS["compile"])
    assert r["energy_vs_compile"] == pytest.approx(expected)
    assert (table.loc[table["impl"] == "compile", "energy_vs_compile"] == 1.0).all()
    # Sustained clock: mean over the compute-bound cases (all but T=128) of every impl's clock.
    assert analysis.sustained_sm_clock_mhz(run.rows) == pytest.approx(sum(CLOCK_MHZ.values()) / 4)
    idle = run.rows.assign(sm_clock_mhz=run.rows["sm_clock_mhz"].where(run.rows["tokens"] != 128, 1980.0))
    assert analysis.sustained_sm_clock_mhz(idle) == pytest.approx(sum(CLOCK_MHZ.values()) / 4)  # T=128 left out
    assert analysis.sustained_sm_clock_mhz(idle[idle["tokens"] == 128]) == 1980.0  # only memory-bound: all rows
    assert analysis.max_sm_clock_mhz(run.meta) == 1980.0 and analysis.power_limit_w(run.meta) == 700.0
    hw = analysis.sustained_hardware(run.rows, run.meta)
    assert hw.peak_tflops == pytest.approx(989.4 * sum(CLOCK_MHZ.values()) / 4 / 1980) and hw.peak_tbps == 4.8


def test_runs_without_power_data(tmp_path):
    write_synthetic_run(tmp_path)
    run = analysis.load_run(tmp_path)
    assert not analysis.has_power_data(run.rows) and not analysis.has_power_data(None)
    table = analysis.power_table(run.rows)
    assert len(table) == len(run.rows) and table["energy_per_backward_j"].isna().all()
    assert math.isnan(analysis.sustained_sm_clock_mhz(run.rows))
    assert analysis.sustained_hardware(run.rows, run.meta) is None
    assert analysis.max_sm_clock_mhz(run.meta) is None
    # Older runs still name the maximum clock and power limit through nvidia-smi's strings.
    meta = {"gpu": {"nvidia_smi": {"clocks.max.sm": "1980 MHz", "power.limit": "700.00 W"}}}
    assert analysis.max_sm_clock_mhz(meta) == 1980.0 and analysis.power_limit_w(meta) == 700.0
    assert analysis.max_sm_clock_mhz({"gpu": {"nvidia_smi": {"clocks.max.sm": "[N/A]"}}}) is None


def test_power_figures(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from swiglu_lab.research import plots

    write_synthetic_run(tmp_path, power=True)
    run = analysis.load_run(tmp_path)
    table = analysis.power_table(run.rows)
    hw = {**analysis.hardware_table(), "H200-sustained": analysis.sustained_hardware(run.rows, run.meta)}
    for name, fig in {
        "energy": plots.energy_plot(table, "f"),
        "clock": plots.clock_power_plot(table, "f", max_clock_mhz=1980.0, power_limit_w=700.0),
        "energy_no_compile": plots.energy_plot(table[table["impl"] != "compile"], "f"),
        "roof": plots.roofline_plot(hw, analysis.roofline_table(hardware=hw), None, "f"),
    }.items():
        paths = plots.save(fig, name, tmp_path / "fig", formats=("png",))
        assert all(p.stat().st_size > 1000 for p in paths)


@pytest.mark.parametrize(
    "name,loaded,clock",
    [("dmon_20261129T180943Z-643a0c9.txt", 173, 1430.12), ("dmon_20261129T182915Z-d465888.txt", 165, 1448.45)],
)
def test_recorded_dmon_traces_match_their_readme(name, loaded, clock):
    # data/power/README.md states these figures (from awk); the parser must agree.
    trace = analysis.read_dmon(analysis.repo_root() / "data" / "power" / name)
    assert list(trace.columns) == ["sample", *analysis.DMON_COLUMNS] and trace["power_w"].notna().all()
    s = analysis.dmon_summary(trace)
    assert s["loaded_samples"] == loaded and s["loaded_mean_sm_clock_mhz"] == pytest.approx(clock, abs=0.01)
    assert 650 < s["max_power_w"] <= 710 and s["loaded_max_sm_clock_mhz"] <= 1980


def test_read_dmon_rejects_other_files(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("# a b\n1 2 3\n")
    with pytest.raises(ValueError, match="nvidia-smi dmon"):
        analysis.read_dmon(path)


def test_sustained_roof_sources(tmp_path):
    write_synthetic_run(tmp_path / "bench", run_id="20261201T000000Z-power", power=True)
    hw, why = analysis.sustained_roof(analysis.load_run(tmp_path / "bench", "20261201T000000Z-power"), tmp_path)
    assert hw.peak_tflops == pytest.approx(989.4 * sum(CLOCK_MHZ.values()) / 4 / 1980) and "per-case" in why
    # A run without power columns: the clock of its dmon trace's loaded samples (> 650 W).
    write_synthetic_run(tmp_path / "bench", run_id="20261201T010000Z-old", utc="2026-12-01T01:00:00Z")
    old = analysis.load_run(tmp_path / "bench", "20261201T010000Z-old")
    assert analysis.sustained_roof(old, tmp_path)[0] is None
    (tmp_path / "dmon_20261201T010000Z-old.txt").write_text(
        "# gpu    pwr  gtemp  mtemp   mclk   pclk\n# Idx      W      C      C    MHz    MHz\n"
        "    0     82     37     40   3201   1980\n    0    690     57     47   3201   1400\n"
        "    0    700     58     48   3201   1500\n"
    )
    hw, why = analysis.sustained_roof(old, tmp_path)
    assert hw.peak_tflops == pytest.approx(989.4 * 1450 / 1980) and "2 of 3 samples above 650 W" in why
    assert analysis.sustained_roof(None, tmp_path)[0] is None
