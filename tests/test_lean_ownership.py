"""The memory-lean backward consumes (overwrites, then frees) the saved gate/up activations only
when nothing user code can reach aliases them (issue 19, item 1).

A caller that kept the op's outputs, a view or alias of them, a saved-tensor hook that stores what
autograd saves, or ``grad_fn.saved_tensors`` kept: the backward leaves them as they are (the
same gradients, bit for bit) and they still read back the forward's values. Before the fix the
first of these read freed storage (SIGSEGV on the CPU; an illegal memory access on the H200), so
each runs in a child process (tests/lean_ownership_worker.py). The normal path (``swiglu_mlp`` /
``SwiGLUMLP``, nothing else holding them) still consumes them: the memory saving stays.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import swiglu
import swiglu.ops as ops

WORKER = Path(__file__).with_name("lean_ownership_worker.py")
CASES = ["op_outputs", "views", "aliases", "saved_tensors_hook", "grad_fn", "opcheck"]


def _run_worker(device, T, H, I, cases, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(WORKER), device, str(T), str(H), str(I), *cases],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"worker exited with {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.split() == [w for c in cases for w in ("ok", c)], done.stdout


def test_reachable_activations_are_never_consumed(device):
    """The issue's input (x [4, 16], weights [48, 16] / [16, 48], bf16) and its kind."""
    _run_worker(device, 4, 16, 48, CASES)


class _LeanSpy:
    def __init__(self):
        self.calls = []

    def __enter__(self):
        self.original = ops.mlp_backward_lean
        ops.mlp_backward_lean = lambda *a: self.calls.append(a[-1]) or self.original(*a)
        return self

    def __exit__(self, *exc):
        ops.mlp_backward_lean = self.original


def _bf16(*shape, gen):
    return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).bfloat16()


@pytest.mark.parametrize("shape", [(4, 16), (2, 3, 16)])
def test_the_normal_path_still_consumes(device, shape):
    """swiglu_mlp and SwiGLUMLP: nothing but autograd holds gate/up, so the consuming backward runs
    (with the storage release) and gives the gradients of the one that does not."""
    gen = torch.Generator().manual_seed(3)
    x = _bf16(*shape, gen=gen).to(device)
    mlp = swiglu.SwiGLUMLP(16, 48, backward_impl="triton", dtype=torch.bfloat16, device=device)
    grads = {}
    for consume in (True, False):
        xr = x.clone().requires_grad_()
        mlp.zero_grad(set_to_none=True)
        original = ops._overwrite_ok
        if not consume:
            ops._overwrite_ok = lambda t: False
        try:
            with _LeanSpy() as spy:
                mlp(xr).float().sum().backward()
        finally:
            ops._overwrite_ok = original
        assert spy.calls == ([True] if consume else []), spy.calls
        grads[consume] = [xr.grad] + [p.grad for p in mlp.parameters()]
    for a, b in zip(grads[True], grads[False]):
        assert torch.equal(a, b) and a.abs().max() > 0


def test_hooks_and_held_outputs_take_the_non_consuming_backward(device):
    """In process, without reading anything freed: who holds a reference decides the path."""
    gen = torch.Generator().manual_seed(4)
    x = _bf16(4, 16, gen=gen).to(device).requires_grad_()
    w = [_bf16(*s, gen=gen).to(device).requires_grad_() for s in ((48, 16), (48, 16), (16, 48))]
    with _LeanSpy() as spy:
        out, gate, up, _ = ops.mlp_forward(x, *w, "triton", False)
        out.sum().backward()
        assert spy.calls == [], "consumed the gate/up the caller holds"
        del gate, up
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            out = swiglu.swiglu_mlp(x, *w, backward_impl="triton")
        out.sum().backward()
        assert spy.calls == [], "consumed under a saved-tensor hook"
        swiglu.swiglu_mlp(x, *w, backward_impl="triton").sum().backward()
        assert spy.calls == [True], "the normal path no longer consumes"


def test_opcheck_every_op_in_every_mode(device):
    """torch.library.opcheck on the forward op in both modes and on both backward ops, Triton
    path (the reference path: tests/test_module.py, tests/test_forward.py). The lean forward,
    the one that crashed, runs in the worker (its "opcheck" case)."""
    gen = torch.Generator().manual_seed(5)
    x = _bf16(2, 3, 16, gen=gen).to(device).requires_grad_()
    w = [_bf16(*s, gen=gen).to(device).requires_grad_() for s in ((48, 16), (48, 16), (16, 48))]
    torch.library.opcheck(ops.mlp_forward, (x, *w, "triton", True))
    out, gate, up, act = ops.mlp_forward(x, *w, "triton", True)
    go = torch.randn(out.shape, generator=gen).bfloat16().to(device)
    plain = [t.detach() for t in (x, *w)]
    needs = (True, True, False, True)
    torch.library.opcheck(ops.mlp_backward, (go, plain[0], gate, up, act, *plain[1:], *needs, "triton"))
    torch.library.opcheck(ops.mlp_backward, (go, plain[0], gate, up, None, *plain[1:], *needs, "triton"))


@pytest.mark.gpu
def test_reachable_activations_at_full_size_on_the_gpu():
    """Hermes' MLP (H=16384, I=53248) at T=4096 on the H200: the kept op outputs (and the other
    cases) read back valid data after the backward, no illegal memory access."""
    _run_worker("cuda", 4096, 16384, 53248, ["op_outputs", "views", "saved_tensors_hook", "grad_fn"], timeout=600)
