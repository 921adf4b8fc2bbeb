"""Our MLP kernels against cuBLAS's GEMMs as a training step runs them: warm clocks, no L2 flush,
launches back to back. The benchmark's protocol (L2 flushed, one call at a time) had our
kernels level with cuBLAS at Llama-3-8B's layer, while inside a Hugging Face step cuBLAS ran
each GEMM of that size 6-9% faster than our forward and weight gradients (docs/huggingface.md);
this probe times each kernel under the step's conditions to say which kernel to change or hand
to cuBLAS at a shape.

Answer (data/tuning/in_step_gemms_*.csv, docs/huggingface.md): at Llama-3-8B's layer the fused
forward ran 6-9% behind cuBLAS's path at 2048-8192 tokens (hence ``configs_by_shape`` sends it to
cuBLAS there), the other kernels within 0-3% from 2048 tokens up; grad_x at 1.86x cuBLAS's time
at 512 tokens until its tile rule (1.003x after).

    python lab/probes/probe_in_step_gemms.py --hidden-size 4096 --intermediate-size 14336 --tokens 2048
    python lab/probes/probe_in_step_gemms.py --device cpu      # wiring check under the interpreter, tiny shape

Ops (ours as the backward plan and the forward table choose them at --tokens; cuBLAS the same
products through torch.mm/addmm into preallocated outputs): ``forward`` (gate and up projections
with the SwiGLU product; skipped where the forward table picks cuBLAS), ``dswiglu`` (ours with
its epilogue; cuBLAS the GEMM alone, a lower bound), ``grad_x`` (cuBLAS: mm then addmm),
``grad_down_weight`` and ``grad_gate_weight`` (one weight gradient each orientation). Protocol:
one second of launches first (clocks up), then ``--rounds`` rounds; in each, per op and impl in
rotated order, ``--repeats`` launches back to back between two CUDA events, ms per launch = span
/ repeats; the median over rounds. Every op's outputs are checked against cuBLAS's (relative
Frobenius error, printed). Writes ``in_step_gemms.csv`` to ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def rel_err(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def build_ops(T: int, H: int, I: int, device):
    """name -> (ours, cublas, outputs_ours, outputs_cublas, flop) for one layer's kernels."""
    import torch

    from swiglu import make_inputs
    from swiglu.kernels import backward, forward

    inp = make_inputs(1, T, H, I, seed=T, device=device)
    go, x = inp.grad_output.view(T, H), inp.x.view(T, H)
    gate, up, act = (t.view(T, I) for t in (inp.gate_output, inp.up_output, inp.activated_gate))
    gw, uw, dw = inp.gate_weight, inp.up_weight, inp.down_weight
    plan = backward.backward_plan(T, H, I, device)
    empty = lambda *shape: torch.empty(shape, device=device, dtype=torch.bfloat16)  # noqa: E731
    gemm = 2 * T * H * I
    ops = {}

    # The shape-agnostic bucket's fused kernel (the per-shape table may pick cuBLAS at this shape:
    # this comparison is what such an entry is measured by).
    cfg = forward.forward_config_for(T)
    if cfg is not None:
        f_ours, f_ref = [empty(T, I) for _ in range(3)], [empty(T, I) for _ in range(3)]

        def fwd_ours():
            forward.launch_fused_forward(x, gw, uw, f_ours[0], f_ours[1], None, f_ours[2], cfg)

        def fwd_cublas():
            torch.mm(x, gw.t(), out=f_ref[0])
            torch.mm(x, uw.t(), out=f_ref[1])
            forward.launch_swiglu_product(f_ref[0], f_ref[1], f_ref[2])

        ops["forward"] = (fwd_ours, fwd_cublas, f_ours, f_ref, 2 * gemm)

    d_ours, g_ref = [empty(T, I) for _ in range(3)], [empty(T, I)]
    if plan.gluon_dswiglu is not None:
        from swiglu.kernels import gluon_dswiglu

        def dswiglu_ours():
            gluon_dswiglu.launch_dswiglu_gluon(go, dw, gate, up, act, *d_ours, plan.gluon_dswiglu, plan.gluon_dswiglu_programs)
    else:

        def dswiglu_ours():
            backward.launch_dswiglu(go, dw, gate, up, act, *d_ours, plan.dswiglu, plan.dswiglu_programs)

    # Checked on h = bf16(act * up), the output the GEMM alone does not give.
    ops["dswiglu"] = (dswiglu_ours, lambda: torch.mm(go, dw, out=g_ref[0]), d_ours[2:], [act * up], gemm)

    # Realistic d_gate / d_up for the GEMMs that read them (the dSwiGLU kernel's own outputs).
    dswiglu_ours()
    d_gate, d_up = d_ours[0].clone(), d_ours[1].clone()
    gx_ours, gx_ref = [empty(T, H)], [empty(T, H)]

    def grad_x_cublas():
        torch.mm(d_gate, gw, out=gx_ref[0])
        gx_ref[0].addmm_(d_up, uw)

    ops["grad_x"] = (
        lambda: backward.launch_grad_x(d_gate, d_up, gw, uw, gx_ours[0], plan.grad_x, plan.grad_x_programs),
        grad_x_cublas,
        gx_ours,
        gx_ref,
        2 * gemm,
    )
    h = d_ours[2].clone()
    for name, a, b, shape, nprog in (
        ("grad_down_weight", go, h, (H, I), plan.grad_weight_programs_hi),
        ("grad_gate_weight", d_gate, x, (I, H), plan.grad_weight_programs_ih),
    ):
        w_ours, w_ref = [empty(*shape)], [empty(*shape)]
        ops[name] = (
            (
                lambda a=a, b=b, o=w_ours[0], n=nprog: backward.launch_grad_weight_gluon_or_tl(
                    a, b, o, plan.grad_weights, plan.gluon_grad_weights, n
                )
            ),
            (lambda a=a, b=b, o=w_ref[0]: torch.mm(a.t(), b, out=o)),
            w_ours,
            w_ref,
            gemm,
        )
    return ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden-size", type=int, default=4096)
    ap.add_argument("--intermediate-size", type=int, default=14336)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=20, help="launches back to back per timed span")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu (wiring check, tiny shape)")
    ap.add_argument("--out", default=str(REPO / "build" / "probe"))
    args = ap.parse_args(argv)
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules are imported
        T, H, I = 300, 64, 96  # the forward table's fused bucket, the tl dSwiGLU kernel
    else:
        T, H, I = args.tokens, args.hidden_size, args.intermediate_size
    if args.repeats < 1 or args.rounds < 1:
        ap.error("--repeats and --rounds must be >= 1")
    ops = build_ops(T, H, I, device)
    errors = {}
    for name, (ours, cublas, o_ours, o_ref, _) in ops.items():
        ours()
        cublas()
        if o_ours is not None:
            errors[name] = max(rel_err(a, b) for a, b in zip(o_ours, o_ref))
    if device.type == "cpu":
        for name, err in errors.items():
            print(f"{name}: rel. error against cuBLAS's {err:.2e}")
        bad = [n for n, e in errors.items() if not e < 2e-2]
        print("wiring ok" if not bad else f"MISMATCH: {bad}")
        return 1 if bad else 0

    sync = torch.cuda.synchronize
    start = time.perf_counter()
    while time.perf_counter() - start < 1.0:  # clocks up, as in a running step
        for ours, cublas, *_ in ops.values():
            ours()
            cublas()
        sync()
    times = {(n, impl): [] for n in ops for impl in ("ours", "cublas")}
    entries = [(n, impl, fn) for n, (ours, cublas, *_) in ops.items() for impl, fn in (("ours", ours), ("cublas", cublas))]
    try:
        from tqdm import tqdm
    except ImportError:

        def tqdm(it, **_):
            return it

    for r in tqdm(range(args.rounds), desc="rounds"):
        for name, impl, fn in entries[r % len(entries) :] + entries[: r % len(entries)]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            sync()
            a.record()
            for _ in range(args.repeats):
                fn()
            b.record()
            b.synchronize()
            times[(name, impl)].append(a.elapsed_time(b) / args.repeats)
    rows = []
    for name, (*_, flop) in ops.items():
        ours_ms, cublas_ms = (statistics.median(times[(name, i)]) for i in ("ours", "cublas"))
        rows.append(
            dict(
                op=name,
                tokens=T,
                hidden_size=H,
                intermediate_size=I,
                ours_ms=round(ours_ms, 4),
                cublas_ms=round(cublas_ms, 4),
                ours_over_cublas=round(ours_ms / cublas_ms, 4),
                ours_tflops=round(flop / ours_ms / 1e9, 1),
                cublas_tflops=round(flop / cublas_ms / 1e9, 1),
                rel_err=errors.get(name, float("nan")),
                repeats=args.repeats,
                rounds=args.rounds,
                gpu=torch.cuda.get_device_name(device),
            )
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "in_step_gemms.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(
        f"\nT={T} H={H} I={I}, {args.repeats} launches per span, median of {args.rounds} rounds "
        f"(dswiglu's cuBLAS row: the GEMM alone, without the epilogue)"
    )
    print(f"{'op':<18} {'ours ms':>9} {'cuBLAS ms':>10} {'ours/cuBLAS':>12} {'TFLOP/s':>15} {'rel err':>9}")
    for r in rows:
        print(
            f"{r['op']:<18} {r['ours_ms']:>9.4f} {r['cublas_ms']:>10.4f} {r['ours_over_cublas']:>12.3f} "
            f"{r['ours_tflops']:>7.1f}/{r['cublas_tflops']:<7.1f} {r['rel_err']:>9.1e}"
        )
    print(f"CSV: {out / 'in_step_gemms.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
