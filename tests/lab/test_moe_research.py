"""swiglu_lab.research.moe: the grouped SwiGLU MLP's FLOPs, minimum bytes and SOL by hand, the
roofline table, and the loader, tables and figure on a real tiny CPU run of scripts/moe_bench_gpu.py."""

from __future__ import annotations

import json
import math

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from moe_fixtures import tiny_run_copy  # noqa: E402
from swiglu import roofline  # noqa: E402
from swiglu_lab.research import moe  # noqa: E402


def test_flops_bytes_and_sol_of_qwen3_30b_by_hand():
    s = moe.MOE_SHAPES["qwen3-30b-a3b"]
    T, H, I, E, k = 2048, 2048, 768, 128, 8
    assert moe.flops(T, s, "forward") == 6 * T * k * H * I
    assert moe.flops(T, s, "backward") == 12 * T * k * H * I
    assert moe.flops(T, s) == 18 * T * k * H * I
    weights = 2 * 3 * E * H * I
    fwd = 2 * 2 * T * H + weights + 12 * T * k
    bwd = 2 * 3 * T * H + weights + 12 * T * k + weights + 4 * T * k
    assert moe.min_bytes(T, s, "forward") == fwd and moe.min_bytes(T, s, "backward") == bwd
    assert moe.min_bytes(T, s) == fwd + bwd
    hw = roofline.HARDWARE["H200-SXM"]
    assert moe.sol_time_s(T, s, "forward") == pytest.approx(max(6 * T * k * H * I / 989.4e12, fwd / 4.8e12))
    assert moe.sol_time_s(T, s, "forward") == pytest.approx(fwd / (hw.peak_tbps * 1e12))  # memory bound
    # At 32768 tokens the pairs per expert (2048) pass the ridge: compute bound.
    assert moe.sol_time_s(32768, s, "forward") == pytest.approx(6 * 32768 * k * H * I / 989.4e12)


def test_weights_read_only_for_experts_that_can_be_hit():
    s = moe.MOE_SHAPES["deepseek-v3"]
    assert moe.experts_hit(4, s) == 32 and moe.experts_hit(4096, s) == 256
    one = moe.min_bytes(1, s, "forward")
    assert one == 2 * 2 * 7168 + 2 * 3 * 7168 * 2048 * 8 + 12 * 8
    with pytest.raises(ValueError, match="mode"):
        moe.flops(1, s, "fwd")
    with pytest.raises(ValueError, match="unknown MoE shape"):
        moe.shape_of("llama")


def test_roofline_table_has_every_shape_tokens_and_mode():
    table = moe.roofline_table()
    assert len(table) == 4 * 3 * 3
    assert set(table["shape"]) == set(moe.DEFAULT_SHAPES)
    r = table[(table["shape"] == "mixtral-8x7b") & (table["tokens"] == 2048) & (table["mode"] == "forward")].iloc[0]
    s = moe.MOE_SHAPES["mixtral-8x7b"]
    assert r["sol_ms"] == pytest.approx(moe.sol_time_s(2048, s, "forward") * 1e3)
    assert r["intensity"] == pytest.approx(moe.flops(2048, s, "forward") / moe.min_bytes(2048, s, "forward"))
    assert (table["sol_tflops"] <= 989.4 + 1e-9).all()
    assert set(table["bound"]) == {"memory", "compute"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_bench")
    tiny_run_copy(tmp_path_factory, root / "20990101T000000Z-abc1234")
    return root


def test_latest_run_loads_the_newest_and_none_without_one(tiny_run, tmp_path):
    assert moe.latest_run(tmp_path) is None and moe.latest_run(tmp_path / "absent") is None
    old = tmp_path / "old"
    old.mkdir()
    for name in (moe.BENCH_CSV, moe.CHECK_CSV, moe.META_JSON):
        (old / name).write_bytes((tiny_run / "20990101T000000Z-abc1234" / name).read_bytes())
    meta = json.loads((old / moe.META_JSON).read_text())
    (old / moe.META_JSON).write_text(json.dumps(dict(meta, date_utc="2000-01-01T00:00:00Z", run_id="old")))
    (tiny_run / "old").mkdir(exist_ok=True)
    for name in (moe.BENCH_CSV, moe.CHECK_CSV, moe.META_JSON):
        (tiny_run / "old" / name).write_bytes((old / name).read_bytes())
    run = moe.latest_run(tiny_run)
    assert run["run"].endswith("-abc1234") and run["rows"]["oom"].dtype == bool
    assert moe.latest_run(old)["run"] == "old"
    assert moe.latest_run(tiny_run, "CPU")["run"].endswith("-abc1234") and moe.latest_run(tiny_run, "H200") is None


def test_tables_and_figure_from_the_tiny_run(tiny_run):
    run = moe.latest_run(tiny_run)
    table = moe.latency_table(run["rows"])
    assert set(table["impl"]) == {"triton", "grouped_mm", "eager"} and set(table["tokens"]) == {16}
    g = table[table["impl"] == "grouped_mm"]
    assert (g["speedup_vs_grouped_mm"] == 1.0).all()
    r = table.iloc[0]
    assert r["sol_fraction"] == pytest.approx(r["sol_ms"] / r["ms"])
    valid = moe.validation_table(run["checks"])
    assert set(valid["impl"]) == {"triton", "grouped_mm", "eager"} and (valid["status"] == "ok").all()
    assert (valid["max_ratio_vs_eager"] < 2).all() and "rel_err_grad_x" in valid
    fig = moe.moe_plot(table, "footer")
    drawn = fig.plotted
    ours = drawn[(drawn["panel"] == "tiny: ms") & (drawn["series"] == "triton")]
    expected = table[(table["impl"] == "triton") & (table["mode"] == "forward+backward")]
    assert sorted(ours["y"]) == pytest.approx(sorted(expected["ms"]))
    assert len(drawn[drawn["series"] == "sol"]) == 2 and not math.isnan(drawn["y"].sum())
    rate = drawn[(drawn["panel"] == "tiny: tflops") & (drawn["series"] == "eager")]
    assert len(rate) == 2 and isinstance(pd.DataFrame(drawn), pd.DataFrame)
    matplotlib.pyplot.close(fig)
