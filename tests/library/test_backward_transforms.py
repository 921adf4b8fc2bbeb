"""``swiglu_mlp_backward`` inside the wrappers users put around it: ``torch.compile`` (the call
becomes the custom op, whose result is the eager call's, bit for bit) and ``torch.func.vmap``
(the reference formula per sample). Small shapes; Triton through the interpreter on a CPU."""

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
