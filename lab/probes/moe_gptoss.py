"""Are gpt-oss's experts right and fast through swiglu_moe on the GPU?

At gpt-oss-20b's experts shape (hidden_size 2880, intermediate_size 2880, 32 experts, top-4):
the Triton path with both biases and interleaved gate/up rows (swiglu_limit 7, swiglu_alpha
1.702) against the float64 oracle within the tests' bound (``moe_checks.failures``: every output
and gradient, both biases'), at 512, 77 and 1 tokens; then one forward+backward of a
transformers ``GptOssExperts`` module (random weights) with its "grouped_mm" implementation
against "swiglu", at 2048 and 8192 tokens (do_bench). Answer (an H100): right at every size;
1.46x grouped_mm's speed at 2048 tokens, 1.65x at 8192 with the bias gradients at 128 x 64 tiles
(data/tuning/moe_gptoss_tiles_h100_20261207/); 1.45x and 1.63x with down_proj's bias in the combine kernel
(data/tuning/moe_gptoss_bias_h100_20261207/); 1.41x and 1.57x with it in torch
(data/tuning/moe_gptoss_tiles_h100_20261206/); 0.66x and 0.60x before the interleaved rows became
contiguous B tiles (data/tuning/moe_gptoss_h100_20261206/).
Run: PYTHONPATH=src:lab:tests python3 lab/probes/moe_gptoss.py
"""

import os

import torch

import swiglu
from swiglu.moe import moe_float64
from moe_checks import bound_failure, failures, fresh_seed, make_moe, same_rounding

torch.manual_seed(0)
LIM = dict(swiglu_limit=7.0, swiglu_alpha=1.702)
rows = []
for T, H, I, E, k in [(512, 2880, 2880, 32, 4), (77, 2880, 2880, 32, 4), (1, 2880, 2880, 32, 4)]:
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, device="cuda")
    x, idx, w, gu, dp, go = inp.tensors()
    gen = torch.Generator().manual_seed(seed + 1)
    bgu = (0.5 * torch.randn(E, 2 * I, generator=gen)).to(torch.bfloat16).cuda()
    bd = (0.5 * torch.randn(E, H, generator=gen)).to(torch.bfloat16).cuda()

    def run(impl):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w, gu, dp, bgu, bd)]
        xx, ww, g1, d1, b1, b2 = leaves
        out = swiglu.swiglu_moe(xx, idx, ww, g1, d1, impl=impl, gate_up_proj_bias=b1, down_proj_bias=b2, interleaved=True, **LIM)
        out.backward(go)
        return (out.detach(), *(t.grad for t in leaves))

    got, ref = run("triton"), run("reference")
    o = moe_float64(x, idx, w, gu, dp, go, gate_up_proj_bias=bgu, down_proj_bias=bd, interleaved=True, **LIM)
    same = same_rounding(inp, gate_up_proj_bias=bgu, down_proj_bias=bd, interleaved=True, **LIM)
    bad = failures(got[:5], ref[:5], o[:5], same[:5])
    for name, g, r, oo, sr in zip(("grad_gate_up_proj_bias", "grad_down_proj_bias"), got[5:], ref[5:], o[5:], same[5:]):
        bad.append(bound_failure(name, g, r, oo, sr))
    bad = [b for b in bad if b]
    errs = [float((g.double() - oo).norm() / oo.norm().clamp_min(1e-30)) for g, oo in zip(got, o)]
    rerrs = [float((r.double() - oo).norm() / oo.norm().clamp_min(1e-30)) for r, oo in zip(ref, o)]
    rows.append(
        (
            f"check T={T}",
            "PASS" if not bad else "FAIL " + "; ".join(bad)[:300],
            " ".join(f"{a:.1e}/{b:.1e}" for a, b in zip(errs, rerrs)),
        )
    )
    print(rows[-1], flush=True)

# timing against transformers' grouped_mm on GptOssExperts
try:
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    from triton.testing import do_bench

    cfg = GptOssConfig(hidden_size=2880, intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4, swiglu_limit=7.0)
    for T in (2048, 8192):
        mod = GptOssExperts(cfg).cuda().to(torch.bfloat16)
        with torch.no_grad():
            for p in mod.parameters():
                p.normal_(0, 0.02)
        x = torch.randn(T, 2880, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        logits = torch.randn(T, 32, device="cuda")
        tw, ti = torch.topk(logits, 4, dim=-1)
        tw = torch.softmax(tw, dim=-1).to(torch.bfloat16).requires_grad_()
        go = torch.randn(T, 2880, device="cuda", dtype=torch.bfloat16)
        res = {}
        for impl in ("grouped_mm", "swiglu"):
            if impl == "swiglu":
                import swiglu.integrations.transformers as st

                st.register_experts()
            mod.config._experts_implementation = impl

            def step():
                out = mod(x, ti, tw)
                out.backward(go)
                return out

            outs = step()
            for p in [x, tw, *mod.parameters()]:
                p.grad = None
            res[impl] = (do_bench(step, warmup=5, rep=40), outs.detach().float())
        d = float((res["swiglu"][1] - res["grouped_mm"][1]).norm() / res["grouped_mm"][1].norm())
        rows.append(
            (
                f"time T={T}",
                f"grouped_mm {res['grouped_mm'][0]:.3f} ms  swiglu {res['swiglu'][0]:.3f} ms  {res['grouped_mm'][0] / res['swiglu'][0]:.2f}x",
                f"out rel diff {d:.1e}",
            )
        )
        print(rows[-1], flush=True)
except Exception as exc:  # the check above is what matters
    rows.append(("time", f"failed: {type(exc).__name__}: {exc}"[:300], ""))
print(torch.cuda.get_device_name(), "commit", os.environ.get("SWIGLU_GIT_COMMIT", "?"))
for r in rows:
    print(" | ".join(r))
