"""Where users run a patched MLP: accelerate-style offloading and device hooks, copies of patched
modules, and float16 autocast (the last in tests/library/test_module.py).

accelerate replaces an instance's ``forward`` (``add_hook_to_module``: a ``functools.partial``
wrapper that calls the hook's ``pre_forward``, then ``module._old_forward``) instead of
registering torch hooks. ``_accelerate_hook`` below does exactly that (accelerate is not a
dependency): an offloading hook keeps the weight on the meta device until ``pre_forward`` puts it
back. With accelerate itself: ``scripts/check_accelerate_gpu.py`` (the GPU machine has it).
"""

from __future__ import annotations

import copy
import functools
import pickle
import types
import warnings

import pytest
import torch
from torch import nn

import swiglu

transformers = pytest.importorskip("transformers", minversion="5.3")

from swiglu.integrations import transformers as swiglu_hf  # noqa: E402


class _OffloadHook:
    """Keeps ``module``'s parameters on the meta device between forwards (as accelerate's
    AlignDevicesHook(offload=True)), restoring them in ``pre_forward``."""

    def __init__(self, offload: bool):
        self.offload, self.stored = offload, {}

    def init_hook(self, module):
        if self.offload:
            for name, p in list(module.named_parameters(recurse=False)):
                self.stored[name] = p.detach().clone()
                module._parameters[name] = nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
        return module

    def pre_forward(self, module, *args, **kwargs):
        for name, value in self.stored.items():
            module._parameters[name] = nn.Parameter(value.clone(), True)
        return args, kwargs

    def post_forward(self, module, output):
        return output


def _accelerate_hook(module: nn.Module, hook) -> None:
    # accelerate.hooks.add_hook_to_module, in its essentials.
    old_forward = module.forward
    module._old_forward = old_forward
    module = hook.init_hook(module)
    module._hf_hook = hook

    def new_forward(module, *args, **kwargs):
        args, kwargs = module._hf_hook.pre_forward(module, *args, **kwargs)
        return module._hf_hook.post_forward(module, module._old_forward(*args, **kwargs))

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), old_forward)


def _mlp(seed=0):
    config = transformers.LlamaConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=2)
    torch.manual_seed(seed)
    return transformers.models.llama.modeling_llama.LlamaMLP(config).double()


@pytest.fixture
def fused_calls(monkeypatch):
    calls = []
    real = swiglu_hf._swiglu_mlp
    monkeypatch.setattr(swiglu_hf, "_swiglu_mlp", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_offloaded_projections_fall_back_to_the_original_forward(fused_calls):
    """Weights of the projections on meta until their hooks run. Without the fallback, the
    fused op reads the meta weights (ValueError: gate_weight is on meta but x is on cpu)."""
    m, plain = _mlp(), _mlp()
    x = torch.randn(1, 8, dtype=torch.float64)
    swiglu_hf.apply(m)
    for name in ("gate_proj", "up_proj", "down_proj"):
        _accelerate_hook(getattr(m, name), _OffloadHook(offload=True))
    assert getattr(m, "gate_proj").weight.device.type == "meta"
    with pytest.warns(UserWarning, match="replaced on the instance"):
        out = m(x)
    assert fused_calls == [] and torch.allclose(out, plain(x), rtol=1e-12, atol=0)


def test_a_hook_on_the_mlp_itself_before_apply_runs_the_fused_op(fused_calls):
    """accelerate's AlignDevicesHook(io_same_device=True) on the MLP, then apply: before, apply
    reported it patched and the fused op ran 0 times (the hook called the old class's forward)."""
    m, plain = _mlp(), _mlp()
    x = torch.randn(3, 8, dtype=torch.float64)
    _accelerate_hook(m, _OffloadHook(offload=False))
    assert swiglu_hf.apply(m, impl="reference") == [""]
    assert torch.allclose(m(x), plain(x), rtol=1e-12, atol=0) and fused_calls == [1]


def test_an_instance_forward_that_is_not_a_hook_is_reported():
    m = _mlp()
    m.forward = lambda x: x
    with pytest.warns(UserWarning, match="replaced on the instance"):
        assert swiglu_hf.apply(m) == []


@pytest.mark.parametrize("state", ["plain", "method_rebound", "accelerate_hook"])
def test_copies_of_a_patched_module(state, fused_calls):
    """deepcopy, pickle and torch.save/torch.load of a patched module in every state it can be
    in (TRL's reference model, PEFT modules_to_save): before, an instance forward bound to the
    module made deepcopy recurse without end."""
    m, plain = _mlp(), _mlp()
    x = torch.randn(2, 8, dtype=torch.float64)
    swiglu_hf.apply(m, impl="reference")
    if state == "method_rebound":
        m.forward = types.MethodType(type(m).forward, m)
    elif state == "accelerate_hook":
        _accelerate_hook(m, _OffloadHook(offload=False))
        swiglu_hf.apply(m, impl="reference")
    want = plain(x)
    copies = [copy.deepcopy(m)]
    if state != "accelerate_hook":  # accelerate's own wrapper (a local function) does not pickle
        copies.append(pickle.loads(pickle.dumps(m)))
    for c in copies:
        assert isinstance(c, swiglu_hf._SwigluForward) and c is not m
        before = len(fused_calls)
        assert torch.allclose(c(x), want, rtol=1e-12, atol=0)
        assert len(fused_calls) == before + 1, "the copy does not run the fused op"
        assert c.gate_proj.weight.data_ptr() != m.gate_proj.weight.data_ptr()


def test_swiglu_module_with_a_replaced_projection_forward_takes_the_plain_path():
    mlp = swiglu.SwiGLUMLP(8, 16, dtype=torch.float64)
    plain = swiglu.module.PlainSwiGLUMLP(8, 16, dtype=torch.float64)
    plain.load_state_dict(mlp.state_dict())
    _accelerate_hook(mlp.up_proj, _OffloadHook(offload=True))
    x = torch.randn(4, 8, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = mlp(x)
    assert any("replaced on the instance" in str(w.message) for w in caught)
    assert torch.allclose(out, plain(x), rtol=1e-12, atol=0)
