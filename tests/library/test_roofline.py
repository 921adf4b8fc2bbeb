"""FLOPs, bytes, SOL times and the benchmark's score against the published tables (data/spec/)."""

import math
from pathlib import Path

import pandas as pd
import pytest

from swiglu import roofline
from swiglu.roofline import HARDWARE, geometric_mean, sol_score, sol_time_s
from swiglu.workloads import CASES, HIDDEN_SIZE, INTERMEDIATE_SIZE

SPEC = Path(__file__).resolve().parents[2] / "data" / "spec"
B200 = HARDWARE["B200-benchmark"]


@pytest.fixture(scope="module")
def published() -> pd.DataFrame:
    return pd.read_csv(SPEC / "published_b200.csv")


@pytest.fixture(scope="module")
def h200() -> pd.DataFrame:
    return pd.read_csv(SPEC / "h200_baseline_2026-11-29.csv")


def test_flops_and_bytes_formulas():
    T, H, I = 7, 200, 344
    assert roofline.flops(T, H, I) == 12 * T * H * I
    # problem.md's formula (and the H200 table's gbytes column, below)
    assert roofline.min_bytes(T, H, I) == 2 * (4 * T * H + 3 * T * I + 6 * I * H)
    # Counting tensors: reads grad_output, x [T, H], gate/up/activated_gate [T, I], 3 weights
    # [I, H]; writes grad_x [T, H] and 3 weight gradients. That is 3*T*H, one [T, H] tensor fewer
    # than the published formula's 4*T*H; we keep the benchmark's formula (2*T*H bytes more,
    # 0.04% of the total at T = 128, 1.9% at T = 8192, where the SOL is compute-bound anyway).
    reads = 2 * T * H + 3 * T * I + 3 * I * H
    writes = T * H + 3 * I * H
    assert roofline.min_bytes(T, H, I) == 2 * (reads + writes) + 2 * T * H
    assert roofline.arithmetic_intensity(T, H, I) == roofline.flops(T, H, I) / roofline.min_bytes(T, H, I)
    # defaults are the Hermes-4-405B shape
    assert roofline.flops(128) == roofline.flops(128, HIDDEN_SIZE, INTERMEDIATE_SIZE)


def test_flops_and_bytes_agree_with_h200_table(h200):
    assert len(h200) == 18
    for row in h200.itertuples():
        # the table rounds to 3 (GFLOP) and 4 (GB) decimals
        assert roofline.flops(row.tokens) / 1e9 == pytest.approx(row.gflop, abs=1e-3)
        assert roofline.min_bytes(row.tokens) / 1e9 == pytest.approx(row.gbytes, abs=1e-4)


def test_hardware_table():
    assert set(HARDWARE) == {"H100-SXM", "H200-SXM", "B200-HGX", "B200-benchmark"}
    # dense bf16 (not the 2:4-sparse 1979 TFLOP/s), as problem.md quotes the datasheets
    assert (HARDWARE["H100-SXM"].peak_tflops, HARDWARE["H100-SXM"].peak_tbps) == (989.4, 3.35)
    assert (HARDWARE["H200-SXM"].peak_tflops, HARDWARE["H200-SXM"].peak_tbps) == (989.4, 4.8)
    assert (HARDWARE["B200-HGX"].peak_tflops, HARDWARE["B200-HGX"].peak_tbps) == (2250.0, 7.7)
    assert (B200.peak_tflops, B200.peak_tbps) == (1811.0, 7.67)
    for hw in HARDWARE.values():
        assert len(hw.source) > 20, f"{hw.name} has no source"
        assert hw.ridge_intensity == hw.peak_tflops / hw.peak_tbps


def test_b200_sol_matches_published_for_compute_bound_cases(published):
    checked = 0
    for row in published.itertuples():
        if row.tokens == 128:
            continue  # see test_b200_sol_at_128_tokens
        assert roofline.bound(row.tokens, B200) == "compute"
        ours_ms = sol_time_s(row.tokens, B200) * 1e3
        assert ours_ms == pytest.approx(row.sol_ms, rel=0.01), f"T={row.tokens}"
        # in fact well inside 0.1%: the published values are rounded to 3 decimals
        assert ours_ms == pytest.approx(row.sol_ms, rel=1e-3, abs=5e-4)
        checked += 1
    assert checked == 17


def test_b200_sol_at_128_tokens(published):
    """T = 128 is the one case where our SOL and the published one part.

    Our terms at 128 tokens: compute 12*T*H*I / 1.811 PFLOP/s = 0.740 ms; memory
    2*(4*T*H + 3*T*I + 6*I*H) = 10.53 GB / 7.67 TB/s = 1.372 ms, so our SOL is 1.372 ms
    (memory-bound: the six weight-sized tensors, 3 read + 3 written, dominate). The published
    T_SOL is 0.92 ms: above our compute term, below our memory term. At 7.67 TB/s it
    corresponds to ~7.06 GB, about two thirds of our minimum bytes (roughly four weight-sized
    [I, H] transfers instead of six), so the benchmark's byte model for this case counts less
    traffic than "every input read once, every output written once"; the FLOP term agrees. The
    benchmark does not publish its byte model, so we keep ours (a true lower bound) and only
    pin down where the difference lies.
    """
    row = published.set_index("tokens").loc[128]
    compute_ms = roofline.flops(128) / (B200.peak_tflops * 1e12) * 1e3
    memory_ms = roofline.min_bytes(128) / (B200.peak_tbps * 1e12) * 1e3
    assert compute_ms == pytest.approx(0.740, abs=1e-3)
    assert memory_ms == pytest.approx(1.372, abs=1e-3)
    assert roofline.bound(128, B200) == "memory"
    assert sol_time_s(128, B200) * 1e3 == pytest.approx(memory_ms)
    assert row.sol_ms == 0.92
    assert compute_ms < row.sol_ms < memory_ms
    implied_gb = row.sol_ms * 1e-3 * B200.peak_tbps * 1e12 / 1e9
    assert implied_gb / (roofline.min_bytes(128) / 1e9) == pytest.approx(2 / 3, abs=0.02)


def test_only_128_tokens_is_memory_bound():
    memory_bound = {c.tokens for c in CASES if roofline.bound(c.tokens, B200) == "memory"}
    assert memory_bound == {128}
    assert {c.tokens for c in CASES if roofline.bound(c.tokens, "H200-SXM") == "memory"} == {128}


def test_sol_time_is_max_of_terms():
    for hw_name, hw in HARDWARE.items():
        for T in (1, 128, 4096):
            compute = roofline.flops(T) / (hw.peak_tflops * 1e12)
            memory = roofline.min_bytes(T) / (hw.peak_tbps * 1e12)
            assert sol_time_s(T, hw_name) == max(compute, memory)
            assert sol_time_s(T, hw) == sol_time_s(T, hw_name)
            assert roofline.bound(T, hw) == ("compute" if compute >= memory else "memory")


def test_h200_summary_figures(h200):
    """problem.md's H200 summary: SOL gmean 22.16 ms; eager reference 36.23 ms (fraction 0.61)."""
    sol_gmean = geometric_mean(sol_time_s(t, "H200-SXM") * 1e3 for t in h200.tokens)
    assert sol_gmean == pytest.approx(22.16, abs=0.005)
    eager_gmean = geometric_mean(h200.eager_ms)
    assert eager_gmean == pytest.approx(36.23, abs=0.005)
    assert sol_gmean / eager_gmean == pytest.approx(0.61, abs=0.005)
    assert geometric_mean(h200.cublas_gemms_only_ms) == pytest.approx(33.76, abs=0.005)


def test_sol_score():
    assert sol_score(t_kernel=30.0, t_baseline=30.0, t_sol=20.0) == pytest.approx(0.5)
    assert sol_score(t_kernel=20.0, t_baseline=30.0, t_sol=20.0) == pytest.approx(1.0)
    assert sol_score(25.0, 30.0, 20.0) == pytest.approx(1 / 1.5)
    assert sol_score(40.0, 30.0, 20.0) == pytest.approx(1 / 3)  # slower than the baseline
    with pytest.raises(ValueError, match="t_baseline"):
        sol_score(25.0, 20.0, 20.0)
    with pytest.raises(ValueError, match="t_baseline"):
        sol_score(25.0, 10.0, 20.0)


def test_sol_score_on_published_rows(published):
    for row in published.itertuples():
        assert sol_score(row.baseline_ms, row.baseline_ms, row.sol_ms) == pytest.approx(0.5)
        assert sol_score(row.sol_ms, row.baseline_ms, row.sol_ms) == pytest.approx(1.0)


def test_geometric_mean():
    assert geometric_mean([4.0]) == pytest.approx(4.0)
    assert geometric_mean([1.0, 4.0, 16.0]) == pytest.approx(4.0)
    assert geometric_mean(iter([2.0, 8.0])) == pytest.approx(4.0)  # any iterable
    values = [0.92, 5.919, 47.35]
    assert geometric_mean(values) == pytest.approx(math.prod(values) ** (1 / 3))
    for bad in ([], [1.0, 0.0], [1.0, -2.0], [float("nan")]):
        with pytest.raises(ValueError):
            geometric_mean(bad)


def test_peak_at_a_lower_sm_clock():
    hw = roofline.at_sm_clock("H200-SXM", 1485.0, 1980.0)
    assert hw.peak_tflops == pytest.approx(989.4 * 0.75) and hw.peak_tbps == 4.8
    assert "1485 of 1980 MHz" in hw.name and hw.ridge_intensity == pytest.approx(989.4 * 0.75 / 4.8)
    assert roofline.at_sm_clock(HARDWARE["H100-SXM"], 1980, 1980).peak_tflops == pytest.approx(989.4)
    for bad in ((0.0, 1980.0), (1500.0, 0.0), (float("nan"), 1980.0)):
        with pytest.raises(ValueError, match="positive"):
            roofline.at_sm_clock("H200-SXM", *bad)
