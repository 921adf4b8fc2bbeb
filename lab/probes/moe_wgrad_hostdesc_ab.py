"""Do the weight gradients on host descriptors (the library's ping-pong kernel, each expert's rows
past its end zeroed in its last K step) make the whole MoE backward faster than the device-descriptor loader it
replaced (the lab's ``moe_wgrad_hostdesc`` with ``HOST`` 0), and which form (gathering x's /
grad_out's rows, or copy-fed) should the plan take now?

The backward (``swiglu.kernels.moe.moe_backward``, balanced routing, 8192 tokens, do_bench with L2
flushed, the fastest of rotated orders) three ways: the library; the library with every weight
gradient copy-fed (``GATHER_MAX_ROWS = 0``); the library with the old loader in both launchers;
the gradients compared bitwise with the library's.
Answer (an H100, data/tuning/moe_wgrad_desc_20261206/moe_wgrad_hostdesc_ab.log; bitwise all three
ways): yes. Qwen3-30B-A3B 2.870 ms against 3.201 with the old loader, Qwen3-235B-A22B 10.09
against 10.43, DeepSeek-V3 28.67 against 29.28; copy-fed 3.064, 10.02, 28.67: the gathering
threshold stays.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_wgrad_hostdesc_ab.py [--rep=MS] [shape ...]
"""

import sys
from types import SimpleNamespace

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as kmoe
from swiglu_lab.experiments import moe_wgrad_hostdesc as D

REP = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--rep=")), 300)


def measure(name: str) -> dict:
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, 8192)
    plan = kmoe.moe_plan(S, E, H, I, kmoe._gluon_here(x.device))
    out, gate, up, r = kmoe.moe_forward(x, idx, w, gu, dp, plan)
    wg = kmoe._gluon().wgrad
    saved = wg.GATHER_MAX_ROWS, wg.launch_moe_wgrad_pingpong, wg.launch_moe_wgrad_gather
    old = {
        "launch_moe_wgrad_pingpong": lambda c, a, b, start, *_: D.launch(
            c, a, b, SimpleNamespace(expert_start=start), host=0, store=True
        ),
        "launch_moe_wgrad_gather": lambda c, a, b, r_, *_: D.launch(c, a, b, r_, host=0, store=True),
    }

    def backward(variant):
        if variant == "copy-fed":
            wg.GATHER_MAX_ROWS = 0
        if variant == "device descriptors":
            for n, f in old.items():
                setattr(wg, n, f)
        try:
            return kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan, r)
        finally:
            wg.GATHER_MAX_ROWS, wg.launch_moe_wgrad_pingpong, wg.launch_moe_wgrad_gather = saved

    variants = ("library", "copy-fed", "device descriptors")
    want = [t.cpu() for t in backward("library")]
    row = {"shape": name, "rows/expert": S // E}
    for v in variants[1:]:
        row[f"{v} bitwise"] = all(torch.equal(t.cpu(), b) for t, b in zip(backward(v), want))
    ms = dict.fromkeys(variants, float("inf"))
    for shift in range(len(variants)):
        for v in variants[shift:] + variants[:shift]:
            ms[v] = min(ms[v], P.kernel_ms(lambda v=v: backward(v), rep=REP))
    row |= {f"{v} ms": t for v, t in ms.items()}
    return row


rows = []
for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]:
    rows.append(measure(name))
    print(rows[-1], flush=True)
    torch.cuda.empty_cache()
print("\n| " + " | ".join(rows[0]) + " |")
print("|" + "---|" * len(rows[0]))
for row in rows:
    print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
