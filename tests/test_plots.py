"""What a reader of the figures would stumble on, checked on the drawn figures: overlapping
labels, an axis that hides the differences, legend swatches that say the wrong thing, a failing
implementation that does not say so. Data: the synthetic run of tests/bench_fixtures.py and the
recorded full-size validation table."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from bench_fixtures import write_synthetic_run  # noqa: E402
from swiglu import roofline  # noqa: E402
from swiglu.research import analysis, plots  # noqa: E402
from swiglu.research import gradient_validation as validate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def overlaps(texts, margin: float = -1) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty texts whose drawn boxes, grown by ``margin`` px each side
    (default: shrunk by 1 px), intersect."""
    fig = texts[0].figure
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()
    # Text's own extent: an annotation's would include its leader line.
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer).padded(margin)) for t in texts
             if t.get_visible() and t.get_text()]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


@pytest.fixture
def table(tmp_path):
    write_synthetic_run(tmp_path)
    return analysis.latency_table(analysis.load_run(tmp_path).rows)


def test_overlap_check_can_fail():
    fig, ax = plt.subplots(figsize=(2, 2))
    texts = [ax.text(0.5, 0.5, "T=2984"), ax.text(0.52, 0.5, "T=3376")]
    assert overlaps(texts)


def test_gmean_axis_spans_the_data_not_zero(table):
    summary = analysis.latency_summary(table)
    fig = plots.gmean_plot(summary, "f")
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    values = summary["gmean_ms"]
    assert lo > 0.9 * values.min()  # not from zero: the differences are a few % of the values
    assert (values.max() - values.min()) / (hi - lo) > 0.6
    labels = [t.get_text() for t in ax.texts]
    assert any("x vs compile" in t for t in labels)


def test_gmean_says_when_an_implementation_fails_correctness(table):
    summary = analysis.latency_summary(table)
    summary.loc[summary["impl"] == "triton", "all_correct"] = False
    texts = [t.get_text() for t in plots.gmean_plot(summary, "f").axes[0].texts]
    assert sum("FAILS the correctness check" in t for t in texts) == 1


def test_validation_ratio_case_labels_do_not_overlap():
    rows = pd.read_csv(ROOT / "data" / "derived" / "validation_cuda.csv")
    rows = rows[rows["output"] != "all"]
    assert rows["case"].nunique() == 18
    fig = plots.error_ratio_plot(rows, validate.ERROR_FACTOR, "f")
    labelled = [ax for ax in fig.axes if any(t.get_text() for t in ax.get_xticklabels())]
    assert len(labelled) >= 1
    for ax in labelled:
        texts = [t for t in ax.get_xticklabels() if t.get_text()]
        assert len(texts) == 18
        assert overlaps(texts) == []


def test_sol_per_case_legend_hatches_only_the_memory_bound_swatch():
    table = analysis.roofline_table(hardware=analysis.hardware_table())
    fig = plots.sol_bar_plot(table, "f")
    legend = fig.axes[0].get_legend()
    hatches = {t.get_text(): h.get_hatch() for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert hatches.pop("memory-bound") == "///"
    assert set(hatches) == set(table["hardware"]) and not any(hatches.values())
    # ... while the bars of memory-bound cases are hatched.
    assert any(p.get_hatch() == "///" for p in fig.axes[0].patches)


def test_history_marks_an_implementation_that_fails_correctness():
    history = pd.DataFrame({
        "run_id": ["a", "a", "b", "b", "b"], "impl": ["eager", "triton", "eager", "triton", "liger"],
        "gmean_ms": [36.0, 34.0, 36.2, 34.1, 34.05], "all_correct": [True, True, True, True, False]})
    ax = plots.history_plot(history, "f").axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [t for t in legend if "correctness" in t] == [next(t for t in legend if t.startswith("Liger"))]
    assert any("fails the correctness check" in t.get_text() for t in ax.texts)


def test_roofline_token_labels_do_not_crowd(table):
    hw = analysis.hardware_table()
    points = table.assign(flop_per_byte=[roofline.arithmetic_intensity(t) for t in table["tokens"]])
    fig = plots.roofline_plot(hw, analysis.roofline_table(hardware=hw), points, "f")
    labels = [t for t in fig.axes[0].texts if t.get_text().startswith("T=")]
    assert len(labels) == 10  # distinct token counts of the 18 cases
    # Crowding: closer than 3 px to another label or the title.
    assert overlaps(labels + [fig.axes[0].title], margin=1.5) == []
