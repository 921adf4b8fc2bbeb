"""What JupyterLab saves of a notebook: the committed form (no outputs, no execution counts,
only the metadata the repository keeps), so opening, running and saving a notebook leaves
``git status`` clean. ``make lab`` installs ``strip_for_git`` as the server's pre-save hook; it
cleans the repository's notebooks (``notebooks/*.ipynb``) and leaves any other notebook, a
user's scratch notebook elsewhere in the clone included, as the Lab saves it.
``python -m swiglu_lab.research.reproduce --strip-outputs`` cleans with the same code
(``strip_file``), for notebooks saved by another Jupyter.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..paths import repo_root

#: Notebook-level metadata the repository keeps, and what of ``language_info`` (Jupyter writes
#: the kernel's whole description, version included, on every save).
KEPT_METADATA = ("kernelspec",)
KEPT_LANGUAGE_INFO = ("name",)
#: Cell-level metadata the repository keeps (papermill reads the "parameters" tag).
KEPT_CELL_METADATA = ("tags",)
#: The folder (under the repository root) whose notebooks are committed and cleaned on save.
NOTEBOOKS_DIR = "notebooks"


def clean_notebook(nb: dict) -> dict:
    """``nb`` (an nbformat v4 notebook, a dict or NotebookNode) in its committed form, in place:
    outputs and execution counts cleared, volatile metadata dropped. Returns ``nb``."""
    meta = nb.get("metadata", {})
    language = meta.get("language_info")
    for key in [k for k in meta if k not in KEPT_METADATA]:
        del meta[key]
    if isinstance(language, dict):
        meta["language_info"] = {k: language[k] for k in KEPT_LANGUAGE_INFO if k in language}
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell_meta = cell.get("metadata", {})
        for key in [k for k in cell_meta if k not in KEPT_CELL_METADATA]:
            del cell_meta[key]
    return nb


def committed_text(nb: dict) -> str:
    """The file text of ``nb``'s committed form (``clean_notebook`` on a copy), byte for byte what
    a Lab save through ``strip_for_git`` writes: nbformat's layout (sorted keys, one-space
    indent, sources as lists of lines, a final newline), without needing nbformat."""
    nb = clean_notebook(json.loads(json.dumps(nb)))
    for cell in nb.get("cells", []):
        if isinstance(cell.get("source"), str):
            cell["source"] = cell["source"].splitlines(True)
    return json.dumps(nb, sort_keys=True, indent=1, separators=(",", ": "), ensure_ascii=False) + "\n"


def strip_file(path: str | Path) -> bool:
    """Rewrite the notebook file ``path`` in its committed form; True when that changed it."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    new = committed_text(json.loads(text))
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def is_repository_notebook(os_path: str | Path) -> bool:
    """Whether ``os_path`` is a notebook in the ``notebooks/`` folder of the clone holding it."""
    path = Path(os_path).resolve()
    return path.suffix == ".ipynb" and path.parent == repo_root(path.parent) / NOTEBOOKS_DIR


def _os_path(path: str, contents_manager) -> Path:
    get = getattr(contents_manager, "_get_os_path", None)
    if callable(get):
        return Path(get(path))
    return Path(getattr(contents_manager, "root_dir", ".")) / path


def strip_for_git(model: dict, path: str = "", contents_manager=None, **kwargs) -> None:
    """jupyter_server's ``ContentsManager.pre_save_hook``: the content of a notebook saved into
    the clone's ``notebooks/`` is cleaned (``clean_notebook``) before it is written; every other
    file and notebook is left alone."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    if is_repository_notebook(_os_path(path, contents_manager)):
        clean_notebook(model["content"])
