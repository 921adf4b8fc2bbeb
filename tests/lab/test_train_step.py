"""swiglu_lab.research.train_step off the GPU: the forward sweep and the step measurement run end to end at a
tiny shape (interpreter on CPU; times are perf_counter's, memory columns 0), the measured table
round-trips through forward_configs.json, and a written run reads back and plots."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from swiglu.kernels import forward
from swiglu_lab.bench.tables import forward_table
from swiglu_lab.research import plots, train_step
from swiglu.kernels.backward import TOKEN_BUCKETS, KernelConfig

matplotlib.use("Agg")
TINY = KernelConfig(BM=64, BN=64, BK=32, EPI_SPLIT=2)
H, I = 64, 136


@pytest.fixture
def restore_forward_table():
    saved = dict(forward.FORWARD_CONFIGS)
    yield
    forward.FORWARD_CONFIGS.clear()
    forward.FORWARD_CONFIGS.update(saved)


def test_another_shapes_table_goes_beside_the_packages(tmp_path, monkeypatch):
    """Measured at another shape, the table becomes that shape's ``configs_by_shape`` entry in a
    copy of the package's file (its own buckets and the other shapes' entries kept), and the
    forward takes it at that shape only once loaded."""
    from swiglu_lab.bench.tables import shape_forward_table

    base = json.loads(forward.FORWARD_CONFIGS_PATH.read_text())
    doc = forward_table({128: ("fused", TINY, 1.0, 3), 256: ("cublas", None, 2.0, 130)}, {"run_id": "r1"})
    merged = shape_forward_table(doc, H, I, base)
    assert merged["configs"] == base["configs"]
    assert {k: v for k, v in merged["configs_by_shape"].items() if k != f"{H}x{I}"} == base.get("configs_by_shape", {})
    assert merged["configs_by_shape"][f"{H}x{I}"]["128"] == {**doc["configs"]["128"], "run_id": "r1"}
    path = tmp_path / "forward_configs.json"
    path.write_text(json.dumps(merged))
    monkeypatch.setattr(forward, "FORWARD_CONFIGS", dict(forward.FORWARD_CONFIGS))
    monkeypatch.setattr(forward, "FORWARD_CONFIGS_BY_SHAPE", {})
    forward._load_forward_configs(path)
    assert forward.forward_config_for(100, H, I) == TINY and forward.forward_config_for(200, H, I) is None
    assert forward.forward_config_for(100) is forward.FORWARD_CONFIGS[128]  # the shape-agnostic choice, as shipped
    assert forward.FORWARD_CONFIGS[128] == (
        None if base["configs"]["128"]["config"] is None else KernelConfig(**base["configs"]["128"]["config"])
    )


def test_measure_write_read_plot(device, tmp_path, restore_forward_table):
    rows, table = train_step.tune_forward(H, I, (3, 130), device=device, candidates={"cublas": None, "fused": TINY}, iters=(0, 1))
    assert {(r["tokens"], r["candidate"]) for r in rows} == {(t, c) for t in (3, 130) for c in ("cublas", "fused")}
    assert set(table) == {128, 256} and all(v[0] in ("cublas", "fused") for v in table.values())
    doc = forward_table({128: ("fused", TINY, 1.0, 3), 256: ("cublas", None, 2.0, 130)}, {})
    path = tmp_path / "forward_configs.json"
    path.write_text(json.dumps(doc))
    forward._load_forward_configs(path)
    assert forward.forward_config_for(100) == TINY and forward.forward_config_for(200) is None
    steps = train_step.measure_steps(
        H, I, (3, 130), variants=("plain", "saved", "lean", "lean_cublas"), device=device, iters=(0, 1)
    )
    got = {(r["tokens"], r["variant"]): r for r in steps}
    # lean_cublas only where the table picks the fused kernel (T = 3 here).
    assert set(got) == {(t, v) for t in (3, 130) for v in ("plain", "saved", "lean")} | {(3, "lean_cublas")}
    for T in (3, 130):
        assert [got[T, v]["saved_TxI"] for v in ("plain", "saved", "lean")] == [4, 3, 2]
        assert got[T, "lean"]["saved_bytes"] == 2 * (T * H + 2 * T * I)
    assert got[3, "lean"]["forward"] == "fused" and got[130, "lean"]["forward"] == "cublas"
    for r in steps:  # allocator statistics on the GPU only
        assert r["peak_bytes"] >= r["floor_bytes"] if device == "cuda" else pd.isna(r["floor_bytes"])
    meta = dict(
        utc="2026-11-30T00:00:00Z",
        run_id="20261130T000000Z-test",
        gpu={"name": "CPU"},
        software={"torch": "x", "triton": "y"},
        hidden_size=H,
        intermediate_size=I,
    )
    run = dict(meta=meta, checks=[], forward=rows, steps=steps, forward_configs=doc)
    train_step.write_run(run, tmp_path / "run")
    back = train_step.load_run(tmp_path / "run")
    assert len(back["steps"]) == len(steps) and set(train_step.summary_table(back["steps"]).variant) >= {"lean"}
    fig = plots.training_step_plot(back["steps"])
    # speed-up, saved bytes, peak memory: one series per variant in each, plain at 1.0x
    assert len(fig.axes) == 3
    speed = fig.plotted[fig.plotted["panel"] == "speed-up"]
    assert set(speed["series"]) == {r["variant"] for r in steps}
    assert list(speed[speed["series"] == "plain"]["y"]) == pytest.approx([1.0] * len({r["tokens"] for r in steps}))
    assert train_step.load_run(tmp_path / "missing") is None
    _run_notebook_06(tmp_path)


def _run_notebook_06(tmp_path):
    """notebooks/06_training_memory.ipynb on the run just written (its code cells, parameters overridden)."""
    book = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "06_training_memory.ipynb").read_text())
    cells = ["".join(c["source"]) for c in book["cells"] if c["cell_type"] == "code"]
    ns: dict = {}
    exec(cells[0], ns)
    ns.update(train_step_dir=str(tmp_path / "run"), figures_dir=str(tmp_path / "fig"), derived_dir=str(tmp_path / "derived"))
    for cell in cells[1:]:
        exec(cell, ns)
    summary = pd.read_csv(tmp_path / "derived" / "train_step_summary.csv")
    assert set(summary.variant) == {"plain", "saved", "lean", "lean_cublas"}
    assert (tmp_path / "fig" / "06_training_memory.png").stat().st_size > 1000


def test_measure_steps_needs_plain():
    with pytest.raises(ValueError, match="plain"):
        train_step.measure_steps(H, I, (3,), variants=("lean",), device="cpu")


def test_buckets_cover_the_forward_tokens():
    """Every default forward token count falls in a distinct bucket (each bucket gets measured)."""
    buckets = [next(b for b in TOKEN_BUCKETS if t <= b) for t in train_step.FORWARD_TOKENS]
    assert len(set(buckets)) == len(buckets) == len(TOKEN_BUCKETS)


def test_step_floor_bytes():
    """At Hermes size, T = 4096: weights 3 * 16384 * 53248 * 2 B start the step with x and
    grad_output; the floor adds as much again (gradients), the output, grad_x and one [T, I]."""
    w = 3 * 16384 * 53248 * 2
    start = w + 2 * 4096 * 16384 * 2
    assert train_step.step_floor_bytes(start, w, 4096, 16384, 53248) == start + w + 2 * 4096 * 16384 * 2 + 4096 * 53248 * 2


def test_recorded_peaks_respect_the_floor():
    """Every recorded step peak (on the H200) is at least the floor that ``step_floor_bytes``
    computes now from the run's start bytes and shapes (a peak below it would mean the floor's
    argument or its code is wrong), and the memory-lean mode peaks no higher than the plain module."""
    run = train_step.latest_run(Path(__file__).resolve().parents[2] / "data" / "train_step")
    steps, H, I = run["steps"], run["meta"]["hidden_size"], run["meta"]["intermediate_size"]
    for r in steps.itertuples():
        assert r.peak_bytes >= train_step.step_floor_bytes(r.start_bytes, 3 * H * I * 2, r.tokens, H, I), r
    by = steps.set_index(["tokens", "variant"]).peak_bytes
    for T in set(steps.tokens):
        assert by[T, "lean"] <= by[T, "plain"], T
