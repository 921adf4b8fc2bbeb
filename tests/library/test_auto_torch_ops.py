"""``impl="auto"`` where it would pick the Triton kernels but the call holds too little work
(tokens x hidden_size x intermediate_size < ``ops.AUTO_TORCH_OPS_BELOW``): torch's own ops run, with
nn.Linear's bits and autograd; explicit ``"triton"`` and larger calls keep the kernels' route. The
GPU's decision is simulated on the CPU by making the backend resolve to Triton."""

import pytest
import torch
import torch.nn.functional as F

import swiglu
from swiglu import ops


@pytest.fixture
def kernels_route(monkeypatch):
    """Resolve every impl to "triton" (as on an H200) and record the calls that reach the kernels'
    carrier, answering them with the reference so the test runs without a GPU."""
    calls = []
    real_eager = ops._eager
    monkeypatch.setattr(ops, "resolve_impl", lambda impl, x, w: "triton")

    def eager(x, g, u, d, impl, save_activated_gate, reuse_saved_buffers):
        calls.append(impl)
        return real_eager(x, g, u, d, "reference", save_activated_gate, reuse_saved_buffers)

    monkeypatch.setattr(ops, "_eager", eager)
    return calls


def _inputs(T=5, H=16, I=24, seed=None):
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    x = torch.randn(T, H, generator=gen).requires_grad_()
    weights = [(torch.randn(*s, generator=gen) / s[1] ** 0.5).requires_grad_() for s in ((I, H), (I, H), (H, I))]
    return x, weights


def test_auto_runs_torch_ops_below_the_threshold(kernels_route):
    x, weights = _inputs()
    assert x.numel() * weights[0].shape[0] < ops.AUTO_TORCH_OPS_BELOW
    out = swiglu.swiglu_mlp(x, *weights)
    assert kernels_route == []
    x2, w2 = x.detach().clone().requires_grad_(), [w.detach().clone().requires_grad_() for w in weights]
    want = F.linear(F.silu(F.linear(x2, w2[0])) * F.linear(x2, w2[1]), w2[2])
    assert torch.equal(out, want)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *weights], grad)
    expected = torch.autograd.grad(want, [x2, *w2], grad)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_auto_keeps_the_kernels_at_or_above_the_threshold(kernels_route, monkeypatch):
    x, weights = _inputs()
    monkeypatch.setattr(ops, "AUTO_TORCH_OPS_BELOW", x.numel() * weights[0].shape[0])
    swiglu.swiglu_mlp(x, *weights)
    assert kernels_route == ["triton"]


def test_explicit_triton_keeps_the_kernels_below_the_threshold(kernels_route):
    x, weights = _inputs()
    swiglu.swiglu_mlp(x, *weights, impl="triton")
    assert kernels_route == ["triton"]


def test_threshold_is_between_the_measured_regimes():
    # Llama-3-8B's layer (4096 x 14336) at 1024 tokens: torch's ops; at 2048 and every case of the
    # Hermes-size benchmark (16384 x 53248, from 128 tokens): the kernels.
    assert 1024 * 4096 * 14336 < ops.AUTO_TORCH_OPS_BELOW <= 2048 * 4096 * 14336
    assert 128 * 16384 * 53248 >= ops.AUTO_TORCH_OPS_BELOW


def test_autocast_route_has_nn_linears_bits(kernels_route):
    # fp32 weights, a non-leaf fp32 x (a norm's output) under bf16 autocast: autocast casts x once
    # per linear, so grad_x's two parts are summed in float32; the route must do the same.
    x, weights = _inputs(T=16, H=32, I=48)
    grads = []
    for fn in (swiglu.swiglu_mlp, lambda x, g, u, d: F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)):
        for t in (x, *weights):
            t.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(x * 1.0, *weights)
        out.float().square().sum().backward()
        grads.append([t.grad.clone() for t in (x, *weights)])
    assert kernels_route == []
    for a, b in zip(*grads):
        assert torch.equal(a, b)
