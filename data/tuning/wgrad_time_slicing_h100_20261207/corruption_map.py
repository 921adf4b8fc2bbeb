"""Where the wg_store ping-pong tile's bad elements are, beside a process running matmuls (three
launches at K = 1024; the table's entry at fc93df1, wg_store 2). From the repository root on the GPU
machine: PYTHONPATH=src:lab python3 data/tuning/wgrad_time_slicing_h100_20261207/corruption_map.py"""

import collections
import subprocess
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, "lab/probes")
from time_slicing import LOAD  # noqa: E402
from swiglu.kernels import backward  # noqa: E402

M, N, K = 53248, 16384, 1024
g = replace(backward.GLUON_CONFIGS[K], wg_store=2)
G, BM, BT = g.GROUP_M, 128, 192
num_m, num_n = M // BM, -(-N // BT)
nprog = backward.tile_programs(torch.device("cuda"), M, N, g)
print("nprog", nprog, "tiles", num_m * num_n, g, flush=True)
gen = torch.Generator(device="cuda").manual_seed(0)
a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
tl_cfg = backward.config_for("grad_weights", K)
ref = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
backward.launch_grad_weight_gluon_or_tl(a, b, ref, tl_cfg, g); torch.cuda.synchronize()
def tile_mn(t):
    per = G * num_n; first = (t // per) * G; gm = min(num_m - first, G)
    return first + (t % per) % gm, (t % per) // gm
def tile_of(pm, pn):
    per = G * num_n; first = (pm // G) * G; gm = min(num_m - first, G)
    return (pm // G) * per + pn * gm + (pm - first)
def chunk(x, pm, pn, pos):
    c0 = pn * BT + pos * 64
    if c0 >= N: return None
    return x[pm * BM:(pm + 1) * BM, c0:c0 + 64]
p = subprocess.Popen([sys.executable, "-c", LOAD, "1", "0"], stdout=subprocess.PIPE, text=True)
assert p.stdout.readline().strip() == "ready"; time.sleep(1)
got = torch.empty_like(ref)
try:
    for rep in range(3):
        got.fill_(float("nan"))
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); backward.launch_grad_weight_gluon_or_tl(a, b, got, tl_cfg, g); e1.record(); torch.cuda.synchronize()
        bad = (got != ref)
        bc = bad.view(num_m, BM, N // 64, 64).any(3).any(1).nonzero().tolist()
        print(f"launch {rep}: {e0.elapsed_time(e1):.2f} ms, {int(bad.sum())} bad in {len(bc)} chunks", flush=True)
        which = collections.Counter(); pos = collections.Counter(); ivals = []; pids = collections.Counter()
        rowband = torch.zeros(8); colband = torch.zeros(8); expl = collections.Counter(); nbad_tot = 0; nan_tot = 0
        for pm, c64 in bc:
            pn, ps = divmod(c64, 3); pos[ps] += 1
            t = tile_of(pm, pn); assert tile_mn(t) == (pm, pn)
            pid, i = t % nprog, t // nprog
            which[i % 2] += 1; ivals.append(i); pids[pid] += 1
            gc, rc = chunk(got, pm, pn, ps), chunk(ref, pm, pn, ps)
            bm = gc != rc; nbad = int(bm.sum()); nbad_tot += nbad; nan_tot += int(torch.isnan(gc).sum())
            rowband += bm.view(8, 16, 64).sum((1, 2)).cpu().float(); colband += bm.view(128, 8, 8).sum((0, 2)).cpu().float()
            cands = {}
            for name, (dt, cpos) in {"own lo": (0, 0), "own hi": (0, 1), "prev2 lo": (-2, 0), "prev2 hi": (-2, 1), "prev2 acc2": (-2, 2),
                                      "prev1 acc2": (-1, 2), "prev1 lo": (-1, 0), "next1 acc2": (1, 2), "prev4 acc2": (-4, 2)}.items():
                tt = t + dt * nprog
                if tt < 0 or tt >= num_m * num_n: continue
                pm2, pn2 = tile_mn(tt); cc = chunk(ref, pm2, pn2, cpos)
                if cc is None: continue
                expl[name] += int((gc[bm] == cc[bm]).sum())
        print(f"  chunk pos {dict(pos)}, WHICH {dict(which)}, i range {min(ivals)}..{max(ivals)} (tiles per program {num_m*num_n/nprog:.0f}), programs hit {len(pids)}, max per program {max(pids.values())}")
        print(f"  bad rows by 16-row band {rowband.int().tolist()}, cols by 8-col band {colband.int().tolist()}, NaN {nan_tot} of {nbad_tot}")
        print(f"  bad elements equal to another chunk's ref: {dict(expl)}")
        hist = collections.Counter(v // 10 * 10 for v in ivals); print(f"  i histogram (by 10) {sorted(hist.items())}", flush=True)
finally:
    p.kill()
