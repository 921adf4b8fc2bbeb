"""notebooks/07_moe.ipynb on a real tiny CPU run of scripts/moe_bench_gpu.py (no GPU numbers are
made up), and without any run (a placeholder that says so); ``make reproduce`` runs it on the
recorded run (data/moe_bench/) and its figure is committed."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from moe_fixtures import tiny_run_copy
from swiglu_lab.research import plots, reproduce

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "07_moe.ipynb"


def execute(tmp: Path, moe_bench_dir: Path) -> str:
    params = dict(moe_bench_dir=str(moe_bench_dir), gpu="", figures_dir=str(tmp / "figures"), derived_dir=str(tmp / "derived"))
    old = os.environ.get(plots.PLOTTED_DIR_ENV)
    os.environ[plots.PLOTTED_DIR_ENV] = str(tmp / "plotted")
    try:
        reproduce.execute_python(NOTEBOOK, tmp / "07_moe.ipynb", params, ROOT)
    finally:
        if old is None:
            os.environ.pop(plots.PLOTTED_DIR_ENV, None)
        else:
            os.environ[plots.PLOTTED_DIR_ENV] = old
    return (tmp / "07_moe.ipynb").read_text()


def test_the_notebook_draws_the_newest_recorded_run(tmp_path_factory, tmp_path):
    tiny_run_copy(tmp_path_factory, tmp_path / "moe_bench" / "20990101T000000Z-abc1234")
    text = execute(tmp_path, tmp_path / "moe_bench")
    for ext in ("png", "svg"):
        assert (tmp_path / "figures" / f"07_moe.{ext}").is_file()
    latency = pd.read_csv(tmp_path / "derived" / "moe_latency.csv")
    assert set(latency["impl"]) == {"triton", "grouped_mm", "eager"} and set(latency["tokens"]) == {16}
    drawn = pd.read_csv(tmp_path / "plotted" / "07_moe.csv")
    both = latency[latency["mode"] == "forward+backward"]
    ms = drawn[drawn["panel"] == "tiny: ms"]
    assert sorted(ms["y"]) == pytest.approx(sorted(both["ms"]), rel=1e-5)  # the table keeps 6 digits
    validation = pd.read_csv(tmp_path / "derived" / "moe_validation.csv")
    assert set(validation["impl"]) == {"triton", "grouped_mm", "eager"} and (validation["max_ratio_vs_eager"] < 2).all()
    roof = pd.read_csv(tmp_path / "derived" / "moe_roofline.csv")
    assert len(roof) == 4 * 3 * 3
    assert "fake: 40 > 20" in text and "-abc1234" in text  # the faked OOM rows are listed; the run named


def test_without_a_run_the_notebook_says_so(tmp_path):
    text = execute(tmp_path, tmp_path / "empty")
    assert "No recorded MoE run" in text
    assert pd.read_csv(tmp_path / "plotted" / "07_moe.csv").empty
    assert (tmp_path / "derived" / "moe_roofline.csv").is_file()  # the roofline needs no run
    assert not (tmp_path / "derived" / "moe_latency.csv").exists()


def test_make_reproduce_runs_the_notebook_and_its_figure_is_committed():
    assert "07_moe" in reproduce.NOTEBOOKS and "07_moe" not in reproduce.PENDING_NOTEBOOKS
    assert NOTEBOOK in reproduce.select_notebooks(None, ROOT / "notebooks")
    assert reproduce.select_notebooks("07", ROOT / "notebooks") == [NOTEBOOK]
    assert {p.suffix for p in (ROOT / "figures").glob("07_moe.*")} == {".png", ".svg"}
