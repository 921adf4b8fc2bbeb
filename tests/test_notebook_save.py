"""Saving a notebook from JupyterLab (``make lab``'s pre-save hook) writes its committed form:
a notebook run and saved interactively, outputs, execution counts, the kernel's language_info
and cell timing metadata included, is written byte for byte as the repository holds it."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
manager_module = pytest.importorskip("jupyter_server.services.contents.filemanager")

from swiglu_lab.research.notebook_save import clean_notebook  # noqa: E402

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
HOOK = "swiglu_lab.research.notebook_save.strip_for_git"


def _as_lab_leaves_it(nb):
    """What a Run All and a save in JupyterLab add (seen with JupyterLab 4 and ipykernel)."""
    nb = copy.deepcopy(nb)
    nb.metadata["language_info"] = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                                    "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                                    "pygments_lexer": "ipython3", "version": "3.11.7"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    for k, cell in enumerate(nb.cells):
        cell.metadata["execution"] = {"iopub.execute_input": "2026-12-01T09:00:00.000Z"}
        cell.metadata["scrolled"] = True
        if cell.cell_type == "code":
            cell.execution_count = k + 1
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_lab_save_writes_the_committed_notebook(path, tmp_path):
    committed = path.read_text()
    nb = nbformat.reads(committed, as_version=nbformat.NO_CONVERT)
    dirty = _as_lab_leaves_it(nb)
    shutil.copy(path, tmp_path / path.name)
    manager = manager_module.FileContentsManager(root_dir=str(tmp_path), pre_save_hook=HOOK)
    manager.save({"type": "notebook", "format": "json", "content": dirty}, path.name)
    assert (tmp_path / path.name).read_text() == committed
    # Without the hook the same save changes the file: the test can fail.
    plain = manager_module.FileContentsManager(root_dir=str(tmp_path))
    plain.save({"type": "notebook", "format": "json", "content": _as_lab_leaves_it(nb)}, path.name)
    assert (tmp_path / path.name).read_text() != committed


def test_clean_keeps_what_papermill_and_the_kernel_choice_need():
    nb = nbformat.reads(NOTEBOOKS[0].read_text(), as_version=nbformat.NO_CONVERT)
    clean_notebook(nb)
    assert nb.metadata["kernelspec"]["name"] and nb.metadata["language_info"] == {"name": "python"}
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells)


def test_a_run_with_other_choices_writes_under_build(capsys):
    """One rule for make reproduce and an interactive run: changing a choice in a notebook's
    parameters (a subset of cases, another run) sends its figures and tables to
    build/reproduce/ unless overwrite = True; explicit folders are kept. Before, a notebook run
    with two cases rewrote the committed figures, the README's headline among them."""
    from swiglu_lab.research import analysis

    root = Path(__file__).parents[1]
    defaults = analysis.parameter_defaults("03_latency", root)
    assert analysis.output_dirs("03_latency", defaults, root) == (root / "figures", root / "data" / "derived")
    subset = {**defaults, "cases": "s128_b1,s256_b1"}
    assert analysis.output_dirs("03_latency", subset, root) == (root / "build/reproduce/figures",
                                                                 root / "build/reproduce/derived")
    assert "cases differ" in capsys.readouterr().out
    assert analysis.output_dirs("03_latency", {**subset, "overwrite": True}, root)[0] == root / "figures"
    mine = {**subset, "figures_dir": "build/mine", "derived_dir": "build/mine"}
    assert analysis.output_dirs("03_latency", mine, root) == (root / "build/mine", root / "build/mine")
    for name in ("01_roofline", "02_validation", "04_history", "05_tensor_parallel", "06_training_memory"):
        assert analysis.parameter_defaults(name, root)["overwrite"] is False


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_kernel_without_swiglu_is_told_how_to_set_up(path):
    """A plain JupyterLab's python3 kernel, outside the clone's .venv, used to fail at
    ``import swiglu`` with no hint; the cell after the parameters says what to run."""
    import os
    import subprocess
    import sys

    nb = nbformat.reads(path.read_text(), as_version=nbformat.NO_CONVERT)
    check = next(c for c in nb.cells if c.get("id") == "setup-check")
    # -S and no PYTHONPATH: no site-packages, so neither the editable installs nor any swiglu_lab is importable.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-S", "-c", check.source], capture_output=True, text=True, timeout=60,
                          cwd="/", env=env)
    assert done.returncode != 0 and "make lab" in done.stderr and "ModuleNotFoundError" in done.stderr, done.stderr
    ok = subprocess.run([sys.executable, "-c", check.source], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
