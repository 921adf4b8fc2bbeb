"""The library under the tools users wrap around training: compiled autograd (the backward traced
by torch.compile over an eager forward), ``FlopCounterMode`` (MFU loggers), and the backward
entry point's own differentiability under ``torch.compile``. Small shapes; Triton through the
interpreter on a CPU."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import swiglu
from swiglu import ops
from swiglu.checks import ALL_NEEDS

H, I = 16, 48


def _gen(request):
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _module(request, impl, device, dtype=torch.bfloat16, **kwargs):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return swiglu.SwiGLUMLP(H, I, impl=impl, dtype=dtype, device=device, **kwargs)


def _grads(m, x):
    return [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]


def _compiled_autograd(kind, fullgraph):
    if kind == "torch_helper":  # what torchtitan enables: inductor over the traced backward
        from torch._dynamo.utils import maybe_enable_compiled_autograd

        return maybe_enable_compiled_autograd(True, fullgraph=fullgraph, dynamic=False)
    return torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=fullgraph))


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "saved_activated_gate"])
@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph_breaks_allowed"])
@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_compiled_autograd_is_bitwise_eager(request, impl, fullgraph, lean, device):
    m = _module(request, impl, device, save_activated_gate=not lean)
    gen = _gen(request)
    x0 = torch.randn(7, H, generator=gen).bfloat16().to(device)
    go = torch.randn(7, H, generator=gen).bfloat16().to(device)
    want = []
    for compiled in (False, True):
        torch._dynamo.reset()
        m.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        y = m(x)
        if compiled:
            with _compiled_autograd("aot_eager", fullgraph):
                y.backward(go)
            got = _grads(m, x)
            assert all(torch.equal(g, w) for g, w in zip(got, want)), impl
        else:
            y.backward(go)
            want = _grads(m, x)
    torch._dynamo.reset()


def test_compiled_autograd_with_torchs_inductor_helper(request, device):
    m = _module(request, "triton", device)
    x = torch.randn(5, H, generator=_gen(request)).bfloat16().to(device).requires_grad_(True)
    m(x).sum().backward()
    want = _grads(m, x)
    m.zero_grad(set_to_none=True)
    x.grad = None
    torch._dynamo.reset()
    y = m(x)
    with _compiled_autograd("torch_helper", fullgraph=True):
        y.sum().backward()
    torch._dynamo.reset()
    assert all(torch.equal(g, w) for g, w in zip(_grads(m, x), want))


# --------------------------------------------------------------------------- FLOP counts


def _count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "saved_activated_gate"])
@pytest.mark.parametrize("impl", ["triton", "reference", "auto"])
def test_flop_counter_sees_every_gemm(request, impl, lean, device):
    """18 T H I over forward and backward, as the plain nn.Linear MLP counts, on every path: the
    module, the custom op called directly, and the backward entry point alone (12 T H I)."""
    tokens = 64
    m = _module(request, impl, device, save_activated_gate=not lean)
    gen = _gen(request)
    x = torch.randn(tokens, H, generator=gen).bfloat16().to(device).requires_grad_(True)
    w = (m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)

    def plain_step():  # the same formula in nn.Linear's ops
        F = torch.nn.functional
        F.linear(F.silu(F.linear(x, w[0])) * F.linear(x, w[1]), w[2]).sum().backward()

    assert _count(plain_step) == 18 * tokens * H * I
    assert _count(lambda: m(x).sum().backward()) == 18 * tokens * H * I
    assert _count(lambda: torch.ops.swiglu.mlp_forward(x, *w, impl, not lean)[0].sum().backward()) == 18 * tokens * H * I
    t = swiglu.make_inputs(
        batch_size=2, seq_len=tokens // 2, hidden_size=H, intermediate_size=I, device=device, seed=1, mode="forward"
    ).as_tuple()
    t = tuple(a.bfloat16() for a in t)
    assert _count(lambda: swiglu.swiglu_mlp_backward(*t, impl=impl)) == 12 * tokens * H * I
    # a frozen gate_weight: no d_gate.T @ x
    assert _count(lambda: ops.mlp_backward(*t, True, False, True, True, impl)) == 10 * tokens * H * I
    assert _count(lambda: ops.mlp_backward(*t, False, False, False, True, impl)) == 2 * tokens * H * I


# --------------------------------------------------------------------------- the backward entry point


def _saved(request, dtype, requires_grad, device="cpu"):
    gen = _gen(request)
    x = torch.randn(2, 5, H, generator=gen, dtype=torch.float64)
    w = [torch.randn(*s, generator=gen, dtype=torch.float64) / s[1] ** 0.5 for s in ((I, H), (I, H), (H, I))]
    gate, up = x @ w[0].t(), x @ w[1].t()
    go = torch.randn(2, 5, H, generator=gen, dtype=torch.float64)
    t = [go, x, gate, up, torch.nn.functional.silu(gate), *w]
    return tuple(a.to(device, dtype).requires_grad_(requires_grad and i in (1, 5, 6, 7)) for i, a in enumerate(t))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_backward_under_compile_with_inputs_requiring_grad(request, impl, device):
    """Weights that are parameters (they require grad): the compiled call is the eager one, bitwise,
    and its gradients are differentiable like the eager ones."""
    dtype = torch.bfloat16 if impl == "triton" else torch.float64
    t = _saved(request, dtype, requires_grad=True, device=device)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: swiglu.swiglu_mlp_backward(*a, impl=impl), backend="aot_eager")
    got = compiled(*t)
    want = swiglu.swiglu_mlp_backward(*t, impl=impl)
    torch._dynamo.reset()
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert all(g.requires_grad for g in got) and all(w.requires_grad for w in want)
    with torch.no_grad():
        assert not any(g.requires_grad for g in swiglu.swiglu_mlp_backward(*t, impl=impl))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_backward_gradients_are_differentiable_by_the_reference_formula(request, impl, device):
    """Every backend's gradients carry the reference formula's derivative (float64 reference:
    the exact second derivative; triton: the same formula's, computed in bf16)."""
    if impl == "reference":
        t = _saved(request, torch.float64, requires_grad=True)
        f = lambda *a: swiglu.swiglu_mlp_backward(*a, impl="reference")  # noqa: E731
        assert torch.autograd.gradcheck(f, t, fast_mode=True)  # a random projection of the Jacobian
        return
    t = _saved(request, torch.bfloat16, requires_grad=True, device=device)
    leaves = [t[i] for i in (1, 5, 6, 7)]
    got = torch.autograd.grad(sum((g.float() ** 2).sum() for g in swiglu.swiglu_mlp_backward(*t, impl="triton")), leaves)
    want = torch.autograd.grad(sum((g.float() ** 2).sum() for g in swiglu.reference.reference_gradients(t)), leaves)
    for g, w in zip(got, want):
        assert torch.allclose(g.float(), w.float(), rtol=0.05, atol=0.05 * w.float().abs().max().item())


def test_opcheck_every_util_with_inputs_requiring_grad(request, device):
    x = torch.randn(2, 5, H, dtype=torch.float64, generator=_gen(request)).requires_grad_(True)
    w = [(torch.randn(*s, dtype=torch.float64) / s[1] ** 0.5).requires_grad_(True) for s in ((I, H), (I, H), (H, I))]
    for lean in (False, True):
        torch.library.opcheck(ops.mlp_forward, (x, *w, "reference", not lean))
    t = _saved(request, torch.float64, requires_grad=True)
    t = tuple(a.detach().requires_grad_(True) for a in t)
    for needs in (ALL_NEEDS, (False, True, False, True), (True, False, False, False)):
        for act in (t[4], None):
            torch.library.opcheck(ops.mlp_backward, (*t[:4], act, *t[5:], *needs, "reference"))
    tb = tuple(a.detach().to(device, torch.bfloat16).requires_grad_(True) for a in t)
    torch.library.opcheck(ops.mlp_backward, (*tb[:4], None, *tb[5:], *ALL_NEEDS, "triton"))


@pytest.mark.parametrize("order", ["swiglu_first", "flop_counter_first"])
def test_flop_formulas_whichever_is_imported_first(order):
    """``import swiglu`` does not import torch.utils.flop_counter (it imports Triton); the formulas
    are registered when it is imported later, or at once when it was imported before."""
    import subprocess
    import sys

    imports = ["import swiglu", "import torch.utils.flop_counter as fc"]
    if order == "flop_counter_first":
        imports.reverse()
    code = "; ".join(
        imports
        + [
            "import sys, torch",
            "assert torch.ops.swiglu.mlp_forward in fc.flop_registry",
            "assert torch.ops.swiglu.mlp_backward in fc.flop_registry",
        ]
    )
    lean = "import sys, swiglu; assert 'torch.utils.flop_counter' not in sys.modules and 'triton' not in sys.modules"
    for c in (code, lean) if order == "swiglu_first" else (code,):
        subprocess.run([sys.executable, "-c", c], check=True, env={**__import__("os").environ, "TRITON_INTERPRET": "0"})
