"""The memory-lean backward never writes the saved gate/up activations unless asked
(``reuse_saved_buffers=True``), and then only the forward's own tensors, handed back unchanged.

Anything user code can reach (the raw op's outputs, views or aliases of them, what a saved-tensor
hook stored, ``grad_fn.saved_tensors``) reads back the forward's values after a default backward,
with the gradients bit for bit those of the raw op. The kept-reference cases run in a child
process (tests/lean_ownership_worker.py): a read of freed storage kills a process (SIGSEGV on the
CPU, an illegal memory access on a GPU), which must fail one test, not the whole run.
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

WORKER = Path(__file__).resolve().parents[1] / "lean_ownership_worker.py"
CASES = ["op_outputs", "views", "aliases", "saved_tensors_hook", "grad_fn", "opcheck"]


def _run_worker(device, T, H, I, cases, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, str(WORKER), device, str(T), str(H), str(I), *cases],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert done.returncode == 0, f"worker exited with {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.split() == [w for c in cases for w in ("ok", c)], done.stdout


def test_reachable_activations_are_never_consumed(device):
    """A small input (x [4, 16], weights [48, 16] / [16, 48], bf16) of each kind."""
    _run_worker(device, 4, 16, 48, CASES)


def test_released_activations_read_as_empty(device):
    """``reuse_saved_buffers=True``, dense and MoE: gate/up that user code still holds after the
    backward released them (``grad_fn.saved_tensors`` taken before it, a saved-tensor hook's)
    read as empty tensors, not as their old sizes over freed memory."""
    cases = ["reuse_grad_fn", "reuse_saved_tensors_hook", "moe_reuse_grad_fn", "moe_reuse_saved_tensors_hook"]
    _run_worker(device, 4, 16, 48, cases)


class _LeanSpy:
    """Records, per Triton backward, whether it wrote over the saved gate/up."""

    def __init__(self):
        self.calls = []

    def __enter__(self):
        import swiglu.kernels.backward as module

        self.module, self.original = module, module.launch_backward
        module.launch_backward = lambda *a, **kw: self.calls.append(kw["overwrite_activations"]) or self.original(*a, **kw)
        return self

    def __exit__(self, *exc):
        self.module.launch_backward = self.original


def _bf16(*shape, gen):
    return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).bfloat16()


@pytest.mark.parametrize("shape", [(4, 16), (2, 3, 16)])
def test_reuse_consumes_and_gives_the_same_gradients(device, shape):
    """SwiGLUMLP(reuse_saved_buffers=True): nothing but autograd holds gate/up, so the backward
    writes over them (and frees them), bitwise the gradients of the default, which does not."""
    gen = torch.Generator().manual_seed(3)
    x = _bf16(*shape, gen=gen).to(device)
    mlp = swiglu.SwiGLUMLP(16, 48, impl="triton", dtype=torch.bfloat16, device=device)
    grads = {}
    for reuse in (True, False):
        mlp.reuse_saved_buffers = reuse
        xr = x.clone().requires_grad_()
        mlp.zero_grad(set_to_none=True)
        with _LeanSpy() as spy:
            mlp(xr).float().sum().backward()
        assert spy.calls == [reuse], spy.calls
        grads[reuse] = [xr.grad] + [p.grad for p in mlp.parameters()]
    for a, b in zip(grads[True], grads[False]):
        assert torch.equal(a, b) and a.abs().max() > 0


def test_who_may_be_consumed(device):
    """In process, without reading anything freed: the raw op and the default never write the
    saved tensors; reuse_saved_buffers does, unless a saved-tensor hook replaced them."""
    gen = torch.Generator().manual_seed(4)
    x = _bf16(4, 16, gen=gen).to(device).requires_grad_()
    w = [_bf16(*s, gen=gen).to(device).requires_grad_() for s in ((48, 16), (48, 16), (16, 48))]
    with _LeanSpy() as spy:
        out, gate, up, _ = ops.mlp_forward(x, *w, "triton", False)
        out.sum().backward()
        swiglu.swiglu_mlp(x, *w, impl="triton").sum().backward()
        assert spy.calls == [False, False], "the raw op or the default wrote over the saved gate/up"
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
            out = swiglu.swiglu_mlp(x, *w, impl="triton", reuse_saved_buffers=True)
        out.sum().backward()
        assert spy.calls[-1] is False, "consumed tensors a saved-tensor hook handed back"
        swiglu.swiglu_mlp(x, *w, impl="triton", reuse_saved_buffers=True).sum().backward()
        assert spy.calls[-1] is True, "reuse_saved_buffers no longer consumes"


def test_opcheck_every_op_in_every_mode(device):
    """torch.library.opcheck on the forward op in both modes and on both backward ops, Triton
    path (the reference path: tests/library/test_module.py, tests/library/test_forward.py). The lean forward,
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
