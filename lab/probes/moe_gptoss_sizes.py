"""Over which token counts is gpt-oss's experts module (and OpenAI-Privacy-Filter's) faster
through swiglu_moe than through transformers' grouped_mm?

A transformers ``GptOssExperts`` module at gpt-oss-20b's shape (hidden_size 2880, intermediate_size
2880, 32 experts, top-4, swiglu_limit 7; random weights in its own transposed, interleaved layout
with both biases), its "grouped_mm" implementation against "swiglu": forward (no grad) and
forward+backward, do_bench, at 1 to 8192 tokens.
Answer (an H100, data/tuning/moe_gptoss_bias_h100_20261207/, down_proj's bias in the combine
kernel): gpt-oss forward+backward 1.04-1.63x grouped_mm's speed at every count (1.45x at 2048, 1.63x
at 8192 tokens), forward alone 1.31-2.09x; OpenAI-Privacy-Filter 1.41-2.89x, forward 1.80-3.38x.
With the bias in torch (data/tuning/moe_gptoss_tiles_h100_20261206/): gpt-oss 1.03-1.59x, forward
0.90x at one token.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_gptoss_sizes.py [gpt-oss] [privacy-filter]
"""

import importlib
import os
import sys

import torch
import transformers
from triton.testing import do_bench

import swiglu.integrations.transformers as st

MODELS = {  # modeling module, experts class, config class, hidden_size, intermediate_size, experts, top-k
    "gpt-oss": ("gpt_oss", "GptOssExperts", "GptOssConfig", 2880, 2880, 32, 4),
    "privacy-filter": ("openai_privacy_filter", "OpenAIPrivacyFilterExperts", "OpenAIPrivacyFilterConfig", 640, 640, 128, 4),
}
st.register_experts()
for model in sys.argv[1:] or ["gpt-oss"]:
    name, experts_cls, config_cls, H, I, E, k = MODELS[model]
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    cfg = getattr(transformers, config_cls)(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=k)
    torch.manual_seed(0)
    mod = getattr(module, experts_cls)(cfg).cuda().to(torch.bfloat16)
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0, 0.02)
    for T in (1, 16, 128, 512, 1024, 2048, 4096, 8192):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        tw, ti = torch.topk(torch.randn(T, E, device="cuda"), k, dim=-1)
        tw = torch.softmax(tw, dim=-1).to(torch.bfloat16).requires_grad_()
        go = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        res = {}
        for impl in ("grouped_mm", "swiglu"):
            mod.config._experts_implementation = impl

            def fb():
                mod(x, ti, tw).backward(go)

            def fw():
                with torch.no_grad():
                    mod(x, ti, tw)

            fb()
            res[impl] = (do_bench(fw, warmup=5, rep=60), do_bench(fb, warmup=5, rep=60))
            for p in [x, tw, *mod.parameters()]:
                p.grad = None
        g, s = res["grouped_mm"], res["swiglu"]
        print(
            f"{model} T={T:5d} fwd grouped_mm {g[0]:7.3f} swiglu {s[0]:7.3f} ({g[0] / s[0]:.2f}x) | "
            f"fwd+bwd grouped_mm {g[1]:7.3f} swiglu {s[1]:7.3f} ({g[1] / s[1]:.2f}x)",
            flush=True,
        )
print(torch.cuda.get_device_name(), "commit", os.environ.get("SWIGLU_GIT_COMMIT", "?"))
