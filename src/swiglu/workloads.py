"""The 18 workload cases of SOL-ExecBench L2/005 and the model shapes we check against.

Source: ``docs/problem.md`` (the benchmark's case table, its per-case ``atol`` and the
common ``rtol = 0.05``), which mirrors NVIDIA SOL-ExecBench problem L2/005
(``005_swiglu_mlp_backward``, model hermes-4-405b).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

#: Hermes-4-405B MLP sizes (the benchmark's constants).
HIDDEN_SIZE = 16384
INTERMEDIATE_SIZE = 53248

#: The benchmark's relative tolerance, common to every case.
RTOL = 0.05
#: The benchmark's minimum fraction of matching elements per output tensor.
MIN_MATCH_FRACTION = 0.99


@dataclass(frozen=True)
class ModelShape:
    """An MLP shape: ``hidden_size`` (H) and ``intermediate_size`` (I)."""

    name: str
    hidden_size: int
    intermediate_size: int


#: Named model shapes. Llama-3 sizes from the published model configs (config.json).
MODEL_SHAPES: dict[str, ModelShape] = {
    "hermes-4-405b": ModelShape("hermes-4-405b", HIDDEN_SIZE, INTERMEDIATE_SIZE),
    "llama-3-70b": ModelShape("llama-3-70b", 8192, 28672),
    "llama-3-8b": ModelShape("llama-3-8b", 4096, 14336),
}


@dataclass(frozen=True)
class Case:
    """One workload case: ``tokens = batch_size * seq_len`` rows of activations."""

    seq_len: int
    batch_size: int
    atol: float
    rtol: float = RTOL

    @property
    def tokens(self) -> int:
        return self.seq_len * self.batch_size

    @property
    def name(self) -> str:
        return f"s{self.seq_len}_b{self.batch_size}"


#: (seq_len, batch_size, atol), in the benchmark's order.
CASES: tuple[Case, ...] = tuple(
    Case(s, b, a)
    for s, b, a in [
        (128, 1, 0.13),
        (128, 8, 0.16),
        (128, 16, 0.24),
        (128, 32, 0.22),
        (128, 64, 0.26),
        (211, 16, 0.23),
        (256, 1, 0.13),
        (256, 2, 0.14),
        (256, 4, 0.16),
        (256, 16, 0.22),
        (373, 8, 0.23),
        (512, 4, 0.24),
        (512, 8, 0.22),
        (1024, 2, 0.24),
        (1024, 4, 0.22),
        (1571, 4, 0.24),
        (2048, 2, 0.22),
        (4096, 1, 0.22),
    ]
)


def get_case(name: str) -> Case:
    """Return the case called ``name`` (e.g. ``"s128_b8"``); raises ``ValueError`` if unknown."""
    for case in CASES:
        if case.name == name:
            return case
    raise ValueError(f"unknown case {name!r}; expected one of {[c.name for c in CASES]}")


def select_cases(selection: str | int | Iterable[str | int] | None = None) -> list[Case]:
    """Pick cases by name (``"s128_b8"``), token count (``4096`` picks every case with
    4096 tokens) or ``"all"``/``None`` for all 18. A string may be comma-separated.

    Raises ``ValueError`` for a name or token count that matches no case.
    """
    if selection is None:
        return list(CASES)
    if isinstance(selection, int):
        selection = str(selection)
    if isinstance(selection, str):
        items: list[str | int] = [s.strip() for s in selection.split(",") if s.strip()]
    else:
        items = list(selection)
    if not items or items == ["all"]:
        return list(CASES)
    chosen: list[Case] = []
    for item in items:
        text = str(item)
        if text.isdigit():
            matches = [c for c in CASES if c.tokens == int(text)]
            if not matches:
                raise ValueError(f"no case has {text} tokens; token counts are {sorted({c.tokens for c in CASES})}")
        else:
            matches = [get_case(text)]
        chosen.extend(c for c in matches if c not in chosen)
    return chosen
