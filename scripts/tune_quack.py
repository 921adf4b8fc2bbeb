"""Tune quack-kernels' SwiGLU MLP backward (the bench's "quack" peer) for given token counts and
persist quack's autotune choices, then optionally check and time it against eager.

GPU only (SM90). Run with quack importable: the lab's [quack] extra, or on the offline GPU machine
what ``scripts/pack_quack.sh`` packed, installed by ``scripts/install_quack.sh`` in two back-to-back
calls (a folder named site-packages on purpose, see ``quack_peer.check_install_location``):

    python scripts/tune_quack.py --tokens 128 256 512 1024 --max-minutes 6 \
        --cache-dir data/tuning/quack_cache --verify-tokens 128 1024

For each token count T (ascending) it runs the peer's backward once at the full shape
(H=16384, I=53248, bf16): quack's first tuned call per shape sweeps its candidate configs for the
four GEMMs (gemm_dgated, dW2, dx, dW1) and writes the winners as ``<fn>.autotune.json`` under
``--cache-dir`` (quack's QUACK_CACHE_DIR). The search is ``swiglu_lab.bench.quack_peer``'s (default
"reduced"; the bench must use the same, since quack's cache key hashes the candidate list). The
time bound: a shape is not started when the elapsed time plus an estimate of its own (the
previous shape's time x max(1.3, 0.8 x the token ratio)) would pass ``--max-minutes``; each finished GEMM is already on disk.

Tuning-only speed-up (does not change what is cached): each candidate is benched with
``--bench-calls`` timed calls after ``--bench-warmup-ms`` of warm-up instead of quack's 200 and
200 ms (``quack.autotuner._bench_cuda_graph_l2_rotate``).

``--verify-tokens``: for each T, the peer's outputs against ``reference_backward`` with the
benchmark's criterion, on forward-consistent inputs (activated_gate = silu(gate_output): quack
should pass) and on the benchmark's independent inputs (quack recomputes silu, so grad_x,
grad_up_weight and grad_down_weight are expected to fail, like Liger), then the median of
``--iters`` L2-flushed iterations of quack and of eager.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument("--hidden-size", type=int, default=16384)
    p.add_argument("--intermediate-size", type=int, default=53248)
    p.add_argument(
        "--cache-dir",
        default=str(REPO / "data" / "tuning" / "quack_cache"),
        help="quack's autotune cache (QUACK_CACHE_DIR); default data/tuning/quack_cache",
    )
    p.add_argument(
        "--kernel-cache-dir", default=None, help="quack's compiled-kernel .o cache (default <tmp>/swiglu_quack_kernels)"
    )
    p.add_argument(
        "--search", choices=("reduced", "full"), default=None, help="candidate configs (default $SWIGLU_QUACK_SEARCH or reduced)"
    )
    p.add_argument("--max-minutes", type=float, default=8.0)
    p.add_argument("--bench-calls", type=int, default=60, help="timed calls per candidate (quack: 200)")
    p.add_argument("--bench-warmup-ms", type=float, default=60.0, help="warm-up per candidate (quack: 200)")
    p.add_argument("--compile-workers", type=int, default=None, help="QUACK_COMPILE_WORKERS (default: CPU count - 2, at least 8)")
    p.add_argument(
        "--no-kernel-cache",
        action="store_true",
        help="QUACK_CACHE_ENABLED=0: no .o cache and no async compile pool (slower; the workaround "
        "for a CuTe-DSL whose objects quack cannot hash into its kernel-cache key)",
    )
    p.add_argument("--verify-tokens", type=int, nargs="*", default=[])
    p.add_argument("--iters", type=int, default=10, help="timed iterations per impl in --verify-tokens")
    p.add_argument("--summary", default=None, help="write a JSON summary here")
    return p.parse_args(argv)


def _case_atol(tokens: int) -> float:
    from swiglu import CASES

    atols = [c.atol for c in CASES if c.tokens == tokens]
    return min(atols) if atols else 0.24


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    budget_s = args.max_minutes * 60
    workers = args.compile_workers or max(8, (os.cpu_count() or 10) - 2)
    os.environ.setdefault("QUACK_COMPILE_WORKERS", str(workers))
    if args.no_kernel_cache:
        os.environ["QUACK_CACHE_ENABLED"] = "0"

    import torch

    from swiglu_lab.bench import quack_peer
    from swiglu import make_inputs

    device = torch.device("cuda")
    why = quack_peer.unavailable_reason(device)
    if why:
        print(f"tune_quack: {why}", flush=True)
        return 2
    settings = quack_peer.configure(args.search, args.cache_dir, args.kernel_cache_dir)
    import quack.autotuner as qa
    import quack.gemm_interface as gi
    import quack.gemm_runtime.autotune as rt

    qa._bench_cuda_graph_l2_rotate = functools.partial(
        qa._bench_cuda_graph_l2_rotate, n_timed_calls=args.bench_calls, warmup_target_ms=args.bench_warmup_ms
    )
    info = {
        **quack_peer.versions(),
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "compile_workers": os.environ["QUACK_COMPILE_WORKERS"],
        "bench_calls": args.bench_calls,
        "bench_warmup_ms": args.bench_warmup_ms,
    }
    print(f"tune_quack: {json.dumps(info)}", flush=True)
    fn = quack_peer.build(device, allow_tuning=True)
    H, I = args.hidden_size, args.intermediate_size

    def tuners():
        return [("gemm", gi.gemm_tuned)] + [(t.fn.__name__, t) for t in rt._MOD_TUNERS.values()]

    def choices():
        return {(name, str(k)): str(cfg) for name, t in tuners() for k, cfg in t.cache.items()}

    summary = {"settings": settings, "info": info, "tuned": [], "skipped": [], "verify": []}
    last = None
    for T in sorted(set(args.tokens)):
        elapsed = time.perf_counter() - t_start
        # the sweep's bench time grows with T; the first shape also paid the compiles
        estimate = last[1] * max(1.3, 0.8 * T / last[0]) if last is not None else 0.0
        if elapsed + estimate > budget_s:
            print(
                f"tune_quack: T={T} skipped: {elapsed:.0f}s elapsed + ~{estimate:.0f}s estimate > {budget_s:.0f}s budget",
                flush=True,
            )
            summary["skipped"].append(T)
            continue
        before = choices()
        inputs = quack_peer.to_quack_layout(make_inputs(1, T, H, I, mode="benchmark", seed=0, device=device).as_tuple())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*inputs)
        torch.cuda.synchronize()
        took = time.perf_counter() - t0
        t1 = time.perf_counter()
        out = fn(*inputs)
        torch.cuda.synchronize()
        again = time.perf_counter() - t1
        del out, inputs
        torch.cuda.empty_cache()
        new = {k: v for k, v in choices().items() if k not in before}
        last = (T, took)
        print(
            f"tune_quack: T={T} tuned in {took:.1f}s (second call {again * 1e3:.1f} ms host, total "
            f"{time.perf_counter() - t_start:.0f}s); {len(new)} new choices:",
            flush=True,
        )
        for (name, key), cfg in new.items():
            print(f"    {name} {key[:160]} -> {cfg}", flush=True)
        summary["tuned"].append({"tokens": T, "seconds": round(took, 1), "choices": [[n, k, c] for (n, k), c in new.items()]})
    files = sorted(str(p.relative_to(args.cache_dir)) for p in Path(args.cache_dir).rglob("*.autotune.json"))
    print(f"tune_quack: {len(files)} autotune files under {args.cache_dir}", flush=True)
    summary["files"] = files

    if args.verify_tokens:
        summary["verify"] = verify(fn, args, device, quack_peer)
    print(f"tune_quack: done in {time.perf_counter() - t_start:.0f}s", flush=True)
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(json.dumps(summary, indent=1))
    return 0


def verify(fn, args, device, quack_peer) -> list[dict]:
    import statistics

    import torch

    from swiglu import benchmark_criterion
    from swiglu_lab.bench.timing import L2Flusher, time_iterations
    from swiglu import make_inputs
    from swiglu import reference_backward

    names = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")
    flush = L2Flusher(device)
    results = []
    for T in args.verify_tokens:
        row = {"tokens": T, "atol": _case_atol(T)}
        for mode in ("forward", "benchmark"):
            inputs = make_inputs(1, T, args.hidden_size, args.intermediate_size, mode=mode, device=device).as_tuple()
            ref = reference_backward(*inputs)
            t0 = time.perf_counter()
            out = fn(*quack_peer.to_quack_layout(inputs))
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            checks = {n: benchmark_criterion(o, r, row["atol"]) for n, o, r in zip(names, out, ref)}
            row[mode] = {n: {"passed": bool(c.passed), "match": round(float(c.match_fraction), 5)} for n, c in checks.items()}
            row[f"{mode}_first_call_s"] = round(first, 2)
            print(
                f"verify T={T} {mode:<9} first call {first:.2f}s; "
                + ", ".join(f"{n} {'ok' if c.passed else 'FAIL'} {c.match_fraction:.4f}" for n, c in checks.items()),
                flush=True,
            )
            del out, ref
            if mode == "benchmark":
                prepared = quack_peer.to_quack_layout(inputs)
                for name, call, make in (("eager", reference_backward, lambda: inputs), ("quack", fn, lambda: prepared)):
                    time_iterations(call, make, 2, device, flush)
                    times = time_iterations(call, make, args.iters, device, flush)
                    row[f"{name}_median_ms"] = round(statistics.median(times), 4)
                print(
                    f"verify T={T} median ms: eager {row['eager_median_ms']:.3f}, quack {row['quack_median_ms']:.3f} "
                    f"(x{row['eager_median_ms'] / row['quack_median_ms']:.2f} vs eager)",
                    flush=True,
                )
                del prepared
            inputs = None  # freed (the lambdas above close over it)
            torch.cuda.empty_cache()
        results.append(row)
    return results


if __name__ == "__main__":
    sys.exit(main())
