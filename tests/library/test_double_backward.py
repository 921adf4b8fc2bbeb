"""Double backward through swiglu_mlp / SwiGLUMLP.

``create_graph=True`` used to fail with PyTorch's "no autograd formula was registered"; the
autograd formula now falls back to the reference formula in differentiable ops. Checked with
torch.autograd.gradcheck / gradgradcheck in float64 at tiny shapes (finite differences), and
against the plain nn.Linear MLP for a gradient penalty.
"""

import zlib

import pytest
import torch

import swiglu
from swiglu.kernels import tl_kernels as kernels

from mlp_pairs import mlp_pair

H, I = 8, 16
PARAM_NAMES = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")


def _gen(request):
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.mark.parametrize("leading", [(3,), (2, 2)], ids=str)
@pytest.mark.parametrize("frozen", [None, 1, 3], ids=["all", "gate_weight_frozen", "down_weight_frozen"])
def test_gradcheck_and_gradgradcheck(request, leading, frozen):
    gen = _gen(request)
    shapes = [leading + (4,), (6, 4), (6, 4), (4, 6)]
    inputs = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_(i != frozen) for i, s in enumerate(shapes)]

    def f(*args):
        return swiglu.swiglu_mlp(*args, impl="reference")

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def _pair(request, dtype, impl, device="cpu"):
    gen = _gen(request)
    ours, plain = mlp_pair(gen, H, I, dtype, impl, device)
    x = torch.randn(2, 5, H, generator=gen, dtype=torch.float64).to(device, dtype)
    go = torch.randn(2, 5, H, generator=gen, dtype=torch.float64).to(device, dtype)
    return ours, plain, x, go


def _gradient_penalty(module, x, go):
    """d/dparams of ||d(out . go)/dx||^2 plus the first-order grad_x: needs create_graph=True."""
    x = x.clone().requires_grad_(True)
    (grad_x,) = torch.autograd.grad(module(x), x, go, create_graph=True)
    grad_x.square().sum().backward()
    return [grad_x.detach(), x.grad] + [dict(module.named_parameters())[n].grad for n in PARAM_NAMES]


def test_gradient_penalty_matches_plain_float64(request):
    ours, plain, x, go = _pair(request, torch.float64, "reference")
    for name, a, b in zip(("grad_x", "x.grad") + PARAM_NAMES, _gradient_penalty(ours, x, go), _gradient_penalty(plain, x, go)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("impl", ["triton", "auto"])
def test_double_backward_uses_the_reference_formula(request, monkeypatch, impl, device):
    """Whatever backward_impl, create_graph=True gives the reference formula's gradients (bf16,
    bit for bit) and launches no Triton kernel."""
    pytest.importorskip("swiglu.kernels.backward")

    class _NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("a Triton kernel was launched under create_graph=True")

    for name in ("dswiglu_gemm_kernel", "grad_weight_kernel", "grad_x_kernel", "grad_x_split_tail_kernel"):
        monkeypatch.setattr(kernels, name, _NoLaunch())
    ours, _, x, go = _pair(request, torch.bfloat16, impl, device)
    ref = swiglu.SwiGLUMLP(H, I, impl="reference", dtype=torch.bfloat16).to(device)
    ref.load_state_dict(ours.state_dict())
    for name, a, b in zip(("grad_x", "x.grad") + PARAM_NAMES, _gradient_penalty(ours, x, go), _gradient_penalty(ref, x, go)):
        assert torch.isfinite(a).all() and torch.equal(a, b), name
