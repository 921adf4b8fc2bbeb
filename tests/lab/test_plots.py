"""What a figure shows, checked on the drawn figure against the data it was given: the plotted
series and their values (``fig.plotted`` and the artists themselves), the spread of every
comparison and what it says about it, categories not joined by lines, partial runs left out,
labels that do not collide, and type readable at the width the README shows a figure (800 px).
Data: the synthetic run of tests/bench_fixtures.py (with a made-up p20/p80 spread) and the
recorded tables in data/."""

from __future__ import annotations

import io
import itertools
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from PIL import Image  # noqa: E402

from bench_fixtures import FACTORS, write_synthetic_run, write_synthetic_tp_run  # noqa: E402
from swiglu import roofline  # noqa: E402
from swiglu_lab.bench import tp_model  # noqa: E402
from swiglu_lab.research import analysis, hf_step, plots, tp_report, train_step  # noqa: E402
from swiglu_lab.research import gradient_validation as validate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
README_WIDTH_PX = 800  # the width GitHub's README column shows a figure at, about
MIN_TEXT_PX = 8.5  # smallest readable type there (cap height is ~0.7 of this)


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
    boxes = [
        (t.get_text(), Text.get_window_extent(t, renderer).padded(margin)) for t in texts if t.get_visible() and t.get_text()
    ]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def smallest_text_px(fig) -> tuple[float, str]:
    """(height in px of the smallest visible text when the saved PNG is shown README_WIDTH_PX
    wide, that text)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=150, bbox_inches="tight")
    width = Image.open(io.BytesIO(buffer.getvalue())).size[0]
    scale = min(1.0, README_WIDTH_PX / width)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    t = min(texts, key=lambda t: t.get_fontsize())
    return t.get_fontsize() * 150 / 72 * scale, t.get_text()


def errorbar_data(fig, label: str) -> tuple[np.ndarray, np.ndarray]:
    """x and y of the markers drawn for the series labelled ``label`` (an errorbar container)."""
    for ax in fig.axes:
        for c in ax.containers:
            if isinstance(c, ErrorbarContainer) and c.get_label() == label:
                line = c.lines[0]
                return np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    raise AssertionError(f"no series labelled {label!r}")


def joined_categories(fig) -> list[str]:
    """Lines through more than two points that are not horizontal reference lines: a line
    joining categories."""
    bad = []
    for ax in fig.axes:
        for line in ax.get_lines():
            y = np.asarray(line.get_ydata(), float)
            if line.get_linestyle() not in ("None", "none", "") and len(y) > 2 and np.nanstd(y) > 0:
                bad.append(f"{ax.get_title()}: {line.get_label()}")
    return bad


def spread_run(tmp_path: Path) -> Path:
    """The synthetic run with a different p20/p80 spread per implementation (known values)."""
    csv = write_synthetic_run(tmp_path)
    rows = pd.read_csv(csv)
    width = rows["impl"].map({"eager": 0.01, "compile": 0.02, "cublas-gemms": 0.03, "triton": 0.04})
    rows["p20_ms"], rows["p80_ms"] = rows["median_ms"] * (1 - width), rows["median_ms"] * (1 + width)
    rows.to_csv(csv, index=False)
    return tmp_path


@pytest.fixture
def table(tmp_path):
    spread_run(tmp_path)
    return analysis.latency_table(analysis.load_run(tmp_path).rows)


def test_overlap_and_join_checks_can_fail():
    fig, ax = plt.subplots(figsize=(2, 2))
    texts = [ax.text(0.5, 0.5, "T=2984"), ax.text(0.52, 0.5, "T=3376")]
    assert overlaps(texts)
    ax.plot([0, 1, 2], [1, 2, 3], "-o")
    assert joined_categories(fig)


def test_latency_per_case_plots_every_median_with_its_p20_p80(table):
    fig = plots.latency_plot(table, "f")
    got = fig.plotted.set_index(["series", "x"])
    assert len(got) == len(table)
    for _, r in table.iterrows():
        p = got.loc[(r["impl"], r["case"])]
        assert (p["y"], p["lo"], p["hi"]) == pytest.approx((r["median_ms"], r["p20_ms"], r["p80_ms"]))
        assert p["panel"] == f"T={r['tokens']}"
    # The artists hold the same values: ours in the T=4096 panel, 6 cases.
    y = np.concatenate([errorbar_data(fig, "swiglu Triton (ours)")[1]])
    assert sorted(y) == pytest.approx(sorted(table.loc[table["impl"] == "triton", "median_ms"].head(1)))
    assert joined_categories(fig) == []
    assert any("p20-p80 of the 50 timed iterations" in t.get_text() and "1 run" in t.get_text() for t in fig.texts)


def test_speedup_whiskers_are_the_implementations_own_spread(table):
    fig = plots.speedup_plot(table, "f")
    got = fig.plotted.set_index(["panel", "series", "x"])
    r = got.loc[("over compile", "triton", "s4096_b1")]
    expected = FACTORS["compile"] / FACTORS["triton"]
    assert r["y"] == pytest.approx(expected)
    assert (r["lo"], r["hi"]) == pytest.approx((expected / 1.04, expected / 0.96))
    assert "compile" not in set(fig.plotted.loc[fig.plotted["panel"] == "over compile", "series"])
    assert joined_categories(fig) == []


def test_speedup_without_torch_compile_draws_one_panel_and_says_why(table):
    # notebook 03 with impls="eager,triton": no jumbled log ticks, no empty legend, no claim that
    # the run measured no torch.compile
    fig = plots.speedup_plot(table[table["impl"].isin(["eager", "triton"])], "f")
    assert set(fig.plotted["panel"]) == {"over eager"} and set(fig.plotted["series"]) == {"triton"}
    assert "no torch.compile (default) among the plotted implementations" in fig.axes[0].get_title()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["swiglu Triton (ours)"]
    assert not any("measurement in this run" in t.get_text() for t in fig.findobj(Text))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert len(labels) == len(set(labels)), labels


def test_gmean_is_the_speedup_over_compile_with_spread(table):
    summary = analysis.latency_summary(table)
    fig = plots.gmean_plot(summary, "f")
    got = fig.plotted.set_index("series")
    for impl, factor in FACTORS.items():
        expected = FACTORS["compile"] / factor
        width = {"eager": 0.01, "compile": 0.02, "cublas-gemms": 0.03, "triton": 0.04}[impl]
        assert got.loc[impl, "y"] == pytest.approx(expected)
        assert (got.loc[impl, "lo"], got.loc[impl, "hi"]) == pytest.approx((expected / (1 + width), expected / (1 - width)))
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert lo < got["lo"].min() and hi > got["hi"].max() and lo < 1 < hi  # whiskers and the 1.0 line shown
    assert "right = faster" in ax.get_xlabel()  # one axis, not reversed
    assert any("p20-p80 of 50 timed iterations" in t.get_text() and "one run" in t.get_text() for t in fig.texts)


def test_gmean_says_when_an_implementation_fails_correctness(table):
    summary = analysis.latency_summary(table)
    summary.loc[summary["impl"] == "triton", "all_correct"] = False
    fig = plots.gmean_plot(summary, "f")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert sum("FAILS the correctness check" in t for t in texts) == 1
    hollow = [c.lines[0].get_markerfacecolor() for c in fig.axes[0].containers]
    assert hollow.count("white") == 1


def test_gmean_says_when_an_implementation_timed_fewer_cases(table):
    # A peer whose last case has no time (quack without a tuned choice there): its means are over
    # the other cases, and the figure says so (and the summary counts only timed cases).
    last = table["case"].iloc[-1]
    table = table.copy()
    table.loc[(table["impl"] == "cublas-gemms") & (table["case"] == last), "median_ms"] = float("nan")
    summary = analysis.latency_summary(table)
    n = table["case"].nunique()
    assert summary.set_index("impl").loc["cublas-gemms", "cases"] == n - 1
    texts = [t.get_text() for t in plots.gmean_plot(summary, "f").axes[0].texts]
    assert [t for t in texts if f"over {n - 1} of {n} cases" in t] and sum("of 18 cases" in t for t in texts) == 1


def test_history_leaves_out_a_partial_run_and_says_so(tmp_path):
    write_synthetic_run(tmp_path, run_id="20261201T000000Z-a", utc="2026-12-01T00:00:00Z")
    write_synthetic_run(
        tmp_path, run_id="20261201T010000Z-b", utc="2026-12-01T01:00:00Z", cases=[c for c in analysis.CASES if c.tokens >= 4096]
    )  # 8 of 18: a fake dip
    write_synthetic_run(tmp_path, run_id="20261201T020000Z-c", utc="2026-12-01T02:00:00Z")
    history = analysis.run_history(tmp_path)
    fig = plots.history_plot(history, "f")
    assert set(fig.plotted["x"]) == {"20261201T000000Z-a", "20261201T020000Z-c"}
    assert len(fig.plotted) == 2 * len(FACTORS) and fig.plotted["lo"].notna().all()
    note = " ".join(t.get_text() for t in fig.texts)
    assert "20261201T010000Z-b (8 cases)" in note and "left out" in note
    x, y = errorbar_data(fig, "swiglu Triton (ours)")
    assert len(x) == 2


@pytest.mark.parametrize("n_runs", [3, 23])
def test_history_run_labels_do_not_overprint(n_runs):
    """Two-line labels (date; time and commit) level while they fit; with many runs (23 in
    figures/04_history.png) one line each, slanted, clear of their neighbours."""
    history = pd.DataFrame(
        [
            {
                "run_id": f"run{k:02d}",
                "impl": impl,
                "cases": 18,
                "gmean_ms": 34.0 + k / 10 + j,
                "utc": f"2026-12-{1 + k // 10:02d}T{k % 24:02d}:{k:02d}:00Z",
                "commit": f"{k:07x}",
            }
            for k in range(n_runs)
            for j, impl in enumerate(("eager", "triton"))
        ]
    )
    fig = plots.history_plot(history, "f")
    ax = fig.axes[0]
    fig.draw_without_rendering()
    ticks = [t for t in ax.get_xticklabels() if t.get_text()]
    assert len(ticks) == n_runs
    if n_runs == 3:
        assert all(t.get_rotation() == 0 and "\n" in t.get_text() for t in ticks)
        assert overlaps(ticks) == []
        return
    assert all(t.get_rotation() == 45 and "\n" not in t.get_text() for t in ticks)
    # Parallel slanted labels clear each other when the gap across the text exceeds the type's height.
    step = ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0]
    height = ticks[0].get_fontsize() * fig.dpi / 72
    assert step * math.sin(math.radians(45)) > 1.2 * height


def test_history_marks_an_implementation_that_fails_correctness():
    history = pd.DataFrame(
        {
            "run_id": ["a", "a", "b", "b", "b"],
            "impl": ["eager", "triton", "eager", "triton", "liger"],
            "cases": 18,
            "gmean_ms": [36.0, 34.0, 36.2, 34.1, 34.05],
            "all_correct": [True, True, True, True, False],
        }
    )
    fig = plots.history_plot(history, "f")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert [t for t in legend if "correctness" in t] == ["Liger SiLU-mul + cuBLAS (FAILS the correctness check)"]
    hollow = [ln for ln in fig.axes[0].get_lines() if ln.get_markerfacecolor() == "white"]
    hollow_y = {float(v) for ln in hollow for v in ln.get_ydata() if np.isfinite(v)}
    assert hollow and hollow_y == {34.05}  # only Liger's point is open


def test_roofline_token_labels_do_not_collide_and_every_legend_entry_has_points(table):
    hw = analysis.hardware_table()
    points = table.assign(flop_per_byte=[roofline.arithmetic_intensity(t) for t in table["tokens"]])
    points.loc[points["impl"] == "triton", "correct"] = False  # all of ours fail: no filled entry for it
    fig = plots.roofline_plot(hw, analysis.roofline_table(hardware=hw), points, "f")
    top = fig.axes[0].child_axes[0]  # the secondary x axis of token counts
    labels = [t for t in top.get_xticklabels() if t.get_text()]
    assert len(labels) >= 7 and overlaps(labels, margin=2) == []
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "swiglu Triton (ours) (FAILS correctness)" in legend and "swiglu Triton (ours)" not in legend
    assert len(fig.plotted) == len(points)


def test_sol_per_case_is_markers_on_a_log_axis_hollow_where_memory_bound():
    table = analysis.roofline_table(hardware=analysis.hardware_table())
    fig = plots.sol_bar_plot(table, "f")
    assert not fig.axes[0].patches  # no bars on a log axis
    got = fig.plotted.set_index(["series", "x"])["y"]
    for _, r in table.iterrows():
        assert got[(r["hardware"], r["case"])] == pytest.approx(r["sol_ms"])
    hollow = [ln for ln in fig.axes[0].get_lines() if ln.get_markerfacecolor() == "white" and len(ln.get_xdata())]
    assert sum(len(ln.get_xdata()) for ln in hollow) == (table["bound"] == "memory").sum()


def test_validation_ratio_names_cases_like_everything_else_and_labels_are_readable():
    rows = pd.read_csv(ROOT / "data" / "derived" / "validation_cuda.csv")
    rows = rows[rows["output"] != "all"]
    fig = plots.error_ratio_plot(rows, validate.ERROR_FACTOR, "f")
    ax = fig.axes[-1]
    ticks = [t for t in ax.get_xticklabels() if t.get_text()]
    assert len(ticks) == 18 and all(10 <= t.get_rotation() < 60 for t in ticks)  # not 90 degrees
    # Rotated labels are parallel: they clear each other when the gap between neighbours,
    # measured across the text, exceeds the type's height.
    fig.draw_without_rendering()
    step = ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0]
    height = ticks[0].get_fontsize() * fig.dpi / 72
    assert step * math.sin(math.radians(ticks[0].get_rotation())) > 1.2 * height
    ok = rows[rows["status"] == "ok"].groupby(["output", "impl", "case"])["ratio"].max()
    got = fig.plotted.set_index(["panel", "series", "x"])["y"]
    assert got.to_dict() == pytest.approx(ok.to_dict())
    cpu = pd.read_csv(ROOT / "data" / "derived" / "validation_cpu.csv")
    assert cpu["case"].str.fullmatch(r"s\d+_b\d+").all()  # s<seq_len>_b<batch_size>, as the 18 cases


def test_training_step_plot_categories_spread_and_the_missing_point(tmp_path):
    steps = pd.read_csv(ROOT / "data" / "derived" / "train_step_summary.csv")
    latest = train_step.latest_run(ROOT / "data" / "train_step")
    runs = [train_step.load_run(p) for p in sorted((ROOT / "data" / "train_step").glob("*/train_step.json"))]
    history = pd.concat([r["steps"].assign(run_id=r["meta"]["run_id"]) for r in runs], ignore_index=True)
    fig = plots.training_step_plot(latest["steps"], history, "f")
    assert [a.get_title() for a in fig.axes] == [
        "step speed-up over nn.Linear",
        "saved activations per layer",
        "peak memory of the step",
    ]
    speed = fig.plotted[fig.plotted["panel"] == "speed-up"].set_index(["series", "x"])
    for _, r in steps.iterrows():
        p = speed.loc[(r["variant"], r["tokens"])]
        assert p["y"] == pytest.approx(r["speedup_vs_plain"], rel=1e-5)
        per_run = history[(history["variant"] == r["variant"]) & (history["tokens"] == r["tokens"])]["speedup_vs_plain"]
        assert (p["lo"], p["hi"]) == pytest.approx((per_run.min(), per_run.max()))
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("not run at T=1024, where memory-lean's forward is cuBLAS already" in t for t in legend)
    assert "min-max over the 3 recorded runs" in " ".join(t.get_text() for t in fig.texts)
    assert joined_categories(fig) == []


def test_tp_model_explains_an_efficiency_above_one_and_fits_its_width(tmp_path):
    write_synthetic_tp_run(tmp_path)
    run = tp_report.load_tp_run(tmp_path)
    rows, latency, bw, source = tp_report.model_inputs(run, tmp_path)
    model = tp_model.model_table(rows, (2, 4, 8), latency, bw)
    fig = tp_report.model_plot(model, None, "f " + "+".join(["20261130T142105Z-6e117f1"] * 6))
    assert fig.get_figwidth() <= plots.MAX_WIDTH_IN
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=150, bbox_inches="tight")
    assert Image.open(buffer).size[0] <= plots.MAX_WIDTH_IN * 150 * 1.06  # the long footer wraps (was 3638 px)
    assert "Efficiency above 1" in " ".join(t.get_text() for t in fig.texts)
    eff = fig.plotted[(fig.plotted["panel"] == "efficiency") & (fig.plotted["series"] == "TP=4 serial")]
    expected = model[model["tp"] == 4].groupby("tokens")["efficiency_serial"].median()
    assert eff.set_index("x")["y"].to_dict() == pytest.approx(expected.to_dict())


@pytest.mark.parametrize(
    "name",
    [
        "latency",
        "speedup",
        "sol",
        "gmean",
        "energy",
        "clock",
        "history",
        "roofline",
        "sol_bar",
        "ratio",
        "tp_measured",
        "tp_model",
        "train_step",
        "hf_step",
        "long_seq",
    ],
)
def test_every_figure_is_readable_at_readme_width(name, tmp_path):
    spread_run(tmp_path / "bench")
    write_synthetic_run(tmp_path / "power", power=True)
    run = analysis.load_run(tmp_path / "bench")
    table = analysis.latency_table(run.rows)
    power = analysis.power_table(analysis.load_run(tmp_path / "power").rows)
    footer = analysis.run_footer(run.meta, run.run_id)
    write_synthetic_tp_run(tmp_path / "tp")
    tp = tp_report.load_tp_run(tmp_path / "tp")
    measured, _ = tp_report.single_gpu_source(tp_model.case_table(tp.rows), tmp_path / "bench")
    rows, latency, bw, _ = tp_report.model_inputs(tp, tmp_path / "bench")
    hw = analysis.hardware_table()
    make = {
        "latency": lambda: plots.latency_plot(table, footer),
        "speedup": lambda: plots.speedup_plot(table, footer),
        "sol": lambda: plots.sol_fraction_plot(table, footer),
        "gmean": lambda: plots.gmean_plot(analysis.latency_summary(table), footer),
        "energy": lambda: plots.energy_plot(power, footer),
        "clock": lambda: plots.clock_power_plot(power, footer, max_clock_mhz=1980.0, power_limit_w=700.0),
        "history": lambda: plots.history_plot(analysis.run_history(tmp_path / "bench"), footer),
        "roofline": lambda: plots.roofline_plot(
            hw,
            analysis.roofline_table(hardware=hw),
            table.assign(flop_per_byte=[roofline.arithmetic_intensity(t) for t in table["tokens"]]),
            footer,
        ),
        "sol_bar": lambda: plots.sol_bar_plot(analysis.roofline_table(hardware=hw), footer),
        "ratio": lambda: plots.error_ratio_plot(pd.read_csv(ROOT / "data" / "derived" / "validation_cuda.csv"), 2.0, footer),
        "tp_measured": lambda: tp_report.measured_plot(measured, footer),
        "tp_model": lambda: tp_report.model_plot(tp_model.model_table(rows, (2, 4, 8), latency, bw), measured, footer),
        "train_step": lambda: plots.training_step_plot(
            train_step.latest_run(ROOT / "data" / "train_step")["steps"], None, footer
        ),
        "hf_step": lambda: plots.hf_step_plot(hf_step.load_runs(ROOT / "data" / "hf_step"), footer),
        "long_seq": lambda: plots.long_seq_plot(hf_step.load_long_seq(ROOT / "data" / "hf_long_seq"), footer),
    }
    fig = make[name]()
    assert fig.get_figwidth() <= plots.MAX_WIDTH_IN
    px, text = smallest_text_px(fig)
    assert px >= MIN_TEXT_PX, f"{text!r} is {px:.1f} px high at {README_WIDTH_PX} px wide"
    assert len(fig.plotted) > 0 and set(fig.plotted.columns) == set(plots.PLOTTED_COLUMNS)


def test_comparisons_show_their_spread_or_say_there_is_none(table, tmp_path):
    write_synthetic_run(tmp_path / "power", power=True)
    power = analysis.power_table(analysis.load_run(tmp_path / "power").rows)
    for fig in (
        plots.latency_plot(table),
        plots.speedup_plot(table),
        plots.sol_fraction_plot(table),
        plots.gmean_plot(analysis.latency_summary(table)),
    ):
        assert fig.plotted["lo"].notna().all() and (fig.plotted["lo"] <= fig.plotted["y"]).all()
        assert (fig.plotted["hi"] >= fig.plotted["y"]).all()
    for fig in (plots.energy_plot(power), plots.clock_power_plot(power)):
        assert "no spread recorded" in " ".join(t.get_text() for t in fig.texts)
    assert math.isnan(plots.energy_plot(power).plotted["lo"].iloc[0])


def test_a_line_joining_cases_would_be_caught(table):
    fig = plots.latency_plot(table)
    ax = fig.axes[0]
    ax.add_line(Line2D([0, 1, 2], [1.0, 2.0, 1.5]))
    assert joined_categories(fig)


def test_every_benchmark_implementation_has_a_colour_of_its_own():
    """One colour per implementation in every figure: a name without an entry took a cycle colour
    that depended on its position (triton-tl drew as Liger in one figure, as cuBLAS in another)."""
    from swiglu_lab.bench.impls import IMPLS
    from swiglu_lab.research.plots import IMPL_STYLE

    missing = sorted(set(IMPLS) - set(IMPL_STYLE))
    assert not missing, f"no IMPL_STYLE entry for {missing}"
    colours = [IMPL_STYLE[name][0] for name in IMPLS]
    assert len(set(colours)) == len(colours), dict(zip(IMPLS, colours))


def test_hf_step_speedups_above_the_axis_sit_on_its_edge_with_their_value():
    """A compiled model's 3x over the eager step (the host-bound regime) must not flatten the eager
    comparisons: it is drawn on the top edge (``HF_YMAX``), its value written beside it, and
    recorded unclipped."""
    runs = pd.DataFrame(
        [
            dict(run="r1", shape="s", variant=v, speedup=y, side_by_side=True, commit="abc1234")
            for v, y in (("unpatched", 1.0), ("swiglu", 0.97), ("swiglu+compile", 3.12))
        ]
    )
    fig = plots.hf_step_plot(runs)
    ax = fig.axes[0]
    assert ax.get_ylim()[1] == plots.HF_YMAX
    drawn = [y for line in ax.get_lines() for y in line.get_ydata() if np.isfinite(y)]
    assert max(drawn) <= plots.HF_YMAX and 0.97 in drawn
    assert "3.12x" in [t.get_text() for t in ax.texts]
    assert set(fig.plotted["y"].round(2)) == {0.97, 3.12}


def test_long_seq_runs_load_and_their_longest_lengths(tmp_path):
    """The longest length per variant is the longest that fit without checkpointing, over every
    run, with the first out-of-memory length above it; a checkpointed row never counts."""
    run = tmp_path / "a"
    run.mkdir()
    rows = [
        ("unpatched", 4096, False, 70.0, False),
        ("unpatched", 8192, False, float("nan"), True),
        ("unpatched", 6144, False, 90.0, False),
        ("unpatched", 16384, True, 75.0, False),
        ("swiglu", 8192, False, 100.0, False),
        ("swiglu", 9216, False, float("nan"), True),
    ]
    pd.DataFrame(
        [
            dict(variant=v, seq_len=s, layers=2, activation_checkpointing=c, step_ms=1.0, tokens_per_s=1.0, peak_gib=p, oom=o)
            for v, s, c, p, o in rows
        ]
    ).to_csv(run / "long_seq.csv", index=False)
    table = hf_step.load_long_seq(tmp_path)
    assert list(table.columns) == hf_step.LONG_SEQ_COLUMNS and set(table["run"]) == {"a"}
    longest = hf_step.longest_without_checkpointing(table).set_index("variant")
    assert longest.loc["unpatched", "longest_seq"] == 6144 and longest.loc["unpatched", "first_oom_seq"] == 8192
    assert longest.loc["swiglu", "longest_seq"] == 8192 and longest.loc["swiglu", "peak_gib"] == 100.0
    fig = plots.long_seq_plot(table)
    assert set(fig.plotted["series"]) >= {"unpatched", "swiglu", "stock + checkpointing"}
