"""Tests of the benchmark harness (swiglu_lab.bench): its pure logic on CPU (statistics, SOL math,
CSV schema, append-only storage, summaries), error handling, and one end-to-end CPU smoke run of
the CLI. Speed itself is measured by the harness on the GPU, never asserted here."""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
import types
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from swiglu import make_inputs, reference_backward
from swiglu_lab.bench import environment, power
from swiglu_lab.bench.cli import format_summary, main
from swiglu_lab.bench.impls import (
    IMPLS,
    BenchImpl,
    cublas_gemms,
    default_impls,
    liger_prepare,
    make_liger_backward,
    unavailable_reason,
)
from swiglu_lab.bench.runner import BenchConfig, check_outputs, pick_hardware, run_benchmark
from swiglu_lab.bench.schema import COLUMNS, check_row, coerce, read_rows, rows_to_frame
from swiglu_lab.bench.stats import Ceilings, add_speedups, per_case_table, power_summary, sol_columns, summary_table, time_stats
from swiglu_lab.bench.storage import INDEX_COLUMNS, RunWriter, write_run
from swiglu_lab.bench.timing import L2Flusher, alternating, time_iterations
from swiglu.workloads import select_cases

H, I = 16384, 53248


# ------------------------------------------------------------------------------------- statistics
# Percentiles by hand: numpy.percentile's default method "linear" (Hyndman and Fan 1996, type 7):
# sort the n times as x[0..n-1]; the q-th percentile sits at position h = (n - 1) q / 100 and is
# x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h]). The median is the 50th percentile.
# The samples are skewed, so median, mean, p20 and p80 all differ (a median computed as a mean, or
# a percentile taken at the wrong position or by nearest rank, gives another number).
STATS_CASES = [
    # sorted [1, 2, 3, 5, 8, 13, 40], n = 7: median x[3] = 5; mean 72 / 7;
    # p20 at h = 1.2: 2 + 0.2 (3 - 2) = 2.2; p80 at h = 4.8: 8 + 0.8 (13 - 8) = 12.
    ([13.0, 2.0, 40.0, 5.0, 1.0, 8.0, 3.0], {"median_ms": 5.0, "p20_ms": 2.2, "p80_ms": 12.0, "mean_ms": 72 / 7, "min_ms": 1.0}),
    # sorted [0.5, 0.75, 1, 4], n = 4 (even: the median interpolates): median at h = 1.5:
    # 0.75 + 0.5 (1 - 0.75) = 0.875; mean 6.25 / 4 = 1.5625;
    # p20 at h = 0.6: 0.5 + 0.6 (0.75 - 0.5) = 0.65; p80 at h = 2.4: 1 + 0.4 (4 - 1) = 2.2.
    ([4.0, 1.0, 0.5, 0.75], {"median_ms": 0.875, "p20_ms": 0.65, "p80_ms": 2.2, "mean_ms": 1.5625, "min_ms": 0.5}),
]


@pytest.mark.parametrize("times,want", STATS_CASES, ids=["n7", "n4"])
def test_time_stats_known_values(times, want):
    assert len(set(want.values())) == len(want), "the case must tell the statistics apart"
    assert time_stats(times) == pytest.approx(want, rel=1e-12)
    assert time_stats(times[::-1]) == pytest.approx(want, rel=1e-12)  # order of the samples does not matter


def test_time_stats_single_time():
    assert time_stats([7.5]) == {"median_ms": 7.5, "p20_ms": 7.5, "p80_ms": 7.5, "mean_ms": 7.5, "min_ms": 7.5}


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [1.0, -0.5], [float("inf")]])
def test_time_stats_rejects_bad_times(bad):
    with pytest.raises(ValueError):
        time_stats(bad)


# --------------------------------------------------------------------------------------- SOL math
def test_sol_columns_compute_bound_case():
    T, median_ms = 4096, 60.0
    flops = 12 * T * H * I
    nbytes = 2 * (4 * T * H + 3 * T * I + 6 * I * H)
    cols = sol_columns(T, H, I, median_ms, "H200-SXM", Ceilings(copy_tbps=4.0, gemm_tflops=760.0))
    sol_ms = max(flops / 989.4e12, nbytes / 4.8e12) * 1e3
    assert sol_ms == pytest.approx(flops / 989.4e12 * 1e3)  # compute-bound at T=4096
    assert cols["sol_ms"] == pytest.approx(sol_ms)
    assert cols["sol_fraction"] == pytest.approx(sol_ms / median_ms)
    assert cols["tflops"] == pytest.approx(flops / 0.060 / 1e12)
    assert cols["gbps"] == pytest.approx(nbytes / 0.060 / 1e9)
    assert cols["sol_ms_measured"] == pytest.approx(flops / 760e12 * 1e3)
    assert cols["sol_fraction_measured"] == pytest.approx(flops / 760e12 * 1e3 / median_ms)


def test_sol_columns_memory_bound_case_and_nan_median():
    T = 1
    nbytes = 2 * (4 * T * H + 3 * T * I + 6 * I * H)
    cols = sol_columns(T, H, I, float("nan"), "H100-SXM", Ceilings(copy_tbps=2.0, gemm_tflops=500.0))
    assert cols["sol_ms"] == pytest.approx(nbytes / 3.35e12 * 1e3)  # memory-bound: bytes term wins
    assert cols["sol_ms_measured"] == pytest.approx(nbytes / 2.0e12 * 1e3)
    for key in ("tflops", "gbps", "sol_fraction", "sol_fraction_measured"):
        assert math.isnan(cols[key])
    assert math.isnan(sol_columns(T, H, I, 1.0, "H200-SXM")["sol_ms_measured"])  # no ceilings measured


def test_pick_hardware():
    assert pick_hardware("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert pick_hardware("NVIDIA H200") == "H200-SXM"
    assert pick_hardware("NVIDIA B200") == "B200-HGX"
    # Another GPU or none: no datasheet, rather than a fraction of a card the run was not made on.
    assert pick_hardware("NVIDIA A100-SXM4-80GB") == ""
    assert pick_hardware("") == ""


def test_sol_columns_without_a_datasheet_are_nan():
    cols = sol_columns(128, H, I, 5.0, "", Ceilings(copy_tbps=0.02, gemm_tflops=1.0))
    assert math.isnan(cols["sol_ms"]) and math.isnan(cols["sol_fraction"])
    assert cols["sol_ms_measured"] > 0 and cols["sol_fraction_measured"] > 0  # this machine's own ceilings
    assert cols["tflops"] > 0


def test_a_cpu_run_gets_no_gpu_datasheet():
    cases = select_cases("s128_b1")
    assert (
        BenchConfig(cases=cases, hidden_size=64, intermediate_size=96, impls=["eager"], device=torch.device("cpu")).hardware == ""
    )
    with pytest.raises(ValueError, match="hardware='H200-SXM' for a cpu run"):
        BenchConfig(
            cases=cases, hidden_size=64, intermediate_size=96, impls=["eager"], device=torch.device("cpu"), hardware="H200-SXM"
        )


# ------------------------------------------------------------------------------- schema, summaries
def fake_row(case: str, impl: str, median_ms: float, correct=True, tokens: int = 4096) -> dict:
    # The other statistics differ from the median, so a summary that reads the wrong one fails.
    stats = {
        "median_ms": median_ms,
        "p20_ms": 0.9 * median_ms,
        "p80_ms": 1.2 * median_ms,
        "mean_ms": 1.3 * median_ms,
        "min_ms": 0.8 * median_ms,
    }
    return {
        "run_id": "",
        "case": case,
        "seq_len": tokens,
        "batch_size": 1,
        "tokens": tokens,
        "hidden_size": H,
        "intermediate_size": I,
        "impl": impl,
        "protocol": "full",
        "warmup": 10,
        "iters": 50,
        **stats,
        "first_call_s": 0.5,
        "host_ms": 0.35,
        "hardware": "H200-SXM",
        "speedup_vs_eager": math.nan,
        "speedup_vs_compile": math.nan,
        "peak_mem_gb": 1.5,
        "correct": correct,
        "min_match_fraction": 0.999 if correct is True else math.nan,
        "note": f"{impl} note",
        **power.empty_power_columns(),
        **sol_columns(tokens, H, I, median_ms, "H200-SXM", Ceilings(4.0, 760.0)),
    }


def fake_frame() -> pd.DataFrame:
    medians = {"eager": (10.0, 40.0), "compile": (8.0, 32.0), "cublas-gemms": (6.0, 20.0), "triton": (5.0, 10.0)}
    rows = []
    for k, case in enumerate(("a", "b")):
        for impl, m in medians.items():
            correct = pd.NA if impl == "cublas-gemms" else not (impl == "triton" and case == "b")
            rows.append(fake_row(case, impl, m[k], correct, tokens=1024 * (k + 1)))
    rows.append(fake_row("c", "eager", 20.0, True, tokens=4096))
    rows.append(fake_row("c", "triton", math.nan, False, tokens=4096))  # an impl that errored
    return add_speedups(rows_to_frame(rows))


def test_schema_columns_and_dtypes():
    frame = fake_frame()
    assert list(frame.columns) == list(COLUMNS)
    for column, kind in COLUMNS.items():
        series = frame[column]
        if kind == "int":
            assert pd.api.types.is_integer_dtype(series), column
        elif kind == "int?":
            assert str(series.dtype) == "Int64", column
        elif kind == "float":
            assert pd.api.types.is_float_dtype(series), column
        elif kind == "bool?":
            assert str(series.dtype) == "boolean", column
        else:
            assert all(isinstance(v, str) for v in series), column
    with pytest.raises(ValueError, match="missing"):
        check_row({k: v for k, v in fake_row("a", "eager", 1.0).items() if k != "note"})
    with pytest.raises(ValueError, match="unknown"):
        check_row({**fake_row("a", "eager", 1.0), "extra": 1})


def test_speedups_and_summary_geomeans():
    frame = fake_frame()
    triton_a = frame[(frame["impl"] == "triton") & (frame["case"] == "a")].iloc[0]
    assert triton_a["speedup_vs_eager"] == pytest.approx(2.0)
    assert triton_a["speedup_vs_compile"] == pytest.approx(1.6)
    summary = summary_table(frame).set_index("impl")
    assert list(summary.index) == ["eager", "compile", "cublas-gemms", "triton"]
    assert summary.loc["eager", "gmean_ms"] == pytest.approx((10 * 40 * 20) ** (1 / 3))
    assert summary.loc["triton", "n_cases"] == 2  # case c errored
    assert summary.loc["triton", "gmean_ms"] == pytest.approx(math.sqrt(50))
    assert summary.loc["triton", "speedup_vs_eager"] == pytest.approx(math.sqrt(2 * 4))
    assert summary.loc["triton", "speedup_vs_compile"] == pytest.approx(math.sqrt(1.6 * 3.2))
    sol = frame[frame["impl"] == "triton"]["sol_ms"].iloc[:2].to_numpy()
    assert summary.loc["triton", "sol_fraction"] == pytest.approx(math.sqrt(sol[0] * sol[1]) / math.sqrt(50))
    assert bool(summary.loc["eager", "all_correct"]) is True
    assert bool(summary.loc["triton", "all_correct"]) is False
    assert summary.loc["cublas-gemms", "all_correct"] is pd.NA
    assert summary.loc["cublas-gemms", "speedup_vs_compile"] == pytest.approx(math.sqrt(8 / 6 * 32 / 20))
    table = per_case_table(frame)
    assert list(table.index) == ["a", "b", "c"]
    assert list(table.columns) == ["tokens", "eager", "compile", "cublas-gemms", "triton", "sol_ms"]
    assert table.loc["b", "triton"] == 10.0 and math.isnan(table.loc["c", "compile"])


def test_speedup_vs_compile_is_nan_without_compile():
    frame = add_speedups(rows_to_frame([fake_row("a", "eager", 10.0), fake_row("a", "triton", 5.0)]))
    assert frame["speedup_vs_compile"].isna().all()
    assert list(frame["speedup_vs_eager"]) == pytest.approx([1.0, 2.0])


# -------------------------------------------------------------------------------------- storage
def test_write_run_is_append_only_and_round_trips(tmp_path):
    frame = fake_frame()
    meta = {
        "utc": "2026-11-29T17:15:00Z",
        "gpu": {"name": "NVIDIA H200"},
        "protocol": {"name": "full"},
        "git": {"commit": "d946c89"},
        "ceilings": {"copy_tbps": math.nan},
    }
    run_id = environment.make_run_id(meta["utc"], "d946c89")
    assert run_id == "20261129T171500Z-d946c89"
    first, csv1, json1 = write_run(frame, meta, tmp_path, run_id)
    before = (csv1.read_bytes(), json1.read_bytes())
    second, csv2, json2 = write_run(frame, meta, tmp_path, run_id)
    assert first == run_id and second == f"{run_id}-2"
    assert (csv1.read_bytes(), json1.read_bytes()) == before  # the first run is untouched
    back = read_rows(csv2)
    assert set(back["run_id"]) == {second}
    expected = coerce(frame.assign(run_id=second))
    pd.testing.assert_frame_equal(back, expected, check_exact=False, rtol=1e-5)
    record = json.loads(json2.read_text(), parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
    assert record["run_id"] == second and record["n_rows"] == len(frame)
    assert record["ceilings"]["copy_tbps"] is None  # NaN is written as null
    index = pd.read_csv(tmp_path / "runs.csv")
    assert list(index.columns) == list(INDEX_COLUMNS)
    assert list(index["run_id"]) == [first, second]
    assert list(index["n_rows"]) == [len(frame)] * 2


def test_run_writer_keeps_finished_cases_of_an_unfinished_run(tmp_path):
    frame = fake_frame()
    writer = RunWriter(tmp_path, "20261129T171500Z-d946c89")
    writer.write_metadata({"utc": "2026-11-29T17:15:00Z"}, complete=False)
    writer.append(frame[frame["case"] == "a"])
    # killed here: the finished case is readable, the JSON says incomplete, the index lacks it
    partial = read_rows(writer.csv_path)
    assert set(partial["case"]) == {"a"} and len(partial) == 4
    assert json.loads(writer.json_path.read_text())["complete"] is False
    assert not (tmp_path / "runs.csv").exists()
    writer.append(frame[frame["case"] != "a"])
    writer.finish({"utc": "2026-11-29T17:15:00Z"})
    assert len(read_rows(writer.csv_path)) == len(frame)
    record = json.loads(writer.json_path.read_text())
    assert record["complete"] is True and record["n_rows"] == len(frame)
    assert list(pd.read_csv(tmp_path / "runs.csv")["run_id"]) == [writer.run_id]
    # runs copied in from elsewhere: the index is rebuilt from complete JSON records only
    later = write_run(frame, {"utc": "2026-11-30T09:00:00Z", "git_commit": "abc1234"}, tmp_path, "20261130T090000Z-abc1234")
    unfinished = RunWriter(tmp_path, "20261130T100000Z-abc1234")
    index_before = (tmp_path / "runs.csv").read_text()
    (tmp_path / "runs.csv").unlink()
    assert main(["--reindex", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "runs.csv").read_text() == index_before
    assert unfinished.run_id not in index_before and later[0] in index_before


def test_git_info_falls_back_to_env(tmp_path, monkeypatch):
    monkeypatch.delenv("SWIGLU_GIT_COMMIT", raising=False)
    monkeypatch.delenv("SWIGLU_GIT_DIRTY", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert environment.git_info(tmp_path) == {"commit": "unknown", "dirty": "unknown", "source": "unknown"}
    monkeypatch.setenv("SWIGLU_GIT_COMMIT", "abc1234")
    monkeypatch.setenv("SWIGLU_GIT_DIRTY", "1")
    info = environment.git_info(tmp_path)
    assert info["commit"] == "abc1234" and info["dirty"] is True
    # The env var also wins inside a working git checkout (a stale .git must not override it).
    repo = Path(environment.__file__).resolve().parent
    assert environment.git_info(repo)["source"] == "env SWIGLU_GIT_COMMIT"
    monkeypatch.delenv("SWIGLU_GIT_COMMIT")
    monkeypatch.delenv("GIT_CEILING_DIRECTORIES")
    assert environment.git_info(repo)["source"] in ("git", "unknown")  # unknown: a copy without .git
    assert re.fullmatch(r"\d{8}T\d{6}Z-abc1234", environment.make_run_id(environment.utc_now(), "abc1234"))


# ------------------------------------------------------------------------------ timing, impls
def test_iterations_alternate_between_input_sets():
    seen = []
    sets = [(torch.zeros(2),), (torch.ones(2),)]
    times = time_iterations(lambda t: seen.append(t.data_ptr()), alternating(sets), 5, torch.device("cpu"))
    assert len(times) == 5 and all(t >= 0 for t in times)
    ptrs = [s[0].data_ptr() for s in sets]
    assert seen == [ptrs[0], ptrs[1], ptrs[0], ptrs[1], ptrs[0]]
    assert L2Flusher(torch.device("cpu")).nbytes == 0


def test_unavailable_reasons_on_cpu(monkeypatch):
    cpu = torch.device("cpu")
    assert unavailable_reason("liger", cpu) and unavailable_reason("compile-max-autotune", cpu)
    assert unavailable_reason("eager", cpu) is None and unavailable_reason("cublas-gemms", cpu) is None
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "TRITON_INTERPRET" in unavailable_reason("triton", cpu)
    with pytest.raises(ValueError, match="unknown impl"):
        unavailable_reason("nope", cpu)


def test_cublas_gemms_has_the_gradients_shapes():
    inputs = make_inputs(2, 3, 32, 48, seed=1).as_tuple()
    outs, ref = cublas_gemms(*inputs), reference_backward(*inputs)
    assert [o.shape for o in outs] == [r.shape for r in ref]
    assert all(o.abs().sum() > 0 for o in outs)


def fake_liger_swiglu_backward(a, b, dc):
    """Liger's _swiglu_backward_kernel in torch: fp32 silu of a, results written into a and b."""
    a32 = a.float()
    sig = torch.sigmoid(a32)
    silu = a32 * sig
    db = dc.float() * silu
    da = dc.float() * (silu * (1 - sig) + sig) * b.float()
    a.copy_(da)
    b.copy_(db)
    return a, b


@pytest.mark.parametrize("mode,passes", [("forward", True), ("benchmark", False)])
def test_liger_wrapper(mode, passes):
    case = select_cases("s128_b1")[0]
    inputs = make_inputs(1, 128, 64, 96, mode=mode, seed=3).as_tuple()
    originals = [t.clone() for t in inputs]
    outs = make_liger_backward(fake_liger_swiglu_backward)(*liger_prepare(inputs))
    assert all(torch.equal(a, b) for a, b in zip(inputs, originals))  # prepare cloned gate/up
    correct, fraction, text = check_outputs(outs, reference_backward(*inputs), case)
    # Liger recomputes silu(gate_output): right on forward inputs, wrong on independent ones.
    assert correct is passes, text
    assert (fraction >= 0.99) is passes


# ----------------------------------------------------------------------------- runner, end to end
def _cpu_config(impls, **kw):
    return BenchConfig(
        cases=select_cases("s128_b1"),
        hidden_size=64,
        intermediate_size=96,
        impls=impls,
        device=torch.device("cpu"),
        protocol="cpu-smoke",
        measure_ceilings=False,
        **kw,
    )


def test_failing_and_wrong_impls_are_recorded_not_fatal():
    def boom(*args):
        raise RuntimeError("kernel exploded")

    def doubled(*args):
        return tuple(2 * o for o in reference_backward(*args))

    impls = {
        **IMPLS,
        "boom": BenchImpl("boom", "always raises", lambda d: boom),
        "doubled": BenchImpl("doubled", "twice the reference", lambda d: doubled),
    }
    result = run_benchmark(_cpu_config(["eager", "boom", "doubled"]), impls=impls, progress=False, log=lambda s: None)
    rows = result.rows.set_index("impl")
    assert rows.loc["eager", "correct"] == True  # noqa: E712 - pandas boolean scalar
    assert rows.loc["eager", "median_ms"] > 0
    assert rows.loc["boom", "correct"] == False  # noqa: E712
    assert rows.loc["boom", "note"].startswith("ERROR in first call: RuntimeError: kernel exploded")
    assert np.isnan(rows.loc["boom", ["median_ms", "p20_ms", "first_call_s", "tflops"]].astype(float)).all()
    assert rows.loc["doubled", "correct"] == False  # noqa: E712
    assert rows.loc["doubled", "min_match_fraction"] < 0.99
    assert "criterion failed: grad_x" in rows.loc["doubled", "note"]


def test_read_only_prepare_runs_once_per_set_and_a_writing_call_is_caught():
    """A read-only layout change (quack's) is made once per input set, so its GPU work is in
    neither the timed loop nor the power window, and the two sets still take turns; a call that
    writes into such arguments, made anew or passed through, gets an ERROR row without timings."""
    prepared, seen = [], []

    def counting_prepare(args):
        prepared.append(1)
        return tuple(a.clone() for a in args)

    def recording(*args):
        seen.append(args[1].data_ptr())
        return reference_backward(*args)

    def writes_input(*args):
        out = reference_backward(*args)
        args[1].add_(1.0)  # x
        return out

    impls = {
        **IMPLS,
        "once": BenchImpl("once", "read-only prepare", lambda d: recording, prepare=counting_prepare, prepare_every_call=False),
        "writer": BenchImpl(
            "writer", "writes x", lambda d: writes_input, prepare=lambda a: tuple(t.clone() for t in a), prepare_every_call=False
        ),
        "passthrough": BenchImpl(
            "passthrough",
            "writes x, which its prepare passes through",
            lambda d: writes_input,
            prepare=lambda a: tuple(a),
            prepare_every_call=False,
        ),
    }
    result = run_benchmark(_cpu_config(["once", "writer", "passthrough"]), impls=impls, progress=False, log=lambda s: None)
    rows = result.rows.set_index("impl")
    assert rows.loc["once", "correct"] == True and rows.loc["once", "median_ms"] > 0  # noqa: E712
    # first call + one per set (2) + the correctness call: not one per iteration
    assert len(prepared) == 4 and rows.loc["once", "iters"] > 2
    timed = seen[1:-1]  # between the first call and the correctness call: set 1, set 0, set 1, ...
    assert len(set(timed)) == 2 and all(a != b for a, b in zip(timed, timed[1:]))
    for impl in ("writer", "passthrough"):
        assert rows.loc[impl, "note"].startswith("ERROR in prepared inputs check: InputsChanged: argument 1 changed")
        assert rows.loc[impl, "correct"] == False  # noqa: E712
        assert np.isnan(rows.loc[impl, ["median_ms", "p20_ms", "host_ms"]].astype(float)).all()  # timed other inputs


def test_rows_are_handed_over_case_by_case():
    seen, started = [], []
    config = _cpu_config(["eager", "cublas-gemms"])
    config.cases = select_cases("s128_b1,s256_b1")
    result = run_benchmark(config, progress=False, log=lambda s: None, on_start=started.append, on_case=seen.append)
    assert [list(f["case"].unique()) for f in seen] == [["s128_b1"], ["s256_b1"]]
    assert started and started[0]["finished_utc"] is None and result.metadata["finished_utc"]
    assert len(result.rows) == 4 and list(result.rows.columns) == list(COLUMNS)


def test_cli_cpu_smoke_end_to_end(tmp_path, capsys):
    assert (
        main(["--device", "cpu", "--impls", "eager,cublas-gemms", "--cases", "s128_b1", "--out", str(tmp_path), "--no-progress"])
        == 0
    )
    out = capsys.readouterr().out
    csvs = sorted(p for p in tmp_path.glob("*.csv") if p.name != "runs.csv")
    assert len(csvs) == 1
    rows = read_rows(csvs[0]).set_index("impl")
    assert list(rows.index) == ["eager", "cublas-gemms"]
    assert set(rows["protocol"]) == {"cpu-smoke"} and set(rows["iters"]) == {5}
    assert rows.loc["eager", "correct"] == True  # noqa: E712
    assert rows.loc["cublas-gemms", "correct"] is pd.NA
    for impl in rows.index:
        r = rows.loc[impl]
        assert 0 < r["min_ms"] <= r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert r["first_call_s"] > 0 and 0 < r["host_ms"] <= r["p80_ms"]  # CPU: host time is the latency
        # No speed of light for a CPU run: no datasheet, and a CPU's copy/GEMM rates bound nothing.
        assert pd.isna(r["sol_ms"]) and pd.isna(r["sol_fraction"]) and pd.isna(r["sol_ms_measured"])
    assert rows.loc["eager", "speedup_vs_eager"] == pytest.approx(1.0)
    meta = json.loads(csvs[0].with_suffix(".json").read_text())
    assert meta["run_id"] == csvs[0].stem
    assert meta["protocol"]["name"] == "cpu-smoke" and "not a CUDA device" in meta["ceilings"]["skipped"]
    assert {"gpu", "software", "git", "command", "hardware", "gpu_name", "git_commit", "utc"} <= set(meta)
    assert meta["git_commit"] == meta["git"]["commit"] and csvs[0].stem.endswith(meta["git_commit"][:7])
    assert meta["hardware"]["key"] == "" and meta["hardware"]["peak_tflops"] is None
    assert "CPU-SMOKE" in out
    assert out.index("SUMMARY") > out.index("wrote") and out.rstrip().endswith("not the benchmark protocol.")
    # A CPU row is not cuBLAS and has no datasheet SOL: neither is printed as if it were.
    assert "cublas-gemms" not in out and "gemms-only" in out
    assert "SOL nan" not in out and "datasheet nan" not in out and "nan ms" not in out
    assert "speed of light: none (CPU run)" in out and "sol_fraction" not in out


def test_cli_cpu_run_goes_under_build_by_default(tmp_path, monkeypatch, capsys):
    (tmp_path / "data" / "bench").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "--device",
                "cpu",
                "--impls",
                "eager",
                "--cases",
                "s128_b1",
                "--hidden-size",
                "64",
                "--intermediate-size",
                "96",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "writing to build/bench" in capsys.readouterr().out
    assert len(list((tmp_path / "build" / "bench").glob("*.json"))) == 1
    assert (tmp_path / "build" / "bench" / "runs.csv").is_file()
    assert not any((tmp_path / "data" / "bench").iterdir())


def test_cli_refuses_a_cpu_run_in_the_committed_runs(tmp_path, capsys):
    committed = Path(__file__).resolve().parents[2] / "data" / "bench"
    before = sorted((p.name, p.stat().st_size) for p in committed.iterdir())
    for out in (committed, committed / "sub"):
        with pytest.raises(SystemExit) as exit_info:
            main(["--device", "cpu", "--impls", "eager", "--cases", "s128_b1", "--out", str(out), "--no-progress"])
        assert exit_info.value.code == 2
        assert "GPU measurements only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--hardware", "H200-SXM", "--out", str(tmp_path), "--no-progress"])
    assert "--hardware H200-SXM with --device cpu" in capsys.readouterr().err
    assert sorted((p.name, p.stat().st_size) for p in committed.iterdir()) == before


def test_cli_refuses_without_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "--device cpu" in capsys.readouterr().err
    for bad in (["--impls", "nope"], ["--cases", "s1_b1"], ["--hidden-size", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["--device", "cpu", *bad])
        assert exit_info.value.code == 2


# ------------------------------------------------------------------------------ power and energy
class FakeNvml(types.SimpleNamespace):
    """A stand-in for pynvml: 400 W instantaneous power (field 186), 1500 MHz SM clock, max 1980,
    and an energy counter that advances by exactly 1000 mJ per read."""

    NVML_CLOCK_SM = 1
    NVML_FI_DEV_POWER_INSTANT = 186

    def __init__(self, instant=True):
        super().__init__(energy_reads=0, instant=instant, shut=False)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetFieldValues(self, handle, fields):
        assert fields == [186]
        if not self.instant:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return [types.SimpleNamespace(nvmlReturn=0, valueType=1, value=types.SimpleNamespace(uiVal=400_000))]

    def nvmlDeviceGetPowerUsage(self, handle):
        return 250_000  # mW

    def nvmlDeviceGetClockInfo(self, handle, kind):
        assert kind == self.NVML_CLOCK_SM
        return 1500

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.energy_reads += 1
        return 5_000_000 + 1000 * self.energy_reads


def fake_monitor(nvml: FakeNvml, min_window_s: float = 0.0) -> power.PowerMonitor:
    backend = power._NvmlBackend(nvml, nvml.nvmlDeviceGetHandleByIndex(0))
    return power.PowerMonitor(backend, interval_s=0.002, min_window_s=min_window_s)


def test_window_columns_arithmetic():
    samples = [
        power.Sample(t, p, c)
        for t, p, c in [(0.5, 999, 999), (1.0, 300, 1400), (1.5, 500, 1600), (2.0, 400, 1500), (2.5, 999, 999)]
    ]
    cols = power.window_columns(samples, 1.0, 2.0, 12_000.0, 40)  # 12 J over 40 iterations
    assert cols["power_w"] == pytest.approx(400.0) and cols["sm_clock_mhz"] == pytest.approx(1500.0)
    assert cols["power_samples"] == 3 and cols["energy_iters"] == 40
    assert cols["energy_j"] == pytest.approx(0.3) and cols["energy_window_s"] == pytest.approx(1.0)
    assert math.isnan(cols["flush_energy_j"]) and math.isnan(cols["energy_per_backward_j"])
    full = power.with_flush_energy(cols, 0.05)
    assert full["energy_per_backward_j"] == pytest.approx(0.25) and full["flush_energy_j"] == 0.05
    # No energy counter: mean power x duration, per iteration (400 W x 1 s / 40).
    assert power.window_columns(samples, 1.0, 2.0, None, 40)["energy_j"] == pytest.approx(10.0)
    empty = power.window_columns([], 1.0, 2.0, None, 4)
    assert empty["power_samples"] == 0 and math.isnan(empty["power_w"]) and math.isnan(empty["energy_j"])
    with pytest.raises(ValueError, match="iterations"):
        power.window_columns(samples, 1.0, 2.0, 1.0, 0)
    with pytest.raises(ValueError, match="ends before"):
        power.window_columns(samples, 2.0, 1.0, 1.0, 1)
    assert power.extension_iterations(0.25, 5.0, 1.0) == 150  # 0.75 s more at 5 ms each
    assert power.extension_iterations(1.5, 5.0, 1.0) == 0 and power.extension_iterations(0.1, math.nan, 1.0) == 0


def test_nvidia_smi_line_parsing():
    s = power.parse_nvidia_smi_line("2026/11/30 13:47:56.250, 512.34, 1980\n")
    assert s.power_w == pytest.approx(512.34) and s.sm_clock_mhz == 1980.0
    assert s.t == pytest.approx(datetime(2026, 11, 30, 13, 47, 56, 250000).timestamp())
    for bad in ("timestamp, power.draw [W], clocks.sm [MHz]", "2026/11/30 13:47:56.250, [N/A], 1980", ""):
        assert power.parse_nvidia_smi_line(bad) is None


@pytest.mark.parametrize("instant", [True, False])
def test_fake_nvml_monitor_reads_power_clock_and_energy(instant):
    nvml = FakeNvml(instant=instant)
    monitor = fake_monitor(nvml)
    try:
        window = monitor.open_window()
        time.sleep(0.05)
        cols = monitor.close_window(window, 10)
        info = monitor.describe()
    finally:
        monitor.close()
    assert nvml.shut
    assert cols["power_samples"] > 0
    assert cols["power_w"] == pytest.approx(400.0 if instant else 250.0)
    assert cols["sm_clock_mhz"] == pytest.approx(1500.0)
    assert cols["energy_j"] == pytest.approx(1.0 / 10)  # one counter step (1000 mJ) over 10 iterations
    assert info["max_sm_clock_mhz"] == 1980 and info["power_limit_w"] == 700
    assert ("INSTANT" in info["power_source"]) is instant and "TotalEnergy" in info["energy_source"]


def test_cpu_run_leaves_power_columns_empty(tmp_path):
    assert power.open_monitor(torch.device("cpu"))[0] is None
    result = run_benchmark(_cpu_config(["eager"]), progress=False, log=lambda s: None)
    assert result.metadata["power"]["backend"] is None and "CPU" in result.metadata["power"]["status"]
    rows = result.rows
    for column in power.POWER_COLUMNS:
        assert column in rows.columns and rows[column].isna().all(), column
    _, csv_path, _ = write_run(rows, result.metadata, tmp_path, "20261130T000000Z-abc1234")
    text = csv_path.read_text().splitlines()
    header, line = text[0].split(","), text[1].split(",")
    assert all(line[header.index(c)] == "" for c in power.POWER_COLUMNS)  # empty, not 0
    assert read_rows(csv_path)[list(power.POWER_COLUMNS)].isna().all().all()


def test_run_with_fake_nvml_fills_power_columns():
    nvml = FakeNvml()
    monitor = fake_monitor(nvml, min_window_s=0.05)
    calls = []

    def fails_in_timing(*args):
        calls.append(1)
        if len(calls) > 1:  # the first call passes, the timed loop raises inside the window
            raise RuntimeError("late failure")
        return reference_backward(*args)

    impls = {**IMPLS, "late": BenchImpl("late", "raises in the timed loop", lambda d: fails_in_timing)}
    try:
        result = run_benchmark(
            _cpu_config(["eager", "late", "cublas-gemms"]), impls=impls, progress=False, log=lambda s: None, monitor=monitor
        )
    finally:
        monitor.close()
    rows = result.rows.set_index("impl")
    assert rows.loc["late", "note"].startswith("ERROR in timing") and rows.loc["late", list(power.POWER_COLUMNS)].isna().all()
    text = format_summary(result.rows, dict(result.metadata, run_id="x"))
    assert "power per case" in text and "max 1980 MHz" in text and "J eager" in text
    assert result.metadata["power"]["backend"].startswith("nvml") and result.metadata["max_sm_clock_mhz"] == 1980
    for impl in ("eager", "cublas-gemms"):
        r = rows.loc[impl]
        assert r["power_w"] == pytest.approx(400.0) and r["sm_clock_mhz"] == pytest.approx(1500.0)
        assert r["power_samples"] > 0 and r["energy_window_s"] >= 0.05
        assert r["energy_iters"] >= r["iters"]  # stretched to min_window_s with untimed iterations
        # Every window sees exactly one counter step of 1 J: per iteration, minus the flush's share.
        assert r["energy_j"] == pytest.approx(1.0 / r["energy_iters"])
        assert r["energy_per_backward_j"] == pytest.approx(r["energy_j"] - r["flush_energy_j"])
    flush = rows["flush_energy_j"]
    assert flush.nunique() == 1 and 0 < flush.iloc[0] <= 1.0 / 50  # one step over >= 50 flushes


def test_runs_recorded_without_host_time_still_read(tmp_path):
    """Runs from before the host_ms column (with power columns) read back with it empty."""
    legacy = fake_frame().drop(columns=["host_ms"])
    path = tmp_path / "older.csv"
    legacy.to_csv(path, index=False)
    back = read_rows(path)
    assert list(back.columns) == list(COLUMNS) and back["host_ms"].isna().all()
    assert (back["power_w"].notna() == legacy["power_w"].notna()).all()


def test_runs_recorded_without_power_columns_still_read(tmp_path):
    frame = fake_frame()
    legacy = frame.drop(columns=list(power.POWER_COLUMNS) + ["host_ms"])
    path = tmp_path / "old.csv"
    legacy.to_csv(path, index=False)
    back = read_rows(path)
    assert list(back.columns) == list(COLUMNS) and back[list(power.POWER_COLUMNS)].isna().all().all()
    assert power_summary(back) is None
    assert "power: not recorded" in format_summary(
        back,
        {
            "protocol": {"name": "full", "warmup": 10, "iters": 50},
            "gpu": {"name": "x"},
            "hardware": {"name": "H200", "peak_tflops": 989.4, "peak_tbps": 4.8},
            "shape": {"hidden_size": H, "intermediate_size": I},
            "power": {"backend": None, "status": "CPU run"},
        },
    )


def test_max_autotune_is_opt_in():
    cpu = torch.device("cpu")
    assert "compile-max-autotune" in IMPLS and "max-autotune" in IMPLS["compile-max-autotune"].note
    assert "compile-max-autotune" not in default_impls(cpu, max_autotune=False)


def test_nvidia_smi_fallback_with_a_fake_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import datetime, sys, time\n"
        "assert '--query-gpu=timestamp,power.draw,clocks.sm' in sys.argv, sys.argv\n"
        "print('timestamp, power.draw [W], clocks.sm [MHz]', flush=True)\n"
        "while True:\n"
        "    print(datetime.datetime.now().strftime('%Y/%m/%d %H:%M:%S.%f')[:-3] + ', 321.5, 1755', flush=True)\n"
        "    time.sleep(0.005)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monitor = power.PowerMonitor(power._NvidiaSmiBackend("0", 0.005), interval_s=0.005)
    try:
        time.sleep(0.5)  # the child starts
        window = monitor.open_window()
        time.sleep(0.2)
        cols = monitor.close_window(window, 4)
        assert "nvidia-smi" in monitor.describe()["backend"]
    finally:
        monitor.close()
    assert cols["power_samples"] >= 5
    assert cols["power_w"] == pytest.approx(321.5) and cols["sm_clock_mhz"] == pytest.approx(1755.0)
    # No energy counter: mean power x window duration, per iteration.
    assert cols["energy_j"] == pytest.approx(321.5 * cols["energy_window_s"] / 4)


def test_median_step_ms_times_after_the_warmup_on_cpu():
    """The step timers' helper (train_step, forward_probe): warm-up calls untimed, then the median."""
    from swiglu_lab.bench.timing import median_step_ms

    calls = []
    ms = median_step_ms(lambda: calls.append(1), 2, 5, "cpu")
    assert len(calls) == 7 and 0 <= ms < 1000
