"""What does a tile of the ping-pong MoE weight gradient wait on at 256-512 rows per expert: the
TMA descriptors its loader made on the device per run of tiles, or its epilogue's stores?

Each weight gradient at 8192 tokens as the backward runs it (the operand that the plan gathers
given as ``TokenRows``), also copy-fed, with the lab's copy of the kernel as it was
(``swiglu_lab.experiments.moe_wgrad_hostdesc``, ``HOST`` 0: descriptors made on the device):
host descriptors over all rows (wrong sums at the experts' ends: time only, "*"); with the rows
past each expert's end zeroed in shared memory (right sums: the library's form since); with
``--diag`` also its stores left out and runs of 2 and 4 consecutive tiles per program. Right-sum
columns are checked bitwise (NaN-poisoned) against the library's launcher, after a smoke case
(skewed routing, an empty expert, infinite rows beside each expert's). do_bench, L2 flushed.
Answer (an H100, data/tuning/moe_wgrad_desc_20261206/): the descriptors. At Qwen3-30B-A3B (a
descriptor set per tile) grad_gate_up_proj copy-fed 0.978 ms, 0.702 on host descriptors, 0.840
without stores; grad_down_proj 0.477, 0.351, 0.408; runs of 4 tiles recover 78% and 56%; host
descriptors with zeroed rows 0.783 and 0.407 (gathering 0.883 and 0.417 against 1.014 and 0.493).
The zeroing itself cost 0.08 / 0.06 ms there and 0.75 / 0.66 at DeepSeek-V3 (host descriptors with
and without it). A leaner zeroing (whole pieces past the end stored as zeros unread, a column of
this probe until it lost: 0.99-1.03x the time where the library gathers) is in
data/tuning/moe_wgrad_bound_h100_20261206/lean_zeroing_h100.log.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_wgrad_desc.py [--diag] [shape ...]
"""

import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M
from swiglu_lab.experiments import moe_wgrad_hostdesc as D

rows = []
# Columns: the lab kernel's switches; " *": wrong sums (time only). Without --diag, the first and
# the right-sum forms with host descriptors.
VARIANTS = {
    "lab copy": dict(host=0, store=True),
    "host desc *": dict(host=1, store=True),
    "host desc, zeroed rows": dict(host=2, store=True),
}
if "--diag" in sys.argv:
    VARIANTS |= {
        "no stores *": dict(host=0, store=False),
        "host desc, no stores *": dict(host=1, store=False),
        "run 2": dict(host=0, store=True, run=2),
        "run 4": dict(host=0, store=True, run=4),
    }


def same_bits(x, y):
    """Equal, NaN where the other is NaN."""
    return torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(0), y.nan_to_num(0))


def smoke():
    """Host descriptors with the zeroed rows (``HOST`` 2) against the library on a small case:
    skewed routing, expert 3 without rows, rows ending inside K boxes, infinite rows beside each
    expert's; 3 programs and one per SM."""
    E, k, T, H, I = 8, 2, 300, 256, 384
    x, idx, w, gu, dp, go = P.inputs(H, I, E, k, T, skew=True)
    idx = torch.where(idx == 3, (idx + 1) % E, idx).contiguous()
    r = M.Routing(idx, E)
    S = T * k
    dgu = torch.randn(S, 2 * I, device="cuda").bfloat16()
    hw = torch.randn(S, I, device="cuda").bfloat16()
    plan = M.moe_plan(S, E, H, I, True)
    xs, gos = M.gather_rows(x, r, k), M.gather_rows(go, r, k)
    # Each expert's first row infinite in the sorted operands: a K box that runs past the expert
    # before it must not bring it in (0 * inf); the experts' own gradients then hold inf / NaN.
    start = r.expert_start.tolist()
    for e in range(1, E):
        if start[e + 1] > start[e]:
            for t_ in (dgu, hw, xs, gos):
                t_[start[e]] = float("inf")
    for role, c, pairs in (
        ("gu", torch.empty_like(gu), ((dgu, M.TokenRows(x, k)), (dgu, xs))),
        ("dp", torch.empty_like(dp), ((M.TokenRows(go, k), hw), (gos, hw))),
    ):
        for fa, fb in pairs:
            c.fill_(float("nan"))
            M.launch_wgrad(c, fa, fb, r, plan.wgrad_gu)
            want = c.clone()
            for nprog in (3, None):
                for _ in range(10):
                    c.fill_(float("nan"))
                    D.launch(c, fa, fb, r, host=2, store=True, num_programs=nprog)
                    torch.cuda.synchronize()
                    assert same_bits(c, want), (role, type(fa).__name__, nprog)
            c.fill_(float("nan"))
            D.launch(c, fa, fb, r, host=1, store=True)  # no zeroing: the infinite rows must show
            torch.cuda.synchronize()
            assert not same_bits(c, want), (role, type(fa).__name__, "HOST 1 (no zeroing) gave the library's result")
    print(
        "smoke: host descriptors with zeroed rows (HOST 2) bitwise the library's (both forms, 3 programs and one per SM)",
        flush=True,
    )


def run(name):
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, 8192)
    r = M.Routing(idx, E)
    plan = M.moe_plan(S, E, H, I, M._gluon_here(x.device))
    dgu = torch.randn(S, 2 * I, device="cuda").bfloat16()
    hw = torch.randn(S, I, device="cuda").bfloat16()
    xs, gos = M.gather_rows(x, r, k), M.gather_rows(go, r, k)
    per_expert = S / E
    cases = {
        "gu": (torch.empty_like(gu), dgu, M.TokenRows(x, k), xs, plan.wgrad_gu),
        "dp": (torch.empty_like(dp), M.TokenRows(go, k), hw, gos, plan.wgrad_dp),
    }
    for role, (c, a, b, copy, tile) in cases.items():
        forms = {"gather": (a, b), "copy": (copy, b) if isinstance(a, M.TokenRows) else (a, copy)}
        for form, (fa, fb) in forms.items():
            c.fill_(float("nan"))
            M.launch_wgrad(c, fa, fb, r, tile)
            want = c.clone()
            row = {"shape": name, "rows/expert": f"{per_expert:.0f}", "grad": role, "form": form}
            row["launch_wgrad"] = P.kernel_ms(lambda: M.launch_wgrad(c, fa, fb, r, tile))
            bitwise = True
            for label, kw in VARIANTS.items():
                if label.endswith(" *"):  # wrong sums: time only
                    row[label] = P.kernel_ms(lambda kw=kw: D.launch(c, fa, fb, r, **kw))
                    continue
                c.fill_(float("nan"))
                D.launch(c, fa, fb, r, **kw)
                torch.cuda.synchronize()
                bitwise &= torch.equal(c, want)
                row[label] = P.kernel_ms(lambda kw=kw: D.launch(c, fa, fb, r, **kw))
                bitwise &= torch.equal(c, want)
            row["bitwise"] = bitwise
            rows.append(row)
            print(row, flush=True)
    del cases
    torch.cuda.empty_cache()


try:
    try:
        smoke()
    except AssertionError as e:
        print("smoke failed:", e, flush=True)
    for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]:
        run(name)
finally:
    if rows:
        print("\n| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for row in rows:
            print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
