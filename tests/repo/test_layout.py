"""The library, the lab and their import rules, checked from the source (AST), so they stay true.

Parts (docs/reproduce.md, "Layout"):
- kernels   ``swiglu.kernels.*`` (src/swiglu/kernels): Triton kernels, launchers, config tables.
  May import only each other and ``swiglu.checks`` (input checks shared with the library).
- library   every other ``swiglu.*`` module (src/swiglu): what a training job imports. Imports the
  kernels, never the lab.
- lab       ``swiglu_lab`` and ``swiglu_lab.paths`` (lab/swiglu_lab): what bench and research share.
  May import the library.
- bench     ``swiglu_lab.bench.*``: the benchmark harness. May import the library and the lab's
  shared modules, never research.
- research  ``swiglu_lab.research.*``: analysis, figures, notebooks runner. May import all of the
  above.
- experiments  ``swiglu_lab.experiments.*``: kernels a probe of lab/probes tried that the library
  does not ship. May import the library and the lab's shared modules; nothing imports it but the
  probes and the tests.

Every import counts, also one inside a function (a lazy import still ties the modules together),
and the graph of swiglu and swiglu_lab modules has no cycle. The library and the kernels import
no third-party package but torch and triton, so ``pip install swiglu`` needs nothing else (the
lean install); ``import swiglu`` imports none of them but torch, and no lab module. The lab
imports only what ``lab/pyproject.toml`` declares (or an optional peer, inside a function).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Where each top-level package's source lives.
PACKAGES = {"swiglu": ROOT / "src", "swiglu_lab": ROOT / "lab"}
STDLIB = set(sys.stdlib_module_names)
LIBRARY_THIRD_PARTY = {"torch", "triton"}
# An integration imports the library it integrates with (an optional extra, e.g. swiglu[hf]),
# only inside the functions that need it (tests/library/test_integrations_hf.py checks the import).
INTEGRATION_THIRD_PARTY = {"swiglu.integrations.transformers": {"transformers"}}
#: Import names of the lab's dependencies (lab/pyproject.toml: the required ones, the notebooks
#: extra and its Jupyter stack, the liger and quack peers) besides the library's torch and triton.
LAB_THIRD_PARTY = LIBRARY_THIRD_PARTY | {
    "numpy",
    "pandas",
    "tqdm",
    "pynvml",  # required (nvidia-ml-py is imported as pynvml)
    "matplotlib",
    "papermill",
    "nbformat",
    "jupyter_client",
    "IPython",  # notebooks
    "liger_kernel",  # liger
    "quack",
    "cutlass",  # quack (nvidia-cutlass-dsl is imported as cutlass)
}


def module_name(path: Path) -> str:
    top = next(t for t, base in PACKAGES.items() if path.is_relative_to(base / t))
    parts = list(path.relative_to(PACKAGES[top]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for top, base in PACKAGES.items() for p in sorted((base / top).rglob("*.py"))}


def part(name: str) -> str:
    if name == "swiglu.kernels" or name.startswith("swiglu.kernels."):
        return "kernels"
    if name == "swiglu" or name.startswith("swiglu."):
        return "library"
    for sub in ("bench", "research", "experiments"):
        if name == f"swiglu_lab.{sub}" or name.startswith(f"swiglu_lab.{sub}."):
            return sub
    return "lab"


#: The parts each part may import (itself included).
ALLOWED = {
    "kernels": {"kernels"},
    "library": {"library", "kernels"},
    "lab": {"lab", "library", "kernels"},
    "bench": {"bench", "lab", "library", "kernels"},
    "research": {"research", "bench", "lab", "library", "kernels"},
    "experiments": {"experiments", "lab", "library", "kernels"},
}


def imports(name: str) -> tuple[set[str], set[str]]:
    """(swiglu and swiglu_lab modules, third-party top-level packages) that module ``name``
    imports anywhere."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    ours, theirs = set(), set()

    def add(target: str) -> None:
        # ``from pkg import sub`` names a submodule when one exists; otherwise the package itself.
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target:
            ours.add(target)

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    add(alias.name)
                else:
                    theirs.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] not in PACKAGES:
                theirs.add(mod.split(".")[0])
                continue
            for alias in node.names:
                add(f"{mod}.{alias.name}" if f"{mod}.{alias.name}" in MODULES else mod)
    ours.discard(name)
    return ours, theirs - STDLIB - {"__future__", ""}


GRAPH = {name: imports(name)[0] for name in MODULES}


def test_every_part_has_modules():
    assert {part(n) for n in MODULES} == set(ALLOWED)
    assert "swiglu.kernels.backward" in MODULES and "swiglu_lab.research.reproduce" in MODULES
    assert "swiglu_lab.bench.cli" in MODULES and "swiglu_lab.paths" in MODULES


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_respect_the_parts(name):
    allowed = ALLOWED[part(name)] | ({"swiglu.checks"} if part(name) == "kernels" else set())
    wrong = sorted(t for t in GRAPH[name] if part(t) not in allowed and t not in allowed)
    assert not wrong, f"{name} ({part(name)}) imports {wrong}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if part(n) in ("library", "kernels")))
def test_library_needs_only_torch_and_triton(name):
    extra = imports(name)[1] - LIBRARY_THIRD_PARTY - INTEGRATION_THIRD_PARTY.get(name, set())
    assert not extra, f"{name} imports {sorted(extra)}: the library's dependencies are torch and triton"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if part(n) in ("lab", "bench", "research", "experiments")))
def test_lab_imports_what_its_pyproject_declares(name):
    extra = imports(name)[1] - LAB_THIRD_PARTY
    assert not extra, f"{name} imports {sorted(extra)}, which lab/pyproject.toml does not declare"


def test_lab_pyproject_declares_the_lab_third_party():
    """LAB_THIRD_PARTY above follows lab/pyproject.toml: its distributions, required and extras."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    declared = {re.match(r"[\w.-]+", r).group(0) for r in requirements}
    for dist in (
        "swiglu",
        "numpy",
        "pandas",
        "tqdm",
        "nvidia-ml-py",
        "matplotlib",
        "papermill",
        "nbformat",
        "jupyterlab",
        "ipykernel",
        "liger-kernel",
        "quack-kernels",
        "nvidia-cutlass-dsl",
    ):
        assert dist in declared, f"lab/pyproject.toml does not declare {dist}"


def test_no_import_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(GRAPH[n]):
            if state.get(m) == 1:
                cycle = stack[stack.index(m) :] + [m]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(GRAPH):
        if n not in state:
            visit(n)


def test_checker_sees_a_planted_cycle_and_a_wrong_import(monkeypatch):
    """The rules can fail: a kernels module importing the library, the library importing the lab,
    bench importing research, a lazy import back."""
    for importer, imported in (
        ("swiglu.kernels.launch", "swiglu.api"),
        ("swiglu.api", "swiglu_lab.bench.stats"),
        ("swiglu_lab.bench.cli", "swiglu_lab.research.analysis"),
        ("swiglu_lab.paths", "swiglu_lab.bench.stats"),
    ):
        monkeypatch.setitem(GRAPH, importer, GRAPH[importer] | {imported})
        with pytest.raises(AssertionError, match="imports"):
            test_imports_respect_the_parts(importer)
    monkeypatch.setitem(GRAPH, "swiglu.checks", GRAPH["swiglu.checks"] | {"swiglu.kernels.launch"})
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycle()


def test_import_swiglu_is_lean():
    """``import swiglu`` (and its public names) loads no lab module, and neither Triton nor the
    lab's libraries beyond what ``import torch`` itself loads (torch imports tqdm and pynvml when
    installed)."""
    code = (
        "import sys, torch; before = set(sys.modules); import swiglu; swiglu.SwiGLUMLP; swiglu.swiglu_mlp_backward; "
        "print(sorted(m for m in sys.modules if m not in before and (m.split('.')[0] in "
        "('swiglu_lab', 'triton', 'pandas', 'matplotlib', 'tqdm', 'pynvml', 'papermill'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_scripts_index_names_every_script():
    """scripts/README.md is the shed's index: one row per file, none for a file that is gone."""
    root = Path(__file__).resolve().parents[2] / "scripts"
    indexed = set(re.findall(r"`([\w.]+\.(?:py|sh))`", (root / "README.md").read_text()))
    present = {p.name for p in root.iterdir() if p.suffix in (".py", ".sh")}
    assert indexed == present, (sorted(present - indexed), sorted(indexed - present))


def test_probes_index_names_every_probe():
    """lab/probes/README.md indexes the one-off probes: one row per file, none for a file that is gone."""
    root = Path(__file__).resolve().parents[2] / "lab" / "probes"
    indexed = set(re.findall(r"`([\w.]+\.py)`", (root / "README.md").read_text()))
    present = {p.name for p in root.glob("*.py")}
    assert indexed == present, (sorted(present - indexed), sorted(indexed - present))


def sys_path_edits(source: str) -> list[int]:
    """Lines of ``source`` that change ``sys.path`` (assign to it or a slice of it, call a method on it)."""

    def is_sys_path(node) -> bool:
        node = node.value if isinstance(node, ast.Subscript) else node
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    lines = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        if any(is_sys_path(t) for t in targets):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            lines.append(node.lineno)
    return lines


def test_scripts_and_probes_leave_sys_path_alone():
    """Scripts and probes import the installed swiglu and swiglu_lab (or PYTHONPATH=src:lab), never by
    editing sys.path."""
    root = Path(__file__).resolve().parents[2]
    edits = {
        str(p.relative_to(root)): sys_path_edits(p.read_text())
        for folder in ("scripts", "lab/probes")
        for p in sorted((root / folder).glob("*.py"))
    }
    assert not {k: v for k, v in edits.items() if v}


def test_the_sys_path_check_sees_each_kind_of_edit():
    for code in (
        "import sys\nsys.path.insert(0, 'src')",
        "import sys\nsys.path[:0] = ['src']",
        "import sys\nsys.path.append('x')",
        "import sys\nsys.path = []",
        "import sys\nsys.path += ['x']",
    ):
        assert sys_path_edits(code) == [2], code
    assert sys_path_edits("import sys\nprint(sys.path[0])\nfrom x import y  # sys.path") == []
