"""Kernels launched from several Python threads at once under TRITON_INTERPRET=1: Triton's
interpreter keeps the running launch's grid in process-wide state, so ``launch.launch`` runs
interpreted launches one at a time. Each thread's results are bitwise those of the same
computation run alone. Interpreter only (compiled launches on a GPU need no lock)."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

import swiglu
from swiglu.kernels import devices

# (T, H, I): different grids and tile counts per thread, T on both sides of a 128-row tile.
SHAPES = [(7, 16, 48), (33, 32, 64), (130, 16, 48), (5, 24, 40)]


def _forward_backward(mlp: swiglu.SwiGLUMLP, x: torch.Tensor, grad_output: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_(True)
    mlp.zero_grad(set_to_none=True)
    out = mlp(x)
    out.backward(grad_output)
    return [out.detach(), x.grad, *(p.grad for p in mlp.parameters())]


@pytest.mark.skipif(not devices.INTERPRET, reason="needs TRITON_INTERPRET=1")
def test_threads_launching_at_once_get_the_results_they_get_alone():
    # Modules and inputs are drawn here, not in the threads (the global RNG is shared).
    torch.manual_seed(0)
    cases = []
    for T, H, I in SHAPES:
        mlp = swiglu.SwiGLUMLP(H, I, impl="triton", dtype=torch.bfloat16)
        x, grad_output = torch.randn(2, T, H, dtype=torch.bfloat16).unbind(0)
        cases.append((mlp, x, grad_output))
    alone = [_forward_backward(copy.deepcopy(mlp), x, go) for mlp, x, go in cases]
    for (T, H, I), (mlp, x, go), got in zip(SHAPES, cases, alone):  # each alone run is right
        reference = swiglu.SwiGLUMLP(H, I, impl="reference", dtype=torch.bfloat16)
        reference.load_state_dict(mlp.state_dict())
        for g, r in zip(got, _forward_backward(reference, x, go)):
            assert swiglu.relative_error(g, r) < 2e-2, (T, H, I)

    start = threading.Barrier(len(cases))
    results, errors = [None] * len(cases), [None] * len(cases)

    def worker(i):
        start.wait()
        try:
            results[i] = _forward_backward(*cases[i])
        except Exception as e:  # reported below, with the shape
            errors[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for shape, err, got, want in zip(SHAPES, errors, results, alone):
        assert err is None, f"(T, H, I) = {shape}: {err!r}"
        names = ("out", "grad_x", *(n for n, _ in cases[0][0].named_parameters()))
        for name, g, w in zip(names, got, want):
            assert torch.equal(g, w), f"(T, H, I) = {shape}: {name} differs from the same step run alone"
