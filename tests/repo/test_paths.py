"""Every in-repository path the sources and docs cite resolves in a clone: no citation of files
that only exist beside the repository (the project's specification and notes are in docs/), and
no path that leaves the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Top-level folders a citation starts with. "shared" is not in the repository: citing it fails.
PREFIXES = ("shared", "data", "docs", "src", "lab", "figures", "notebooks", "scripts", "tests", ".ci")
TOKEN = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(p) for p in PREFIXES) + r")/[\w.\-/<>*{}]*)")
#: Placeholders (``<run>``, ``{name}``) and globs stand for files: at least one must match.
PLACEHOLDER = re.compile(r"<[^>/]*>|\{[^}/]*\}")
#: Patterns that name build outputs, which a clone does not have before it is built.
BUILD_OUTPUTS = {"src/*.egg-info", "lab/*.egg-info"}
#: Ways of reaching outside the repository (strings assembled so this file does not match itself).
OUTSIDE = [re.compile(p) for p in (r"\.\./", "/" + "work/", r"\.library/")]


def scanned_files() -> list[Path]:
    files = [
        p
        for folder in ("src", "lab", "tests", "notebooks", "scripts", "docs")
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and p.suffix in {".py", ".ipynb", ".md", ".json", ".toml", ".txt"}
    ]
    files += [ROOT / n for n in ("README.md", "NOTES.md", "Makefile", "environment.yml", "pyproject.toml", ".ci/run")]
    files += sorted((ROOT / "data").rglob("README.md"))
    # This file's own examples are dangling on purpose (test_the_scanner_finds_...).
    # Build outputs (egg-info metadata) are not the repository's text: a stale one lists moved files.
    return [
        p
        for p in files
        if p.is_file()
        and "__pycache__" not in p.parts
        and p != Path(__file__).resolve()
        and not any(part.endswith(".egg-info") for part in p.parts)
    ]


#: A Markdown link or image target (up to an anchor or a title).
MD_LINK = re.compile(r"\]\(([^)\s#]*)(?:#[^)\s]*)?(?:\s+\"[^\"]*\")?\)")


def link_problems(text: str, base: Path, root: Path = ROOT) -> list[str]:
    """Markdown link targets in ``text`` (a file in folder ``base``) that a local viewer cannot
    follow: root-absolute (``/figures/x.png`` works on GitHub only), missing, or outside ``root``."""
    bad = []
    for match in MD_LINK.finditer(text):
        target = match.group(1)
        if not target or re.match(r"[a-z]+:", target):  # an anchor in the same file, or a URL
            continue
        resolved = (base / target).resolve()
        if target.startswith("/") or not resolved.exists() or not resolved.is_relative_to(root.resolve()):
            bad.append(target)
    return bad


def dangling(text: str, root: Path = ROOT, base: Path | None = None) -> list[str]:
    """The path tokens in ``text`` that do not resolve under ``root``, and any that leave it.
    With ``base`` (the folder of the Markdown file the text is from), relative link targets that
    resolve inside ``root`` (``../figures/x.png`` from docs/) are allowed."""
    if base is not None:
        text = MD_LINK.sub(lambda m: "]()" if m.group(1) and not link_problems(m.group(0), base, root) else m.group(0), text)
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
    text = (
        "see shared/spec/problem.md, data/bench/run1.csv, data/bench/<run>.csv and data/bench/{run_id}.json; "
        "docs/missing.md or ../elsewhere"
    )
    assert dangling(text, tmp_path) == ["shared/spec/problem.md", "data/bench/{run_id}.json", "docs/missing.md", "../"]


def test_scan_covers_the_documented_places():
    names = {str(p.relative_to(ROOT)) for p in scanned_files()}
    assert {
        "README.md",
        "NOTES.md",
        "Makefile",
        "src/swiglu/kernels/tl_kernels.py",
        "lab/swiglu_lab/bench/cli.py",
        "lab/pyproject.toml",
        "tests/conftest.py",
        "notebooks/02_validation.ipynb",
        "data/spec/README.md",
        "docs/problem.md",
    } <= names


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_path_resolves_inside_the_repository(path):
    markdown = path.suffix in {".md", ".ipynb"}
    text = path.read_text(errors="replace")
    assert dangling(text, base=path.parent if markdown else None) == []
    if markdown:
        assert link_problems(text, path.parent) == [], "links must be relative to the file (local viewers)"


def test_links_are_checked_relative_to_their_file(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "a.png").write_text("x")
    (tmp_path / "docs").mkdir()
    text = "![a](../figures/a.png) ![b](/figures/a.png) [c](figures/a.png) [d](../../out.md) [e](https://x.org/y) [f](#top)"
    assert link_problems(text, tmp_path / "docs", tmp_path) == ["/figures/a.png", "figures/a.png", "../../out.md"]
    assert dangling("![a](../figures/a.png)", tmp_path, base=tmp_path / "docs") == []
    assert dangling("![a](../figures/a.png)", tmp_path) == ["../"]
