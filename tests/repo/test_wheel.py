"""The wheel built from the root pyproject.toml holds the library alone: swiglu/... (the kernels'
config tables included) and its metadata, no lab file. scripts/check_wheel.sh checks the same in CI
and then installs the wheel into a venv with nothing but torch and triton."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("needs setuptools in this Python (the wheel is built without build isolation)")
    # A copy of what the build reads (the lab beside it, as in the clone), so the checkout gets no build/.
    tree = tmp_path_factory.mktemp("tree")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    for name in ("src", "lab"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore)
    dist = tree / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(tree)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("swiglu-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_the_wheel_holds_the_library_only(wheel_names):
    outside = [n for n in wheel_names if not n.startswith(("swiglu/", "swiglu-"))]
    assert not outside, f"files outside swiglu/ in the wheel: {outside}"
    lab = [n for n in wheel_names if "swiglu_lab" in n or n.startswith(("swiglu/bench/", "swiglu/research/"))]
    assert not lab, f"lab files in the wheel: {lab}"


def test_the_wheel_holds_every_library_module_and_table(wheel_names):
    sources = {
        str(p.relative_to(ROOT / "src"))
        for p in (ROOT / "src" / "swiglu").rglob("*")
        if p.suffix in {".py", ".json"} and "__pycache__" not in p.parts
    }
    missing = sorted(sources - set(wheel_names))
    assert not missing, f"library files missing from the wheel: {missing}"
