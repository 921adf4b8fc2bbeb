"""The hand-written prose that quotes the headline run names the run the generated tables show:
when a newer full run is recorded, these fail until the prose is rewritten for it."""

from __future__ import annotations

from pathlib import Path

from swiglu_lab.research import analysis

ROOT = Path(__file__).parents[2]


def _headline_run_id() -> str:
    return analysis.load_run(ROOT / "data" / "bench", None, "full").run_id


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_results_prose_describes_the_headline_run():
    run_id = _headline_run_id()
    results = (ROOT / "docs" / "results.md").read_text()
    for title in ("Where we stand, plainly", "Energy, power and clock"):
        first = _section(results, title).split("\n\n")[1]
        assert run_id in first, f"docs/results.md '{title}' opens without the headline run {run_id}"


def test_history_marks_the_headline_run():
    run_id = _headline_run_id()
    bullets = [b for b in (ROOT / "docs" / "history.md").read_text().split("\n* ") if "(the headline)" in b]
    assert len(bullets) == 1 and bullets[0].startswith(f"`{run_id}`"), bullets
