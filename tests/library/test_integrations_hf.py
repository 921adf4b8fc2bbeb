"""swiglu.integrations.transformers on tiny random Hugging Face models (CPU, configs built in code:
no downloads).

Patched vs unpatched in float64: logits and every parameter's gradient agree to float64 rounding
(relative Frobenius error <= 1e-12; a 0.1% planted error in the op fails it). bf16: our error
against the float64 model is at most twice the unpatched bf16 model's plus a small floor (the
project's bound, tests/library/test_module.py). 30 AdamW steps of a 2-layer model: loss curves agree within
1e-5 relative. save_pretrained / from_pretrained, torch.compile (AOTAutograd, the op in both graphs),
gradient checkpointing; models it cannot serve are left alone with a warning naming the reason.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers", minversion="5.3")

from swiglu import relative_error  # noqa: E402
from swiglu.integrations import transformers as swiglu_hf  # noqa: E402

F64_TOL = 1e-12
BF16_FACTOR, BF16_FLOOR = 2.0, 1e-3
SMALL = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=96,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
}


def build(family: str, seed: int = 0, dtype=torch.float64, **overrides) -> nn.Module:
    """A tiny random model of ``family``: weights std 1/sqrt(fan_in) (not HF's 0.02, so the MLP's
    activations are far from zero), norms 1 + noise."""
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**SMALL, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
    return model.to(dtype)


def batch(seed: int, shape=(2, 12)) -> torch.Tensor:
    return torch.randint(3, SMALL["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


def step(model: nn.Module, ids: torch.Tensor, run=None):
    """Logits and every parameter's gradient of one LM loss (gradients reset first); ``run``:
    the callable to run instead of ``model`` (a compiled wrapper)."""
    model.zero_grad(set_to_none=True)
    out = (model if run is None else run)(ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.fixture
def op_calls(call_spy):
    """Counts the integration's calls of the fused op (proves the op ran, not a fallback)."""
    return call_spy(swiglu_hf, "_swiglu_mlp")


def assert_same(ours, theirs, tol, label=""):
    logits, grads = ours
    ref_logits, ref_grads = theirs
    errors = {"logits": relative_error(logits, ref_logits)}
    errors.update({n: relative_error(g, ref_grads[n]) for n, g in grads.items()})
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"{label} relative errors above {tol}: {bad}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_float64_logits_and_gradients_match(family, op_calls):
    plain = build(family)
    ours = copy.deepcopy(plain)
    names = swiglu_hf.apply(ours, impl="reference")
    assert names == [f"model.layers.{i}.mlp" for i in range(SMALL["num_hidden_layers"])]
    assert type(ours.model.layers[0].mlp).__name__.startswith("Swiglu")
    assert ours.state_dict().keys() == plain.state_dict().keys()
    ids = batch(1)
    assert_same(step(ours, ids), step(plain, ids), F64_TOL, family)
    assert len(op_calls) == SMALL["num_hidden_layers"]


def test_float64_check_catches_a_planted_error(monkeypatch):
    """A 0.1% error in the op's output fails the float64 comparison."""
    plain = build("llama")
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours, impl="reference")
    real = swiglu_hf._swiglu_mlp
    monkeypatch.setattr(swiglu_hf, "_swiglu_mlp", lambda *a, **k: real(*a, **k) * 1.001)
    ids = batch(1)
    with pytest.raises(AssertionError, match="relative errors"):
        assert_same(step(ours, ids), step(plain, ids), F64_TOL)


@pytest.mark.parametrize(
    "family, backward_impl",
    [("llama", "auto"), ("qwen3", "auto"), pytest.param("mistral", "triton", marks=pytest.mark.interpreter)],
)
def test_bf16_within_bound_of_the_float64_model(family, backward_impl, op_calls):
    """bf16 weights (the float64 oracle holds the same rounded values). "triton": the Triton
    forward and memory-lean backward under TRITON_INTERPRET=1 (tests/conftest.py)."""
    if backward_impl == "triton":
        pytest.importorskip("swiglu.kernels.backward")
    plain = build(family, dtype=torch.bfloat16)
    ours = copy.deepcopy(plain)
    oracle = copy.deepcopy(plain).double()
    swiglu_hf.apply(ours, impl=backward_impl)
    ids = batch(2)
    (lo, go), (lp, gp), (lr, gr) = step(ours, ids), step(plain, ids), step(oracle, ids)
    assert len(op_calls) == SMALL["num_hidden_layers"]
    for name, mine, theirs, ref in [("logits", lo, lp, lr)] + [(n, go[n], gp[n], gr[n]) for n in gr]:
        bound = BF16_FACTOR * relative_error(theirs, ref) + BF16_FLOOR
        assert relative_error(mine, ref) <= bound, (name, relative_error(mine, ref), bound)


def test_30_steps_of_training_track_the_unpatched_model(op_calls):
    """2-layer Llama, float32, AdamW (lr 3e-3), 30 steps on fresh batches: the loss curves agree
    within 1e-5 relative at every step (measured: 2e-7), and the loss falls."""
    plain = build("llama", dtype=torch.float32)
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours)
    curves = []
    for model in (ours, plain):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for i in range(30):
            loss = model(batch(100 + i % 4), labels=batch(100 + i % 4)).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        curves.append(torch.tensor(losses, dtype=torch.float64))
    assert len(op_calls) == 30 * SMALL["num_hidden_layers"]
    ours_curve, plain_curve = curves
    assert ours_curve[-1] < 0.7 * ours_curve[0], ours_curve
    worst = ((ours_curve - plain_curve).abs() / plain_curve).max().item()
    assert worst <= 1e-5, (worst, ours_curve, plain_curve)


@pytest.fixture
def registered():
    yield
    swiglu_hf.unpatch_classes()


def test_patch_classes_survives_save_and_from_pretrained(tmp_path, registered, op_calls):
    config = transformers.LlamaConfig(**SMALL)
    plain = transformers.AutoModelForCausalLM.from_config(config)
    assert swiglu_hf.patch_classes(("llama", "qwen3")) == ["LlamaMLP", "Qwen3MLP"]
    patched = transformers.AutoModelForCausalLM.from_config(config)
    assert type(patched.model.layers[1].mlp).__name__ == "SwigluLlamaMLP"
    assert patched.state_dict().keys() == plain.state_dict().keys()
    patched.save_pretrained(tmp_path / "ckpt")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert type(loaded.model.layers[0].mlp).__name__ == "SwigluLlamaMLP"
    for name, tensor in patched.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    swiglu_hf.unpatch_classes()
    unpatched = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert type(unpatched.model.layers[0].mlp) is transformers.models.llama.modeling_llama.LlamaMLP
    ids = batch(3)
    op_calls.clear()
    torch.testing.assert_close(loaded(ids).logits, unpatched(ids).logits, rtol=1e-6, atol=1e-6)
    assert len(op_calls) == SMALL["num_hidden_layers"]


def test_a_second_patch_classes_leaves_models_built_before_alone(registered, monkeypatch):
    """Model A built under patch_classes(impl="reference", save_activated_gate=True), then
    unpatch_classes(), patch_classes(impl="triton") and model B: A keeps its impl and memory mode
    (also through pickle) and its float64 logits and gradients equal the stock model's; B has the
    new options."""
    import pickle

    calls = []
    real = swiglu_hf._swiglu_mlp
    monkeypatch.setattr(swiglu_hf, "_swiglu_mlp", lambda *a, **k: calls.append(a[4:6]) or real(*a, **k))
    config = transformers.LlamaConfig(**{**SMALL, "num_hidden_layers": 1, "num_key_value_heads": 4, "vocab_size": 64})
    stock = transformers.AutoModelForCausalLM.from_config(config).double()
    swiglu_hf.patch_classes(impl="reference", save_activated_gate=True)
    model_a = transformers.AutoModelForCausalLM.from_config(config).double()
    model_a.load_state_dict(stock.state_dict())
    swiglu_hf.unpatch_classes()
    swiglu_hf.patch_classes(impl="triton")
    model_b = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    mlp_a, mlp_b = model_a.model.layers[0].mlp, model_b.model.layers[0].mlp
    assert isinstance(mlp_a, swiglu_hf._SwigluForward) and isinstance(mlp_b, swiglu_hf._SwigluForward)
    assert (mlp_a.swiglu_impl, mlp_a.swiglu_save_activated_gate) == ("reference", True)
    assert (mlp_b.swiglu_impl, mlp_b.swiglu_save_activated_gate) == ("triton", False)
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(9))
    assert_same(step(model_a, ids), step(stock, ids), F64_TOL, "model A")
    assert calls == [("reference", True)]
    loaded = pickle.loads(pickle.dumps(model_a)).model.layers[0].mlp
    assert (loaded.swiglu_impl, loaded.swiglu_save_activated_gate) == ("reference", True)
    import swiglu

    if "triton" in swiglu.available_impls("cpu"):  # TRITON_INTERPRET=1 (conftest, no GPU)
        model_b(ids[:, :4])
        assert calls[-1] == ("triton", False)


def test_patch_classes_errors(registered):
    with pytest.raises(ValueError, match="no model type 'no_such_model'"):
        swiglu_hf.patch_classes(("no_such_model",))
    with pytest.raises(ValueError, match="phi3 has no MLP class"):
        swiglu_hf.patch_classes(("phi3",))
    with pytest.raises(ValueError, match="impl"):
        swiglu_hf.patch_classes(impl="cuda")
    from transformers import monkey_patching

    monkey_patching.register_patch_mapping({"MistralMLP": nn.Identity})
    try:
        with pytest.raises(ValueError, match="already replaces"):
            swiglu_hf.patch_classes(("mistral",))
    finally:
        monkey_patching.unregister_patch_mapping(["MistralMLP"])


def test_torch_compile_traces_the_op(op_calls):
    """AOTAutograd (aot_eager's path, with graph capture): the forward graph holds
    swiglu::mlp_forward, the backward graph swiglu::mlp_backward; results equal eager's."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    targets = []

    def capture(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    plain = build("llama", num_hidden_layers=1)
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours, impl="reference")
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend=aot_autograd(fw_compiler=capture, bw_compiler=capture))
    ids = batch(4)
    assert_same(step(ours, ids, compiled), step(plain, ids), F64_TOL, "compiled")
    assert any("swiglu.mlp_forward" in t for t in targets), targets
    assert any("swiglu.mlp_backward" in t for t in targets), targets
    torch._dynamo.reset()


def test_gradient_checkpointing(op_calls):
    plain = build("qwen2")
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours, impl="reference")
    # transformers >= 5.24 renames it activation_checkpointing_enable (the old name warns).
    getattr(ours, "activation_checkpointing_enable", ours.gradient_checkpointing_enable)()
    ours.train()
    ids = batch(5)
    assert_same(step(ours, ids), step(plain, ids), F64_TOL, "checkpointed")
    assert len(op_calls) == 2 * SMALL["num_hidden_layers"]  # forward + recomputation in the backward


def _apply_warns(model, match):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = swiglu_hf.apply(model)
    messages = [str(w.message) for w in caught]
    assert any(match in m and "model.layers.0.mlp" in m for m in messages), messages
    return names


@pytest.mark.parametrize(
    "case, match",
    [
        ("bias", "gate_proj has a bias"),
        ("phi3", "packed gate_up_proj"),
        ("gemma", "not SiLU"),
        ("adapter", "not a plain nn.Linear"),
        ("hook", "up_proj has a forward hook"),
    ],
)
def test_models_it_cannot_serve_are_left_alone(case, match):
    if case == "bias":
        model = build("llama", mlp_bias=True)
    elif case == "phi3":
        model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**SMALL)).double()
    elif case == "gemma":
        model = transformers.GemmaForCausalLM(transformers.GemmaConfig(**SMALL)).double()
    else:
        model = build("llama")

        class LoraLike(nn.Linear):  # an adapter: the op would skip its extra term
            def forward(self, x):
                return super().forward(x) + 0.5 * x.sum(-1, keepdim=True)

        for layer in model.model.layers:
            if case == "adapter":
                old = layer.mlp.gate_proj
                layer.mlp.gate_proj = LoraLike(old.in_features, old.out_features, bias=False, dtype=old.weight.dtype)
            else:
                layer.mlp.up_proj.register_forward_hook(lambda mod, inp, out: out * 2)
    classes = [type(layer.mlp) for layer in model.model.layers]
    ids = batch(6)
    before = model(ids).logits
    assert _apply_warns(model, match) == []
    assert [type(layer.mlp) for layer in model.model.layers] == classes
    assert torch.equal(model(ids).logits, before)


def test_a_hook_added_after_patching_falls_back_with_a_warning(op_calls):
    plain = build("llama")
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours)
    seen = []
    for model in (ours, plain):
        model.model.layers[1].mlp.down_proj.register_forward_hook(lambda mod, inp, out: seen.append(1) or out * 2)
    ids = batch(7)
    with pytest.warns(UserWarning, match="runs its original forward: down_proj has a forward hook"):
        logits = ours(ids).logits
    torch.testing.assert_close(logits, plain(ids).logits, rtol=1e-12, atol=1e-12)
    assert len(seen) == 2 and len(op_calls) == 1  # the hook ran in both; layer 0 still used the op


@pytest.mark.parametrize(
    "change, match",
    [
        ("act_hook", "act_fn has hooks"),
        ("act_gelu", "not SiLU"),
        ("bias", "up_proj has a bias"),
        ("global_hook", "global module forward hooks"),
    ],
)
def test_what_appears_after_patching_takes_the_original_forward(change, match, op_calls):
    """The patched forward's few-reads check (plain projections, a SiLU without hooks, no global
    hooks) hands anything else to the full one: each of these, added after ``apply``, makes the
    layer run its original forward with the warning."""
    plain = build("llama")
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours)
    handles = []
    for model in (ours, plain):
        mlp = model.model.layers[1].mlp
        if change == "act_hook":
            handles.append(mlp.act_fn.register_forward_hook(lambda mod, inp, out: out * 2))
        elif change == "act_gelu":
            mlp.act_fn = nn.GELU()
        elif change == "bias":
            mlp.up_proj.bias = nn.Parameter(torch.full((mlp.up_proj.out_features,), 0.5, dtype=torch.float64))
    if change == "global_hook":
        handles.append(nn.modules.module.register_module_forward_hook(lambda mod, inp, out: None))
    try:
        ids = batch(8)
        with pytest.warns(UserWarning, match=f"runs its original forward: .*{match}"):
            logits = ours(ids).logits
        torch.testing.assert_close(logits, plain(ids).logits, rtol=1e-12, atol=1e-12)
    finally:
        for handle in handles:
            handle.remove()
    assert len(op_calls) == (0 if change == "global_hook" else 1)  # layer 0 still used the op


def test_flop_counter_counts_the_fused_op_without_a_fallback(op_calls):
    """FlopCounterMode's module tracker registers global module hooks: they change nothing, so the
    patched MLPs still run the op (no warning), and the count is the stock model's."""
    from torch.utils.flop_counter import FlopCounterMode

    plain = build("llama")
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours)
    counts = []
    for model in (plain, ours):
        with warnings.catch_warnings(), FlopCounterMode(display=False) as counter:
            warnings.simplefilter("error")
            model(batch(8))
        counts.append(counter.get_total_flops())
    assert len(op_calls) == len(ours.model.layers) and counts[0] == counts[1] > 0


def test_apply_arguments_and_unpatch():
    model = build("llama")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        swiglu_hf.apply(model.state_dict())
    with pytest.raises(ValueError, match="impl must be one of"):
        swiglu_hf.apply(model, impl="fast")
    with pytest.raises(TypeError, match="save_activated_gate must be a bool"):
        swiglu_hf.apply(model, save_activated_gate=1)
    assert swiglu_hf.apply(model.model.layers[0]) == ["mlp"]
    names = swiglu_hf.apply(model, save_activated_gate=True)  # again: options updated, both listed
    assert names == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert model.model.layers[0].mlp.swiglu_save_activated_gate is True
    assert swiglu_hf.unpatch(model) == names
    assert type(model.model.layers[0].mlp) is transformers.models.llama.modeling_llama.LlamaMLP
    assert "swiglu_save_activated_gate" not in vars(model.model.layers[0].mlp)


def test_forward_formula_detection():
    class Canonical(nn.Module):
        def forward(self, hidden_state):
            """Docstrings are fine."""
            return self.down_proj(self.act_fn(self.gate_proj(hidden_state)) * self.up_proj(hidden_state))

    class WithDropout(nn.Module):
        def forward(self, x):
            return self.dropout(self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))

    class Swapped(nn.Module):
        def forward(self, x):
            return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))

    assert swiglu_hf.computes_swiglu(Canonical)
    assert swiglu_hf.computes_swiglu(transformers.models.mistral.modeling_mistral.MistralMLP)
    assert not swiglu_hf.computes_swiglu(WithDropout)
    assert not swiglu_hf.computes_swiglu(Swapped)
    assert not swiglu_hf.computes_swiglu(transformers.models.phi3.modeling_phi3.Phi3MLP)


def test_import_is_lean():
    """``import swiglu.integrations.transformers`` imports neither transformers (until a call needs
    it) nor the research libraries beyond what torch itself imports."""
    code = (
        "import sys, torch; before = set(sys.modules); import swiglu.integrations.transformers; "
        "print(sorted(m for m in ('transformers', 'triton', 'pandas', 'matplotlib', 'tqdm', 'pynvml', 'papermill') "
        "if m in sys.modules and m not in before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_patched_model_pickles_and_loads_patched(op_calls, tmp_path):
    """torch.save(model) pickles the whole model: the run-time subclass pickles as its original
    class and is patched again on load (with its options), in this process and in a fresh one."""
    import pickle

    plain = build("llama")
    ours = copy.deepcopy(plain)
    swiglu_hf.apply(ours, impl="reference", save_activated_gate=True)
    loaded = pickle.loads(pickle.dumps(ours))
    mlp = loaded.model.layers[0].mlp
    assert isinstance(mlp, swiglu_hf._SwigluForward) and type(mlp) is type(ours.model.layers[0].mlp)
    assert mlp.swiglu_save_activated_gate is True and mlp.swiglu_impl == "reference"
    ids = batch(3)
    assert_same(step(loaded, ids), step(plain, ids), F64_TOL)
    assert len(op_calls) == SMALL["num_hidden_layers"]
    path = tmp_path / "model.pt"
    torch.save(ours, path)
    code = (
        "import torch, sys; from swiglu.integrations import transformers as h; "
        f"m = torch.load({str(path)!r}, weights_only=False); "
        "print(type(m.model.layers[0].mlp).__name__, isinstance(m.model.layers[0].mlp, h._SwigluForward))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["SwigluLlamaMLP", "True"]
