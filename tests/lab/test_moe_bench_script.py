"""scripts/moe_bench_gpu.py on the CPU at the tiny shape (ours under the Triton interpreter), with
out-of-memory errors faked above a token count: every implementation and mode gets its row, the
check rows hold errors against float64, the metadata says the run completed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import moe_bench_gpu  # noqa: E402
from moe_fixtures import tiny_run_copy  # noqa: E402


def test_the_tiny_cpu_run_writes_every_row_and_column(tmp_path_factory, tmp_path):
    stdout = tiny_run_copy(tmp_path_factory, tmp_path / "run")
    rows = pd.read_csv(tmp_path / "run" / "moe_bench.csv")
    assert list(rows.columns) == moe_bench_gpu.FIELDS
    assert len(rows) == 2 * 2 * len(moe_bench_gpu.IMPLS) * 3  # tokens x routings x impls x modes
    ran = rows[rows["status"] == "ok"]
    assert set(ran["impl"]) == {"triton", "grouped_mm", "eager"} and set(ran["tokens"]) == {16}
    assert set(ran["mode"]) == set(moe_bench_gpu.MODES) and (ran["reps"] == 2).all()
    assert (ran["ms"] > 0).all() and (ran["p20_ms"] <= ran["p80_ms"]).all()
    expected = {"forward": 6, "backward": 12, "forward+backward": 18}
    for _, r in ran.iterrows():  # tflops from the FLOP count over the median
        flop = expected[r["mode"]] * r["tokens"] * r["k"] * r["H"] * r["I"]
        assert r["tflops"] == pytest.approx(flop / (r["ms"] * 1e-3) / 1e12, rel=1e-6)
    for col in moe_bench_gpu.ERR_COLUMNS:  # bf16-level errors against float64, not zero
        assert ((ran[col] > 1e-4) & (ran[col] < 3e-2)).all(), col
    oom = rows[rows["tokens"] == 40]
    assert (oom[oom["impl"] != "liger"]["oom"]).all() and (oom[oom["impl"] != "liger"]["status"] == "oom").all()
    if "liger" in set(rows["impl"]) and not (rows["impl"].eq("liger") & rows["status"].eq("ok")).any():
        assert rows[rows["impl"] == "liger"]["error"].str.contains("liger").all()  # skipped, with the reason
    checks = pd.read_csv(tmp_path / "run" / "moe_check.csv")
    assert list(checks.columns) == moe_bench_gpu.CHECK_FIELDS
    assert set(checks["impl"]) == {"triton", "grouped_mm", "eager"} and (checks["status"] == "ok").all()
    assert set(checks["output"]) == set(moe_bench_gpu.OUTPUTS) and (checks["ratio_vs_eager"] < 2).all()
    meta = json.loads((tmp_path / "run" / "moe_bench.json").read_text())
    assert meta["complete"] and meta["git_commit"] == "abc1234" and meta["ours_impl"] == "triton"
    assert meta["run_id"].endswith("-abc1234") and meta["shapes"] == {"tiny": {"H": 64, "I": 96, "E": 8, "k": 2}}
    assert "| tiny | 16 | balanced | triton |" in stdout


def test_routing_skews_a_third_of_the_tokens_to_expert_zero():
    import torch

    gen = torch.Generator().manual_seed(0)
    index, weights = moe_bench_gpu.routing(300, 16, 4, "skewed", "cpu", gen)
    assert index.shape == weights.shape == (300, 4) and weights.dtype == torch.float32
    assert (index == 0).any(dim=1).sum() >= 100
    balanced, _ = moe_bench_gpu.routing(300, 16, 4, "balanced", "cpu", gen)
    assert (balanced == 0).any(dim=1).sum() < 100  # ~300 * 4/16
    with pytest.raises(ValueError, match="routing"):
        moe_bench_gpu.routing(8, 4, 2, "uniform", "cpu", gen)


def test_check_experts_caps_the_float64_oracle():
    shapes = moe_bench_gpu.moe_research.MOE_SHAPES
    assert moe_bench_gpu.check_experts(shapes["qwen3-30b-a3b"], 40) == 128
    deepseek = moe_bench_gpu.check_experts(shapes["deepseek-v3"], 40)
    assert 1 <= deepseek < 256 and deepseek * 3 * 7168 * 2048 * 16 <= 40 * 2**30
