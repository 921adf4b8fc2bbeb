"""Saving a notebook from JupyterLab (``make lab``'s pre-save hook) writes its committed form:
a notebook run and saved interactively, outputs, execution counts, the kernel's language_info
and cell timing metadata included, is written byte for byte as the repository holds it. Only the
repository's notebooks (``notebooks/``) are cleaned; ``reproduce --strip-outputs`` cleans with the
same code; and a saved edit of a parameters cell does not become the committed default."""

from __future__ import annotations

import ast
import copy
import json
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
manager_module = pytest.importorskip("jupyter_server.services.contents.filemanager")

from swiglu_lab.research import analysis, reproduce  # noqa: E402
from swiglu_lab.research.notebook_save import clean_notebook  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
HOOK = "swiglu_lab.research.notebook_save.strip_for_git"


def _as_lab_leaves_it(nb):
    """What a Run All and a save in JupyterLab add (seen with JupyterLab 4 and ipykernel)."""
    nb = copy.deepcopy(nb)
    nb.metadata["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3},
        "file_extension": ".py",
        "mimetype": "text/x-python",
        "name": "python",
        "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3",
        "version": "3.11.7",
    }
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    for k, cell in enumerate(nb.cells):
        cell.metadata["execution"] = {"iopub.execute_input": "2026-12-01T09:00:00.000Z"}
        cell.metadata["scrolled"] = True
        if cell.cell_type == "code":
            cell.execution_count = k + 1
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    return nb


def _clone(tmp_path: Path) -> Path:
    """A folder the lab takes for a clone (``paths.repo_root``), with an empty ``notebooks/``."""
    (tmp_path / "src" / "swiglu").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "notebooks").mkdir()
    return tmp_path


def _save(root: Path, api_path: str, nb, hook: str | None = HOOK) -> Path:
    """Save ``nb`` as JupyterLab does (jupyter_server's contents manager, ``make lab``'s hook)."""
    manager = manager_module.FileContentsManager(root_dir=str(root), **({"pre_save_hook": hook} if hook else {}))
    manager.save({"type": "notebook", "format": "json", "content": nb}, api_path)
    return root / api_path


def _parameters_cell(path: Path) -> dict:
    """The values the file's cell tagged ``parameters`` assigns, as the file holds them now."""
    cell = next(c for c in json.loads(path.read_text())["cells"] if "parameters" in c["metadata"].get("tags", []))
    tree = ast.parse("".join(cell["source"]))
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign) for t in node.targets}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_lab_save_writes_the_committed_notebook(path, tmp_path):
    committed = path.read_text()
    nb = nbformat.reads(committed, as_version=nbformat.NO_CONVERT)
    root = _clone(tmp_path)
    shutil.copy(path, root / "notebooks" / path.name)
    assert _save(root, f"notebooks/{path.name}", _as_lab_leaves_it(nb)).read_text() == committed
    # Without the hook the same save changes the file: the test can fail.
    assert _save(root, f"notebooks/{path.name}", _as_lab_leaves_it(nb), hook=None).read_text() != committed


def test_the_hook_cleans_only_the_repositorys_notebooks(tmp_path):
    """A user's own scratch notebook elsewhere in the clone keeps its outputs when saved from the Lab."""
    nb = _as_lab_leaves_it(nbformat.reads(NOTEBOOKS[0].read_text(), as_version=nbformat.NO_CONVERT))
    root = _clone(tmp_path)
    # (paths written as parts: the citation check of tests/repo/test_paths.py reads "folder/file" as a repository file)
    kept = [("scratch.ipynb",), ("lab", "mine.ipynb"), ("notebooks", "scratch", "mine.ipynb"), ("build", "mine.ipynb")]
    for parts in kept:
        (root / Path(*parts)).parent.mkdir(parents=True, exist_ok=True)
        saved = json.loads(_save(root, "/".join(parts), copy.deepcopy(nb)).read_text())
        assert any(c.get("outputs") for c in saved["cells"]), f"{parts} lost its outputs"
        assert saved["metadata"]["language_info"].get("version") == "3.11.7", parts
    cleaned = json.loads(_save(root, "/".join(("notebooks", "mine.ipynb")), copy.deepcopy(nb)).read_text())
    assert not any(c.get("outputs") for c in cleaned["cells"]) and cleaned["metadata"]["language_info"] == {"name": "python"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_strip_outputs_cleans_what_another_jupyter_saved_as_the_hook_does(path, tmp_path):
    """``reproduce --strip-outputs`` and the save hook share their cleaning: a notebook saved by
    a Jupyter without the hook (language_info, widgets, cell timings, outputs) comes back byte
    for byte as committed."""
    nb = nbformat.reads(path.read_text(), as_version=nbformat.NO_CONVERT)
    dirty = _save(tmp_path, path.name, _as_lab_leaves_it(nb), hook=None)
    assert dirty.read_text() != path.read_text()
    assert reproduce.strip_outputs([dirty]) == [dirty]
    assert dirty.read_text() == path.read_text()
    assert reproduce.strip_outputs([dirty]) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_committed_defaults_are_the_notebooks_parameters_cells(path):
    """``analysis.NOTEBOOK_DEFAULTS`` (what a run compares its choices with) is what each
    committed notebook's parameters cell assigns, name for name and in order."""
    assert list(analysis.parameter_defaults(path.stem).items()) == list(_parameters_cell(path).items())


def test_a_saved_parameter_edit_does_not_become_the_default(tmp_path):
    """Edit a choice in the Lab, save (the hook keeps the edited cell) and Run All: the run still
    writes under build/reproduce/ and says so; the committed figures and tables are not touched.
    Before, the saved edit was read back as the notebook's default and the second Run All
    rewrote figures/ and data/derived/ with two cases."""
    from bench_fixtures import write_synthetic_run

    root = _clone(tmp_path)
    write_synthetic_run(root / "data" / "bench", kernels=True)
    src = ROOT / "notebooks" / "03_latency.ipynb"
    nb = nbformat.reads(src.read_text(), as_version=nbformat.NO_CONVERT)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert 'cases = "all"' in cell.source
    cell.source = cell.source.replace('cases = "all"', 'cases = "s128_b1,s256_b1"')
    saved = _save(root, "notebooks/03_latency.ipynb", _as_lab_leaves_it(nb))
    assert _parameters_cell(saved)["cases"] == "s128_b1,s256_b1"  # the save kept the edit
    assert analysis.parameter_defaults("03_latency")["cases"] == "all"
    # Run All: the saved file's cells as they are, no parameters injected, in the notebook's folder.
    out = tmp_path / "executed.ipynb"
    reproduce.execute_python(saved, out, {}, root / "notebooks")
    assert not (root / "figures").exists() and not (root / "data" / "derived").exists()
    written = sorted(p.name for p in (root / "build" / "reproduce" / "figures").iterdir())
    assert "03_latency_per_case.png" in written and "03_gmean.svg" in written
    assert (root / "build" / "reproduce" / "derived" / "latency_per_case.csv").is_file()
    printed = "".join("".join(o["text"]) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []))
    assert "cases differ from this notebook's defaults" in printed
    # Where figures went, relative to the clone (not the absolute path of this machine's clone).
    assert "saved 03_latency_per_case.{png,svg} in build/reproduce/figures\n" in printed
    assert str(tmp_path) not in printed


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
    root = ROOT
    defaults = analysis.parameter_defaults("03_latency")
    assert analysis.output_dirs("03_latency", defaults, root) == (root / "figures", root / "data" / "derived")
    subset = {**defaults, "cases": "s128_b1,s256_b1"}
    assert analysis.output_dirs("03_latency", subset, root) == (
        root / "build/reproduce/figures",
        root / "build/reproduce/derived",
    )
    assert "cases differ" in capsys.readouterr().out
    assert analysis.output_dirs("03_latency", {**subset, "overwrite": True}, root)[0] == root / "figures"
    mine = {**subset, "figures_dir": "build/mine", "derived_dir": "build/mine"}
    assert analysis.output_dirs("03_latency", mine, root) == (root / "build/mine", root / "build/mine")
    for name in ("01_roofline", "02_validation", "04_history", "05_tensor_parallel", "06_training_memory"):
        assert analysis.parameter_defaults(name)["overwrite"] is False


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
    done = subprocess.run(
        [sys.executable, "-S", "-c", check.source], capture_output=True, text=True, timeout=60, cwd="/", env=env
    )
    assert done.returncode != 0 and "make lab" in done.stderr and "ModuleNotFoundError" in done.stderr, done.stderr
    ok = subprocess.run([sys.executable, "-c", check.source], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
