"""Training step of the SwiGLU MLP on the GPU: time, peak memory and saved activations.

One process, on one H200 (``scripts/train_step_gpu.py`` calls ``main``; < 5 min):

1. Checks at small shapes: the activation the memory-lean backward recomputes is bitwise the
   forward's (fused and cuBLAS forwards), lean and saved gradients pass the float64 rule (error
   <= 2x the plain bf16 module's + 1e-3), the fused forward meets the benchmark's tolerance
   against nn.Linear's bf16 output and errs <= 2x the plain bf16 forward against float64.
2. Forward alone at full Hermes size (H=16384, I=53248), T = 128..8192: fused kernel candidates
   against cuBLAS + the product kernel; the fastest per token bucket is the forward's table
   (written as ``forward_configs.json``, the format ``swiglu.kernels.forward`` loads) and used below.
3. Step (forward + backward, median of CUDA events) and ``torch.cuda.max_memory_allocated`` at
   T = 1024, 4096, 8192 for: PlainSwiGLUMLP, torch.compile(PlainSwiGLUMLP), ours saved
   (``save_activated_gate=True``), ours lean (the default), plus ours lean with the cuBLAS forward
   where the table chose the fused one; saved activation bytes per layer from the saved tensors
   (``swiglu.memory.saved_activations``). Beside each peak, the floor no unchunked
   implementation that materializes bf16 weight gradients can go below (``floor_bytes``; a
   backward chunked over tokens needs only [chunk, I] instead of [T, I]): what the step starts with
   (weights, x, grad_output), the module's output (held by the step), grad_x, the three weight
   gradients, and one [T, I] tensor: every weight-gradient GEMM reads a [T, I] operand (d_gate,
   d_up or h) while its output exists, and grad_x needs two of them, so the last of these four
   GEMMs has at least one [T, I] tensor live beside all the gradients.

Writes ``train_step.csv``, ``forward_tuning.csv``, ``checks.csv``, ``train_step.json`` (all rows
and metadata: GPU, torch, triton, commit from env SWIGLU_GIT_COMMIT) and
``forward_configs.json`` to ``--out`` or $OUT when set; prints a short table last.
``latest_run``/``load_run`` read such a run back from data/train_step/ (notebooks/06_training_memory.ipynb
draws it with ``plots.training_step_plot``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from swiglu import CASES, benchmark_criterion, make_inputs, relative_error
from swiglu.memory import saved_activations
from swiglu.module import PlainSwiGLUMLP, SwiGLUMLP
from swiglu.workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE

from ..bench.environment import git_info, gpu_info, make_run_id, software_info, utc_now
from ..bench.tables import FUSED_CANDIDATES, forward_table, shape_forward_table
from ..bench.timing import median_step_ms

VARIANTS = ("plain", "compile", "saved", "lean", "lean_cublas")
LABELS = {
    "plain": "nn.Linear (eager)",
    "compile": "torch.compile(nn.Linear)",
    "saved": "ours, saved act",
    "lean": "ours, memory-lean",
    "lean_cublas": "ours, lean + cuBLAS forward",
}
STEP_TOKENS = (1024, 4096, 8192)
FORWARD_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192)


# ------------------------------------------------------------------ timing helpers


def _memory(device: str) -> tuple:
    """(allocated, reset_peak, max_allocated) for CUDA; zeros elsewhere (no allocator statistics)."""
    if device == "cuda":
        return torch.cuda.memory_allocated, torch.cuda.reset_peak_memory_stats, torch.cuda.max_memory_allocated
    return (lambda: 0), (lambda: None), (lambda: 0)


def _iters(tokens: int, given: tuple[int, int] | None = None) -> tuple[int, int]:
    """(warmup, timed iterations): ``given``, else fewer at large T (each step is 50-200 ms)."""
    return given or ((2, 5) if tokens >= 4096 else (3, 10))


# ------------------------------------------------------------------ 1. checks


def run_checks() -> list[dict]:
    """The GPU checks of the module docstring, one row each (``passed`` and a detail)."""
    from swiglu.kernels import forward
    from swiglu.kernels.backward import triton_swiglu_backward

    rows = []
    atol = min(c.atol for c in CASES)
    configs = {"cublas": None, **FUSED_CANDIDATES}
    inp = make_inputs(1, 300, 1024, 2816, device="cuda", seed=11)
    w = (inp.gate_weight, inp.up_weight, inp.down_weight)
    for name, cfg in configs.items():
        out, gate, up, act = forward.triton_swiglu_forward(inp.x, *w, config=cfg, return_activated_gate=True)
        act2, h2 = torch.empty_like(act.view(300, -1)), torch.empty_like(act.view(300, -1))
        forward.launch_swiglu_product(gate.view(300, -1), up.view(300, -1), h2, act2)
        given = triton_swiglu_backward(inp.grad_output, inp.x, gate, up, act, *w)
        recomputed = triton_swiglu_backward(inp.grad_output, inp.x, gate, up, None, *w)
        same = torch.equal(act2, act.view(300, -1)) and all(torch.equal(a, b) for a, b in zip(given, recomputed))
        rows.append(
            dict(
                check="bitwise_recompute",
                variant=name,
                passed=same,
                detail="act, product kernel and the 4 gradients with act given vs recomputed",
            )
        )
    # The fused forward's tolerance at a mid size and odd token counts.
    for tokens in (1, 200, 1024):
        fi = make_inputs(1, tokens, 4096, 14336, device="cuda", seed=12 + tokens)
        fw = (fi.gate_weight, fi.up_weight, fi.down_weight)
        plain = PlainSwiGLUMLP(4096, 14336, device="meta", dtype=torch.bfloat16)
        plain.load_state_dict(dict(zip(("gate_proj.weight", "up_proj.weight", "down_proj.weight"), fw)), assign=True)
        with torch.no_grad():
            want = plain(fi.x)
            oracle = plain.double()(fi.x.double())
        for name, cfg in configs.items():
            got = forward.triton_swiglu_forward(fi.x, *fw, config=cfg)[0]
            crit = benchmark_criterion(got, want, atol)
            err, plain_err = relative_error(got, oracle), relative_error(want, oracle)
            rows.append(
                dict(
                    check="forward_tolerance",
                    variant=f"{name}_T{tokens}",
                    passed=bool(crit.passed and err <= 2 * plain_err + 1e-6),
                    detail=f"criterion {crit.passed} ({crit.match_fraction:.4f}); rel err {err:.3e} vs plain {plain_err:.3e}",
                )
            )
        del plain, oracle
    # Gradients of both modes against float64 (the tests/library/test_module_gpu.py rule).
    H, I, T = 1024, 2816, 512
    gen = torch.Generator(device="cuda").manual_seed(13)
    state = {
        k: torch.randn(s, generator=gen, device="cuda", dtype=torch.float64) / s[1] ** 0.5
        for k, s in (("gate_proj.weight", (I, H)), ("up_proj.weight", (I, H)), ("down_proj.weight", (H, I)))
    }
    x = torch.randn(T, H, generator=gen, device="cuda").bfloat16()
    go = torch.randn(T, H, generator=gen, device="cuda").bfloat16()

    def grads(model, dtype):
        model.load_state_dict({k: v.bfloat16().to(dtype) for k, v in state.items()})
        xl = x.to(dtype).requires_grad_(True)
        model(xl).backward(go.to(dtype))
        return [xl.grad] + [p.grad for p in model.parameters()]

    oracle = grads(PlainSwiGLUMLP(H, I, device="cuda", dtype=torch.float64), torch.float64)
    plain_g = grads(PlainSwiGLUMLP(H, I, device="cuda", dtype=torch.bfloat16), torch.bfloat16)
    for mode, save in (("lean", False), ("saved", True)):
        ours = grads(SwiGLUMLP(H, I, save_activated_gate=save, device="cuda", dtype=torch.bfloat16), torch.bfloat16)
        errs = [(relative_error(o, r), relative_error(p, r)) for o, p, r in zip(ours, plain_g, oracle)]
        rows.append(
            dict(
                check="grads_float64",
                variant=mode,
                passed=all(e <= 2 * pe + 1e-3 for e, pe in errs),
                detail="; ".join(f"{e:.2e}/{pe:.2e}" for e, pe in errs),
            )
        )
    return rows


# ------------------------------------------------------------------ 2. forward table


def tune_forward(
    hidden_size: int,
    intermediate_size: int,
    tokens=FORWARD_TOKENS,
    *,
    device: str = "cuda",
    candidates: dict | None = None,
    iters: tuple[int, int] | None = None,
) -> tuple[list[dict], dict]:
    """Time the forward (all of it: gate/up, product, down_proj) per candidate and T. Returns the
    rows and the table {bucket: (candidate name, KernelConfig or None, ms)}, fastest per bucket."""
    from swiglu.kernels import forward
    from swiglu.kernels.backward import bucket_for

    gen = torch.Generator(device=device).manual_seed(0)
    w = [
        torch.randn(s, generator=gen, device=device, dtype=torch.bfloat16) / s[1] ** 0.5
        for s in ((intermediate_size, hidden_size), (intermediate_size, hidden_size), (hidden_size, intermediate_size))
    ]
    candidates = candidates if candidates is not None else {"cublas": None, **FUSED_CANDIDATES}
    rows, table = [], {}
    for T in tokens:
        x = torch.randn(T, hidden_size, generator=gen, device=device, dtype=torch.bfloat16)
        warmup, n = _iters(T, iters)
        plain_ms = median_step_ms(
            lambda: torch.nn.functional.linear(torch.nn.functional.silu(x @ w[0].t()) * (x @ w[1].t()), w[2]), warmup, n, device
        )
        for name, cfg in candidates.items():
            ms = median_step_ms(lambda: forward.triton_swiglu_forward(x, *w, config=cfg), warmup, n, device)
            rows.append(
                dict(
                    tokens=T,
                    candidate=name,
                    ms=ms,
                    plain_ms=plain_ms,
                    speedup_vs_plain=plain_ms / ms,
                    config=None if cfg is None else asdict(cfg),
                )
            )
        best = min((r for r in rows if r["tokens"] == T), key=lambda r: r["ms"])
        bucket = bucket_for(T)
        # The largest T measured in a bucket decides it; buckets never measured keep their entry.
        table[bucket] = (best["candidate"], candidates[best["candidate"]], best["ms"], T)
        x = None  # freed (the timed lambdas close over it)
    return rows, table


# ------------------------------------------------------------------ 3. training step


def _step(module, x, go):
    for p in module.parameters():
        p.grad = None
    x.grad = None
    module(x).backward(go)


def step_floor_bytes(start_bytes: int, grad_bytes: int, tokens: int, hidden_size: int, intermediate_size: int) -> int:
    """The least peak memory (bytes) of one unchunked forward + backward of the MLP that
    materializes bf16 gradients, given what the step starts with (``start_bytes``: weights, x, grad_output) and the
    weight gradients' bytes: plus the output and grad_x ([T, H] each) and one [T, I] tensor (the
    operand of the last gradient GEMM; module docstring). bf16 (2 bytes per element)."""
    return start_bytes + grad_bytes + 2 * (2 * tokens * hidden_size) + 2 * tokens * intermediate_size


def measure_steps(
    hidden_size: int,
    intermediate_size: int,
    tokens=STEP_TOKENS,
    *,
    variants=VARIANTS,
    device: str = "cuda",
    iters: tuple[int, int] | None = None,
) -> list[dict]:
    """Step time, peak memory and saved activations per variant and T (module docstring); the
    "lean_cublas" variant runs only where the forward table picks the fused kernel. Off CUDA
    (CPU tests) the memory columns are 0 and times are perf_counter's."""
    from swiglu.kernels import forward

    if "plain" not in variants:
        raise ValueError(f"variants must include 'plain' (the reference of speedups), got {variants}")
    allocated, reset_peak, max_allocated = _memory(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(1)
    names = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
    shapes = ((intermediate_size, hidden_size), (intermediate_size, hidden_size), (hidden_size, intermediate_size))
    state = {n: torch.randn(s, generator=gen, device=device, dtype=torch.bfloat16) / s[1] ** 0.5 for n, s in zip(names, shapes)}
    rows = []
    for T in tokens:
        x = torch.randn(T, hidden_size, generator=gen, device=device, dtype=torch.bfloat16, requires_grad=True)
        go = torch.randn(T, hidden_size, generator=gen, device=device, dtype=torch.bfloat16)
        fused_here = forward.forward_config_for(T, hidden_size, intermediate_size) is not None
        for variant in variants:
            if variant == "lean_cublas" and not fused_here:
                continue
            if variant in ("plain", "compile"):
                module = PlainSwiGLUMLP(hidden_size, intermediate_size, device="meta", dtype=torch.bfloat16)
            else:
                module = SwiGLUMLP(
                    hidden_size, intermediate_size, save_activated_gate=variant == "saved", device="meta", dtype=torch.bfloat16
                )
            module.load_state_dict(state, assign=True)
            if variant == "compile":
                torch._dynamo.reset()
                module = torch.compile(module, dynamic=False)
            saved_table = dict(forward.FORWARD_CONFIGS)
            if variant == "lean_cublas":
                forward.FORWARD_CONFIGS.update({b: None for b in forward.FORWARD_CONFIGS})
            try:
                saved = saved_activations(module, x)
                warmup, n = _iters(T, iters)
                ms = median_step_ms(lambda: _step(module, x, go), warmup, n, device)
                sync()
                for p in module.parameters():
                    p.grad = None
                x.grad = None
                base = allocated()
                reset_peak()
                _step(module, x, go)  # one more, for the peak alone
                sync()
                peak = max_allocated()
            finally:
                forward.FORWARD_CONFIGS.update(saved_table)
            grad_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
            floor = step_floor_bytes(base, grad_bytes, T, hidden_size, intermediate_size) if device == "cuda" else float("nan")
            rows.append(
                dict(
                    tokens=T,
                    variant=variant,
                    label=LABELS[variant],
                    ms=ms,
                    peak_bytes=peak,
                    floor_bytes=floor,
                    peak_vs_floor=peak / floor,
                    peak_over_start_bytes=peak - base,
                    start_bytes=base,
                    saved_bytes=saved.bytes,
                    saved_TxI=saved.count((T, intermediate_size)),
                    tflops=18 * T * hidden_size * intermediate_size / (ms * 1e-3) / 1e12,
                    forward="fused" if variant == "lean" and fused_here else "cublas",
                )
            )
            module = None  # freed (the timed lambda closes over it)
            if device == "cuda":
                torch.cuda.empty_cache()
        plain_ms = next(r["ms"] for r in rows if r["tokens"] == T and r["variant"] == "plain")
        plain_peak = next(r["peak_bytes"] for r in rows if r["tokens"] == T and r["variant"] == "plain")
        for r in rows:
            if r["tokens"] == T:
                r["speedup_vs_plain"] = plain_ms / r["ms"]
                r["peak_vs_plain"] = r["peak_bytes"] / plain_peak if plain_peak else float("nan")
        x = go = None
    return rows


# ------------------------------------------------------------------ writing, reading back, plotting


def write_run(run: dict, out: str | Path) -> None:
    """``train_step.json`` (everything), ``forward_configs.json`` and three CSVs into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_step.json").write_text(json.dumps(run, indent=1, default=str))
    (out / "forward_configs.json").write_text(json.dumps(run["forward_configs"], indent=1))
    pd.DataFrame(run["steps"]).to_csv(out / "train_step.csv", index=False)
    pd.DataFrame(run["forward"]).drop(columns="config").to_csv(out / "forward_tuning.csv", index=False)
    pd.DataFrame(run["checks"] or [{}]).to_csv(out / "checks.csv", index=False)


def load_run(path: str | Path) -> dict | None:
    """A run written by ``main`` (its ``train_step.json``, or the folder holding it) as
    ``{"meta", "steps": DataFrame, "forward": DataFrame, "checks": DataFrame}``; None when the
    file does not exist (no recorded data)."""
    path = Path(path)
    path = path / "train_step.json" if path.is_dir() else path
    if not path.exists():
        return None
    run = json.loads(path.read_text())
    return {
        "meta": run["meta"],
        "steps": pd.DataFrame(run["steps"]),
        "forward": pd.DataFrame(run["forward"]),
        "checks": pd.DataFrame(run["checks"]),
    }


def latest_run(folder: str | Path) -> dict | None:
    """The most recent run (by its metadata's utc) among the ``train_step.json`` files under
    ``folder``, read with ``load_run``; None when there is none."""
    paths = sorted(Path(folder).glob("**/train_step.json")) if Path(folder).is_dir() else []
    runs = [load_run(p) for p in paths]
    return max(runs, key=lambda r: str(r["meta"].get("utc", "")), default=None)


def summary_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per T and variant: saved MB per layer, peak GB (and the floor, ``floor_GB``, where the run
    recorded it), ms, speedup and peak relative to plain."""
    t = steps.assign(saved_MB=steps.saved_bytes / 1e6, peak_GB=steps.peak_bytes / 1e9)
    cols = ["tokens", "variant", "saved_TxI", "saved_MB", "peak_GB", "peak_vs_plain", "ms", "speedup_vs_plain"]
    if "floor_bytes" in t:
        t = t.assign(floor_GB=t.floor_bytes / 1e9)
        cols.insert(cols.index("peak_vs_plain"), "floor_GB")
    return t[cols]


def main(argv: list[str] | None = None) -> dict:
    """Run the three parts (module docstring) and write the results; returns the run dict."""
    from swiglu.kernels import forward

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the results (default: $OUT)")
    ap.add_argument("--hidden-size", type=int, default=HIDDEN_SIZE)
    ap.add_argument("--intermediate-size", type=int, default=INTERMEDIATE_SIZE)
    ap.add_argument("--step-tokens", type=int, nargs="+", default=list(STEP_TOKENS))
    ap.add_argument("--forward-tokens", type=int, nargs="+", default=list(FORWARD_TOKENS))
    ap.add_argument("--skip-checks", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("swiglu_lab.research.train_step needs a CUDA GPU")
    H, I = args.hidden_size, args.intermediate_size
    when = utc_now()
    git = git_info()
    meta = dict(
        utc=when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        run_id=make_run_id(when, git["commit"]),
        git=git,
        gpu=gpu_info(torch.device("cuda")),
        software=software_info(),
        hidden_size=H,
        intermediate_size=I,
    )
    t0 = time.perf_counter()
    checks = [] if args.skip_checks else run_checks()
    print(f"[{time.perf_counter() - t0:.0f} s] checks done", flush=True)
    for c in checks:
        print(f"check {c['check']:18s} {c['variant']:16s} {'ok' if c['passed'] else 'FAILED'}  {c['detail']}", flush=True)
    fwd_rows, table = tune_forward(H, I, args.forward_tokens)
    for b, (name, cfg, ms, T) in table.items():
        forward.FORWARD_CONFIGS[b] = cfg
    forward.FORWARD_CONFIGS_BY_SHAPE.pop((H, I), None)  # this run's table is the choice at (H, I)
    print(f"[{time.perf_counter() - t0:.0f} s] forward table done", flush=True)
    steps = measure_steps(H, I, args.step_tokens)
    print(f"[{time.perf_counter() - t0:.0f} s] training steps done", flush=True)
    doc = forward_table(table, {k: meta[k] for k in ("utc", "run_id", "hidden_size", "intermediate_size")})
    if (H, I) != (HIDDEN_SIZE, INTERMEDIATE_SIZE):  # another shape: its own entry beside the package's table
        doc = shape_forward_table(doc, H, I, json.loads(forward.FORWARD_CONFIGS_PATH.read_text()))
    run = dict(meta=meta, checks=checks, forward=fwd_rows, steps=steps, forward_configs=doc)
    if args.out:
        write_run(run, args.out)
    pd.set_option("display.width", 160)
    f = pd.DataFrame(fwd_rows).pivot(index="tokens", columns="candidate", values="ms")
    print("\nforward ms (whole forward incl. down_proj; chosen per bucket ->", {b: v[0] for b, v in table.items()}, ")")
    print(f.round(3).to_string())
    print(f"\nchecks: {sum(c['passed'] for c in checks)}/{len(checks)} passed")
    print("\ntraining step (forward + backward), H=%d I=%d, %s" % (H, I, meta["gpu"]["name"]))
    print(summary_table(pd.DataFrame(steps)).round(3).to_string(index=False))
    return run


if __name__ == "__main__":
    main()
