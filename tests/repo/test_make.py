"""The documented make targets: command lines checked with ``make -n`` (nothing is run), and
``make test-gpu`` without a GPU. ``-o .venv/.installed`` keeps make from (re)building the venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def make(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def lab_command(*args: str) -> str:
    result = make("-n", "lab", *args)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "jupyter lab" in line]
    assert len(lines) == 1, result.stdout
    return lines[0]


def test_lab_passes_allow_root_exactly_when_run_as_root():
    # Jupyter refuses to run as root without --allow-root; as another user the flag is not needed.
    assert ("--allow-root" in lab_command().split()) == (os.geteuid() == 0)


def test_lab_args_add_to_allow_root():
    # Setting LAB_ARGS used to drop --allow-root, and Jupyter then refused to start as root.
    command = lab_command("LAB_ARGS=--port=8899 --no-browser").split()
    assert command[-2:] == ["--port=8899", "--no-browser"]
    assert ("--allow-root" in command) == (os.geteuid() == 0)


def test_help_names_lab_args_and_the_gpu_requirement():
    out = make("help").stdout
    lab = next(line for line in out.splitlines() if line.split()[1] == "lab")
    assert "LAB_ARGS" in lab and "--allow-root" in lab
    assert "fails without a CUDA GPU" in next(line for line in out.splitlines() if line.split()[1] == "test-gpu")


def test_test_gpu_fails_clearly_without_a_gpu():
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this checks the no-GPU path on every machine.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = make("test-gpu", f"PY={sys.executable}", env=env)
    assert result.returncode != 0
    assert "no CUDA GPU found" in result.stderr
    assert "pytest" not in result.stdout  # stopped before running (and skipping) every test


def test_bench_tp_says_clearly_when_there_are_too_few_gpus():
    # Without TP GPUs torchrun printed a raw traceback per rank; make bench-tp now stops first.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = make("bench-tp", "TP=2", f"PY={sys.executable}", env=env)
    assert result.returncode != 0
    assert "TP=2 needs 2 CUDA GPUs, torch sees 0" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout and "torch.distributed.run" not in result.stdout


def test_the_libraries_derived_files_depend_on_are_pinned():
    # make reproduce's bytes depend on matplotlib, numpy and pandas: the venv gets the pinned ones.
    text = (ROOT / "Makefile").read_text()
    install = next(line for line in text.splitlines() if "pip install -q" in line and " -e " in line)
    for name in ("MATPLOTLIB", "NUMPY", "PANDAS"):
        assert f"{name}_VERSION ?= " in text
        assert f"{name.lower()}==$({name}_VERSION)" in install, install


def test_lab_saves_notebooks_in_their_committed_form():
    """make lab installs the pre-save hook (tests/lab/test_notebook_save.py checks what it writes)."""
    import importlib

    hook = next(a.split("=", 1)[1] for a in lab_command().split() if a.startswith("--ContentsManager.pre_save_hook="))
    module, name = hook.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))


def test_venv_installs_the_library_and_the_lab_in_one_pip_command():
    """Both editable, together: pip resolves the lab's dependency on swiglu to the clone's library."""
    text = (ROOT / "Makefile").read_text()
    install = next(line for line in text.splitlines() if "pip install -q" in line and " -e " in line)
    assert "-e '.[$(EXTRAS)]'" in install and "-e './lab[$(LAB_EXTRAS)]'" in install, install
    assert "lab/pyproject.toml" in next(line for line in text.splitlines() if line.startswith("$(STAMP):"))


def test_lab_serves_the_whole_clone_and_opens_in_notebooks():
    """README, docs and figures can be browsed from the Lab; it opens on the notebooks folder."""
    args = lab_command().split()
    root = next(a.split("=", 1)[1] for a in args if a.startswith("--ServerApp.root_dir="))
    assert Path(root).resolve() == ROOT
    assert "--LabApp.default_url=/lab/tree/notebooks" in args
    assert (ROOT / "notebooks").is_dir() and "notebooks/" not in args


def _script(path: Path, text: str) -> str:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return str(path)


def test_another_python_recreates_the_venv(tmp_path):
    """make PYTHON=<another interpreter> used to keep an existing .venv and its old Python: the
    interpreter's version is an install setting, so the venv is made afresh with it. The pip
    installs are skipped here (a PY that runs everything but pip, INSTALL_TORCH=true); the venvs are real."""
    venv = tmp_path / "venv"
    py = _script(tmp_path / "py", f'[ "$1 $2" = "-m pip" ] && exit 0\nexec {venv}/bin/python "$@"\n')
    # An interpreter that reports another version than the one it runs (as python3.12 beside 3.11 would).
    other = _script(
        tmp_path / "other", f'case "$2" in *python_version*) echo "CPython 3.99.0"; exit 0;; esac\nexec {sys.executable} "$@"\n'
    )

    def build(python: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [
                "make",
                "--no-print-directory",
                f"VENV={venv}",
                f"PY={py}",
                "INSTALL_TORCH=true",
                f"PYTHON={python}",
                f"{venv}/.installed",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result

    build(sys.executable)
    assert (venv / "bin" / "python").exists() and (venv / ".installed").exists()
    (venv / "marker").write_text("")
    assert "venv" not in build(sys.executable).stdout and (venv / "marker").exists()  # same Python: kept
    build(other)
    assert not (venv / "marker").exists(), "the venv of the old interpreter was kept"
    assert (venv / ".install-settings").read_text().startswith("CPython 3.99.0 | ")
    assert (venv / ".installed").exists()
    # Its settings file, written again after --clear, leaves the next make with nothing to do.
    assert "venv" not in build(other).stdout


def test_clean_removes_jupyter_checkpoints(tmp_path):
    """make clean's find also removes every .ipynb_checkpoints (JupyterLab's copies of saved notebooks)."""
    lines = [line for line in make("-n", "clean").stdout.splitlines() if line.startswith("find ")]
    assert len(lines) == 1, lines
    for parts in (("notebooks", ".ipynb_checkpoints"), (".ipynb_checkpoints",), ("lab", "x", "__pycache__"), ("docs",)):
        tmp_path.joinpath(*parts).mkdir(parents=True)
    (tmp_path / "notebooks" / "01.ipynb").write_text("{}")
    subprocess.run(lines[0], shell=True, cwd=tmp_path, check=True)
    left = sorted(p.relative_to(tmp_path).parts for p in tmp_path.rglob("*"))
    assert left == [("docs",), ("lab",), ("lab", "x"), ("notebooks",), ("notebooks", "01.ipynb")]
