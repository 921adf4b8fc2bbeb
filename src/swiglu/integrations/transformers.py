"""Hugging Face transformers: the SwiGLU MLPs of Llama, Mistral, Qwen2, Qwen3 and their kin on our op.

    from swiglu.integrations import transformers as swiglu_hf

    swiglu_hf.patch_classes()                    # before loading: LlamaMLP, MistralMLP, Qwen2MLP, Qwen3MLP
    model = AutoModelForCausalLM.from_pretrained(...)   # built with the patched classes
    names = swiglu_hf.apply(model)               # or after loading/building, on any model

Each MLP keeps its class's ``__init__``, parameters and state-dict names; only ``forward`` changes,
to ``swiglu.swiglu_mlp`` on the three weights. ``apply`` swaps each module's class for a subclass
that overrides ``forward``; ``patch_classes`` registers the same subclasses with transformers'
patch mapping (``transformers.monkey_patching``, transformers >= 5.3). Patched: modules whose
class's ``forward`` is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` in its source (checked on
the AST), with plain bias-free ``nn.Linear`` projections and SiLU. Everything else (a bias, a
packed ``gate_up_proj``, another activation or forward, adapters, quantized layers or weights,
hooks, accelerate's offloading) is left alone with a ``UserWarning``, also when it appears after
patching: the check runs at every forward. Each module keeps the options it was patched or built
with.

Mixture-of-experts models (experts classes built with transformers' ``use_experts_implementation``):
``apply`` also sets the experts implementation to ``"swiglu"`` (registered with ``ExpertsInterface``
by ``register_experts``; calls ``swiglu.swiglu_moe``). Experts the op does not compute keep their
previous implementation with a ``UserWarning``. Recipe and coverage: docs/huggingface.md.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import importlib
import inspect
import itertools
import textwrap
import types
import warnings
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as _torch_module

from ..checks import FLOAT_DTYPES, check_bool
from ..module import _fusable_fast, projection_reason
from ..moe import check_swiglu_alpha, check_swiglu_limit
from ..moe import swiglu_moe as _swiglu_moe
from ..ops import _check_impl, _renamed, _swiglu_mlp

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
#: ``patch_classes``' default: the transformers model types (``transformers.models.<type>``).
DEFAULT_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: Minimum transformers for ``patch_classes`` (``transformers.monkey_patching``).
MIN_TRANSFORMERS = "5.3"

_SUBCLASSES: dict[type, type] = {}  # original MLP class -> its swiglu subclass
_REGISTERED: dict[str, type] = {}  # class name -> subclass registered with transformers
_BUILD_OPTIONS: dict[type, tuple[str, bool]] = {}  # original class -> patch_classes' (impl, save_activated_gate)


# --------------------------------------------------------------------------- what can be served

#: ``_apply_gate`` bodies the op computes with ``swiglu_limit`` (DeepSeek-V4, GLM-5-Next, HY-V4):
#: LIMIT stands for one ``self`` attribute holding the limit, ACT for ``self.act_fn`` (then
#: checked to be SiLU) or ``F.silu``; ``min=None`` in a clamp is dropped first.
_CLAMPED_GATE = """
def _apply_gate(self, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=self.LIMIT)
    up = up.clamp(min=-self.LIMIT, max=self.LIMIT)
    return ACT(gate) * up
"""
# Step-3.7's and Ling-2.5's (bailing_hybrid): the clamp after the activation, off where the layer's
# limit is None. The op runs those layers; a layer with a limit keeps its own implementation.
_CLAMPED_AFTER_GATE = """
def _apply_gate(self, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    gate = ACT(gate)
    if self.LIMIT is not None:
        gate = gate.clamp(max=self.LIMIT)
        up = up.clamp(min=-self.LIMIT, max=self.LIMIT)
    return gate * up
"""
# MiniMax-M3's (gpt-oss's activation on the op's layout): the op's swiglu_limit and swiglu_alpha,
# ALPHA standing for a second ``self`` attribute.
_ALPHA_GATE = """
def _apply_gate(self, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=self.LIMIT)
    up = up.clamp(min=-self.LIMIT, max=self.LIMIT)
    glu = gate * torch.sigmoid(gate * self.ALPHA)
    return (up + 1.0) * glu
"""
# gpt-oss's own spelling of that gate (``(up + 1)``, a named result): its gate and up rows
# interleaved (gate0, up0, gate1, ...), and OpenAI-Privacy-Filter's on concatenated rows.
_GPT_OSS_GATE = """
def _apply_gate(self, gate_up):
    gate, up = SPLIT
    gate = gate.clamp(max=self.LIMIT)
    up = up.clamp(min=-self.LIMIT, max=self.LIMIT)
    glu = gate * torch.sigmoid(gate * self.ALPHA)
    gated_output = (up + 1) * glu
    return gated_output
"""
_ALPHA_GATES = (
    (_ALPHA_GATE, False),
    (_GPT_OSS_GATE.replace("SPLIT", "gate_up.chunk(2, dim=-1)"), False),
    (_GPT_OSS_GATE.replace("SPLIT", "gate_up[..., ::2], gate_up[..., 1::2]"), True),
)
_SILU_NAMES = ("F.silu", "nn.functional.silu", "torch.nn.functional.silu", "self.act_fn")


class _GateNames(ast.NodeTransformer):
    """Rewrites an ``_apply_gate`` for comparison with ``_CLAMPED_GATE``: its argument to
    ``gate_up``, ``self.<x>`` (other than act_fn) to ``self.LIMIT`` or to its name in ``rename``
    (``attrs`` records them), the SiLU spellings to ``ACT`` (``acts`` records them), clamp's
    ``min=None`` dropped."""

    def __init__(self, arg: str, rename: dict | None = None):
        self.arg, self.rename, self.attrs, self.acts = arg, rename or {}, set(), set()

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id="gate_up", ctx=node.ctx), node) if node.id == self.arg else node

    def visit_Attribute(self, node):
        spelled = ast.unparse(node)
        if spelled in _SILU_NAMES:
            self.acts.add(spelled)
            return ast.copy_location(ast.Name(id="ACT", ctx=node.ctx), node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            self.attrs.add(node.attr)
            return ast.copy_location(
                ast.Attribute(value=node.value, attr=self.rename.get(node.attr, "LIMIT"), ctx=node.ctx), node
            )
        return self.generic_visit(node)

    def visit_Call(self, node):
        self.generic_visit(node)
        node.keywords = [
            k for k in node.keywords if not (k.arg == "min" and isinstance(k.value, ast.Constant) and k.value.value is None)
        ]
        return node


def _gate_values(module: nn.Module, clamped: ClampedGate) -> tuple[str | None, float | None, float | None]:
    """``(reason, swiglu_limit, swiglu_alpha)`` for the op from the module's gate attributes as they
    are now (read at every call: a model may change them after ``apply``); ``reason`` (None when
    the op computes the gate) where they are not what the gate's form needs."""
    cls = type(module)
    limit = getattr(module, clamped.attr, None)
    if clamped.after_act:  # the op computes such a gate only where its clamp is off
        if limit is None:
            return None, None, None
        reason = f"its gate clamps silu(gate) after the activation ({cls.__qualname__}.{clamped.attr} = {limit!r})"
        return reason + "; the op clamps before it", None, None
    values = []
    for attr, check in ((clamped.attr, check_swiglu_limit), (clamped.alpha_attr, check_swiglu_alpha)):
        value = getattr(module, attr, None) if attr else None
        try:
            usable = attr is None or check(value) is not None  # None: the gate would clamp (or scale) by None
        except (TypeError, ValueError):
            usable = False
        if not usable:
            return f"its gate's {cls.__qualname__}.{attr} = {value!r} is not a positive finite number", None, None
        values.append(value)
    return None, *values


def _reads_act_fn(cls: type) -> bool:
    """Whether the experts' gate calls ``self.act_fn`` (not when a clamped gate spells ``F.silu``)."""
    clamped = clamped_gate(cls)
    return clamped is None or clamped.uses_act_fn


class ClampedGate(NamedTuple):
    """What ``clamped_gate`` recognized: the attribute holding the limit, whether the activation
    is ``self.act_fn`` (else ``F.silu`` or none), whether the clamp comes after the activation,
    the attribute holding ``swiglu_alpha`` (None: the plain SwiGLU), and whether the gate takes
    interleaved gate/up columns (gpt-oss's ``[..., ::2]``, ``[..., 1::2]``)."""

    attr: str
    uses_act_fn: bool
    after_act: bool
    alpha_attr: str | None = None
    interleaved: bool = False


def _body(tree, names: _GateNames) -> list[str]:
    skip = lambda st: isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)  # noqa: E731 (docstrings)
    return [ast.dump(names.visit(st)) for st in copy.deepcopy(tree.body) if not skip(st)]


def _pattern(text: str) -> list[str]:
    return [ast.dump(st) for st in ast.parse(text).body[0].body]


@functools.cache
def clamped_gate(cls: type) -> ClampedGate | None:
    """A ``ClampedGate`` when ``cls._apply_gate`` is a clamped SwiGLU: ``_CLAMPED_GATE`` (gate
    clamped to at most ``self.<attr>``, up to [-it, it], then ``act(gate) * up``: the op's
    ``swiglu_limit``), ``_CLAMPED_AFTER_GATE`` (``after_act``: ``act(gate)`` clamped instead, where
    the attribute is not None: the op only without a limit) or ``_ALPHA_GATES`` (gpt-oss's form,
    ``self.<alpha_attr>`` its alpha: the op's ``swiglu_alpha``; on interleaved columns in gpt-oss's
    own gate). None for any other body, or when the source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls._apply_gate))).body[0]
    except (OSError, TypeError, SyntaxError, AttributeError):
        return None
    if not isinstance(tree, ast.FunctionDef) or tree.decorator_list or len(tree.args.args) != 2:
        return None
    arg = tree.args.args[1].arg
    names = _GateNames(arg)
    body = _body(tree, names)
    if len(names.attrs) == 1 and len(names.acts) == 1:
        for after_act, pattern in ((False, _CLAMPED_GATE), (True, _CLAMPED_AFTER_GATE)):
            if body == _pattern(pattern):
                return ClampedGate(names.attrs.pop(), names.acts.pop() == "self.act_fn", after_act)
    if len(names.attrs) == 2 and not names.acts:
        for limit, alpha in itertools.permutations(sorted(names.attrs)):
            body = _body(tree, _GateNames(arg, {limit: "LIMIT", alpha: "ALPHA"}))
            for pattern, interleaved in _ALPHA_GATES:
                if body == _pattern(pattern):
                    return ClampedGate(limit, False, False, alpha, interleaved)
    return None


@functools.cache
def computes_swiglu(cls: type) -> bool:
    """True when ``cls.forward``'s source is ``return self.down_proj(self.act_fn(self.gate_proj(x)) *
    self.up_proj(x))`` (or that expression assigned to one name which is returned), for its single
    argument ``x`` of any name, undecorated. False when the source cannot be read."""
    cls = getattr(cls, "_swiglu_base", cls)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward))).body[0]
    except (OSError, TypeError, SyntaxError, AttributeError):
        return False
    args = tree.args if isinstance(tree, ast.FunctionDef) else None
    if (
        args is None
        or tree.decorator_list
        or len(args.args) != 2
        or args.posonlyargs
        or args.kwonlyargs
        or args.vararg
        or args.kwarg
        or args.defaults
    ):
        return False
    x = args.args[1].arg
    formula = f"self.down_proj(self.act_fn(self.gate_proj({x})) * self.up_proj({x}))"
    expected = ast.dump(ast.parse(formula, mode="eval").body)
    body = [s for s in tree.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return ast.dump(body[0].value) == expected
    if len(body) == 2 and isinstance(body[0], ast.Assign) and isinstance(body[1], ast.Return):
        (target,) = body[0].targets if len(body[0].targets) == 1 else (None,)
        returned = body[1].value
        return (
            isinstance(target, ast.Name)
            and isinstance(returned, ast.Name)
            and target.id == returned.id
            and ast.dump(body[0].value) == expected
        )
    return False


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks)


def _is_silu(act) -> bool:
    # transformers' ACT2FN: "silu" -> transformers.activations.SiLUActivation, "swish" -> nn.SiLU;
    # some experts classes hold the function itself (LFM2-MoE: ``self.act_fn = F.silu``).
    return (
        act is torch.nn.functional.silu
        or isinstance(act, nn.SiLU)
        or (type(act).__name__ == "SiLUActivation" and type(act).__module__.startswith("transformers."))
    )


def _act_fn_reason(module: nn.Module) -> str | None:
    """Why ``module.act_fn`` keeps a module (dense MLP or experts) off the op: not SiLU, or hooked."""
    act = getattr(module, "act_fn", None)
    if not _is_silu(act):
        hidden_act = getattr(getattr(module, "config", None), "hidden_act", None)
        return f"act_fn is {type(act).__name__} (hidden_act={hidden_act!r}), not SiLU"
    if isinstance(act, nn.Module) and _has_hooks(act):
        return "act_fn has hooks registered; the fused op would not run them"
    return None


def _silu_fast(act) -> bool:
    # A SiLU module without hooks (``_act_fn_reason`` finds nothing), in a few reads.
    return isinstance(act, nn.Module) and _is_silu(act) and not _has_hooks(act)


def _runtime_reason(module: nn.Module) -> str | None:
    """Why the fused op cannot stand in for this module's forward right now (None when it can).
    Cheap: types, biases and hook dictionaries only, so it runs at every forward."""
    children = module._modules
    for name in PROJECTIONS:
        proj = children.get(name)
        if proj is None:
            proj = getattr(module, name, None)
        if not isinstance(proj, nn.Module):
            return f"{name} is {type(proj).__name__}, not an nn.Linear"
        # Parallel styles' hooks on a projection belong to a plan the fused op does not run.
        reason = projection_reason(name, proj, parallel_style_hooks=False)
        if reason:
            return reason
    reason = _act_fn_reason(module)
    if reason:
        return reason
    if _foreign_global_hooks():
        return "global module forward hooks are registered; the fused op would not run them on the projections"
    return None


def _foreign_global_hooks() -> bool:
    """Global module forward hooks other than a module tracker's (FlopCounterMode's: it names the
    module each op runs in and changes nothing), which the fused op would skip on the projections."""
    from torch.utils.module_tracker import ModuleTracker

    hooks = (*_torch_module._global_forward_hooks.values(), *_torch_module._global_forward_pre_hooks.values())
    return any(not isinstance(getattr(hook, "__self__", None), ModuleTracker) for hook in hooks)


def unsupported_reason(module: nn.Module) -> str | None:
    """Why ``apply`` leaves ``module`` alone (None when it patches it). Reasons: a packed
    ``gate_up_proj``; a forward other than ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``;
    projections that are not bias-free plain ``nn.Linear``, carry hooks or hold a tensor-subclass
    (quantized) weight; an activation other than SiLU."""
    if hasattr(module, "gate_up_proj"):
        return (
            "packed gate_up_proj (one [2 * intermediate_size, hidden_size] projection, e.g. Phi-3 or fused "
            "MoE experts); the op needs separate gate_proj and up_proj"
        )
    if not computes_swiglu(type(module)):
        return f"its forward ({type(module).__qualname__}.forward) is not down_proj(act_fn(gate_proj(x)) * up_proj(x))"
    if "forward" in module.__dict__ and "_old_forward" not in module.__dict__:
        return "its forward is replaced on the instance (module.forward = ...), so a patched class would not run"
    return _runtime_reason(module)


def _looks_like_mlp(module: nn.Module) -> bool:
    return hasattr(module, "down_proj") and (
        hasattr(module, "gate_up_proj") or (hasattr(module, "gate_proj") and hasattr(module, "up_proj"))
    )


# --------------------------------------------------------------------------- the patched forward


class _SwigluForward(nn.Module):
    """Mixin placed before the original MLP class: its ``__init__``, parameters and state dict stay.
    Each instance holds its options (``swiglu_impl``, ``swiglu_save_activated_gate``,
    ``swiglu_reuse_saved_buffers``); the class attributes are the defaults of instances without them."""

    swiglu_impl = "auto"
    swiglu_save_activated_gate = False
    swiglu_reuse_saved_buffers = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Read once, here: the subclass is shared by every model, so a later patch_classes call
        # must not change the options of models already built.
        impl, save_activated_gate = _BUILD_OPTIONS.get(self._swiglu_base, ("auto", False))
        self.swiglu_impl = impl
        self.swiglu_save_activated_gate = save_activated_gate
        self.swiglu_reuse_saved_buffers = False
        reason = _runtime_reason(self)  # built under patch_classes: say so now, not at the first forward
        if reason is not None:
            warnings.warn(f"swiglu: {type(self).__qualname__} will run its original forward: {reason}", stacklevel=2)

    def __reduce__(self):
        # The subclass is made at run time, so pickle (torch.save(model)) cannot find it by name:
        # pickle the original class, which it can, and patch again when loading. The state goes
        # third, applied after the object exists, so a state that refers back to the module (an
        # instance forward bound to it, accelerate's hook) copies and pickles without recursion.
        return _unpickle, (self._swiglu_base,), self.__getstate__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        children = self._modules
        gate, up, down = children.get("gate_proj"), children.get("up_proj"), children.get("down_proj")
        if (
            _fusable_fast(gate)
            and _fusable_fast(up)
            and _fusable_fast(down)
            and _silu_fast(children.get("act_fn"))
            and not (_torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks)
        ):
            # The usual case, in a few reads (``_runtime_reason``'s verdict; plain nn.Linear weights).
            weights = gate._parameters["weight"], up._parameters["weight"], down._parameters["weight"]
        else:
            reason = _runtime_reason(self)
            if reason is not None:
                warnings.warn(f"swiglu: {type(self).__qualname__} runs its original forward: {reason}", stacklevel=2)
                return super().forward(x)
            weights = self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight
        return _swiglu_mlp(x, *weights, self.swiglu_impl, self.swiglu_save_activated_gate, self.swiglu_reuse_saved_buffers)


def _unpickle(base: type, state: dict | None = None) -> nn.Module:
    cls = swiglu_class(base)
    module = cls.__new__(cls)
    if state is not None:  # pickles written before the state moved to the reduce tuple's third item
        module.__setstate__(state)
    return module


def swiglu_class(cls: type) -> type:
    """The subclass of MLP class ``cls`` whose forward is our op (one per class, cached)."""
    if issubclass(cls, _SwigluForward):
        return cls
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        sub = type(
            f"Swiglu{cls.__name__}",
            (_SwigluForward, cls),
            {"__module__": __name__, "__qualname__": f"Swiglu{cls.__qualname__}", "_swiglu_base": cls},
        )
        _SUBCLASSES[cls] = sub
    return sub


def _check_options(impl, save_activated_gate, reuse_saved_buffers=False) -> None:
    _check_impl(impl)
    check_bool("save_activated_gate", save_activated_gate)
    check_bool("reuse_saved_buffers", reuse_saved_buffers)


def _short(names: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


# --------------------------------------------------------------------------- mixture-of-experts experts

#: The name ``register_experts`` gives our experts forward in transformers' ``ExpertsInterface``
#: (``from_pretrained(..., experts_implementation="swiglu")``, ``model.set_experts_implementation``).
EXPERTS_IMPLEMENTATION = "swiglu"
#: What an experts module falls back to when no previous implementation was recorded (transformers' default).
DEFAULT_EXPERTS_FALLBACK = "grouped_mm"
_EXPERTS_STATE = "_swiglu_experts"  # instance attribute: (impl, reason or None, fallback implementation name)
# The flags every transformers release with ``use_experts_implementation`` sets (later releases
# add is_transposed, is_concatenated, has_post_expert_norm: read with their defaults when absent).
_EXPERTS_FLAGS = ("has_gate", "has_bias")
_experts_default_impl = "auto"  # impl of experts modules that run "swiglu" without apply (register_experts(impl=))


def _is_experts(module: nn.Module) -> bool:
    """An experts module built with transformers' ``use_experts_implementation`` (its ``__init__``
    sets these flags on the instance and its ``forward`` dispatches on the config's
    ``_experts_implementation``)."""
    d = module.__dict__
    return all(flag in d for flag in _EXPERTS_FLAGS) and "config" in d


def _other_experts_interface(module: nn.Module) -> str | None:
    """Why the config of ``module`` must not be switched to "swiglu": its forward dispatches through
    an interface other than ``ExpertsInterface`` (transformers' FP8 experts), which would not find it."""
    try:
        from transformers.integrations.finegrained_fp8 import FP8Experts
    except ImportError:
        return None
    if isinstance(module, FP8Experts):
        return (
            "FP8 experts dispatch through transformers' FP8 experts interface, which has no "
            f"{EXPERTS_IMPLEMENTATION!r}; the model's experts implementation is left as it is"
        )
    return None


def experts_unsupported_reason(module: nn.Module) -> str | None:
    """Why ``swiglu.swiglu_moe`` cannot compute this experts module (None when it can): biases
    that are not floating tensors, interleaved gate/up weights (``is_concatenated=False``) without
    gpt-oss's gate that splits them so, no gate, a post-expert norm, an
    ``_apply_gate`` other than transformers' default ``silu(gate) * up`` or the clamped and alpha
    forms ``clamped_gate`` knows (with a positive finite limit and alpha; a clamp after the
    activation only without a limit), an activation other than SiLU, or weights that
    are not plain floating [E, 2I, H] / [E, H, I] tensors (transposed: [E, H, 2I] / [E, I, H]). What does not
    change between calls; ``swiglu_experts_forward`` checks the rest (routing shape, dtypes,
    expert parallelism) at every call."""
    from transformers.integrations.moe import _default_apply_gate

    if getattr(module, "has_bias", False):
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            b = getattr(module, name, None)
            if not isinstance(b, torch.Tensor) or b.dtype not in FLOAT_DTYPES:
                return f"{name} is {type(b).__name__ if not isinstance(b, torch.Tensor) else b.dtype}, not a floating tensor"
    if not getattr(module, "is_concatenated", True) and not getattr(clamped_gate(type(module)), "interleaved", False):
        return "interleaved gate/up rows (gate0, up0, gate1, ...) with a gate that does not split them so (not gpt-oss's)"
    if not getattr(module, "has_gate", True):
        return "no gate (up_proj and an activation only); the op computes silu(gate) * up"
    if getattr(module, "has_post_expert_norm", False):
        return "a norm after each expert (post_expert_norm); the op has none"
    cls = type(module)
    clamped = None
    if getattr(cls, "_apply_gate", None) is not _default_apply_gate or "_apply_gate" in module.__dict__:
        clamped = None if "_apply_gate" in module.__dict__ else clamped_gate(cls)
        if clamped is None:
            return f"custom gating ({cls.__qualname__}._apply_gate), not transformers' default silu(gate) * up"
        reason = _gate_values(module, clamped)[0]
        if reason:
            return reason
    reason = _act_fn_reason(module) if _reads_act_fn(cls) else None
    if reason:
        return reason
    weights = {}
    for name in ("gate_up_proj", "down_proj"):
        w = getattr(module, name, None)
        if not isinstance(w, torch.Tensor):
            return f"{name} is {type(w).__name__}, not a tensor"
        if w.dtype not in FLOAT_DTYPES:
            return f"{name} has dtype {w.dtype} (quantized?); the op takes {', '.join(map(str, FLOAT_DTYPES))}"
        weights[name] = w
    gate_up, down = weights["gate_up_proj"], weights["down_proj"]
    layout = "[E, H, 2I] and [E, I, H] (transposed)" if _transposed(module) else "[E, 2I, H] and [E, H, I]"
    if _transposed(module) and gate_up.dim() == down.dim() == 3:
        gate_up, down = gate_up.mT, down.mT
    if (
        gate_up.dim() != 3
        or gate_up.shape[1] % 2
        or tuple(down.shape) != (gate_up.shape[0], gate_up.shape[2], gate_up.shape[1] // 2)
    ):
        return f"gate_up_proj {tuple(weights['gate_up_proj'].shape)} and down_proj {tuple(weights['down_proj'].shape)} are not {layout}"
    return None


def _transposed(module: nn.Module) -> bool:
    """transformers' ``is_transposed`` layout (Aria): gate_up_proj [E, H, 2I], down_proj [E, I, H],
    which the op takes as their ``mT`` views (the kernels read that memory in its own order)."""
    return bool(module.__dict__.get("is_transposed", False))


def _call_reason(module, hidden_states, top_k_index, top_k_weights, gate_up, down) -> str | None:
    """Why this call cannot run the op (None when it can): a few shape, type, flag and hook checks."""
    if top_k_weights.shape != top_k_index.shape:
        return (
            f"top_k_weights {tuple(top_k_weights.shape)} is not top_k_index's shape {tuple(top_k_index.shape)} "
            f"(dense [tokens, num_experts] routing weights); the op takes one weight per routed expert"
        )
    plain = (torch.Tensor, nn.Parameter)
    if type(gate_up) not in plain or type(down) not in plain:
        return (
            f"the expert weights are {type(gate_up).__name__} / {type(down).__name__} (a tensor subclass: "
            f"quantized or distributed), not plain tensors"
        )
    if module.__dict__.get("_is_expert_parallel"):
        return "expert parallelism (sharded experts, sentinel expert ids) is not covered"
    # act_fn swapped or hooked after the module's first call (the class checks stay decided once).
    # (Global module hooks on act_fn are not checked: FlopCounterMode's module tracker registers some.)
    if not _silu_fast(module._modules.get("act_fn")) and _reads_act_fn(type(module)) and (reason := _act_fn_reason(module)):
        return reason
    if hidden_states.dtype != gate_up.dtype and not torch.is_autocast_enabled(hidden_states.device.type):
        # (under autocast the op casts hidden_states and the weights to autocast's dtype, as F.linear)
        return f"hidden_states are {hidden_states.dtype} but the expert weights {gate_up.dtype}"
    return None


class _RegisterOnLoad:
    """Kept beside an experts module's state: a pickled model (``torch.save(model)``) names
    "swiglu" only in its config, so loading it registers the name again, as ``apply`` did
    (transformers' KeyError at the first forward otherwise). The forward never reads it."""

    def __reduce__(self):
        return _register_on_load, ()


def _register_on_load() -> _RegisterOnLoad:
    with contextlib.suppress(ImportError, ValueError):  # no transformers, or "swiglu" is another's: as before
        register_experts()
    return _REGISTER_ON_LOAD


_REGISTER_ON_LOAD = _RegisterOnLoad()
_EXPERTS_REGISTRATION = "_swiglu_experts_registration"  # instance attribute: _REGISTER_ON_LOAD


def _experts_state(module: nn.Module, impl: str | None = None, fallback: str | None = None) -> tuple:
    """Decide once per module what ``swiglu_experts_forward`` runs; store and return
    ``(impl, reason, fallback)``. Warns when it falls back and no caller does (first call)."""
    reason = experts_unsupported_reason(module)
    state = (_experts_default_impl if impl is None else impl, reason, fallback or DEFAULT_EXPERTS_FALLBACK)
    module.__dict__[_EXPERTS_STATE] = state
    module.__dict__[_EXPERTS_REGISTRATION] = _REGISTER_ON_LOAD
    return state


def _fallback_forward(module: nn.Module, name: str):
    """The experts forward of implementation ``name`` ("eager": the class's own loop)."""
    if name != "eager":
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        fn = ALL_EXPERTS_FUNCTIONS.get(name)
        if fn is not None and fn is not swiglu_experts_forward:
            return fn
    eager = getattr(type(module).forward, "__wrapped__", None)
    if eager is None:
        raise RuntimeError(
            f"swiglu: {type(module).__qualname__} has no experts implementation {name!r} to fall back to and no eager forward"
        )
    return eager


def swiglu_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The experts forward registered as ``"swiglu"`` in transformers' ``ExpertsInterface``:
    ``swiglu.swiglu_moe(hidden_states, top_k_index, top_k_weights, self.gate_up_proj,
    self.down_proj, impl=...)`` (their ``mT`` where ``is_transposed``), [T, H] out (``swiglu_limit``
    the module's where its gate clamps).

    ``impl`` is the module's (``apply(model, impl=...)``; ``register_experts(impl=...)`` for modules
    that run "swiglu" without ``apply``). Whether the op can compute the module is decided at its
    first call (or by ``apply``: ``experts_unsupported_reason``); a module it cannot, and a call it
    cannot (``[T, num_experts]`` routing weights, a tensor subclass weight, expert parallelism,
    hidden_states in another dtype than the weights outside autocast), runs the module's previous
    implementation (the one ``apply`` replaced, else transformers' default ``"grouped_mm"``) with
    a ``UserWarning`` naming the reason."""
    state = self.__dict__.get(_EXPERTS_STATE)
    if state is None:
        state = _experts_state(self)
        if state[1] is not None:
            warnings.warn(
                f"swiglu: {type(self).__qualname__} runs its {state[2]!r} experts implementation: {state[1]}", stacklevel=2
            )
    impl, reason, fallback = state
    if reason is None:
        gate_up, down = self.gate_up_proj, self.down_proj
        reason = _call_reason(self, hidden_states, top_k_index, top_k_weights, gate_up, down)
        clamped = clamped_gate(type(self))  # cached per class; None for the default gate
        limit = alpha = None
        if reason is None and clamped is not None:
            reason, limit, alpha = _gate_values(self, clamped)
        if reason is None:
            if _transposed(self):
                gate_up, down = gate_up.mT, down.mT
            reuse = self.__dict__.get("swiglu_reuse_saved_buffers", False)
            # Biases are [E, 2I] and [E, H] in either layout (transformers adds them after the product).
            bias = dict(gate_up_proj_bias=self.gate_up_proj_bias, down_proj_bias=self.down_proj_bias) if self.has_bias else {}
            if clamped is not None and clamped.interleaved:
                bias["interleaved"] = True
            return _swiglu_moe(
                hidden_states,
                top_k_index,
                top_k_weights,
                gate_up,
                down,
                impl=impl,
                reuse_saved_buffers=reuse,
                swiglu_limit=limit,
                swiglu_alpha=alpha,
                **bias,
            )
        warnings.warn(f"swiglu: {type(self).__qualname__} runs its {fallback!r} experts implementation: {reason}", stacklevel=2)
    return _fallback_forward(self, fallback)(self, hidden_states, top_k_index, top_k_weights)


def register_experts(impl: str | None = None) -> str:
    """Register ``swiglu_experts_forward`` with transformers' ``ExpertsInterface`` as ``"swiglu"``
    (idempotent); returns the name. Then ``from_pretrained(..., experts_implementation="swiglu")``,
    ``model.set_experts_implementation("swiglu")`` or ``config._experts_implementation = "swiglu"``
    select it (``apply`` registers and selects it itself).

    Args:
        impl: the ``impl`` of experts modules that run "swiglu" without ``apply`` and have not run
            yet (default: unchanged, initially ``"auto"``); ``apply(model, impl=...)`` sets it per module.

    Raises: ImportError (transformers without ``transformers.integrations.moe``), ValueError
    (another function is registered as "swiglu"; an unknown impl), TypeError (a non-str impl).
    """
    global _experts_default_impl
    if impl is not None:
        _check_impl(impl)
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface
    except ImportError as exc:
        raise ImportError(
            f"swiglu.integrations.transformers.register_experts needs transformers with "
            f"transformers.integrations.moe (pip install 'swiglu[hf]'): {exc}"
        ) from exc
    current = ALL_EXPERTS_FUNCTIONS.get(EXPERTS_IMPLEMENTATION)
    if current is not None and current is not swiglu_experts_forward and getattr(current, "__module__", None) != __name__:
        raise ValueError(
            f"transformers' ExpertsInterface already maps {EXPERTS_IMPLEMENTATION!r} to "
            f"{getattr(current, '__qualname__', current)!r}"
        )
    if current is not swiglu_experts_forward:
        ExpertsInterface.register(EXPERTS_IMPLEMENTATION, swiglu_experts_forward)
    if impl is not None:
        _experts_default_impl = impl
    return EXPERTS_IMPLEMENTATION


def _set_experts_implementation(model: nn.Module, configs: list, name_of) -> None:
    """Set each config's experts implementation (``name_of(config)``): through the model's public
    ``set_experts_implementation`` when ``model`` is a transformers model and one name fits all,
    else (and for configs that call did not reach) on the config."""
    names = {name_of(c) for c in configs}
    if (
        len(names) == 1
        and callable(getattr(model, "set_experts_implementation", None))
        and getattr(model, "config", None) is not None
    ):
        model.set_experts_implementation(next(iter(names)))
    for config in configs:
        if config._experts_implementation != name_of(config):
            config._experts_implementation = name_of(config)


def _warn_config_reach(model: nn.Module, switched: str) -> None:
    """The experts implementation is the config's, which a model's layers share: on a part of a
    model (no transformers model inside it), ``apply``/``unpatch`` reach beyond it. Said once per call."""
    from transformers import PreTrainedModel

    if not any(isinstance(m, PreTrainedModel) for m in model.modules()):
        warnings.warn(
            f"swiglu: the experts implementation is chosen per config, which every layer of a model shares: "
            f"switched to {switched} for every experts module sharing the config of this "
            f"{type(model).__qualname__}'s experts, also those outside it",
            stacklevel=4,
        )


def _apply_experts(model: nn.Module, experts: list, impl: str) -> set[str]:
    """``apply``'s part for experts modules ``[(name, module)]``: record each one's state and
    previous implementation, switch the configs of those the op serves to "swiglu", warn about the
    rest. Returns the names of the modules that run the op."""
    register_experts()
    skipped, served, configs, blocked = {}, set(), {}, {}
    for name, module in experts:
        config = module.config
        current = config._experts_implementation
        old = module.__dict__.get(_EXPERTS_STATE)
        if current == EXPERTS_IMPLEMENTATION:
            fallback = old[2] if old is not None else DEFAULT_EXPERTS_FALLBACK
        else:
            fallback = current or DEFAULT_EXPERTS_FALLBACK
        reason = _other_experts_interface(module)
        if reason is not None:
            blocked[id(config)] = reason
        _, static_reason, _ = _experts_state(module, impl, fallback)
        reason = reason or static_reason
        if reason is not None:
            skipped.setdefault((type(module).__qualname__, fallback, reason), []).append(name)
            continue
        served.add(name)
        configs.setdefault(id(config), config)
    for key, reason in blocked.items():  # a config shared with FP8 experts stays as it is
        if key in configs:
            del configs[key]
            for name, module in experts:
                if id(module.config) == key and name in served:
                    served.discard(name)
                    skipped.setdefault((type(module).__qualname__, module.__dict__[_EXPERTS_STATE][2], reason), []).append(name)
    if configs:
        _set_experts_implementation(model, list(configs.values()), lambda c: EXPERTS_IMPLEMENTATION)
        _warn_config_reach(model, repr(EXPERTS_IMPLEMENTATION))
    for (cls, fallback, reason), names in skipped.items():
        warnings.warn(
            f"swiglu: {len(names)} {cls} experts module(s) ({_short(names)}) keep their {fallback!r} "
            f"experts implementation: {reason}",
            stacklevel=3,
        )
    return served


def _unpatch_experts(model: nn.Module) -> list[str]:
    """Give the experts modules ``apply`` switched their previous implementation back."""
    names, configs, previous = [], {}, {}
    for name, module in model.named_modules():
        state = module.__dict__.pop(_EXPERTS_STATE, None)
        module.__dict__.pop(_EXPERTS_REGISTRATION, None)
        if state is None or not _is_experts(module):
            continue
        config = module.config
        if config._experts_implementation == EXPERTS_IMPLEMENTATION:
            configs.setdefault(id(config), config)
            previous.setdefault(id(config), state[2])
            if state[1] is None:
                names.append(name)
    if configs:
        _set_experts_implementation(model, list(configs.values()), lambda c: previous[id(c)])
        _warn_config_reach(model, "the previous implementation")
    return names


# --------------------------------------------------------------------------- public calls


def apply(
    model: nn.Module,
    *,
    impl: str = "auto",
    save_activated_gate: bool = False,
    reuse_saved_buffers: bool = False,
    backward_impl: str | None = None,
) -> list[str]:
    """Patch every SwiGLU MLP inside ``model`` (in place) to run ``swiglu.swiglu_mlp``, and switch
    its mixture-of-experts experts modules to ``swiglu.swiglu_moe``.

    Args:
        model: any ``nn.Module`` (a transformers ``PreTrainedModel``, or a module of one).
        impl, save_activated_gate, reuse_saved_buffers: as ``swiglu.swiglu_mlp`` (``"auto"``: Triton
            for bf16 on CUDA sm_90+, the reference otherwise); ``backward_impl``: impl's former name.
            ``impl`` and ``reuse_saved_buffers`` are also the experts modules' (``swiglu.swiglu_moe``'s);
            ``save_activated_gate`` concerns the dense MLPs only.

    Returns: the qualified names of the patched modules (e.g. ``"model.layers.0.mlp"``,
    ``"model.layers.0.mlp.experts"``), in ``named_modules`` order; modules patched before are
    included (their options updated). Dense MLP classes become ``Swiglu<Class>`` subclasses;
    experts modules keep their class, their config's experts implementation becomes ``"swiglu"``
    (``model.set_experts_implementation``; on a part of a model, every layer's: a warning says so).
    Parameters, buffers, state-dict names and ``save_pretrained`` output are unchanged; ``unpatch``
    undoes it.

    Modules with ``gate_proj``/``up_proj``/``down_proj`` (or ``gate_up_proj``) that cannot be
    served are left alone, one ``UserWarning`` per class and reason naming them (see
    ``unsupported_reason``); experts modules the op cannot compute (``experts_unsupported_reason``)
    keep their previous implementation, with one such warning.

    Raises: TypeError (not an nn.Module, non-bool save_activated_gate), ValueError (unknown impl).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if backward_impl is not None:
        impl = _renamed(backward_impl, impl)
    _check_options(impl, save_activated_gate, reuse_saved_buffers)
    patched, skipped, experts = [], {}, []
    for name, module in model.named_modules():
        if _is_experts(module):
            module.__dict__["swiglu_reuse_saved_buffers"] = reuse_saved_buffers
            experts.append((name, module))
            patched.append(name)  # kept below when the op serves it
            continue
        if not isinstance(module, _SwigluForward):
            if not _looks_like_mlp(module):
                continue
            reason = unsupported_reason(module)
            if reason is not None:
                skipped.setdefault((type(module).__qualname__, reason), []).append(name)
                continue
            module.__class__ = swiglu_class(type(module))
            if "_old_forward" in module.__dict__ and "forward" in module.__dict__:
                # accelerate's hook on the MLP itself (e.g. io_same_device, an offloaded layer):
                # its wrapper calls _old_forward, bound to the old class; bind ours instead.
                module._old_forward = types.MethodType(type(module).forward, module)
        module.swiglu_impl = impl
        module.swiglu_save_activated_gate = save_activated_gate
        module.swiglu_reuse_saved_buffers = reuse_saved_buffers
        patched.append(name)
    for (cls, reason), names in skipped.items():
        warnings.warn(f"swiglu: left {len(names)} {cls} module(s) unpatched ({_short(names)}): {reason}", stacklevel=2)
    if experts:
        served = _apply_experts(model, experts, impl)
        unserved = {name for name, _ in experts} - served
        patched = [name for name in patched if name not in unserved]
    return patched


def unpatch(model: nn.Module) -> list[str]:
    """Give every module ``apply`` patched its original class back, and experts modules their
    previous experts implementation; returns their names."""
    experts = _unpatch_experts(model)
    names = []
    for name, module in model.named_modules():
        if isinstance(module, _SwigluForward):
            for attr in ("swiglu_impl", "swiglu_save_activated_gate", "swiglu_reuse_saved_buffers"):
                module.__dict__.pop(attr, None)
            module.__class__ = type(module)._swiglu_base
            names.append(name)
        elif name in experts:
            module.__dict__.pop("swiglu_reuse_saved_buffers", None)
            names.append(name)
    return names


def patch_classes(
    model_types=DEFAULT_MODEL_TYPES, *, impl: str = "auto", backward_impl: str | None = None, save_activated_gate: bool = False
) -> list[str]:
    """Register our subclasses of these model types' SwiGLU MLP classes with transformers' patch
    mapping, so that ``from_pretrained`` / ``from_config`` (and code inside
    ``transformers.monkey_patching.apply_patches()``) build models with them. Call before loading.

    Args:
        model_types: names under ``transformers.models`` (default ``DEFAULT_MODEL_TYPES``:
            llama, mistral, qwen2, qwen3); every class of ``modeling_<type>`` whose forward is the
            SwiGLU formula is registered (e.g. ``LlamaMLP``).
        impl, save_activated_gate: the options of the modules built while registered; each
            module keeps those it was built with (a later ``patch_classes`` call does not change
            them; ``apply`` can, per module).

    Returns: the registered class names. Instances whose configuration the op cannot serve
    (``mlp_bias=True``, another ``hidden_act``) warn when built and run their original forward.
    ``unpatch_classes()`` removes the registrations.

    Raises: ImportError (transformers missing or older than 5.3), ValueError (an unknown model
    type or one without such a class, an unknown impl, a class name already mapped by
    someone else), TypeError (non-bool save_activated_gate).
    """
    if backward_impl is not None:
        impl = _renamed(backward_impl, impl)
    _check_options(impl, save_activated_gate)
    if isinstance(model_types, str):
        model_types = (model_types,)
    try:
        from transformers import monkey_patching
    except ImportError as exc:
        raise ImportError(
            f"swiglu.integrations.transformers.patch_classes needs transformers>={MIN_TRANSFORMERS} "
            f"(pip install 'swiglu[hf]'): {exc}"
        ) from exc
    mapping = {}
    for model_type in model_types:
        try:
            module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        except ModuleNotFoundError as exc:
            raise ValueError(f"model_types: transformers has no model type {model_type!r} ({exc})") from exc
        found = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, nn.Module) and obj.__module__ == module.__name__ and computes_swiglu(obj)
        ]
        if not found:
            raise ValueError(
                f"model_types: transformers.models.{model_type} has no MLP class computing "
                f"down_proj(act_fn(gate_proj(x)) * up_proj(x))"
            )
        for cls in found:
            mapping[cls.__name__] = swiglu_class(cls)
    current = monkey_patching.get_patch_mapping()
    taken = sorted(n for n in mapping if n in current and current[n] is not _REGISTERED.get(n))
    if taken:
        raise ValueError(
            f"transformers' patch mapping already replaces {taken} with another class; "
            f"unregister it first (transformers.monkey_patching.unregister_patch_mapping)"
        )
    monkey_patching.register_patch_mapping(mapping, overwrite=True)
    _REGISTERED.update(mapping)
    for sub in mapping.values():
        _BUILD_OPTIONS[sub._swiglu_base] = (impl, save_activated_gate)
    return sorted(mapping)


def unpatch_classes() -> list[str]:
    """Remove the registrations ``patch_classes`` made; returns their class names. Models already
    built keep their patched modules and options (``unpatch(model)`` restores those)."""
    _BUILD_OPTIONS.clear()
    if not _REGISTERED:
        return []
    from transformers import monkey_patching

    names = sorted(n for n, sub in _REGISTERED.items() if monkey_patching.get_patch_mapping().get(n) is sub)
    if names:
        monkey_patching.unregister_patch_mapping(names)
    _REGISTERED.clear()
    return names
