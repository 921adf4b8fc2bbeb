"""Which mixture-of-experts families of the installed transformers does ``apply`` switch to the
"swiglu" experts implementation, which keep their own (with a warning), and does any come out wrong?

For every model family whose modeling file decorates an experts class with
``@use_experts_implementation``: a tiny random model on the CPU in float32 (hidden 64, 2 layers,
4 heads / 2 kv heads, head_dim 16, vocab 128, experts of 32, 8 experts, top-2; the config's own
names for those, plus per-family overrides; a multimodal family's text model alone). The model
and a deep copy after ``swiglu.integrations.transformers.apply(copy, impl="reference")`` (warnings
caught) run one LM-loss forward+backward on the same ids; ``_swiglu_moe``'s calls are counted.
Verdict per family: "swiglu" (the op ran; logits, loss and every gradient within F32_TOL = 1e-5
relative of the unpatched model), "fallback: <warning>" (no call, a warning, the same results),
"WRONG: ..." (results differ, or a fallback without a warning), "ERROR: ..." (an exception from
apply or the patched model's step), "skip: <why>" (the tiny model could not be built or run
unpatched).

Answer (transformers 5.25, torch 2.13 CPU): all 72 families build tiny (73 text models: Qwen3-Omni's
thinker and talker); none WRONG or ERROR. 63 run the op and match (max relative error 3.2e-6, on
linear-attention A_log gradients; the experts' own gradients ~1e-7): LFM2-MoE since ``F.silu`` as
``act_fn`` counts as SiLU, DeepSeek-V4, GLM-5-Next, HY-V4 and HY-V4-VL since their clamped gate runs
as ``swiglu_limit``, Step-3.7 and bailing_hybrid (Ling-2.5) since their clamp after the activation is
off where a layer's limit is None, as in their default configs (a layer with a limit falls back),
MiniMax-M3-VL since its gpt-oss activation runs as ``swiglu_alpha``, Aria since its transposed
weights run as their ``mT`` (all nine fell back before). 10 keep their implementation with a warning
and the same results: custom gating (beam, inkling2, inkling2_loop), another activation (GELU-tanh:
gemma4, diffusion_gemma), biases (gpt_oss, openai_privacy_filter), no gate (nemotron_h, ergo), a
post-expert norm (muse_spark). Every family's
'eager' experts equal its default 'grouped_mm' within 1e-5. Per-family overrides: 16 configs
(FAMILY below); MLA families run with as many kv heads as heads. Not exercised: Ernie4.5-VL's
vision experts (text-only ids); Qwen3-Omni's talker is fed inputs_embeds (its forward's input_ids
path reads an embed_tokens it lacks). The table goes to build/experts_survey.txt (``--out=PATH``);
the exit status is 1 if a family is WRONG or ERROR. ``--plant`` (0.1% error in the op's output)
turns qwen3_moe WRONG. tests/lab/test_hf_experts_survey.py runs it.
Run: PYTHONPATH=src:lab .venv/bin/python lab/probes/hf_experts_survey.py [--plant] [--out=PATH] [family ...]
     (~20 s on 2 CPU cores, no GPU; with families named, no file is written unless --out)
"""

from __future__ import annotations

import copy
import importlib
import inspect
import re
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers import PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

from swiglu import relative_error
from swiglu.integrations import transformers as swiglu_hf

ROOT = Path(__file__).resolve().parents[2]
# tests/library/test_moe_hf.py's tolerance, sizes and ids
F32_TOL = 1e-5
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


def batch(seed: int = 1, shape=(2, 12)) -> torch.Tensor:
    return torch.randint(3, SMALL["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


OUT = ROOT / "build" / "experts_survey.txt"
PLANT = False  # --plant: a 0.1% error in the op's output (every "swiglu" family must then read WRONG)
MODELS = Path(transformers.models.__path__[0])

#: Config fields set when the family's config has them (its own names for the tiny sizes).
GENERIC = {
    **SMALL,
    "num_layers": 2,
    "intermediate_size": 96,
    "ffn_hidden_size": 96,
    "first_dense_intermediate_size": 96,
    "mlp_only_intermediate_size": 96,
    "moe_intermediate_size": 32,
    "expert_ffn_hidden_size": 32,
    "shared_expert_intermediate_size": 48,
    "moe_shared_expert_intermediate_size": 48,
    "shared_intermediate_size": 48,
    "num_experts": 8,
    "num_local_experts": 8,
    "n_routed_experts": 8,
    "moe_num_experts": 8,
    "num_experts_per_tok": 2,
    "top_k_experts": 2,
    "num_experts_per_token": 2,
    "moe_k": 2,
    "moe_topk": 2,
    "n_group": 1,
    "topk_group": 1,
    "num_expert_group": 1,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "num_dense_blocks": 1,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "index_head_dim": 16,
    "index_n_heads": 2,
    "index_num_heads": 2,
    "index_topk": 8,
    "o_lora_rank": 16,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_head_dim": 16,
    "linear_num_heads": 4,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "mamba_d_state": 16,
    "mamba_dt_rank": 8,
    "router_hidden_size": 32,
    "zero_expert_num": 2,
    "num_nextn_predict_layers": 0,
    "vocab_size_per_layer_input": 128,
    "hidden_size_per_layer_input": 16,
}
#: Set only when the default is not None (None means "off" for these).
IF_SET = {"q_lora_rank": 32}
#: Per-family overrides on top (model type -> fields; a callable gets the default config dict).
FAMILY = {
    "gemma4_text": {"enable_moe_block": True},
    "diffusion_gemma_text": {"enable_moe_block": True},
    "step3p5": {"sliding_window": 16},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "glm4v_moe_text": {
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
        }
    },
    "hy_v4_vl_text": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}},
    "qwen3_omni_moe_talker_text": {"shared_expert_intermediate_size": 48},
    "dots1": {"n_shared_experts": 1},
    "zaya": {"num_experts_per_tok": 1},
    "ernie4_5_moe": {"moe_layer_start_index": 1, "moe_layer_end_index": 1},
    "glm5_next_text": {"index_topk": 16, "qk_rope_head_dim": 0, "qk_nope_head_dim": 16, "head_dim": 0},  # DSA: NoPE
    "deepseek_ocr2_text": {"mlp_layer_types": ["dense", "sparse"]},
    "ernie4_5_vl_moe_text": {
        "moe_intermediate_size": [32, 32],
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [3, 3, 2]},
    },
    "jamba": {"expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 2, "attn_layer_offset": 0},
    "mistral4": {"first_k_dense_replace": 0, "head_dim": 16},  # head_dim: qk_nope + qk_rope (its YaRN uses it)
    "deepseek_v2": {"first_k_dense_replace": 1, "topk_method": "greedy"},
}


def families() -> list[str]:
    """Model types (folders) whose modeling file decorates an experts class."""
    return sorted(
        p.parent.name for p in MODELS.glob("*/modeling_*.py") if re.search(r"^@use_experts_implementation", p.read_text(), re.M)
    )


def experts_classes(model_type: str) -> list[str]:
    text = "".join(p.read_text() for p in (MODELS / model_type).glob("modeling_*.py"))
    return re.findall(r"^@use_experts_implementation(?:\(([^)]*)\))?\s*\nclass (\w+)", text, re.M)


def _config_class(model_type: str):
    if model_type in CONFIG_MAPPING:
        return CONFIG_MAPPING[model_type]
    mod = importlib.import_module(f"transformers.models.{model_type}.configuration_{model_type}")
    found = [
        c
        for c in vars(mod).values()
        if inspect.isclass(c) and c.__module__ == mod.__name__ and getattr(c, "model_type", None) == model_type
    ] or [  # a multimodal family's config under another model type: the one holding a text config
        c
        for c in vars(mod).values()
        if inspect.isclass(c) and c.__module__ == mod.__name__ and "text_config" in getattr(c, "sub_configs", {})
    ]
    if len(found) != 1:
        raise LookupError(f"no single config class in configuration_{model_type} ({[c.__name__ for c in found]})")
    return found[0]


def text_targets(model_type: str) -> list[tuple[str, type, type]]:
    """(label, config class, model class) of the text model(s) to build: the family's causal LM, or
    for a multimodal family its text config's causal LM (else its text model)."""
    top_cls = _config_class(model_type)
    top = top_cls()
    subs = []
    for key in ("text_config", "thinker_config", "talker_config"):
        sub = getattr(top, key, None)
        if sub is None or not hasattr(sub, "to_dict"):
            continue
        inner = getattr(sub, "text_config", None)
        if inner is not None and hasattr(inner, "to_dict"):
            subs.append((f"{model_type}/{key.split('_')[0]}" if key != "text_config" else model_type, type(inner)))
        else:
            subs.append((model_type, type(sub)))
    if not subs:
        subs = [(model_type, top_cls)]
    modeling = [
        importlib.import_module(f"transformers.models.{model_type}.{p.stem}")
        for p in sorted((MODELS / model_type).glob("modeling_*.py"))
    ]
    out = []
    for label, cfg_cls in subs:
        mt = getattr(cfg_cls, "model_type", "")
        names = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(mt)]
        classes = [
            c
            for mod in modeling
            for c in vars(mod).values()
            if inspect.isclass(c)
            and issubclass(c, PreTrainedModel)
            and c.__module__ == mod.__name__
            and getattr(c, "config_class", None) is cfg_cls
            and not c.__name__.endswith("PreTrainedModel")
        ]
        names += [c.__name__ for c in classes if c.__name__.endswith("ForCausalLM")]
        names += [MODEL_MAPPING_NAMES.get(mt)]
        names += [c.__name__ for c in classes if c.__name__.endswith("Model")]
        by_name = {c.__name__: c for c in classes}
        model_cls = None
        for n in names:
            if n is None:
                continue
            c = by_name.get(n) or getattr(transformers, n, None)
            if c is not None and getattr(c, "config_class", None) is cfg_cls:
                model_cls = c
                break
        if model_cls is None:
            raise LookupError(f"no causal LM or text model class for {cfg_cls.__name__}")
        out.append((label, cfg_cls, model_cls))
    return out


def tiny_config(cfg_cls):
    defaults = cfg_cls().to_dict()
    mt = getattr(cfg_cls, "model_type", "")
    kw = {k: v for k, v in GENERIC.items() if k in defaults}
    kw.update({k: v for k, v in IF_SET.items() if defaults.get(k) is not None})
    if "head_dim" in defaults and "qk_rope_head_dim" in defaults:  # MLA: head_dim is the rope part
        kw["head_dim"] = kw["qk_rope_head_dim"]
    if "kv_lora_rank" in defaults:  # MLA: every head has its own keys and values
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    # per-layer lists: the first entries, keeping one sparse (MoE) layer
    n_default = defaults.get("num_hidden_layers", defaults.get("num_layers"))
    for k, v in defaults.items():
        if isinstance(v, list) and n_default and len(v) == n_default and k not in kw:
            if k == "mlp_layer_types" or k == "layers_block_type":
                kw[k] = v[:2]
            elif k.endswith("_list") or k == "num_attention_heads_per_layer":
                kw[k] = [GENERIC["num_attention_heads"]] * 2 if k == "num_attention_heads_per_layer" else v[:2]
            elif k == "kv_source_layers":
                kw[k] = [0, 1]
            else:
                kw[k] = v[:2]
    if isinstance(kw.get("mlp_layer_types"), list):
        dense = [t for t in defaults["mlp_layer_types"] if t == "dense"]
        sparse = next(t for t in defaults["mlp_layer_types"] if t != "dense")
        kw["mlp_layer_types"] = (["dense"] if dense else [sparse]) + [sparse]
    if isinstance(defaults.get("layers_block_type"), list):  # nemotron_h: the MoE block and attention
        kw["layers_block_type"] = ["moe", "full_attention"]
    for k in ("mlp_only_layers", "index_layers"):
        if isinstance(defaults.get(k), list):
            kw[k] = []
    fam = FAMILY.get(mt, {})
    kw.update(fam(defaults) if callable(fam) else fam)
    try:
        return cfg_cls(**kw)
    except Exception as exc:  # noqa: BLE001 - architectures that want as many kv heads as heads
        if "num_key_value_heads" not in str(exc) or kw.get("num_key_value_heads") == kw.get("num_attention_heads"):
            raise
        return cfg_cls(**{**kw, "num_key_value_heads": kw["num_attention_heads"]})


def build(cfg_cls, model_cls, seed: int = 0):
    """The test's initialization: weights std 1/sqrt(fan_in), 1-D parameters 1 + noise."""
    config = tiny_config(cfg_cls)
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
    return model.float().eval()


def step(model, ids):
    """Logits, loss and every parameter's gradient of one LM loss (a text model without a head:
    its input embeddings given as inputs_embeds, logits against them)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    if hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
        out = model(input_ids=ids, labels=ids, use_cache=False)
        logits, loss = out.logits, out.loss
    else:
        embed = model.get_input_embeddings()
        out = model(inputs_embeds=embed(ids), use_cache=False)
        h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        logits = h @ embed.weight.T
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {"logits": logits.detach(), "loss": loss.detach(), **grads}


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    if not b.any():
        return 0.0 if not a.any() else float("inf")
    return relative_error(a, b)


def compare(ours: dict, theirs: dict) -> tuple[float, str, list[str]]:
    """(largest relative error, its name, keys present on one side only)."""
    only = sorted(set(ours) ^ set(theirs))
    errs = {k: rel(ours[k], theirs[k]) for k in ours.keys() & theirs.keys()}
    worst = max(errs, key=lambda k: (errs[k] != errs[k], errs[k]))  # NaN first
    return errs[worst], worst, only


def survey(label, cfg_cls, model_cls, flags: str) -> tuple[str, str]:
    """(verdict, detail)."""
    try:
        plain = build(cfg_cls, model_cls)
        n_experts = sum(swiglu_hf._is_experts(m) for m in plain.modules())
        if n_experts == 0:
            return "skip", "the tiny model has no experts module (overrides left it dense)"
        ours = copy.deepcopy(plain)
        ids = batch()
        want = step(plain, ids)
        eager = copy.deepcopy(plain)
        eager.set_experts_implementation("eager")
        vs_eager = compare(want, step(eager, ids))[0]  # the class's own loop against the default
    except Exception as exc:  # noqa: BLE001 - the tiny model, not our library
        return "skip", f"build/unpatched step failed: {type(exc).__name__}: {str(exc).splitlines()[0][:150] if str(exc) else ''}"
    calls = []
    real = swiglu_hf._swiglu_moe

    def spy(*a, **k):
        calls.append(k)
        return real(*a, **k) * (1.001 if PLANT else 1.0)

    swiglu_hf._swiglu_moe = spy
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            names = swiglu_hf.apply(ours, impl="reference")
            got = step(ours, ids)
    except Exception as exc:  # noqa: BLE001
        tb = traceback.format_exc().strip().splitlines()
        return "ERROR", f"{type(exc).__name__}: {str(exc)[:200]} [{tb[-3].strip()}]"
    finally:
        swiglu_hf._swiglu_moe = real
    ours_warn = sorted({str(w.message) for w in caught if "swiglu" in str(w.message)})
    err, worst, only = compare(got, want)
    same = not only and err <= F32_TOL
    info = f"{n_experts} experts modules, apply named {len(names)}, {len(calls)} op calls, max rel err {err:.1e} ({worst})"
    if vs_eager > F32_TOL:
        info += f"; NOTE the unpatched model with 'eager' experts differs from its default by {vs_eager:.1e}"
    if only:
        info += f", gradients on one side only: {only[:3]}"
    if not same:
        why = "results differ" + (" after op calls" if calls else "")
        return "WRONG", f"{why}: {info}" + (f"; warnings: {ours_warn}" if ours_warn else "")
    if calls:
        tail = f"; also warned: {ours_warn[0][:160]}" if ours_warn else ""
        return "swiglu", info + tail
    if ours_warn:
        return "fallback", f"{ours_warn[0]} ({info})"
    return "WRONG", f"no op call and no warning: {info}"


def main(selected: list[str], out: Path | None = None) -> int:
    t0 = time.time()
    rows = []
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    for fam in selected or families():
        flags = "; ".join(f"{c}({a})" if a else c for a, c in experts_classes(fam))
        t = time.time()
        try:
            targets = text_targets(fam)
        except Exception as exc:  # noqa: BLE001
            rows.append((fam, "skip", f"no text model to build: {type(exc).__name__}: {str(exc)[:150]}", flags, 0.0))
            print(f"{fam:28s} skip      {rows[-1][2]}", flush=True)
            continue
        for label, cfg_cls, model_cls in targets:
            verdict, detail = survey(label, cfg_cls, model_cls, flags)
            rows.append((label, verdict, f"{model_cls.__name__}: {detail}", flags, time.time() - t))
            print(f"{label:28s} {verdict:9s} {rows[-1][2]}  [{flags}] ({time.time() - t:.1f} s)", flush=True)
    counts = {}
    for r in rows:
        counts[r[1]] = counts.get(r[1], 0) + 1
    lines = [
        f"transformers {transformers.__version__}, torch {torch.__version__}: {len(rows)} text models of "
        f"{len(selected or families())} families with @use_experts_implementation; "
        + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        + f"; {time.time() - t0:.0f} s",
        "",
        f"| {'family':26s} | verdict  | experts class (decorator flags) | detail |",
        "|---|---|---|---|",
    ]
    order = {"WRONG": 0, "ERROR": 1, "swiglu": 2, "fallback": 3, "skip": 4}
    for label, verdict, detail, flags, _ in sorted(rows, key=lambda r: (order[r[1]], r[0])):
        lines.append(f"| {label:26s} | {verdict:8s} | {flags} | {detail.replace('|', '/')} |")
    table = "\n".join(lines)
    print("\n" + table)
    if out is not None or not selected:
        out = out or OUT
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table + "\n")
        print(f"\nwrote {out}")
    return 1 if counts.get("WRONG") or counts.get("ERROR") else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    PLANT = "--plant" in args
    out = next((Path(a.split("=", 1)[1]) for a in args if a.startswith("--out=")), None)
    named = [a for a in args if not a.startswith("--")]
    sys.exit(main(named or ([] if not PLANT else ["qwen3_moe", "gpt_oss"]), out))
