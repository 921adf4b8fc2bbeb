"""Zero tokens: an MoE expert that gets no tokens in a step.

``SwiGLUMLP``, ``swiglu_mlp`` and ``swiglu_mlp_backward`` accept T = 0 (x [0, H], [0, S, H] or
[B, 0, H]) on every implementation, as ``nn.Linear`` does: empty outputs and grad_x of x's shape,
weight gradients exactly zero, and no Triton kernel launched. On the GPU when there is one (the
"auto" impl is then Triton), else on the CPU with the Triton interpreter.
"""

import zlib

import pytest
import torch

import swiglu
from swiglu.kernels import tl_kernels as kernels

from mlp_pairs import mlp_pair

H, I = 16, 24  # multiples of 8, so impl="triton" accepts them
LEADING = [(0,), (0, 5), (3, 0)]
IMPLS = ["reference", "triton", "auto"]
PARAM_NAMES = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")


@pytest.fixture
def no_kernel_launch(monkeypatch):
    """Every Triton kernel replaced by one that fails the test if it is launched."""

    class _NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError(f"a kernel was launched with grid {grid} for zero tokens")

    for name in ("dswiglu_gemm_kernel", "grad_weight_kernel", "grad_x_kernel", "grad_x_split_tail_kernel"):
        monkeypatch.setattr(kernels, name, _NoLaunch())


def _dtypes(impl):
    return [torch.bfloat16] if impl == "triton" else [torch.bfloat16, torch.float64]


def _pair(request, dtype, impl, device):
    gen = torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return mlp_pair(gen, H, I, dtype, impl, device)


def _step(module, x, poison=False):
    x = x.clone().requires_grad_(True)
    if poison:  # a stale gradient from an earlier step must come back unchanged (+ 0)
        for p in module.parameters():
            p.grad = torch.full_like(p, 3.0)
    out = module(x)
    out.backward(torch.ones_like(out))
    return out, [x.grad] + [dict(module.named_parameters())[n].grad for n in PARAM_NAMES]


@pytest.mark.parametrize("leading", LEADING, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_module_matches_nn_linear(request, no_kernel_launch, impl, leading, device):
    for dtype in _dtypes(impl):
        ours, plain = _pair(request, dtype, impl, device)
        x = torch.randn(leading + (H,), dtype=dtype, device=device)
        out, grads = _step(ours, x)
        plain_out, plain_grads = _step(plain, x)
        assert out.shape == plain_out.shape == leading + (H,) and out.dtype == dtype
        for name, g, p in zip(("grad_x",) + PARAM_NAMES, grads, plain_grads):
            assert g is not None and g.shape == p.shape and g.dtype == p.dtype, name
            assert torch.equal(g, p), name  # empty grad_x, exactly zero weight gradients
        assert all(not g.count_nonzero() for g in grads[1:])
        # Accumulation: the zero-token step adds nothing to existing gradients.
        _, grads = _step(ours, x, poison=True)
        assert all(torch.equal(g, torch.full_like(g, 3.0)) for g in grads[1:])


@pytest.mark.parametrize("impl", IMPLS)
def test_module_frozen_weight(request, no_kernel_launch, impl, device):
    ours, _ = _pair(request, torch.bfloat16, impl, device)
    ours.up_proj.weight.requires_grad_(False)
    _, grads = _step(ours, torch.randn(0, H, dtype=torch.bfloat16, device=device))
    assert grads[2] is None
    assert grads[0].shape == (0, H) and not grads[1].count_nonzero() and not grads[3].count_nonzero()


@pytest.mark.parametrize("leading", LEADING, ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_backward_entry_point(no_kernel_launch, impl, leading, device):
    bf = dict(dtype=torch.bfloat16, device=device)
    args = [torch.randn(leading + (H,), **bf), torch.randn(leading + (H,), **bf)]
    args += [torch.randn(leading + (I,), **bf) for _ in range(3)]
    args += [torch.randn(I, H, **bf), torch.randn(I, H, **bf), torch.randn(H, I, **bf)]
    before = [a.clone() for a in args]
    grad_x, *grad_weights = swiglu.swiglu_mlp_backward(*args, impl=impl)
    assert grad_x.shape == leading + (H,) and grad_x.dtype == torch.bfloat16
    for g, w in zip(grad_weights, args[5:]):
        assert g.shape == w.shape and g.dtype == w.dtype and not g.count_nonzero()
    assert all(torch.equal(a, b) for a, b in zip(args, before))


def test_triton_fills_out_buffers_with_zeros(no_kernel_launch, device):
    """Preallocated outputs, NaN-poisoned, are overwritten with the zero weight gradients."""
    from swiglu.kernels.backward import triton_swiglu_backward

    bf = dict(dtype=torch.bfloat16, device=device)
    args = [torch.randn(0, H, **bf), torch.randn(0, H, **bf)] + [torch.randn(0, I, **bf) for _ in range(3)]
    args += [torch.randn(I, H, **bf), torch.randn(I, H, **bf), torch.randn(H, I, **bf)]
    out = (torch.empty(0, H, **bf), torch.full((I, H), float("nan"), **bf), None, torch.full((H, I), float("nan"), **bf))
    grads = triton_swiglu_backward(*args, out=out)
    assert grads[0].shape == (0, H) and grads[2].shape == (I, H)
    for g in (grads[1], grads[2], grads[3], out[1], out[3]):
        assert not g.count_nonzero()  # NaN counts as nonzero
    assert grads[1].data_ptr() == out[1].data_ptr() and grads[3].data_ptr() == out[3].data_ptr()
