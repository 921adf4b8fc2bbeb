"""GPU probe of the Gluon dSwiGLU kernel (swiglu.kernels.gluon_dswiglu; the probe its table entries come
from): correctness against the tl dSwiGLU kernel (bitwise) and a float64 reference, then timing
against the tl kernel and a bare cuBLAS GEMM of the same shape, per candidate config.

Answer (data/tuning/gluon_dswiglu_probe_20261201.csv, gluon_dswiglu_llama_20261201.csv,
docs/kernels.md "Gluon dSwiGLU kernel"): every config bitwise the tl kernel; faster than it from
T = 256 up (e.g. 1.279 against 1.401 ms at 512, 10.37 against 11.21 from 4096), no gain at 128:
the table's ``gluon_dswiglu`` entries, per shape at Llama-3-8B's layer.

    OUT=$OUT PYTHONPATH=src python3 lab/probes/probe_gluon_dswiglu.py            # all configs, all T
    PYTHONPATH=src python3 lab/probes/probe_gluon_dswiglu.py --configs 0,3 --T 256,1024 --out /tmp/p.csv
    PYTHONPATH=src python3 lab/probes/probe_gluon_dswiglu.py --inproc             # one process, no isolation

Every config runs in its own subprocess (--worker i) with --timeout seconds, so a deadlocked mbarrier
or an illegal address costs one config; after a timeout the rest are skipped unless --keep-going
(a deadlock is likely shared by every config). --budget: no new config is started past that many
seconds in all. Estimate on one H200: a worker is ~20-40 s (compiles, data for six T, 3 x 25 timed
launches per T of at most ~12 ms), so 5 configs take ~2-3 min; the defaults cap it below ~4 min.

Per config (worker): ragged case T=200, I=1176, H=520 (partial tiles on every edge, K not a multiple
of BK) against the tl kernel (bitwise) and a float64 evaluation of the formula with the same bf16
rounding points (g rounded from the float64 product: a different summation order, so a few
elements may differ by an ulp or more); then for each T in --T at H=16384, I=53248 (or
--hidden-size/--intermediate-size): tl kernel
(backward.config_for("dswiglu", T) through backward.launch_dswiglu) and the Gluon kernel, outputs
NaN-poisoned first, fraction of bitwise-equal elements and max abs diff of d_gate / d_up / h;
RECOMPUTE_ACT (act=None) for both kernels at --recompute-T. Timing: 256 MB zero_() before each
iteration (L2 flush), CUDA events around the kernel only, median of 20 after 5 warm-ups,
descriptors built once outside the timed region; tl, Gluon and torch.matmul(go, dw, out=g) in
the same process. Table printed last; CSV to --out (default $OUT/gluon_dswiglu_probe.csv when OUT is set).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

H_BIG, I_BIG = 16384, 53248
T_LIST = [128, 256, 512, 1024, 2048, 4096]
RECOMPUTE_T = 512
RAGGED = (200, 520, 1176)  # T, H, I
WARMUP, ITERS = 5, 20
DEVICE = "cuda"


def first_line(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}".strip()
    lines = [l for l in s.splitlines() if l.strip()]
    return (lines[0] if lines else s)[:300]


# ----------------------------------------------------------------------------- worker side


class Ctx:
    def __init__(self):
        import torch

        self.torch = torch
        self.flush_buf = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=DEVICE)
        self.key = None
        self.data = None

    def make(self, T, H, I, seed=0):
        """go [T, H], dw [H, I], gate/up/act [T, I] bf16 (act = bf16(silu(gate)) as the forward)."""
        if self.key != (T, H, I):
            torch = self.torch
            self.data = None
            torch.cuda.empty_cache()
            gen = torch.Generator(device=DEVICE).manual_seed(seed + T)
            go = torch.randn(T, H, device=DEVICE, generator=gen).to(torch.bfloat16)
            dw = (torch.randn(H, I, device=DEVICE, generator=gen) * H**-0.5).to(torch.bfloat16)
            gate = (torch.randn(T, I, device=DEVICE, generator=gen) * 2.0).to(torch.bfloat16)
            up = torch.randn(T, I, device=DEVICE, generator=gen).to(torch.bfloat16)
            gf = gate.float()
            act = (gf * torch.sigmoid(gf)).to(torch.bfloat16)
            del gf
            self.data = (go, dw, gate, up, act)
            self.key = (T, H, I)
        return self.data

    def outs(self, T, I, fill=float("nan")):
        torch = self.torch
        return [torch.full((T, I), fill, device=DEVICE, dtype=torch.bfloat16) for _ in range(3)]

    def time_fn(self, fn):
        torch = self.torch
        times = []
        for i in range(WARMUP + ITERS):
            self.flush_buf.zero_()
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            if i >= WARMUP:
                times.append((s, e))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in times)


def compare(torch, got, ref):
    """[d_gate, d_up, h] vs [d_gate, d_up, h]: fraction bitwise equal each, max abs diff, NaN count."""
    eq = [float((a.view(torch.int16) == b.view(torch.int16)).float().mean().item()) for a, b in zip(got, ref)]
    maxdiff = max(float(torch.nan_to_num((a.float() - b.float()).abs(), nan=float("inf")).max().item()) for a, b in zip(got, ref))
    nan = sum(int(torch.isnan(a).sum().item()) for a in got)
    return dict(eq_dgate=eq[0], eq_dup=eq[1], eq_h=eq[2], maxdiff=maxdiff, nan=nan)


def reference64(torch, go, dw, gate, up, act):
    """The formula in float64 with bf16 rounding at the tl kernel's points; act None: recomputed."""
    bf = lambda x: x.to(torch.bfloat16).double()  # noqa: E731
    g = bf(go.double() @ dw.double())
    gt = gate.double()
    s = torch.sigmoid(gt)
    a = bf(gt * s) if act is None else act.double()
    u = up.double()
    d_act = bf(g * u)
    return [(d_act * s * (1 + gt * (1 - s))).to(torch.bfloat16), (g * a).to(torch.bfloat16), (a * u).to(torch.bfloat16)]


def ulp_close(torch, got, ref, ulps=2):
    """Fraction of elements within `ulps` bf16 ulps of ref (ulp of |ref|, floor at the smallest normal)."""
    fr = []
    for a, b in zip(got, ref):
        bd = b.double()
        ulp = torch.clamp(bd.abs(), min=2.0**-126) * 2.0**-7
        fr.append(float(((a.double() - bd).abs() <= ulps * ulp).double().mean().item()))
    return min(fr)


def tl_launcher(go, dw, gate, up, act, d_gate, d_up, h, c):
    """backward.launch_dswiglu with its descriptors built once (same kernel, same arguments)."""
    from swiglu.kernels import tl_kernels as kernels
    from swiglu.kernels.devices import tile_programs
    from swiglu.kernels.launch import launch_kwargs
    from swiglu.kernels.tma import tma_descriptor

    T, H = go.shape
    I = dw.shape[1]
    piece = [c.BM, c.BN // c.EPI_SPLIT]
    nprog = tile_programs(go.device, T, I, c)
    args = (
        tma_descriptor(go, [c.BM, c.BK]),
        tma_descriptor(dw, [c.BK, c.BN]),
        tma_descriptor(gate, piece),
        tma_descriptor(up, piece),
        tma_descriptor(gate if act is None else act, piece),
        tma_descriptor(d_gate, piece),
        tma_descriptor(d_up, piece),
        tma_descriptor(h, piece),
        T,
        H,
        I,
    )
    kw = dict(NUM_PROGRAMS=nprog, RECOMPUTE_ACT=act is None, **launch_kwargs(c))

    def run():
        kernels.dswiglu_gemm_kernel[(nprog,)](*args, **kw)

    return run


def make_launch(go, dw, gate, up, act, d_gate, d_up, h, cfg, num_programs):
    """A zero-argument launch of the Gluon dSwiGLU kernel with its descriptors built once (for timing)."""
    from swiglu.kernels import gluon_dswiglu as D

    grid, args, kw = D._prepare(go, dw, gate, up, act, d_gate, d_up, h, cfg, num_programs)

    def run():
        D.dswiglu_gluon_kernel[grid](*args, **kw)

    return run


def run_worker(ci, T_list, recompute_T):
    import torch
    import triton
    from swiglu.kernels import gluon_dswiglu as D
    from swiglu.kernels.backward import config_for, launch_dswiglu
    from swiglu_lab.experiments.candidates import DSWIGLU_CANDIDATES
    from swiglu.kernels.devices import tile_programs

    print(f"torch {torch.__version__} triton {triton.__version__} device {torch.cuda.get_device_name()}", flush=True)
    cfg = DSWIGLU_CANDIDATES[ci]
    name = cfg.name()
    print(f"=== config {ci}: {name}", flush=True)
    ctx = Ctx()
    rows = []

    def nprog_for(T, I):
        return tile_programs(torch.device(DEVICE), T, I, cfg)

    def gluon(go, dw, gate, up, act, outs):
        T, I = gate.shape
        D.launch_dswiglu_gluon(go, dw, gate, up, act, *outs, cfg, nprog_for(T, I))

    # ---- ragged case: vs tl (bitwise) and vs float64
    Tr, Hr, Ir = RAGGED
    for recompute in (False, True):
        row = dict(kind="gluon", config=name, T=Tr, H=Hr, I=Ir, recompute=recompute, case="ragged")
        try:
            t0 = time.time()
            go, dw, gate, up, act = ctx.make(Tr, Hr, Ir)
            a = None if recompute else act
            ref_tl = ctx.outs(Tr, Ir)
            launch_dswiglu(go, dw, gate, up, a, *ref_tl, config_for("dswiglu", Tr))
            got = ctx.outs(Tr, Ir)
            gluon(go, dw, gate, up, a, got)
            torch.cuda.synchronize()
            row.update(compare(torch, got, ref_tl))
            ref64 = reference64(torch, go, dw, gate, up, a)
            c64 = compare(torch, got, ref64)
            row["eq64_min"] = min(c64["eq_dgate"], c64["eq_dup"], c64["eq_h"])
            row["ulp2_64"] = ulp_close(torch, got, ref64)
            tl64 = compare(torch, ref_tl, ref64)
            row["tl_eq64_min"] = min(tl64["eq_dgate"], tl64["eq_dup"], tl64["eq_h"])
            row["ok"] = row["nan"] == 0 and row["ulp2_64"] >= 0.999
            print(f"  ragged T={Tr} H={Hr} I={Ir} recompute={recompute}: {row} ({time.time() - t0:.1f}s)", flush=True)
        except Exception as e:
            row.update(ok=False, error=first_line(e))
            print(f"  ERROR ragged: {row['error']}", flush=True)
            traceback.print_exc()
            rows.append(row)
            return rows  # a config that fails here will not run the big shapes
        rows.append(row)

    # ---- big shapes
    for T in T_list:
        go, dw, gate, up, act = ctx.make(T, H_BIG, I_BIG)
        c_tl = config_for("dswiglu", T)
        flops = 2.0 * T * H_BIG * I_BIG
        g_out = torch.empty(T, I_BIG, device=DEVICE, dtype=torch.bfloat16)
        cub = ctx.time_fn(lambda: torch.matmul(go, dw, out=g_out))
        g_out = None  # freed (the timed lambda above closes over the name)
        rows.append(
            dict(
                kind="cublas",
                config="torch.matmul(go, dw)",
                T=T,
                H=H_BIG,
                I=I_BIG,
                recompute="",
                case="big",
                ms=round(cub, 4),
                tflops=round(flops / (cub * 1e-3) / 1e12, 1),
                vs_cublas=1.0,
                ok=True,
            )
        )
        for recompute in (False, True) if T == recompute_T else (False,):
            a = None if recompute else act
            # tl kernel: reference outputs (NaN-poisoned first) and its time
            ref = ctx.outs(T, I_BIG)
            tl_row = dict(
                kind="tl",
                config=f"tl {c_tl.BM}x{c_tl.BN}x{c_tl.BK} S{c_tl.num_stages} "
                f"G{c_tl.GROUP_M} ws{int(c_tl.warp_specialize)} fl{int(c_tl.flatten)}",
                T=T,
                H=H_BIG,
                I=I_BIG,
                recompute=recompute,
                case="big",
            )
            try:
                launch_dswiglu(go, dw, gate, up, a, *ref, c_tl)
                torch.cuda.synchronize()
                tl_row["nan"] = sum(int(torch.isnan(x).sum().item()) for x in ref)
                ms = ctx.time_fn(tl_launcher(go, dw, gate, up, a, *ref, c_tl))
                tl_row.update(
                    ms=round(ms, 4),
                    tflops=round(flops / (ms * 1e-3) / 1e12, 1),
                    vs_cublas=round(cub / ms, 3),
                    ok=tl_row["nan"] == 0,
                )
            except Exception as e:
                tl_row.update(ok=False, error=first_line(e))
            rows.append(tl_row)
            tl_ms = tl_row.get("ms")
            # Gluon kernel
            row = dict(kind="gluon", config=name, T=T, H=H_BIG, I=I_BIG, recompute=recompute, case="big")
            try:
                got = ctx.outs(T, I_BIG)
                gluon(go, dw, gate, up, a, got)
                torch.cuda.synchronize()
                row.update(compare(torch, got, ref))
                row["ok"] = row["nan"] == 0 and min(row["eq_dgate"], row["eq_dup"], row["eq_h"]) == 1.0
                ms = ctx.time_fn(make_launch(go, dw, gate, up, a, *got, cfg, nprog_for(T, I_BIG)))
                row.update(
                    ms=round(ms, 4),
                    tflops=round(flops / (ms * 1e-3) / 1e12, 1),
                    vs_cublas=round(cub / ms, 3),
                    vs_tl=round(tl_ms / ms, 3) if tl_ms else "",
                )
                del got
            except Exception as e:
                row.update(ok=False, error=first_line(e))
                print(f"  ERROR T={T}: {row['error']}", flush=True)
                traceback.print_exc()
            rows.append(row)
            del ref
            print(
                f"  T={T:5d} rec={int(recompute)}: cuBLAS {cub:.4f}  tl {tl_ms}  gluon {row.get('ms')} ms "
                f"({row.get('tflops')} TF/s, vs tl {row.get('vs_tl')}, vs cuBLAS {row.get('vs_cublas')})  "
                f"eq {row.get('eq_dgate')}/{row.get('eq_dup')}/{row.get('eq_h')} maxdiff {row.get('maxdiff')} "
                f"nan {row.get('nan')} ok={row.get('ok')}",
                flush=True,
            )
    return rows


# ----------------------------------------------------------------------------- driver

KEYS = [
    "kind",
    "config",
    "T",
    "H",
    "I",
    "recompute",
    "case",
    "ms",
    "tflops",
    "vs_cublas",
    "vs_tl",
    "ok",
    "eq_dgate",
    "eq_dup",
    "eq_h",
    "maxdiff",
    "nan",
    "eq64_min",
    "ulp2_64",
    "tl_eq64_min",
    "error",
]


def print_table(rows):
    hdr = [
        "kind",
        "config",
        "T",
        "rec",
        "case",
        "ms",
        "TF/s",
        "vs cuBLAS",
        "vs tl",
        "ok",
        "eq dg/du/h",
        "maxdiff",
        "nan",
        "error",
    ]
    print("\n" + " | ".join(hdr))
    seen = set()
    for r in rows:
        if r["kind"] in ("cublas", "tl"):  # repeated per worker: print each once
            key = (r["kind"], r["T"], r.get("recompute"), r["config"])
            if key in seen:
                continue
            seen.add(key)
        eq = "" if r.get("eq_dgate") is None else f"{r['eq_dgate']:.6f}/{r['eq_dup']:.6f}/{r['eq_h']:.6f}"
        print(
            " | ".join(
                str(x)
                for x in [
                    r["kind"],
                    r["config"],
                    r.get("T", ""),
                    r.get("recompute", ""),
                    r.get("case", ""),
                    r.get("ms", ""),
                    r.get("tflops", ""),
                    r.get("vs_cublas", ""),
                    r.get("vs_tl", ""),
                    r.get("ok", ""),
                    eq,
                    r.get("maxdiff", ""),
                    r.get("nan", ""),
                    r.get("error", ""),
                ]
            )
        )


def print_summary(rows, cfg_indices, candidates):
    """The short table: ms per T (and recompute) for cuBLAS, tl and each config; 'x' = tl time / this
    config's (> 1: faster than tl); '!' = not bitwise the tl kernel's outputs, or an error."""
    names = {candidates[i].name(): i for i in cfg_indices}
    keys = sorted({(r["T"], bool(r["recompute"])) for r in rows if r.get("case") == "big"})
    print("\nsummary (ms, median; x = speed-up over tl; ! = not bitwise / failed); configs:")
    for name, i in names.items():
        print(f"  c{i}: {name}")
    print("T     rec | cuBLAS   | tl       | " + " | ".join(f"c{i:<13}" for i in names.values()))
    for T, rec in keys:
        cell = {}
        for r in rows:
            if r.get("case") == "big" and r["T"] == T and (r["kind"] == "cublas" or bool(r["recompute"]) == rec):
                cell[names.get(r["config"], r["kind"])] = r

        def ms(r):
            return f"{r['ms']:8.4f}" if r and r.get("ms") not in (None, "") else "   -    "

        out = [f"{T:<5} {int(rec):>3}", ms(cell.get("cublas")), ms(cell.get("tl"))]
        for i in names.values():
            r = cell.get(i)
            if r is None:
                out.append(" " * 14)
                continue
            x = f"x{r['vs_tl']:.3f}" if r.get("vs_tl") not in (None, "") else ""
            out.append(f"{ms(r)} {x:>6}" + ("" if r.get("ok") else "!"))
        print(" | ".join(out))


def main():
    global H_BIG, I_BIG
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--configs", default=None, help="comma-separated indices into swiglu_lab.experiments.candidates.DSWIGLU_CANDIDATES"
    )
    ap.add_argument("--out", default=None, help="CSV path (default $OUT/gluon_dswiglu_probe.csv when OUT is set)")
    ap.add_argument("--T", default=",".join(map(str, T_LIST)))
    ap.add_argument("--recompute-T", type=int, default=RECOMPUTE_T)
    ap.add_argument("--hidden-size", type=int, default=H_BIG, help="H of the timed cases")
    ap.add_argument("--intermediate-size", type=int, default=I_BIG, help="I of the timed cases")
    ap.add_argument("--inproc", action="store_true")
    ap.add_argument("--timeout", type=float, default=100.0, help="seconds per config subprocess")
    ap.add_argument("--budget", type=float, default=130.0, help="start no config after this many seconds")
    ap.add_argument("--keep-going", action="store_true", help="go on after a timeout")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    H_BIG, I_BIG = args.hidden_size, args.intermediate_size
    os.environ.pop("TRITON_INTERPRET", None)
    T_list = [int(x) for x in args.T.split(",") if x]

    from swiglu_lab.experiments.candidates import DSWIGLU_CANDIDATES

    cfg_indices = list(range(len(DSWIGLU_CANDIDATES))) if args.configs is None else [int(x) for x in args.configs.split(",")]

    if args.worker is not None:
        rows = run_worker(args.worker, T_list, args.recompute_T)
        with open(args.result, "w") as f:
            json.dump({"rows": rows}, f)
        return

    t_start = time.time()
    rows = []
    if args.inproc:
        for ci in cfg_indices:
            rows += run_worker(ci, T_list, args.recompute_T)
    else:
        for ci in cfg_indices:
            name = DSWIGLU_CANDIDATES[ci].name()
            if time.time() - t_start > args.budget:
                print(f"config {ci} ({name}): skipped, past --budget {args.budget}s", flush=True)
                rows.append(dict(kind="gluon", config=name, ok=False, error="skipped (budget)"))
                continue
            res = tempfile.mktemp(suffix=".json")
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                str(ci),
                "--result",
                res,
                "--T",
                args.T,
                "--recompute-T",
                str(args.recompute_T),
                "--hidden-size",
                str(H_BIG),
                "--intermediate-size",
                str(I_BIG),
            ]
            t0 = time.time()
            timed_out = False
            try:
                p = subprocess.run(cmd, timeout=args.timeout, cwd=str(REPO))
                if p.returncode != 0 or not os.path.exists(res):
                    raise RuntimeError(f"worker exited with {p.returncode}")
                rows += json.load(open(res))["rows"]
            except subprocess.TimeoutExpired:
                timed_out = True
                print(f"config {ci} ({name}): TIMEOUT after {args.timeout}s (deadlock?)", flush=True)
                rows.append(dict(kind="gluon", config=name, ok=False, error=f"timeout {args.timeout}s"))
            except Exception as e:
                print(f"config {ci} ({name}): {first_line(e)}", flush=True)
                rows.append(dict(kind="gluon", config=name, ok=False, error=first_line(e)))
            print(f"config {ci} done in {time.time() - t0:.1f}s (total {time.time() - t_start:.1f}s)", flush=True)
            if timed_out and not args.keep_going:
                print("stopping after a timeout (--keep-going to go on)", flush=True)
                break

    path = args.out or (os.path.join(os.environ["OUT"], "gluon_dswiglu_probe.csv") if os.environ.get("OUT") else None)
    print_table(rows)
    if path:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=KEYS, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(r)
        print(f"wrote {path}")
    print(f"total {time.time() - t_start:.1f}s")
    print_summary(rows, cfg_indices, DSWIGLU_CANDIDATES)


if __name__ == "__main__":
    main()
