"""``src/swiglu/kernels/`` holds what the library runs: every public name a kernels module defines
at top level is used elsewhere under ``src/swiglu`` (code, not prose), or is one of the package's
documented lower-level entry points (``ENTRY_POINTS``). Candidates, probes' launchers and
tuning helpers that only lab/, scripts/ or tests/ reach live in the lab."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "swiglu"

#: Called from outside the library by design: the lower-level entries docs/usage.md and
#: docs/kernels.md describe, the plan and launch caches' resets, and the checked Gluon dSwiGLU launcher
#: (``backward`` runs its unchecked twin).
ENTRY_POINTS = {
    "triton_swiglu_backward",
    "triton_swiglu_forward",
    "clear_plans",
    "set_pdl",
    "clear_launches",
    "launch_dswiglu_gluon",
}


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _used(node: ast.AST) -> set[str]:
    used = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            used.add(n.id)
        elif isinstance(n, ast.Attribute):
            used.add(n.attr)
        elif isinstance(n, ast.alias):
            used.add(n.name.rpartition(".")[2])
    return used


def test_every_public_kernels_name_is_used_by_the_library():
    defined, used = [], set()
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = _defined(node)
            if path.parent.name == "kernels":
                defined += [(path.name, name) for name in names if not name.startswith("_")]
            # A definition's own body does not count as a use of it (an assignment's value does).
            used |= _used(node) - set(names) if not isinstance(node, (ast.Assign, ast.AnnAssign)) else _used(node.value)
    unused = [f"{file}: {name}" for file, name in defined if name not in used and name not in ENTRY_POINTS]
    assert not unused, f"defined in src/swiglu/kernels but used by nothing in the library (move to the lab): {unused}"


def test_the_check_sees_an_unused_name(tmp_path):
    module = ast.parse("def helper():\n    return 1\n\nVALUE = helper()\n")
    assert _defined(module.body[0]) == ["helper"] and "helper" in _used(module.body[1].value)
    assert "helper" not in _used(module.body[0]) - {"helper"}
