"""The persistent MoE GEMMs (up, down-shaped, dSwiGLU, weight gradients) of ``swiglu_lab.experiments.moe_persistent`` (interpreter on the CPU):
bitwise the library's kernels on the same routing, with fewer programs than tiles (each walks
several, across experts), experts with no pairs, ids outside [0, E) and a ragged last tile."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import swiglu.kernels.moe as M
from swiglu_lab.experiments import moe_persistent as P

from moe_checks import fresh_seed, make_moe


def _nan(*shape, device):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)


@pytest.mark.parametrize("loads", ["tma", "pointer"])
@pytest.mark.parametrize("programs", [1, 3, 64])
@pytest.mark.parametrize("sizes", [(13, 64, 96, 4, 2), (40, 32, 48, 3, 2)])
def test_persistent_kernels_are_the_library_kernels_bitwise(device, sizes, programs, loads):
    """Every kernel against the library's on the same routing and tiles: with TMA operands (what
    the interpreter's plan takes) and with pointer loads and dSwiGLU's epilogue in two pieces (what
    the GPU plan takes for grad_x and dSwiGLU)."""
    seed = fresh_seed()
    T, H, I, E, k = sizes
    inp = make_moe(seed, T, H, I, E, k, kind="skewed", device=device)
    x, idx, w, gu, dp, go = inp.flat()
    idx = idx.clone()
    idx[idx == E - 1] = 0  # expert E - 1 gets no pairs
    idx[0, 0] = E  # an id outside [0, E): sorted last, in no tile
    S = T * k
    plan = M.moe_plan(S, E, H, I)
    if loads == "pointer":
        plan = plan.replace_tiles(TMA_A=False, TMA_B=False)
        plan = dataclasses.replace(plan, dswiglu=dataclasses.replace(plan.dswiglu, EPI_SPLIT=2))
    r = M.Routing(idx, E)
    want = [torch.zeros(S, I, dtype=torch.bfloat16, device=device) for _ in range(3)]
    got = [_nan(S, I, device=device) for _ in range(3)]
    M.launch_up(x, gu, r, k, *want, plan.up)
    P.launch_up(x, gu, r, k, *got, plan.up, programs)
    valid = r.order[: int(r.expert_start[E])].long()  # sorted rows of real pairs
    rows = torch.arange(int(r.expert_start[E]), device=device)
    for name, a, b in zip(("gate", "up", "h"), want, got):
        assert torch.equal(a[rows], b[rows]), f"seed={seed}: {name}"
        assert b[len(rows) :].isnan().all(), f"seed={seed}: {name}: rows of no tile written"
    h = want[2]
    for transposed, a, wt, n, tile in ((True, h, dp, H, plan.down), (False, torch.cat(want[:2], 1), gu, H, plan.grad_x)):
        ref, out = torch.zeros(S, n, dtype=torch.bfloat16, device=device), _nan(S, n, device=device)
        M.launch_pairs(a, wt, r, w, ref, tile, transposed=transposed)
        P.launch_pairs(a, wt, r, w, out, tile, transposed=transposed, programs=programs)
        assert torch.equal(ref[valid], out[valid]), f"seed={seed}: down (transposed={transposed})"
        assert out[r.order[len(valid) :].long()].isnan().all(), "rows of pairs in no tile written"
    # dSwiGLU, into a [S, 2I] buffer.
    nb = -(-I // plan.dswiglu.BN)
    outs = []
    for launch in (M.launch_dswiglu, lambda *a: P.launch_dswiglu(*a, programs)):
        dgu, hw = _nan(S, 2 * I, device=device), _nan(S, I, device=device)
        part = torch.full((S, nb), float("nan"), device=device)
        launch(go, dp, r, k, w, *want[:2], dgu, hw, part, plan.dswiglu)
        outs.append((dgu[rows], hw[rows], part[valid]))
    for name, a, b in zip(("d_gate|d_up", "h * w", "partial sums"), *outs):
        assert torch.equal(a, b), f"seed={seed}: dSwiGLU {name}"
    # Weight gradients (an empty expert writes zeros) over expert-order copies, as the backward runs them.
    xs, gos = M.gather_rows(x, r, k), M.gather_rows(go, r, k)
    for c_shape, a, b, tile in (
        ((E, 2 * I, H), torch.cat(want[:2], 1), xs, plan.wgrad_gu),
        ((E, H, I), gos, want[2], plan.wgrad_dp),
    ):
        ref, out = torch.zeros(c_shape, dtype=torch.bfloat16, device=device), _nan(*c_shape, device=device)
        M.launch_wgrad(ref, a, b, r, tile)
        P.launch_wgrad(out, a, b, r, tile, programs)
        assert torch.equal(ref, out), f"seed={seed}: weight gradient {c_shape}"
        assert out[E - 1].eq(0).all()


COMPILE = """
import json, sys
sys.path.insert(0, "tests")
import moe_compile_worker as W
from swiglu.kernels import moe as M
from swiglu_lab.experiments import moe_persistent as X
plan = M.moe_plan(65536, 128, 2048, 768)  # Qwen3-30B-A3B at 8192 tokens
rows = []
for fn, t, const, boxes in (
    (X.moe_up_persistent_kernel, plan.up, dict(B_TMA=True), {"w_ptr": (plan.up.BN, plan.up.BK)}),
    (X.moe_down_persistent_kernel, plan.down, dict(B_TRANS=True, SCALE=True, A_TMA=True, B_TMA=True),
     {"a_ptr": (plan.down.BM, plan.down.BK), "w_ptr": (plan.down.BN, plan.down.BK)}),
    (X.moe_down_persistent_kernel, plan.grad_x, dict(B_TRANS=False, SCALE=False, A_TMA=False, B_TMA=False), {}),
    (X.moe_dswiglu_persistent_kernel, plan.dswiglu, dict(EPI_SPLIT=plan.dswiglu.EPI_SPLIT, B_TMA=True),
     {"w_ptr": (plan.dswiglu.BK, plan.dswiglu.BN)}),
    (X.moe_wgrad_persistent_kernel, plan.wgrad_gu, dict(A_TMA=True, B_TMA=True),
     {"a_ptr": (plan.wgrad_gu.BK, plan.wgrad_gu.BM), "b_ptr": (plan.wgrad_gu.BK, plan.wgrad_gu.BN)}),
):
    opts = dict(num_warps=t.num_warps, num_stages=t.num_stages)
    pad = {} if fn is X.moe_wgrad_persistent_kernel else dict(E_PAD=256)
    rows.append(W.compile_one(fn, opts, boxes, BM=t.BM, BN=t.BN, BK=t.BK, FLATTEN=True, **pad, **const))
print(json.dumps(rows))
"""


def test_persistent_kernels_compile_for_sm90_with_the_gpu_machines_triton():
    """What the probe launches compiles for sm_90 with a software-pipelined main loop (at least
    two stages of operand tiles in shared memory, within an sm_90 block), under the GPU machine's triton where
    ``make test-gpu-triton`` provides it (else this interpreter's)."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    paths = [os.environ.get("SWIGLU_EXTRA_TRITON_DIR", ""), str(root / "src"), str(root / "lab")]
    env["PYTHONPATH"] = os.pathsep.join([p for p in paths if p] + [env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", COMPILE], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) == 5
    for r in rows:
        assert r["error"] is None, r
        assert r["wgmma"] > 0, r
        b_tiles = 2 if r["kernel"] == "moe_up_persistent_kernel" else 1  # [BK, BM] + [BK, BN] for the weight gradient too
        stage = 2 * r["BK"] * (r["BM"] + b_tiles * r["BN"])
        # Two stages at least (one and a TMA barrier: an unpipelined loop), within an sm_90 block.
        assert 2 * stage <= r["shared"] <= 232448, f"main loop not pipelined or too big: {r}"
