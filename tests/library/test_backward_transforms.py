"""``swiglu_mlp_backward`` inside the wrappers users put around it: ``torch.compile`` (the call
becomes the custom op, whose result is the eager call's, bit for bit), ``torch.func.vmap``
(the reference formula per sample) and a batched backward of ``swiglu_mlp`` (the op per
example). Small shapes; Triton through the interpreter on a CPU."""

from __future__ import annotations

import pytest
import torch

import swiglu


def _inputs(device, batch=2, seq=5, hidden=32, inter=64, seed=0):
    return swiglu.make_inputs(
        batch_size=batch, seq_len=seq, hidden_size=hidden, intermediate_size=inter, device=device, seed=seed, mode="forward"
    ).as_tuple()


@pytest.mark.parametrize("impl", ["reference", "triton", "auto"])
def test_compiled_backward_is_the_eager_one(device, impl):
    torch._dynamo.reset()
    t = _inputs(device, seed=3)
    want = swiglu.swiglu_mlp_backward(*t, impl=impl)
    compiled = torch.compile(lambda *a: swiglu.swiglu_mlp_backward(*a, impl=impl), backend="eager", fullgraph=True)
    got = compiled(*t)
    assert len(got) == 4
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w)


def test_compiled_backward_still_rejects_a_bad_impl(device):
    torch._dynamo.reset()
    t = _inputs(device)
    with pytest.raises(ValueError, match="impl must be one of"):
        torch.compile(lambda *a: swiglu.swiglu_mlp_backward(*a, impl="bogus"), backend="eager")(*t)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_vmap_over_the_backward_is_the_reference_per_sample(device, impl):
    t = _inputs(device, batch=3, seq=4, seed=5)
    weights = t[5:]
    got = torch.func.vmap(lambda go, x, g, u, a: swiglu.swiglu_mlp_backward(go, x, g, u, a, *weights, impl=impl))(*t[:5])
    for i in range(3):
        want = swiglu.swiglu_mlp_backward(*(a[i] for a in t[:5]), *weights, impl="reference")
        for g, w in zip(got, want):
            assert torch.equal(g[i], w)


@pytest.mark.parametrize("how", ["is_grads_batched", "jacobian"])
def test_batched_backward_through_triton_is_the_per_row_one(device, how):
    """``autograd.grad(..., is_grads_batched=True)`` and ``jacobian(vectorize=True)`` run
    ``swiglu_mlp``'s backward under torch's older vmap (batched grad_output, no storage): the op
    per example, bitwise each row's own backward."""
    t = _inputs(device, batch=1, seq=4, seed=6)
    x, ws = t[1].detach(), [w.detach() for w in t[5:]]
    leaves = [a.clone().requires_grad_() for a in [x, *ws]]
    out = swiglu.swiglu_mlp(*leaves, impl="triton")
    grads = torch.randn(3, *out.shape, generator=torch.Generator().manual_seed(7)).to(device, out.dtype)
    wrt = leaves
    if how == "is_grads_batched":
        got = torch.autograd.grad(out, wrt, grads, is_grads_batched=True, retain_graph=True)
    else:  # d out / d x for three elements of out (one backward each: the interpreter is slow)
        first3 = lambda a: swiglu.swiglu_mlp(a, *ws, impl="triton").reshape(-1)[:3]  # noqa: E731
        got = [torch.autograd.functional.jacobian(first3, x, vectorize=True)]
        grads = torch.eye(out.numel(), dtype=out.dtype, device=device)[:3].reshape(3, *out.shape)
        wrt = leaves[:1]
    for b in range(3):
        want = torch.autograd.grad(out, wrt, grads[b], retain_graph=True)
        for g, r in zip(got, want):
            assert r.abs().sum() > 0 and torch.equal(g[b], r)


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("how", ["forward_ad", "jacobian_forward_mode"])
def test_forward_mode_ad_takes_the_plain_formula(device, impl, how):
    """Forward-mode AD through ``swiglu_mlp`` (a dual tensor, ``jacobian(strategy="forward-mode")``):
    the plain formula's tangents (the autograd.Function has no jvp), equal to nn.Linear's."""
    import torch.autograd.forward_ad as fwAD
    import torch.nn.functional as F

    t = _inputs(device, batch=1, seq=3, seed=8)
    x, ws = t[1].detach(), [w.detach() for w in t[5:]]
    plain = lambda a: F.linear(F.silu(F.linear(a, ws[0])) * F.linear(a, ws[1]), ws[2])  # noqa: E731
    ours = lambda a: swiglu.swiglu_mlp(a, *ws, impl=impl)  # noqa: E731
    if how == "forward_ad":
        tangent = torch.randn_like(x)
        with fwAD.dual_level():
            got = fwAD.unpack_dual(ours(fwAD.make_dual(x, tangent))).tangent
            want = fwAD.unpack_dual(plain(fwAD.make_dual(x, tangent))).tangent
    else:
        got = torch.autograd.functional.jacobian(ours, x, vectorize=True, strategy="forward-mode")
        want = torch.autograd.functional.jacobian(plain, x, vectorize=True, strategy="forward-mode")
    assert want.abs().sum() > 0 and torch.equal(got, want)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_compiled_transform_of_the_function_is_the_eager_transform(device, transform):
    """torch.compile of torch.func.grad / vmap over ``swiglu_mlp``: the plain formula inside the
    transform, as eager (the custom op has no functorch rules), whole-graph."""
    torch._dynamo.reset()
    t = _inputs(device, batch=2, seq=3, seed=9)
    x, ws = t[1].detach(), [w.detach() for w in t[5:]]
    if transform == "grad":
        f = torch.func.grad(lambda g: swiglu.swiglu_mlp(x, g, *ws[1:]).float().sum())
        arg = ws[0]
    else:
        f = torch.func.vmap(lambda a: swiglu.swiglu_mlp(a, *ws))
        arg = x
    want = f(arg)
    got = torch.compile(f, backend="eager", fullgraph=True)(arg)
    assert want.abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)
