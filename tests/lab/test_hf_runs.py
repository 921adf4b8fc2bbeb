"""``swiglu_lab.research.hf_step``: the recorded Hugging Face step runs read back as one table, and
the figure notebook 06 draws of them plotting exactly those speed-ups."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from swiglu_lab.research import hf_step, plots

ROOT = Path(__file__).resolve().parents[2]


def _run(folder: Path, date: str, commit: str, speedups: dict, rounds: bool, tokens: int = 2048, failed: tuple = ()) -> None:
    folder.mkdir(parents=True)
    rows = [
        dict(
            variant=v,
            status="ok",
            ms_median=27.0 / s,
            speedup=s,
            peak_gib=2.0,
            host_ms_median=15.0,
            layers=4,
            hidden_size=4096,
            intermediate_size=14336,
            tokens=tokens,
        )
        for v, s in speedups.items()
    ]
    rows += [dict(variant=v, status="failed", layers=4, hidden_size=4096, intermediate_size=14336, tokens=tokens) for v in failed]
    pd.DataFrame(rows).to_csv(folder / "hf_step.csv", index=False)
    args = {"layers": 4, "iters": 30, **({"rounds": 5} if rounds else {})}
    (folder / "hf_step.json").write_text(json.dumps({"date_utc": date, "git_commit": commit, "args": args}))


def test_runs_read_back_in_date_order_with_their_protocol(tmp_path):
    _run(tmp_path / "b", "2026-12-01T19:00:00Z", "bbbbbbb", {"unpatched": 1.0, "swiglu": 1.02, "liger": 1.01}, True)
    _run(
        tmp_path / "a" / "llama8b_8192",
        "2026-12-01T09:00:00Z",
        "aaaaaaa",
        {"unpatched": 1.0, "swiglu": 0.97},
        False,
        tokens=8192,
        failed=("liger",),
    )
    runs = hf_step.load_runs(tmp_path)
    assert list(runs.columns) == hf_step.COLUMNS
    assert list(dict.fromkeys(runs["run"])) == ["a/llama8b_8192", "b"]  # by date
    assert not runs[runs["run"] == "a/llama8b_8192"]["side_by_side"].any() and runs[runs["run"] == "b"]["side_by_side"].all()
    assert "liger" not in set(runs[runs["run"] == "a/llama8b_8192"]["variant"])  # a failed variant is not a point
    assert runs.set_index(["run", "variant"]).loc[("b", "swiglu"), "speedup"] == pytest.approx(1.02)
    assert set(runs["shape"]) == {hf_step.shape_label(4, 4096, 14336, 2048), hf_step.shape_label(4, 4096, 14336, 8192)}
    assert hf_step.load_runs(tmp_path / "nothing").empty


def test_a_full_commit_hash_reads_back_short(tmp_path):
    """The figure labels runs by commit: a 40-digit hash in the metadata (``SWIGLU_GIT_COMMIT``
    given in full) reads back as the 7-digit one the other runs carry."""
    _run(tmp_path / "r", "2026-12-01T19:00:00Z", "a238561925bb3debf3739429cd5c6474de997875", {"unpatched": 1.0}, True)
    assert list(hf_step.load_runs(tmp_path)["commit"]) == ["a238561"]


def test_the_figure_draws_every_speedup_but_the_unpatched_baseline(tmp_path):
    _run(tmp_path / "b", "2026-12-01T19:00:00Z", "bbbbbbb", {"unpatched": 1.0, "swiglu": 1.02, "liger": 1.01}, True)
    _run(tmp_path / "c", "2026-12-01T20:00:00Z", "ccccccc", {"unpatched": 1.0, "swiglu": 0.99, "swiglu+compile": 1.13}, False)
    runs = hf_step.load_runs(tmp_path)
    fig = plots.hf_step_plot(runs, "footer")
    drawn = fig.plotted.set_index(["x", "series"])["y"].to_dict()
    want = {(r.run, r.variant): r.speedup for r in runs.itertuples() if r.variant != "unpatched"}
    assert drawn == pytest.approx(want)


def test_the_recorded_runs_load():
    """data/hf_step/ as committed: every run has its metadata, and Llama-3-8B x 4 at 2048 tokens
    has runs of both protocols."""
    runs = hf_step.load_runs(ROOT / "data" / "hf_step")
    assert (runs["commit"] != "").all() and (runs["commit"].str.len() <= 7).all()
    main = runs[runs["shape"] == hf_step.shape_label(4, 4096, 14336, 2048)]
    assert main["side_by_side"].any() and (~main["side_by_side"]).any()
    assert (runs[runs["variant"] == "unpatched"]["speedup"] == 1.0).all()
