"""Worker of tests/library/test_lean_ownership.py, run in its own process: before the fix a read of freed
storage killed the process (SIGSEGV on the CPU, an illegal memory access on the GPU), which must
fail one test, not the whole pytest run.

Usage: python tests/lean_ownership_worker.py DEVICE TOKENS HIDDEN INTER [CASE ...]. Each case holds,
through the memory-lean backward on the Triton path, a reference that user code can reach to the
saved gate/up storage, then reads it: it must still hold the forward's values, and the gradients
must be bitwise those of the backward that never consumes the saved activations. Prints one line
per case, ``ok <case>``, and exits 0; an assertion exits 1 with its message.
"""

from __future__ import annotations

import os
import sys

if len(sys.argv) > 1 and sys.argv[1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import swiglu  # noqa: E402
import swiglu.ops as ops  # noqa: E402


def _inputs(device, T, H, I, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).bfloat16().to(device).requires_grad_()
    w = [(torch.randn(s, generator=g) / s[1] ** 0.5).bfloat16().to(device).requires_grad_() for s in ((I, H), (I, H), (H, I))]
    return x, w


def _grads(x, w):
    return [t.grad for t in (x, *w)]


def _expected(device, T, H, I):
    """Gradients of the backward that leaves gate/up as they are (save_activated_gate=False, the
    raw op, which never writes them), and gate/up as the forward wrote them."""
    x, w = _inputs(device, T, H, I)
    out, gate, up, _ = torch.ops.swiglu.mlp_forward(x, *w, "triton", False)
    out.float().sum().backward()
    return _grads(x, w), gate.detach().clone(), up.detach().clone()


def run_case(case, device, T, H, I, want_grads, want_gate, want_up):
    x, w = _inputs(device, T, H, I)
    keep = []
    if case == "op_outputs":  # the caller keeps the op's gate/up
        out, gate, up, _ = torch.ops.swiglu.mlp_forward(x, *w, "triton", False)
        keep = [gate, up]
    elif case == "views":  # only views of them
        out, gate, up, _ = torch.ops.swiglu.mlp_forward(x, *w, "triton", False)
        keep = [gate[:], up.view(-1)]
        del gate, up
    elif case == "aliases":  # .detach() / .data: other tensors over the same storage
        out, gate, up, _ = torch.ops.swiglu.mlp_forward(x, *w, "triton", False)
        keep = [gate.detach(), up.data]
        del gate, up
    elif case == "saved_tensors_hook":  # a logger or offloader keeping what autograd saves
        stash = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: stash.append(t) or t, lambda t: t):
            out = swiglu.swiglu_mlp(x, *w, impl="triton")
        keep = [t for t in stash if t.shape == want_gate.shape]
    elif case == "grad_fn":  # autograd graph inspection
        out = swiglu.swiglu_mlp(x, *w, impl="triton")
        saved = out.grad_fn.saved_tensors
        keep = [saved[1], saved[2]]
        del saved
    elif case in REUSE_CASES:
        reuse_case(case, device, T, H, I, want_grads)
        return
    elif case == "opcheck":  # torch.library.opcheck runs the op and its autograd, then compares
        torch.library.opcheck(ops.mlp_forward, (x, *w, "triton", False))
        print("ok opcheck", flush=True)
        return
    else:
        raise SystemExit(f"unknown case {case}")
    assert len(keep) == 2, (case, len(keep))
    out.float().sum().backward()
    del out
    for got, want in zip(keep, (want_gate, want_up)):
        got = got.reshape(want.shape)
        assert torch.equal(got.clone(), want), f"{case}: the kept activation changed (overwritten by the backward)"
        assert torch.isfinite(got.float().sum())
    for name, got, want in zip(("grad_x", "grad_gate", "grad_up", "grad_down"), _grads(x, w), want_grads):
        assert torch.equal(got, want), f"{case}: {name} differs from the non-consuming backward's"
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"ok {case}", flush=True)


REUSE_CASES = ("reuse_grad_fn", "reuse_saved_tensors_hook", "moe_reuse_grad_fn", "moe_reuse_saved_tensors_hook")


def _moe_inputs(device, T, H, I, E=4, k=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).bfloat16().to(device).requires_grad_()
    w, idx = torch.softmax(torch.randn(T, E, generator=g), -1).topk(k)
    gu = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).bfloat16().to(device).requires_grad_()
    dp = (torch.randn(E, H, I, generator=g) / I**0.5).bfloat16().to(device).requires_grad_()
    return x, idx.to(device), w.to(device).requires_grad_(), gu, dp


def reuse_case(case, device, T, H, I, want_grads):
    """``reuse_saved_buffers=True`` releases the saved gate/up: whoever still holds them (the
    tensors of ``grad_fn.saved_tensors`` taken before the backward, a saved-tensor hook's) reads
    an empty tensor, and ``grad_fn.saved_tensors`` after it is a RuntimeError; gradients bitwise
    the default's."""
    moe = case.startswith("moe_")
    if moe:
        x, idx, w, gu, dp = _moe_inputs(device, T, H, I)
        leaves = (x, w, gu, dp)

        def call(reuse):
            return swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton", reuse_saved_buffers=reuse)

        gate_shape, where = (T * idx.shape[1], I), (5, 6)
    else:
        x, w = _inputs(device, T, H, I)
        leaves = (x, *w)

        def call(reuse):
            return swiglu.swiglu_mlp(x, *w, impl="triton", reuse_saved_buffers=reuse)

        gate_shape, where = (T, I), (1, 2)
    if moe:  # the default's gradients, for the bits
        want_grads = torch.autograd.grad(call(False).float().sum(), leaves)
    if case.endswith("grad_fn"):
        out = call(True)
        saved = out.grad_fn.saved_tensors
        keep = [saved[i] for i in where]
        del saved
    else:
        stash = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: stash.append(t) or t, lambda t: t):
            out = call(True)
        keep = [t for t in stash if tuple(t.shape) == gate_shape]
    assert len(keep) == 2 and all(tuple(t.shape) == gate_shape for t in keep), (case, [t.shape for t in keep])
    out.float().sum().backward(retain_graph=True)
    for t in keep:  # released: no elements left to read (a read of the old sizes crashed)
        assert t.numel() == 0 and float(t.float().sum()) == 0.0 and t.clone().numel() == 0, f"{case}: {tuple(t.shape)}"
    if case.endswith("grad_fn"):
        try:
            out.grad_fn.saved_tensors
        except RuntimeError:
            pass
        else:
            raise AssertionError(f"{case}: grad_fn.saved_tensors after the release raised nothing")
    for name, got, want in zip(("grad_x", "grad_1", "grad_2", "grad_3"), _grads(*leaves[:1], leaves[1:]), want_grads):
        assert torch.equal(got, want), f"{case}: {name} differs from the default's"
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"ok {case}", flush=True)


def main(argv):
    device, T, H, I, *cases = argv
    T, H, I = int(T), int(H), int(I)
    want = _expected(device, T, H, I)
    for case in cases:
        run_case(case, device, T, H, I, *want)


if __name__ == "__main__":
    main(sys.argv[1:])
