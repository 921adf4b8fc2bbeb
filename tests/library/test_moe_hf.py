"""The "swiglu" experts implementation of swiglu.integrations.transformers on tiny random
mixture-of-experts models (CPU, configs built in code: no downloads).

Qwen3-MoE, Qwen2-MoE (a dense shared expert), Mixtral, OLMoE, DeepSeek-V3 (a dense first layer
and a shared expert), LFM2-MoE (a dense first layer, ``act_fn = F.silu``) and Aria (transposed
expert weights, [E, H, 2I] and [E, I, H]): after ``apply(model, impl="reference")`` in float32 the logits, the loss and
every parameter's gradient equal the unpatched model's (transformers' default "grouped_mm") within
F32_TOL relative (a 0.1% error planted in the op fails it); in bf16 with ``impl="triton"`` (the
Triton kernels under TRITON_INTERPRET=1) their error against a float64 copy of the model is at most
twice the unpatched bf16 model's plus a floor. The name is selectable through the config
(``experts_implementation="swiglu"``); gpt-oss's experts (biases, interleaved gate/up rows) run the
op too; experts the op cannot compute (another activation, custom gating, dense routing weights, ...) run their previous implementation with a
warning naming the reason and give the unpatched model's results.
"""

from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers", minversion="5.3")
moe_integration = pytest.importorskip("transformers.integrations.moe")

from swiglu import relative_error  # noqa: E402
from swiglu.integrations import transformers as swiglu_hf  # noqa: E402

F32_TOL = 1e-5
BF16_FACTOR, BF16_FLOOR = 2.0, 2e-3
MODULE_FACTOR, MODULE_FLOOR = 1.5, 5e-4
SMALL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
#: family: (config class, model class, config overrides, names apply returns)
FAMILIES = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(moe_intermediate_size=32, intermediate_size=96, num_experts=8, num_experts_per_tok=2),
        ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"],
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            moe_intermediate_size=32,
            intermediate_size=96,
            shared_expert_intermediate_size=48,
            num_experts=8,
            num_experts_per_tok=2,
        ),
        [
            "model.layers.0.mlp.experts",
            "model.layers.0.mlp.shared_expert",
            "model.layers.1.mlp.experts",
            "model.layers.1.mlp.shared_expert",
        ],
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),
        ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"],
    ),
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(intermediate_size=32, num_experts=8, num_experts_per_tok=2),
        ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"],
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            moe_intermediate_size=32,
            intermediate_size=96,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            n_shared_experts=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            head_dim=8,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        ["model.layers.0.mlp", "model.layers.1.mlp.experts", "model.layers.1.mlp.shared_experts"],
    ),
    # experts whose act_fn is the function F.silu, not a module
    "lfm2_moe": (
        "Lfm2MoeConfig",
        "Lfm2MoeForCausalLM",
        dict(
            moe_intermediate_size=32,
            intermediate_size=96,
            num_experts=8,
            num_experts_per_tok=2,
            num_dense_layers=1,
            layer_types=["conv", "full_attention"],
        ),
        ["model.layers.1.feed_forward.experts"],
    ),
    # transposed expert weights (gate_up_proj [E, H, 2I], down_proj [E, I, H]): the op takes their mT
    "aria": (
        "AriaTextConfig",
        "AriaTextForCausalLM",
        dict(intermediate_size=32, moe_num_experts=8, moe_topk=2, moe_num_shared_experts=1),
        [
            "model.layers.0.mlp.experts",
            "model.layers.0.mlp.shared_experts",
            "model.layers.1.mlp.experts",
            "model.layers.1.mlp.shared_experts",
        ],
    ),
}
GPT_OSS = (
    "GptOssConfig",
    "GptOssForCausalLM",
    dict(
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    [],
)


def build(family: str, dtype=torch.float32, seed: int = 0, **overrides) -> nn.Module:
    """A tiny random model of ``family``: weights std 1/sqrt(fan_in) (not HF's 0.02, so the
    experts' activations are far from zero and the router's choices are not ties), norms 1 + noise."""
    config_name, model_name, extra, _ = GPT_OSS if family == "gpt_oss" else FAMILIES[family]
    config = getattr(transformers, config_name)(**{**SMALL, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
    return model.to(dtype)


def batch(seed: int = 1, shape=(2, 12)) -> torch.Tensor:
    return torch.randint(3, SMALL["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


def step(model: nn.Module, ids: torch.Tensor):
    """Logits, loss and every parameter's gradient of one LM loss (gradients reset first)."""
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {"logits": out.logits.detach(), "loss": out.loss.detach(), **grads}


def errors(ours: dict, theirs: dict) -> dict:
    assert ours.keys() == theirs.keys(), set(ours) ^ set(theirs)
    return {k: relative_error(v.float(), theirs[k].float()) for k, v in ours.items()}


def assert_same(ours: dict, theirs: dict, tol: float, label: str = "") -> None:
    bad = {k: v for k, v in errors(ours, theirs).items() if not v <= tol}
    assert not bad, f"{label} relative errors above {tol}: {bad}"


def n_moe_layers(model: nn.Module) -> int:
    return sum(swiglu_hf._is_experts(m) for m in model.modules())


@pytest.fixture
def moe_calls(call_spy):
    """Counts the backend's calls of swiglu_moe (proves the op ran, not a fallback)."""
    return call_spy(swiglu_hf, "_swiglu_moe")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_float32_logits_loss_and_gradients_match(family, moe_calls):
    plain = build(family)
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left alone
        names = swiglu_hf.apply(ours, impl="reference")
    assert names == FAMILIES[family][3]
    assert ours.config._experts_implementation == "swiglu"
    assert plain.config._experts_implementation == "grouped_mm"
    assert ours.state_dict().keys() == plain.state_dict().keys()
    ids = batch()
    assert_same(step(ours, ids), step(plain, ids), F32_TOL, family)
    assert len(moe_calls) == n_moe_layers(ours) and all(c["impl"] == "reference" for c in moe_calls)


def test_experts_of_older_transformers_without_the_later_layout_flags_are_switched(moe_calls):
    """Earlier transformers releases' experts modules set only has_gate and has_bias (no
    is_transposed, is_concatenated or has_post_expert_norm): apply still switches them."""
    plain = build("qwen3_moe")
    ours = copy.deepcopy(plain)
    for module in ours.modules():
        for flag in ("is_transposed", "is_concatenated", "has_post_expert_norm"):
            module.__dict__.pop(flag, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swiglu_hf.apply(ours, impl="reference")
    assert ours.config._experts_implementation == "swiglu"
    ids = batch()
    assert_same(step(ours, ids), step(plain, ids), F32_TOL, "older flags")
    assert len(moe_calls) == n_moe_layers(ours)


def test_float32_check_catches_a_planted_error(monkeypatch):
    """A 0.1% error in the op's output fails the float32 comparison."""
    plain = build("qwen3_moe")
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours, impl="reference")
    real = swiglu_hf._swiglu_moe
    monkeypatch.setattr(swiglu_hf, "_swiglu_moe", lambda *a, **k: real(*a, **k) * 1.001)
    ids = batch()
    with pytest.raises(AssertionError, match="relative errors"):
        assert_same(step(ours, ids), step(plain, ids), F32_TOL)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_triton_within_bound_of_the_float64_model(family, moe_calls):
    """bf16 weights, ``impl="triton"`` (the MoE kernels, and the dense MLPs' Triton path, under
    TRITON_INTERPRET=1).

    The whole model: logits, loss and every gradient no further from a float64 copy of the model
    (the same rounded weights; its experts on transformers' eager loop, as grouped_mm has no
    float64 CPU kernel) than twice the unpatched bf16 model plus BF16_FLOOR. That bound is loose
    (the rest of the model in bf16 and routing flips put the unpatched model 1-20% away), so each
    experts module is also checked on the inputs it saw in the model: its output and the four
    gradients against ``swiglu.moe.moe_float64``, within MODULE_FACTOR times transformers'
    grouped_mm in bf16 plus MODULE_FLOOR (a 1% error planted in the op fails it; 0.1% is below a
    bf16 rounding and invisible)."""
    pytest.importorskip("swiglu.kernels.moe")
    from swiglu.moe import moe_float64

    plain = build(family, dtype=torch.bfloat16)
    ours = copy.deepcopy(plain)
    oracle = copy.deepcopy(plain).to(torch.float64)
    oracle.set_experts_implementation("eager")
    swiglu_hf.apply(ours, impl="triton")
    seen = []
    for m in ours.modules():
        if swiglu_hf._is_experts(m):
            m.register_forward_hook(lambda mod, args, out: seen.append((mod, [a.detach() for a in args])))
    ids = batch(shape=(1, 16))
    want = step(oracle, ids)
    err_ours, err_plain = errors(step(ours, ids), want), errors(step(plain, ids), want)
    bad = {k: (e, err_plain[k]) for k, e in err_ours.items() if not e <= BF16_FACTOR * err_plain[k] + BF16_FLOOR}
    assert not bad, f"{family}: (ours, unpatched) errors against float64 beyond the bound: {bad}"
    assert len(moe_calls) == n_moe_layers(ours) and all(c["impl"] == "triton" for c in moe_calls)

    assert len(seen) == n_moe_layers(ours)
    for module, (x, idx, w) in seen:
        grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(0)).to(x.dtype)

        def run(forward):
            xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
            out = forward(module, xs, idx, ws)
            return (out.detach(), *torch.autograd.grad(out, (xs, ws, module.gate_up_proj, module.down_proj), grad_out))

        got, ref = run(swiglu_hf.swiglu_experts_forward), run(moe_integration.grouped_mm_experts_forward)
        if module.is_transposed:  # the oracle on the op's layout, its weight gradients back in the module's
            *exact, g_gu, g_dp = moe_float64(x, idx, w, module.gate_up_proj.mT, module.down_proj.mT, grad_out)
            exact = (*exact, g_gu.mT, g_dp.mT)
        else:
            exact = moe_float64(x, idx, w, module.gate_up_proj, module.down_proj, grad_out)
        names = ("out", "grad_x", "grad_top_k_weights", "grad_gate_up_proj", "grad_down_proj")
        errs = {n: (relative_error(a, o), relative_error(b, o)) for n, a, b, o in zip(names, got, ref, exact)}
        bad = {n: e for n, e in errs.items() if not e[0] <= MODULE_FACTOR * e[1] + MODULE_FLOOR}
        assert not bad, f"{family}: (ours, grouped_mm) errors of an experts module against float64: {bad}"


@pytest.mark.parametrize("how", ["config", "from_config", "set_experts_implementation"])
def test_swiglu_is_selectable_by_name(how, moe_calls):
    """After ``register_experts()`` the name works wherever transformers takes an experts
    implementation; the modules then run the op with ``impl="auto"`` (the reference on a CPU)."""
    assert swiglu_hf.register_experts() == "swiglu"
    assert swiglu_hf.register_experts() == "swiglu"  # idempotent
    assert moe_integration.ALL_EXPERTS_FUNCTIONS["swiglu"] is swiglu_hf.swiglu_experts_forward
    plain = build("mixtral")
    if how == "config":
        ours = build("mixtral", experts_implementation="swiglu")
    elif how == "from_config":
        config = copy.deepcopy(plain.config)
        ours = transformers.AutoModelForCausalLM.from_config(config, experts_implementation="swiglu")
        ours.load_state_dict(plain.state_dict())
    else:
        ours = copy.deepcopy(plain)
        ours.set_experts_implementation("swiglu")
    assert ours.config._experts_implementation == "swiglu"
    ids = batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = step(ours, ids)
    assert_same(got, step(plain, ids), F32_TOL, how)
    assert len(moe_calls) == n_moe_layers(ours) and all(c["impl"] == "auto" for c in moe_calls)


def _add_expert_biases(model: nn.Module) -> None:
    """Make every experts module one with biases (``has_bias``), as gpt-oss's experts are."""
    for m in model.modules():
        if swiglu_hf._is_experts(m):
            E, two_i, H = m.gate_up_proj.shape
            g = torch.Generator().manual_seed(3)
            m.gate_up_proj_bias = nn.Parameter(0.1 * torch.randn(E, two_i, generator=g))
            m.down_proj_bias = nn.Parameter(0.1 * torch.randn(E, H, generator=g))
            m.has_bias = True


def test_experts_with_biases_run_the_op(moe_calls):
    """Experts with biases on the default gate run the op with both biases (also when selected
    by config): float32 results, the biases' gradients included, equal the unpatched model's."""
    plain = build("qwen3_moe")
    _add_expert_biases(plain)
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert swiglu_hf.apply(ours, impl="reference") == FAMILIES["qwen3_moe"][3]
    by_config = copy.deepcopy(plain)
    by_config.set_experts_implementation("swiglu")
    ids = batch()
    want = step(plain, ids)
    assert any("gate_up_proj_bias" in k for k in want)
    assert_same(step(ours, ids), want, F32_TOL)
    assert_same(step(by_config, ids), want, F32_TOL)
    assert len(moe_calls) == 4 and all(c["gate_up_proj_bias"] is not None and not c.get("interleaved") for c in moe_calls)


_QWEN3_EXPERTS = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts


class _ClampedExperts(_QWEN3_EXPERTS):
    """DeepSeek-V4's clamped SwiGLU gate on Qwen3-MoE's experts."""

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return self.act_fn(gate) * up


class _ClampedSiluExperts(_QWEN3_EXPERTS):
    """GLM-5-Next's and HY-V4's spelling: ``min=None``, ``F.silu``, the limit under another name."""

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(min=None, max=self.swiglu_limit)
        up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
        # Simple swiglu instead of alpha
        return torch.nn.functional.silu(gate) * up


class _ClampedAfterExperts(_QWEN3_EXPERTS):
    """Step-3.7's clamp after the activation: not the op's formula."""

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = self.act_fn(gate).clamp(max=self.limit)
        return gate * up.clamp(min=-self.limit, max=self.limit)


@pytest.mark.parametrize("cls, attr", [(_ClampedExperts, "limit"), (_ClampedSiluExperts, "swiglu_limit")])
def test_clamped_gates_run_the_op_with_their_limit(cls, attr, moe_calls):
    """Experts whose ``_apply_gate`` clamps gate and up before ``silu(gate) * up`` run the op with
    ``swiglu_limit`` read from the module (0.5 here: a third or more of the values clamped): float32
    logits, loss and gradients equal the unpatched model's (transformers' grouped_mm, which calls
    the class's ``_apply_gate``); a clamp after the activation falls back."""
    plain = build("qwen3_moe")
    for m in plain.modules():
        if swiglu_hf._is_experts(m):
            m.__class__ = cls
            setattr(m, attr, 0.5)
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swiglu_hf.apply(ours, impl="reference")
    ids = batch()
    got, want = step(ours, ids), step(plain, ids)
    assert_same(got, want, F32_TOL, cls.__name__)
    assert len(moe_calls) == n_moe_layers(ours) and all(c["swiglu_limit"] == 0.5 for c in moe_calls)
    unclamped = copy.deepcopy(plain)
    for m in unclamped.modules():
        if swiglu_hf._is_experts(m):
            m.__class__ = _QWEN3_EXPERTS
    assert errors(step(unclamped, ids), want)["loss"] > 1e-3, "the limit clamped nothing"

    after = build("qwen3_moe")
    for m in after.modules():
        if swiglu_hf._is_experts(m):
            m.__class__, m.limit = _ClampedAfterExperts, 0.5
            assert "custom gating" in swiglu_hf.experts_unsupported_reason(m)
            m.limit = float("inf")
            m.__class__ = cls
            setattr(m, attr, float("inf"))
            assert "not a positive finite number" in swiglu_hf.experts_unsupported_reason(m)


class _LimitAfterActExperts(_QWEN3_EXPERTS):
    """Step-3.7's and Ling-2.5's gate (transformers' spelling): silu(gate) and up clamped where the
    layer's limit is not None."""

    limit = None

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = self.act_fn(gate)
        if self.limit is not None:
            gate = gate.clamp(max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
        return gate * up


def test_a_clamp_after_the_activation_runs_the_op_only_where_the_layer_has_no_limit(moe_calls):
    """Layers of a gate that clamps after the activation: without a limit the op runs (float32
    results equal the unpatched model's); a layer with one keeps its implementation with a warning
    naming the clamp, at ``apply`` and when the limit is set afterwards (bitwise the unpatched)."""
    plain = build("qwen3_moe")
    layers = [m for m in plain.modules() if swiglu_hf._is_experts(m)]
    for m in layers:
        m.__class__ = _LimitAfterActExperts
    assert swiglu_hf.clamped_gate(_LimitAfterActExperts) == ("limit", True, True, None, False)
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swiglu_hf.apply(ours, impl="reference")
    ids = batch()
    assert_same(step(ours, ids), step(plain, ids), F32_TOL, "no limit")
    assert len(moe_calls) == len(layers) and all(c["swiglu_limit"] is None for c in moe_calls)

    moe_calls.clear()
    layers[0].limit = 0.5
    ours = copy.deepcopy(plain)
    with pytest.warns(UserWarning, match=r"clamps silu\(gate\) after the activation .*limit = 0.5"):
        swiglu_hf.apply(ours, impl="reference")
        got = step(ours, ids)
    want = step(plain, ids)
    assert_same(got, want, F32_TOL, "the first layer with a limit")
    assert len(moe_calls) == len(layers) - 1
    unclamped = copy.deepcopy(plain)
    unclamped.model.layers[0].mlp.experts.limit = None
    assert errors(step(unclamped, ids), want)["loss"] > 1e-4, "the limit clamped nothing"

    moe_calls.clear()
    [m for m in ours.modules() if swiglu_hf._is_experts(m)][1].limit = 0.5  # set after the first calls
    with pytest.warns(UserWarning, match="after the activation"):
        step(ours, ids)
    assert len(moe_calls) == len(layers) - 2


class _AlphaGateExperts(_QWEN3_EXPERTS):
    """MiniMax-M3's gate (gpt-oss's activation on the op's layout, transformers' spelling)."""

    swiglu_limit, swiglu_alpha = 0.5, 1.702

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=self.swiglu_limit)
        up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
        glu = gate * torch.sigmoid(gate * self.swiglu_alpha)
        return (up + 1.0) * glu


def test_the_alpha_gate_runs_the_op_with_its_limit_and_alpha(moe_calls):
    """Experts whose gate is gpt-oss's activation on the op's layout (MiniMax-M3) run the op with
    ``swiglu_limit`` and ``swiglu_alpha`` read from the module: float32 results equal the unpatched
    model's (its own ``_apply_gate``); the plain SwiGLU's would not; a bad alpha falls back."""
    assert swiglu_hf.clamped_gate(_AlphaGateExperts) == ("swiglu_limit", False, False, "swiglu_alpha", False)
    plain = build("qwen3_moe")
    for m in plain.modules():
        if swiglu_hf._is_experts(m):
            m.__class__ = _AlphaGateExperts
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swiglu_hf.apply(ours, impl="reference")
    ids = batch()
    want = step(plain, ids)
    assert_same(step(ours, ids), want, F32_TOL, "alpha gate")
    assert len(moe_calls) == n_moe_layers(ours)
    assert all(c["swiglu_limit"] == 0.5 and c["swiglu_alpha"] == 1.702 for c in moe_calls)
    other = copy.deepcopy(plain)
    for m in other.modules():
        if swiglu_hf._is_experts(m):
            m.__class__ = _ClampedExperts
            m.limit = 0.5
    assert errors(step(other, ids), want)["loss"] > 1e-3, "the alpha form changed nothing"
    experts = next(m for m in plain.modules() if swiglu_hf._is_experts(m))
    experts.swiglu_alpha = float("nan")
    assert "swiglu_alpha = nan is not a positive finite number" in swiglu_hf.experts_unsupported_reason(experts)
    experts.swiglu_alpha = 1.702

    # Values set after apply (and after the first calls) are read at every call: a limit of None or
    # an alpha of 0 falls back with the reason, the unpatched results (alpha 0: its own formula).
    moe_calls.clear()
    layers = [m for m in ours.modules() if swiglu_hf._is_experts(m)]
    layers[0].swiglu_limit = None
    with pytest.warns(UserWarning, match=r"swiglu_limit = None is not a positive finite number"):
        with pytest.raises(RuntimeError, match="clamp"):  # the model's own gate cannot clamp by None
            step(ours, ids)
    layers[0].swiglu_limit = 0.5
    for m in (*layers, *(m for m in plain.modules() if swiglu_hf._is_experts(m))):
        m.swiglu_alpha = 0.0
    with pytest.warns(UserWarning, match=r"swiglu_alpha = 0.0 is not a positive finite number"):
        assert_same(step(ours, ids), step(plain, ids), 0.0, "alpha 0 after apply")
    assert moe_calls == []


def test_gpt_oss_runs_the_op(moe_calls):
    """gpt-oss's experts (biases, transposed and interleaved weights, its clamped alpha gate) run
    the op with both biases, interleaved=True, its limit and alpha: float32 logits, loss and every
    gradient (the biases' included) equal the unpatched model's; a 0.1% error in a bias's use shows."""
    assert swiglu_hf.clamped_gate(transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts).interleaved
    plain = build("gpt_oss")
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert swiglu_hf.apply(ours, impl="reference") == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    ids = batch()
    got, want = step(ours, ids), step(plain, ids)
    assert any("down_proj_bias" in k for k in got) and any("gate_up_proj_bias" in k for k in got)
    assert_same(got, want, F32_TOL, "gpt_oss")
    assert len(moe_calls) == 2 and all(c["interleaved"] and c["down_proj_bias"] is not None for c in moe_calls)
    experts = copy.deepcopy(ours.model.layers[0].mlp.experts)
    experts.is_concatenated = True  # the flag contradicts the gate: the gate decides the split
    assert swiglu_hf.experts_unsupported_reason(experts) is None
    with torch.no_grad():
        ours.model.layers[0].mlp.experts.down_proj_bias.mul_(1.001)
    assert errors(step(ours, ids), want)["logits"] > F32_TOL


def test_apply_auto_runs_gpt_oss_through_the_op(moe_calls):
    """impl "auto" serves gpt-oss's experts (interleaved, biased; measured faster through the op):
    no warning, both layers' experts through the op, float32 results the unpatched model's."""
    plain = build("gpt_oss")
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names = swiglu_hf.apply(ours)
    assert names and all(n.endswith("experts") for n in names), names
    ids = batch()
    assert_same(step(ours, ids), step(plain, ids), F32_TOL, "gpt_oss under apply(auto)")
    assert len(moe_calls) == 2 and all(c["interleaved"] and c["impl"] == "auto" for c in moe_calls)


def _privacy_filter():
    """A small OpenAI-Privacy-Filter token classifier (random weights, biases near one), or a skip."""
    cls = getattr(transformers, "OpenAIPrivacyFilterForTokenClassification", None)
    if cls is None:
        pytest.skip("no OpenAI-Privacy-Filter in this transformers")
    config = transformers.OpenAIPrivacyFilterConfig(
        **{**SMALL, "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2, "num_labels": 3}
    )
    torch.manual_seed(0)
    model = cls(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
    return model


def _run_classifier(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids % 3)
    out.loss.backward()
    return {"logits": out.logits.detach(), **{n: p.grad for n, p in model.named_parameters() if p.grad is not None}}


def test_apply_auto_runs_privacy_filter_through_the_op(moe_calls):
    """impl "auto" serves OpenAI-Privacy-Filter's experts (biases on concatenated gate/up rows;
    measured faster through the op): no warning, every layer's experts through the op, float32
    results the unpatched model's."""
    plain = _privacy_filter()
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names = swiglu_hf.apply(ours)
    assert names and all(n.endswith("experts") for n in names), names
    ids = batch()
    assert_same(_run_classifier(ours, ids), _run_classifier(plain, ids), F32_TOL, "privacy filter under apply(auto)")
    assert len(moe_calls) == len(names) and all(c["impl"] == "auto" and not c.get("interleaved") for c in moe_calls)


def test_gpt_oss_bf16_triton_within_bound_of_the_float64_model(moe_calls):
    """gpt-oss in bf16 on the Triton kernels (interpreter): logits, loss and every gradient no
    further from a float64 copy of the model than twice the unpatched bf16 model plus BF16_FLOOR."""
    pytest.importorskip("swiglu.kernels.moe")
    plain = build("gpt_oss", dtype=torch.bfloat16)
    ours = copy.deepcopy(plain)
    oracle = copy.deepcopy(plain).to(torch.float64)
    oracle.set_experts_implementation("eager")
    swiglu_hf.apply(ours, impl="triton")
    ids = batch(shape=(1, 16))
    want = step(oracle, ids)
    err_ours, err_plain = errors(step(ours, ids), want), errors(step(plain, ids), want)
    bad = {k: (e, err_plain[k]) for k, e in err_ours.items() if not e <= BF16_FACTOR * err_plain[k] + BF16_FLOOR}
    assert not bad, f"gpt_oss: (ours, unpatched) errors against float64 beyond the bound: {bad}"
    assert len(moe_calls) == 2 and all(c["impl"] == "triton" for c in moe_calls)


def test_openai_privacy_filter_runs_the_op(moe_calls):
    """OpenAI-Privacy-Filter's experts (biases, transposed concatenated weights, gpt-oss's gate
    spelled on halves, float32 arithmetic): float32 results equal the unpatched model's."""
    plain = _privacy_filter()
    ours = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert swiglu_hf.apply(ours, impl="reference")
    ids = batch()
    assert_same(_run_classifier(ours, ids), _run_classifier(plain, ids), F32_TOL, "openai_privacy_filter")
    assert moe_calls and not any(c.get("interleaved") for c in moe_calls)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda m: setattr(m, "is_transposed", True), r"are not \[E, H, 2I\] and \[E, I, H\] \(transposed\)"),
        (lambda m: setattr(m, "is_concatenated", False), "interleaved gate/up"),
        (lambda m: setattr(m, "has_gate", False), "no gate"),
        (lambda m: setattr(m, "has_post_expert_norm", True), "a norm after each expert"),
        (lambda m: setattr(m, "act_fn", nn.GELU()), "act_fn is GELU"),
        (lambda m: setattr(m, "_apply_gate", lambda x: x), "custom gating"),
        (
            lambda m: setattr(m, "__class__", type("Gated", (type(m),), {"_apply_gate": lambda self, x: x})),
            r"custom gating \(Gated._apply_gate\)",
        ),
        (
            lambda m: setattr(m, "gate_up_proj", nn.Parameter(m.gate_up_proj.data.to(torch.float8_e4m3fn), requires_grad=False)),
            "float8",
        ),
    ],
)
def test_each_unsupported_experts_module_is_named(change, match):
    experts = build("mixtral", num_hidden_layers=1).model.layers[0].mlp.experts
    assert swiglu_hf.experts_unsupported_reason(experts) is None
    change(experts)
    assert experts.__dict__.get("_swiglu_experts") is None
    assert re.search(match, swiglu_hf.experts_unsupported_reason(experts))


@pytest.mark.parametrize("change", ["act_fn_hook", "act_fn_gelu"])
def test_an_activation_hooked_or_swapped_after_the_first_call_falls_back_and_matches(change, moe_calls):
    """A steering hook (or another activation) added after apply and a first step: the experts run
    their previous implementation from then on, with a warning, and the hook runs."""
    plain = build("qwen3_moe")
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours, impl="reference")
    ids = batch()
    step(ours, ids)
    assert moe_calls and moe_calls.clear() is None
    seen = []
    handles = []
    for model in (plain, ours):
        for layer in model.model.layers:
            if change == "act_fn_hook":
                handles.append(layer.mlp.experts.act_fn.register_forward_hook(lambda m, a, out: seen.append(1) or out * 0.5))
            elif change == "act_fn_gelu":
                layer.mlp.experts.act_fn = nn.GELU()
    try:
        with pytest.warns(UserWarning, match="hooks registered" if change == "act_fn_hook" else "act_fn is GELU"):
            got = step(ours, ids)
        calls = len(seen)
        assert_same(got, step(plain, ids), 0.0)
    finally:
        for h in handles:
            h.remove()
    assert moe_calls == []
    assert change == "act_fn_gelu" or calls > 0


def test_flop_counter_counts_the_experts_op_without_a_fallback(moe_calls):
    """FlopCounterMode's module tracker registers global module hooks: not a reason to fall back."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build("qwen3_moe")
    swiglu_hf.apply(model, impl="reference")
    with warnings.catch_warnings(), FlopCounterMode(display=False) as counter:
        warnings.simplefilter("error")
        model(batch())
    assert len(moe_calls) == n_moe_layers(model) and counter.get_total_flops() > 0


def test_apply_on_one_layer_says_it_switches_the_shared_config():
    """transformers' experts implementation is the config's: apply on a decoder layer switches
    every layer's experts and says so; on the model itself it says nothing."""
    model = build("qwen3_moe")
    with pytest.warns(UserWarning, match="chosen per config"):
        assert swiglu_hf.apply(model.model.layers[1], impl="reference") == ["mlp.experts"]
    assert model.config._experts_implementation == "swiglu"
    with pytest.warns(UserWarning, match="chosen per config"):
        assert swiglu_hf.unpatch(model.model.layers[1]) == ["mlp.experts"]
    assert model.config._experts_implementation != "swiglu"
    with warnings.catch_warnings():  # the model, or a wrapper holding it: nothing outside
        warnings.simplefilter("error")
        for whole in (model, nn.ModuleDict({"lm": model})):
            assert swiglu_hf.apply(whole, impl="reference")
            swiglu_hf.unpatch(whole)


def test_another_activation_falls_back_and_matches(moe_calls):
    """hidden_act="gelu": the experts keep grouped_mm (warned), the model's results unchanged."""
    plain = build("olmoe", hidden_act="gelu")
    ours = copy.deepcopy(plain)
    with pytest.warns(UserWarning, match="not SiLU"):
        assert swiglu_hf.apply(ours, impl="reference") == []
    ids = batch()
    assert_same(step(ours, ids), step(plain, ids), 0.0)
    assert moe_calls == []


@moe_integration.use_experts_implementation
class DenseRoutedExperts(nn.Module):
    """A standalone experts module whose own (eager) forward takes dense [T, E] routing weights."""

    def __init__(self, config):
        super().__init__()
        E, H, I = 4, 16, 8
        g = torch.Generator().manual_seed(0)
        self.num_experts = E
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * I, H, generator=g) / H**0.5)
        self.down_proj = nn.Parameter(torch.randn(E, H, I, generator=g) / I**0.5)
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        x = hidden_states.to(self.gate_up_proj.dtype)
        out = torch.zeros_like(x)
        dense = top_k_weights.shape != top_k_index.shape
        for j in range(top_k_index.shape[-1]):
            e = top_k_index[:, j]
            gate, up = torch.einsum("th,tih->ti", x, self.gate_up_proj[e]).chunk(2, dim=-1)
            y = torch.einsum("ti,thi->th", self.act_fn(gate) * up, self.down_proj[e])
            w = top_k_weights.gather(1, e[:, None])[:, 0] if dense else top_k_weights[:, j]
            out = out + w[:, None] * y
        return out.to(hidden_states.dtype)


def _dense_routed(experts_implementation):
    config = transformers.PretrainedConfig()
    config._experts_implementation = experts_implementation
    return DenseRoutedExperts(config)


def _routed_inputs(seed):
    """(generator, hidden_states [6, 16], top_k_index [6, 2] over 4 experts, top_k_weights [6, 2])."""
    g = torch.Generator().manual_seed(seed)
    return g, torch.randn(6, 16, generator=g), torch.randint(0, 4, (6, 2), generator=g), torch.rand(6, 2, generator=g)


@pytest.mark.parametrize("case", ["dense routing weights", "dtype", "expert parallel"])
def test_a_call_the_op_cannot_serve_falls_back(case, moe_calls):
    """Checked at every call: [T, E] routing weights, hidden_states in another dtype than the
    weights (outside autocast), expert parallelism. The module's eager forward (its recorded
    previous implementation) runs, warned, with its own result."""
    ours, plain = _dense_routed("eager"), _dense_routed("eager")
    assert swiglu_hf.apply(ours, impl="reference") == [""]  # the module itself, "eager" recorded as its previous
    assert ours.config._experts_implementation == "swiglu"
    assert ours._swiglu_experts == ("reference", None, "eager")
    g, x, idx, w = _routed_inputs(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ours(x, idx, w)
    assert relative_error(got.detach(), plain(x, idx, w).detach()) <= F32_TOL
    assert len(moe_calls) == 1
    if case == "dense routing weights":
        w = torch.rand(6, 4, generator=g)
    elif case == "dtype":
        x = x.double()
    elif case == "expert parallel":
        ours._is_expert_parallel = True
    with pytest.warns(UserWarning, match="runs its 'eager' experts implementation"):
        got = ours(x, idx, w)
    assert torch.equal(got, plain(x, idx, w))
    assert len(moe_calls) == 1


def test_autocast_runs_the_op_in_autocasts_dtype(moe_calls):
    """Under autocast (fp32 weights, bf16 compute: mixed-precision training) the op runs, with
    hidden_states and the expert weights cast as F.linear would, no warning; fp32 weight gradients."""
    ours = _dense_routed("eager")
    swiglu_hf.apply(ours, impl="reference")
    _, x, idx, w = _routed_inputs(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = ours(x, idx, w)
            want = swiglu_hf._swiglu_moe(x, idx, w, ours.gate_up_proj, ours.down_proj, impl="reference")
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert len(moe_calls) == 2
    got.float().sum().backward()
    assert ours.gate_up_proj.grad.dtype == torch.float32


def test_apply_again_and_unpatch_restore_the_previous_implementation(moe_calls):
    model = build("qwen2_moe")
    model.set_experts_implementation("batched_mm")
    names = swiglu_hf.apply(model, impl="reference")
    assert swiglu_hf.apply(model, impl="auto") == names  # the recorded previous stays batched_mm
    experts = model.model.layers[0].mlp.experts
    assert experts._swiglu_experts == ("auto", None, "batched_mm")
    assert swiglu_hf.unpatch(model) == names
    assert model.config._experts_implementation == "batched_mm"
    assert "_swiglu_experts" not in experts.__dict__ and "_swiglu_experts_registration" not in experts.__dict__
    assert type(model.model.layers[0].mlp.shared_expert).__name__ == "Qwen2MoeMLP"
    model(batch())
    assert moe_calls == []


def test_a_saved_model_loads_and_runs_the_op_in_a_fresh_process(tmp_path):
    """torch.save(model) pickles "swiglu" in the config only: loading registers it again (without
    an import of swiglu by the loader), and the loaded model's logits are the saved model's."""
    import subprocess
    import sys

    model = build("qwen3_moe", num_hidden_layers=1)
    swiglu_hf.apply(model, impl="reference")
    ids = batch()
    with torch.no_grad():
        logits = model(ids).logits
    path = tmp_path / "model.pt"
    torch.save((model, ids, logits), path)
    code = (
        "import sys, torch; "
        f"m, ids, want = torch.load({str(path)!r}, weights_only=False); "
        "from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS as f; "
        "got = m(ids).logits; "
        "print(m.config._experts_implementation, f['swiglu'].__module__, torch.equal(got, want))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["swiglu", "swiglu.integrations.transformers", "True"]


def test_register_experts_errors(monkeypatch):
    with pytest.raises(ValueError, match="impl must be one of"):
        swiglu_hf.register_experts(impl="fast")
    with pytest.raises(TypeError, match="impl must be a str"):
        swiglu_hf.register_experts(impl=1)
    monkeypatch.setitem(moe_integration.ExpertsInterface._global_mapping, "swiglu", lambda *a: None)
    with pytest.raises(ValueError, match="already maps 'swiglu'"):
        swiglu_hf.register_experts()
    with pytest.raises(ValueError, match="already maps 'swiglu'"):
        swiglu_hf.apply(build("mixtral", num_hidden_layers=1))


def test_apply_passes_reuse_saved_buffers_to_the_experts(moe_calls):
    """``apply(model, reuse_saved_buffers=True)`` reaches ``swiglu_moe`` from the experts modules
    (False by default and after ``unpatch``)."""
    model = build("qwen2_moe")
    swiglu_hf.apply(model, impl="reference")
    model(batch())
    assert moe_calls and all(c["reuse_saved_buffers"] is False for c in moe_calls)
    moe_calls.clear()
    swiglu_hf.apply(model, impl="reference", reuse_saved_buffers=True)
    model(batch())
    assert moe_calls and all(c["reuse_saved_buffers"] is True for c in moe_calls)
    swiglu_hf.unpatch(model)
    assert "swiglu_reuse_saved_buffers" not in model.model.layers[0].mlp.experts.__dict__
