"""Where the repository is, for the lab's readers and writers of ``data/``, ``figures/`` and
``notebooks/``."""

from __future__ import annotations

from pathlib import Path


def repo_root(start: str | Path | None = None) -> Path:
    """The repository root: the first folder at or above ``start`` (default: the current
    directory) holding both ``pyproject.toml`` and ``src/swiglu``; else the folder above this
    package's ``lab/`` when installed editable; else ``start`` itself."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "src" / "swiglu").is_dir():
            return folder
    package_root = Path(__file__).resolve().parents[2]
    if (package_root / "pyproject.toml").is_file() and (package_root / "src" / "swiglu").is_dir():
        return package_root
    return here
