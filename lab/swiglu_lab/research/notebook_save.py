"""What JupyterLab saves of a notebook: the committed form (no outputs, no execution counts,
only the metadata the repository keeps), so opening, running and saving a notebook leaves
``git status`` clean. ``make lab`` installs ``strip_for_git`` as the server's pre-save hook.
"""

from __future__ import annotations

#: Notebook-level metadata the repository keeps, and what of ``language_info`` (Jupyter writes
#: the kernel's whole description, version included, on every save).
KEPT_METADATA = ("kernelspec",)
KEPT_LANGUAGE_INFO = ("name",)
#: Cell-level metadata the repository keeps (papermill reads the "parameters" tag).
KEPT_CELL_METADATA = ("tags",)


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


def strip_for_git(model: dict, **kwargs) -> None:
    """jupyter_server's ``ContentsManager.pre_save_hook``: a notebook model's content is cleaned
    (``clean_notebook``) before it is written; other files are left alone."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        clean_notebook(model["content"])
