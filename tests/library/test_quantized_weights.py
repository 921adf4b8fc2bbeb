"""Quantized weights (a tensor subclass in ``nn.Linear.weight``) take the projections' own forward.

torchao's ``quantize_`` keeps each projection an ``nn.Linear`` and swaps its weight for a tensor
subclass whose dispatch implements the linear (``TorchAoConfig`` does it at load, after a class
patched by ``patch_classes`` is built). The fused op cannot read such a weight; the MLP must run the
projections as modules, with one warning naming the weight. ``Int8WeightOnly`` below is a minimal
weight-only int8 wrapper subclass built as torchao's are (``_make_wrapper_subclass``, a dispatch
that dequantizes for the ops ``nn.Linear`` needs and raises ``NotImplementedError`` for any other,
the fused custom op included), so CI needs no torchao. DTensor and the tracing tensors (FakeTensor
under ``torch.export``) stay on the fused op.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_map

import swiglu
from swiglu.module import PlainSwiGLUMLP, projection_reason

aten = torch.ops.aten
H, I = 16, 48
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


class Int8WeightOnly(torch.Tensor):
    """Per-row symmetric int8 weight with a scale, dequantized where ``nn.Linear`` needs it."""

    @staticmethod
    def __new__(cls, qdata, scale, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=dtype, device=qdata.device)

    def __init__(self, qdata, scale, dtype):
        self.qdata, self.scale = qdata, scale

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> "Int8WeightOnly":
        w = weight.detach()
        scale = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
        return cls(torch.round(w / scale).to(torch.int8), scale, w.dtype)

    def dequantize(self) -> torch.Tensor:
        return self.qdata.to(self.dtype) * self.scale.to(self.dtype)

    def __repr__(self):
        return f"Int8WeightOnly(shape={tuple(self.shape)}, dtype={self.dtype})"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.detach.default:  # nn.Parameter(subclass) detaches
            return cls(args[0].qdata, args[0].scale, args[0].dtype)
        if func in (aten.t.default, aten.mm.default, aten.addmm.default, aten.linear.default, aten.matmul.default):

            def plain(t):
                return t.dequantize() if isinstance(t, cls) else t

            return func(*tree_map(plain, args), **tree_map(plain, kwargs))
        raise NotImplementedError(f"{cls.__name__} dispatch: attempting to run unimplemented operator/function: {func}")


def quantize_(mlp: nn.Module) -> None:
    """What torchao's ``quantize_(mlp, Int8WeightOnlyConfig())`` does to the projections: the
    modules stay, each weight becomes a frozen parameter holding the subclass."""
    for name in PROJECTIONS:
        proj = getattr(mlp, name)
        proj.weight = nn.Parameter(Int8WeightOnly.quantize(proj.weight), requires_grad=False)


def dequantized_copy(mlp: nn.Module, plain: nn.Module) -> None:
    """Give ``plain``'s projections the values ``mlp``'s quantized weights stand for (frozen too)."""
    for name in PROJECTIONS:
        getattr(plain, name).weight = nn.Parameter(getattr(mlp, name).weight.dequantize(), requires_grad=False)


def _mlp_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning) and "SwiGLUMLP" in str(w.message)]


@pytest.mark.parametrize("dtype, impl", [(torch.float64, "reference"), (torch.float64, "auto"), (torch.bfloat16, "triton")])
def test_swiglu_mlp_with_quantized_weights_runs_its_projections(dtype, impl):
    """Output and grad_x equal the plain MLP's on the dequantized weights (float64 to 1e-12;
    bf16: the same ops, bitwise); one warning over three calls naming the weight's class."""
    torch.manual_seed(0)
    ours = swiglu.SwiGLUMLP(H, I, impl=impl, dtype=dtype)
    quantize_(ours)
    assert type(ours.gate_proj) is nn.Linear and isinstance(ours.gate_proj.weight, nn.Parameter)
    plain = PlainSwiGLUMLP(H, I, dtype=dtype)
    dequantized_copy(ours, plain)
    x = torch.randn(2, 5, H, dtype=dtype, generator=torch.Generator().manual_seed(1))
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for module in (ours, ours, ours, plain):
            xr = x.clone().requires_grad_()
            out = module(xr)
            out.backward(torch.ones_like(out))
            results.append((out.detach(), xr.grad))
    mine = _mlp_warnings(caught)
    assert len(mine) == 1, mine
    assert "gate_proj.weight is a" in mine[0] and "Int8WeightOnly" in mine[0], mine[0]
    tol = 1e-12 if dtype == torch.float64 else 0
    (out, grad_x), (want_out, want_grad_x) = results[2], results[3]
    torch.testing.assert_close(out, want_out, rtol=tol, atol=tol)
    torch.testing.assert_close(grad_x, want_grad_x, rtol=tol, atol=tol)


def test_one_quantized_projection_is_named():
    ours = swiglu.SwiGLUMLP(H, I, impl="reference", dtype=torch.float64)
    ours.down_proj.weight = nn.Parameter(Int8WeightOnly.quantize(ours.down_proj.weight), requires_grad=False)
    assert projection_reason("gate_proj", ours.gate_proj) is None
    reason = projection_reason("down_proj", ours.down_proj)
    assert reason.startswith("down_proj.weight is a ") and "Int8WeightOnly" in reason, reason


def test_plain_and_parameter_weights_stay_fused():
    """A Parameter wrapping a plain tensor, or a plain tensor put where the Parameter was: no reason."""
    lin = nn.Linear(H, I, bias=False)
    assert projection_reason("gate_proj", lin) is None
    del lin.weight
    lin.weight = torch.randn(I, H)  # a plain attribute now, not in _parameters
    assert projection_reason("gate_proj", lin) is None


def test_a_bias_outside_the_parameters_is_caught():
    """The fast check reads ``_parameters``; a bias kept elsewhere (a buffer) still counts."""
    lin = nn.Linear(H, I, bias=False)
    del lin.bias
    lin.register_buffer("bias", torch.ones(I))
    assert projection_reason("up_proj", lin) == "up_proj has a bias; the fused op has none"


def test_a_parametrized_quantized_weight_is_caught():
    from torch.nn.utils import parametrize

    class Double(nn.Module):
        def forward(self, w):
            return w * 2

    lin = nn.Linear(H, I, bias=False, dtype=torch.float64)
    parametrize.register_parametrization(lin, "weight", Double())
    assert projection_reason("up_proj", lin) is None
    lin.parametrizations.weight.original = nn.Parameter(
        Int8WeightOnly.quantize(lin.parametrizations.weight.original), requires_grad=False
    )
    assert "up_proj.weight is a" in projection_reason("up_proj", lin)


def test_export_keeps_the_fused_op():
    """torch.export traces with FakeTensor weights: the fused custom op stays in the graph, no warning."""
    ours = swiglu.SwiGLUMLP(H, I, impl="reference")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = torch.export.export(ours, (torch.randn(2, 5, H),))
    assert not _mlp_warnings(caught), _mlp_warnings(caught)
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert any("swiglu.mlp_forward" in t for t in targets), targets


# --------------------------------------------------------------------------- Hugging Face


def _tiny_llama(dtype=torch.float64):
    transformers = pytest.importorskip("transformers", minversion="5.3")
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=64,
        max_position_embeddings=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(dtype)


def test_hf_model_quantized_after_apply_runs_the_original_forward():
    """apply, then quantize the MLP's projections (as TorchAoConfig does to a model built by
    patched classes): the MLP warns, runs LlamaMLP.forward, and gives the unpatched model's
    logits and input gradients."""
    from swiglu.integrations import transformers as swiglu_hf

    ours = _tiny_llama()
    plain = copy.deepcopy(ours)
    assert swiglu_hf.apply(ours, impl="reference") == ["model.layers.0.mlp"]
    quantize_(ours.model.layers[0].mlp)
    dequantized_copy(ours.model.layers[0].mlp, plain.model.layers[0].mlp)
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(2))
    with pytest.warns(UserWarning, match=r"runs its original forward: gate_proj\.weight is a .*Int8WeightOnly"):
        out = ours(ids, labels=ids)
    out.loss.backward()
    want = plain(ids, labels=ids)
    want.loss.backward()
    torch.testing.assert_close(out.logits, want.logits, rtol=1e-12, atol=1e-12)
    grads = {n: p.grad for n, p in ours.named_parameters() if p.requires_grad}
    for name, p in plain.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-12, atol=1e-12, msg=name)


def test_hf_apply_leaves_a_quantized_mlp_alone():
    from swiglu.integrations import transformers as swiglu_hf

    model = _tiny_llama()
    quantize_(model.model.layers[0].mlp)
    with pytest.warns(UserWarning, match=r"left 1 LlamaMLP module\(s\) unpatched .*gate_proj\.weight is a"):
        assert swiglu_hf.apply(model) == []
    assert type(model.model.layers[0].mlp).__name__ == "LlamaMLP"
