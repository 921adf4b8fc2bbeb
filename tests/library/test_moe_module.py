"""``swiglu.SwiGLUExperts``: transformers' experts state dict, the functional op's results and
gradients, its initialisation and its argument errors (CPU; Triton under the interpreter)."""

from __future__ import annotations

import math

import pytest
import torch

import swiglu

E, H, I, T, K = 8, 64, 32, 10, 2


def _routing(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    top_k_weights, top_k_index = torch.softmax(torch.randn(T, E, generator=g), -1).topk(K)
    return x, top_k_index, top_k_weights


def test_loads_transformers_experts_and_gives_their_results():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K)
    config._experts_implementation = "eager"
    theirs = Qwen3MoeExperts(config)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    ours = swiglu.SwiGLUExperts(E, H, I, impl="reference")
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x, idx, w = _routing(0)
    assert torch.equal(ours(x, idx, w), theirs(x, idx, w))


@pytest.mark.parametrize("limit, alpha", [(None, None), (0.25, None), (0.25, 1.702)], ids=["plain", "limit", "limit_alpha"])
@pytest.mark.parametrize("impl, dtype", [("reference", torch.float32), ("triton", torch.bfloat16)])
def test_forward_and_gradients_are_the_functional_ops(impl, dtype, limit, alpha):
    module = swiglu.SwiGLUExperts(E, H, I, impl=impl, dtype=dtype, swiglu_limit=limit, swiglu_alpha=alpha)
    x, idx, w = _routing(1, dtype)
    x.requires_grad_()
    out = module(x, idx, w)
    go = torch.randn_like(out)
    out.backward(go)
    leaves = [t.detach().clone().requires_grad_() for t in (x, module.gate_up_proj, module.down_proj)]
    ref = swiglu.swiglu_moe(leaves[0], idx, w, leaves[1], leaves[2], impl=impl, swiglu_limit=limit, swiglu_alpha=alpha)
    ref.backward(go)
    assert torch.equal(out, ref)
    if limit is not None:  # the limit clamps (and alpha changes the form)
        assert not torch.equal(out, swiglu.swiglu_moe(x.detach(), idx, w, module.gate_up_proj, module.down_proj, impl=impl))
    if alpha is not None:
        assert f"swiglu_limit={limit}, swiglu_alpha={alpha}" in repr(module)
    for got, want in zip((x.grad, module.gate_up_proj.grad, module.down_proj.grad), (t.grad for t in leaves)):
        assert torch.equal(got, want)


def test_initialisation_is_nn_linears_per_expert_and_keys_are_transformers():
    torch.manual_seed(0)
    module = swiglu.SwiGLUExperts(E, H, I)
    assert list(module.state_dict()) == ["gate_up_proj", "down_proj"]
    assert module.gate_up_proj.shape == (E, 2 * I, H) and module.down_proj.shape == (E, H, I)
    for w, fan_in in ((module.gate_up_proj, H), (module.down_proj, I)):
        bound = 1 / math.sqrt(fan_in)
        assert w.abs().max() <= bound
        assert abs(w.std().item() - bound / math.sqrt(3)) < 0.05 * bound  # U(-b, b): std b / sqrt(3)
    assert "num_experts=8, hidden_size=64, intermediate_size=32, impl='auto'" in repr(module)
    meta = swiglu.SwiGLUExperts(E, H, I, device="meta")
    assert meta.gate_up_proj.is_meta


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_experts=0), ValueError, "num_experts must be a positive int"),
        (dict(num_experts=2.0), TypeError, "num_experts must be a positive int"),
        (dict(hidden_size=True), TypeError, "hidden_size must be a positive int"),
        (dict(intermediate_size=-1), ValueError, "intermediate_size must be a positive int"),
        (dict(dtype=torch.int32), TypeError, "dtype must be one of"),
        (dict(impl="cuda"), ValueError, "impl"),
        (dict(reuse_saved_buffers=1), TypeError, "reuse_saved_buffers must be a bool"),
        (dict(swiglu_limit=-1.0), ValueError, "swiglu_limit must be positive"),
        (dict(swiglu_limit="7"), TypeError, "swiglu_limit must be a float or None"),
        (dict(swiglu_alpha=0.0), ValueError, "swiglu_alpha must be positive"),
        (dict(device="nowhere"), ValueError, "device must be"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, error, match):
    args = {"num_experts": E, "hidden_size": H, "intermediate_size": I}
    args.update({k: kwargs.pop(k) for k in list(kwargs) if k in args})
    with pytest.raises(error, match=match):
        swiglu.SwiGLUExperts(*args.values(), **kwargs)


def test_bad_inputs_are_the_ops_errors():
    module = swiglu.SwiGLUExperts(E, H, I)
    x, idx, w = _routing(2)
    with pytest.raises(ValueError, match="top_k_index must hold expert ids"):
        module(x, idx + E, w)
    with pytest.raises(ValueError, match="hidden_size"):
        module(x[:, :-1], idx, w)
