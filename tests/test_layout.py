"""The package's parts and their import rules, checked from the source (AST), so they stay true.

Rooms (README "Layout"):
- kernels  ``swiglu.kernels.*``: Triton kernels, launchers, config tables. May import only each
  other and ``swiglu.checks`` (input checks shared with the library).
- library  every other ``swiglu.*`` module outside research/bench: what a training job imports.
  Never imports research or bench.
- research ``swiglu.research.*`` and bench ``swiglu.bench.*``: experiments, analysis, figures,
  the benchmark. May import anything above.

Every import counts, also one inside a function (a lazy import still ties the modules together),
and the graph of swiglu modules has no cycle. The library and the kernels import no third-party
package but torch and triton, so ``pip install swiglu`` needs nothing else (the lean
install); ``import swiglu`` imports none of them but torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "swiglu"
STDLIB = set(sys.stdlib_module_names)
LIBRARY_THIRD_PARTY = {"torch", "triton"}
# An integration imports the library it integrates with (an optional extra, e.g. swiglu[hf]),
# only inside the functions that need it (tests/test_integrations_hf.py checks the import).
INTEGRATION_THIRD_PARTY = {"swiglu.integrations.transformers": {"transformers"}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def room(name: str) -> str:
    for r in ("kernels", "research", "bench"):
        if name == f"swiglu.{r}" or name.startswith(f"swiglu.{r}."):
            return r
    return "library"


def imports(name: str) -> tuple[set[str], set[str]]:
    """(swiglu modules, third-party top-level packages) that module ``name`` imports anywhere."""
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
                if alias.name.split(".")[0] == "swiglu":
                    add(alias.name)
                else:
                    theirs.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "swiglu":
                theirs.add(mod.split(".")[0])
                continue
            for alias in node.names:
                add(f"{mod}.{alias.name}" if f"{mod}.{alias.name}" in MODULES else mod)
    ours.discard(name)
    return ours, theirs - STDLIB - {"__future__", ""}


GRAPH = {name: imports(name)[0] for name in MODULES}


def test_rooms_exist():
    assert {room(n) for n in MODULES} == {"kernels", "library", "research", "bench"}
    assert "swiglu.kernels.backward" in MODULES and "swiglu.research.reproduce" in MODULES


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_respect_rooms(name):
    allowed = {
        "kernels": lambda t: room(t) == "kernels" or t == "swiglu.checks",
        "library": lambda t: room(t) in ("library", "kernels"),
        "research": lambda t: True,
        "bench": lambda t: True,
    }[room(name)]
    wrong = sorted(t for t in GRAPH[name] if not allowed(t))
    assert not wrong, f"{name} ({room(name)}) imports {wrong}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if room(n) in ("library", "kernels")))
def test_library_needs_only_torch_and_triton(name):
    extra = imports(name)[1] - LIBRARY_THIRD_PARTY - INTEGRATION_THIRD_PARTY.get(name, set())
    assert not extra, f"{name} imports {sorted(extra)}: the library's dependencies are torch and triton"


def test_no_import_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(GRAPH[n]):
            if state.get(m) == 1:
                cycle = stack[stack.index(m):] + [m]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(GRAPH):
        if n not in state:
            visit(n)


def test_checker_sees_a_planted_cycle_and_a_wrong_room(monkeypatch):
    """The two rules can fail: a kernels module importing the library, a lazy import back."""
    monkeypatch.setitem(GRAPH, "swiglu.kernels.common", GRAPH["swiglu.kernels.common"] | {"swiglu.api"})
    with pytest.raises(AssertionError, match="imports"):
        test_imports_respect_rooms("swiglu.kernels.common")
    monkeypatch.setitem(GRAPH, "swiglu.checks", GRAPH["swiglu.checks"] | {"swiglu.kernels.common"})
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycle()


def test_import_swiglu_is_lean():
    """``import swiglu`` (and its public names) loads neither Triton nor the research libraries
    beyond what ``import torch`` itself loads (torch imports tqdm and pynvml when installed)."""
    code = (
        "import sys, torch; before = set(sys.modules); import swiglu; swiglu.SwiGLUMLP; swiglu.swiglu_mlp_backward; "
        "print(sorted(m for m in ('triton', 'pandas', 'matplotlib', 'tqdm', 'pynvml', 'papermill') "
        "if m in sys.modules and m not in before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
