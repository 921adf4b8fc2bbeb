"""Memory accounting of a training step: what a module's forward saves for its backward.

``saved_activations(module, x)`` runs one forward under ``torch.autograd.graph.saved_tensors_hooks``
and lists every tensor autograd keeps for the backward (custom ops' ``save_for_backward``,
nn.Linear's inputs, SiLU's input, the product's operands...). Tensors sharing one storage are
counted once, and the module's parameters are left out (they are held by the model anyway), so
``bytes`` is the per-layer activation memory a training step holds between forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class SavedActivations:
    """The distinct saved tensors of one forward: ``shapes`` (one tuple per storage, in save order),
    their total ``bytes`` (storage sizes, not views), and ``count(shape)``."""

    shapes: tuple[tuple[int, ...], ...]
    bytes: int

    def count(self, shape) -> int:
        """How many distinct saved storages have this shape."""
        return sum(1 for s in self.shapes if s == tuple(shape))


def saved_activations(module: nn.Module, x: torch.Tensor) -> SavedActivations:
    """The activations ``module(x)`` saves for its backward (module docstring).

    Args: module: any nn.Module (eager or ``torch.compile``d); x: its input. Runs the forward
    once with autograd recording (x is used as given: it must require grad, or the module must
    have parameters that do, for anything to be saved); the output is discarded.

    Returns: ``SavedActivations`` (bytes = sum of the distinct storages' ``nbytes``).
    """
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, tuple[tuple[int, ...], int]] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr not in seen and storage.nbytes():
            seen[ptr] = (tuple(t.shape), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    del out
    return SavedActivations(tuple(s for s, _ in seen.values()), sum(n for _, n in seen.values()))
