"""Hooks, adapters and wrapped projections are never bypassed, and torch.func
transforms work.

``SwiGLUMLP``'s fused op reads the three weights directly; where a projection's own forward would
compute something else (hooks, a LoRA adapter, a Linear subclass, a bias, a parametrization that
is not of the weight), the module runs the plain formula through the projections, with one
UserWarning per instance. Each case is checked against ``PlainSwiGLUMLP`` carrying the same
hook/adapter (float64: outputs and every gradient, adapters included, to 1e-12).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import swiglu
from swiglu.module import PlainSwiGLUMLP

H, I = 16, 48
F64 = torch.float64


def _pair(seed=0):
    torch.manual_seed(seed)
    ours = swiglu.SwiGLUMLP(H, I, dtype=F64, impl="reference")
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    plain = PlainSwiGLUMLP(H, I, dtype=F64)
    plain.load_state_dict(ours.state_dict())
    return ours, plain


def _x(seed=1):
    return torch.randn(2, 3, H, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _close(got, want, name):
    assert got is not None and want is not None, name
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err <= 1e-12, f"{name}: relative error {err:.3e}"


def _step(module, x):
    xr = x.clone().requires_grad_()
    out = module(xr)
    out.backward(torch.ones_like(out))
    return out.detach(), xr.grad, {n: p.grad for n, p in module.named_parameters() if p.requires_grad}


def _check_same(ours, plain, x, expect_warning=True):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _step(ours, x)
        _step(ours, x)  # a second call: no second warning
        ours.zero_grad(set_to_none=True)
        got = _step(ours, x)
    mine = [w for w in caught if issubclass(w.category, UserWarning) and "SwiGLUMLP" in str(w.message)]
    assert len(mine) == (1 if expect_warning else 0), [str(w.message) for w in mine]
    want = _step(plain, x)
    _close(got[0], want[0], "out")
    _close(got[1], want[1], "grad_x")
    assert set(got[2]) == set(want[2]), (sorted(got[2]), sorted(want[2]))
    for name in want[2]:
        _close(got[2][name], want[2][name], f"{name}.grad")
    return mine[0].message if mine else None


def test_forward_pre_hook_on_gate_proj():
    ours, plain = _pair()
    for m in (ours, plain):
        m.gate_proj.register_forward_pre_hook(lambda mod, args: (args[0] * 0.5,))
    msg = _check_same(ours, plain, _x())
    assert "gate_proj has a forward pre-hook" in str(msg)


def test_forward_hook_on_down_proj():
    ours, plain = _pair()
    for m in (ours, plain):
        m.down_proj.register_forward_hook(lambda mod, args, out: out * 2 + 1)
    assert "down_proj has a forward hook" in str(_check_same(ours, plain, _x()))


def test_backward_hook_on_up_proj():
    seen = []
    ours, plain = _pair()
    for m in (ours, plain):
        m.up_proj.register_full_backward_hook(lambda mod, gi, go: seen.append(go[0].shape) or None)
    _check_same(ours, plain, _x())
    assert len(seen) == 4 and all(s == (2, 3, I) for s in seen), seen  # 3 steps of ours, 1 of plain


class _LoRALinear(nn.Module):
    """A LoRA wrapper with PEFT's structure: base_layer (the frozen nn.Linear), lora_A, lora_B,
    scaling, and ``weight`` forwarded to the base layer (what made the bypass silent)."""

    def __init__(self, base: nn.Linear, r=4, alpha=8):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False, dtype=base.weight.dtype)
        self.lora_B = nn.Linear(r, base.out_features, bias=False, dtype=base.weight.dtype)
        nn.init.normal_(self.lora_B.weight)  # PEFT starts B at zero; non-zero so the adapter shows
        self.scaling = alpha / r
        base.weight.requires_grad_(False)

    @property
    def weight(self):
        return self.base_layer.weight

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


def test_lora_style_wrapper_gets_gradients():
    ours, plain = _pair()
    for m in (ours, plain):
        torch.manual_seed(5)
        m.gate_proj = _LoRALinear(m.gate_proj)
    msg = _check_same(ours, plain, _x())
    assert "gate_proj is a" in str(msg) and "_LoRALinear" in str(msg)
    assert ours.gate_proj.lora_A.weight.grad.abs().max() > 0


def test_peft_lora():
    peft = pytest.importorskip("peft")
    ours, plain = _pair()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "down_proj"], init_lora_weights=False)
    torch.manual_seed(6)
    ours = peft.get_peft_model(ours, config)
    torch.manual_seed(6)
    plain = peft.get_peft_model(plain, config)
    msg = _check_same(ours, plain, _x())
    assert "down_proj" in str(msg) or "gate_proj" in str(msg)
    grads = {n: p.grad for n, p in ours.named_parameters() if "lora_" in n}
    assert grads and all(g is not None and g.abs().max() > 0 for g in grads.values()), grads.keys()


class _ScaledLinear(nn.Linear):
    """A Linear subclass that keeps .weight but computes something else (as float8 / quantized
    training Linears do)."""

    def forward(self, x):
        return super().forward(x) * 0.75


def test_linear_subclass():
    ours, plain = _pair()
    for m in (ours, plain):
        swapped = _ScaledLinear(I, H, bias=False, dtype=F64)
        swapped.load_state_dict(m.down_proj.state_dict())
        m.down_proj = swapped
    assert "down_proj is a" in str(_check_same(ours, plain, _x()))


def test_weight_parametrization_stays_fused():
    """A parametrized weight is read through its parametrization: the fused path is right."""
    from torch.nn.utils import parametrize

    class Double(nn.Module):
        def forward(self, w):
            return w * 2

    ours, plain = _pair()
    for m in (ours, plain):
        parametrize.register_parametrization(m.up_proj, "weight", Double())
    _check_same(ours, plain, _x(), expect_warning=False)


def test_plain_module_takes_the_fused_op(monkeypatch):
    """No hooks, no adapters: the custom op runs, no warning."""
    import swiglu.ops as ops

    calls = []
    original = ops._forward
    monkeypatch.setattr(ops, "_forward", lambda *a: calls.append(1) or original(*a))
    ours, plain = _pair()
    _check_same(ours, plain, _x(), expect_warning=False)
    assert calls, "the fused op did not run"


@pytest.mark.parametrize("save_activated_gate", [False, True])
def test_torch_func_grad_of_functional_call(save_activated_gate):
    """torch.func.grad (and vmap of it) through functional_call(SwiGLUMLP) gives
    torch.func.grad of the plain module."""
    from torch.func import functional_call, grad, vmap

    ours, plain = _pair(seed=7)
    ours.save_activated_gate = save_activated_gate
    params = {k: v.detach() for k, v in ours.named_parameters()}
    x = _x(8)

    def loss(module):
        return lambda ps, inp: functional_call(module, ps, (inp,)).pow(2).sum()

    got, want = grad(loss(ours))(params, x), grad(loss(plain))(params, x)
    for k in want:
        _close(got[k], want[k], k)
    got_x = vmap(grad(lambda inp: loss(ours)(params, inp)))(x)
    want_x = vmap(grad(lambda inp: loss(plain)(params, inp)))(x)
    _close(got_x, want_x, "vmap grad_x")
