"""Every in-repository path the sources and docs cite resolves in a clone: no citation of files
that only exist beside the repository (the project's specification and notes are in docs/), and
no path that leaves the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Top-level folders a citation starts with. "shared" is not in the repository: citing it fails.
PREFIXES = ("shared", "data", "docs", "src", "figures", "notebooks", "scripts", "tests", ".ci")
TOKEN = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(p) for p in PREFIXES) + r")/[\w.\-/<>*{}]*)")
#: Placeholders (``<run>``, ``{name}``) and globs stand for files: at least one must match.
PLACEHOLDER = re.compile(r"<[^>/]*>|\{[^}/]*\}")
#: Patterns that name build outputs, which a clone does not have before it is built.
BUILD_OUTPUTS = {"src/*.egg-info"}
#: Ways of reaching outside the repository (strings assembled so this file does not match itself).
OUTSIDE = [re.compile(p) for p in (r"\.\./", "/" + "work/", r"\.library/")]


def scanned_files() -> list[Path]:
    files = [p for folder in ("src", "tests", "notebooks", "scripts", "docs") for p in (ROOT / folder).rglob("*")
             if p.is_file() and p.suffix in {".py", ".ipynb", ".md", ".json", ".toml", ".txt"}]
    files += [ROOT / n for n in ("README.md", "NOTES.md", "Makefile", "environment.yml", "pyproject.toml", ".ci/run")]
    files += sorted((ROOT / "data").rglob("README.md"))
    # This file's own examples are dangling on purpose (test_the_scanner_finds_...).
    return [p for p in files if p.is_file() and "__pycache__" not in p.parts and p != Path(__file__).resolve()]


def dangling(text: str, root: Path = ROOT) -> list[str]:
    """The path tokens in ``text`` that do not resolve under ``root``, and any that leave it."""
    bad = []
    for match in TOKEN.finditer(text):
        token = match.group(1).rstrip(".,:;")
        pattern = PLACEHOLDER.sub("*", token)
        if pattern in BUILD_OUTPUTS:
            continue
        found = any(root.glob(pattern.rstrip("/"))) if "*" in pattern else (root / token).exists()
        if not found:
            bad.append(token)
    bad += [m.group(0) for rx in OUTSIDE for m in rx.finditer(text)]
    return bad


def test_the_scanner_finds_dangling_and_outside_paths(tmp_path):
    (tmp_path / "data" / "bench").mkdir(parents=True)
    (tmp_path / "data" / "bench" / "run1.csv").write_text("x")
    text = ("see shared/spec/problem.md, data/bench/run1.csv, data/bench/<run>.csv and data/bench/{run_id}.json; "
            "docs/missing.md or ../elsewhere")
    assert dangling(text, tmp_path) == ["shared/spec/problem.md", "data/bench/{run_id}.json", "docs/missing.md", "../"]


def test_scan_covers_the_documented_places():
    names = {str(p.relative_to(ROOT)) for p in scanned_files()}
    assert {"README.md", "NOTES.md", "Makefile", "src/swiglu/kernels/tl_kernels.py", "tests/conftest.py",
            "notebooks/02_validation.ipynb", "data/spec/README.md", "docs/problem.md"} <= names


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_path_resolves_inside_the_repository(path):
    assert dangling(path.read_text(errors="replace")) == []
