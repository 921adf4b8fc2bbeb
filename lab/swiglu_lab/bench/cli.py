"""Command line of the harness: ``python -m swiglu_lab.bench [options]`` (``make bench BENCH_ARGS=...``).

Examples:
    python -m swiglu_lab.bench                          # all 18 cases, every available impl, full protocol
    python -m swiglu_lab.bench --quick --cases s128_b8,4096 --impls eager,triton
    python -m swiglu_lab.bench --max-autotune --cases s211_b16
    python -m swiglu_lab.bench --device cpu             # tiny CPU smoke run (no GPU needed), into build/bench
    torchrun --nproc-per-node 2 -m swiglu_lab.bench --tp 2   # tensor parallel on 2 GPUs (swiglu_lab.bench.tp)

GPU runs are written to data/bench/ (committed measurements); a run not made on a GPU goes to
build/bench/ (untracked scratch) and is refused in data/bench/.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm  # text bar: tqdm.auto warns "IProgress not found" in a kernel without ipywidgets

from swiglu import roofline
from swiglu.inputs import BENCHMARK_SEED
from swiglu.workloads import MODEL_SHAPES, select_cases

from ..paths import repo_root
from . import environment
from .impls import EXPLICIT_ONLY, IMPLS, ORDER, unavailable_reason
from .breakdown import per_role
from .runner import display_name, PROTOCOLS, BenchConfig, pick_hardware, run_benchmark
from .stats import per_case_table, power_summary, summary_table
from .storage import RunWriter, rebuild_index
from .tp import main as tp_main

#: CPU smoke defaults: a tiny shape and two small cases.
CPU_SHAPE = (256, 512)
CPU_CASES = "s128_b1,s256_b2"
#: Where runs go by default (relative to the repository root): GPU measurements are committed,
#: anything else is scratch.
GPU_OUT = "data/bench"
SCRATCH_OUT = "build/bench"

BANNERS = {
    "full": "protocol FULL: {w} warm-ups, {n} timed iterations, median; L2 flushed before every "
    "iteration; CUDA events; 2 alternating input sets; no CUDA graphs",
    "quick": "protocol QUICK (development only, NOT the benchmark protocol): {w} warm-ups, {n} timed "
    "iterations; otherwise as the full protocol",
    "cpu-smoke": "protocol CPU-SMOKE: tiny shapes on the CPU, host timers, no L2 flush, {w} warm-ups, "
    "{n} iterations; checks the harness only, says nothing about GPU speed",
}


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the CLI."""
    p = argparse.ArgumentParser(
        prog="python -m swiglu_lab.bench",
        description="Time the SwiGLU MLP backward implementations side by side with the public "
        "benchmark's protocol (SOL-ExecBench L2/005): 10 warm-ups, 50 timed iterations, median, L2 "
        "flushed before every iteration, CUDA events around each call, no CUDA graphs. Writes "
        "<out>/<run_id>.csv (one row per case x impl), <out>/<run_id>.json (run metadata) and a line "
        "in <out>/runs.csv; never overwrites an earlier run. On a GPU it also records mean board power, "
        "mean SM clock and energy per backward beside every timed loop (NVML via nvidia-ml-py, else "
        "nvidia-smi; see swiglu_lab.bench.power).",
        epilog=f"Implementations: {', '.join(ORDER)}. Default: all available except "
        "compile-max-autotune and quack (name them). 'cublas-gemms' is a lower bound (the six GEMMs alone), not an "
        "implementation. 'liger' needs liger-kernel installed; 'quack' the lab's [quack] extra (tuned configs: "
        "scripts/tune_quack.py). Tensor parallel: torchrun --nproc-per-node N "
        "-m swiglu_lab.bench --tp N --help (swiglu_lab.bench.tp).",
    )
    p.add_argument(
        "--cases",
        default=None,
        help="comma-separated case names (s128_b8) and/or token counts (4096 = every case with "
        f"4096 tokens); default: all 18 (CPU: {CPU_CASES})",
    )
    p.add_argument("--impls", default=None, help=f"comma-separated, from: {','.join(ORDER)}")
    p.add_argument(
        "--model", choices=sorted(MODEL_SHAPES), default=None, help="model shape (default hermes-4-405b: H=16384, I=53248)"
    )
    p.add_argument("--hidden-size", type=int, default=None, help="H, overrides --model")
    p.add_argument("--intermediate-size", type=int, default=None, help="I, overrides --model")
    p.add_argument(
        "--out",
        default=None,
        help=f"output folder (default: {GPU_OUT} for a GPU run, {SCRATCH_OUT} otherwise; a run not made "
        f"on a GPU is refused in {GPU_OUT})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"development mode: {PROTOCOLS['quick'][0]} warm-ups, {PROTOCOLS['quick'][1]} iterations, marked protocol=quick",
    )
    p.add_argument(
        "--max-autotune",
        action="store_true",
        help='also run torch.compile(mode="max-autotune-no-cudagraphs"): max-autotune\'s GEMM and Triton '
        "autotuning without the CUDA graphs the protocol excludes (minutes per case, in first_call_s)",
    )
    p.add_argument(
        "--hardware",
        choices=sorted(roofline.HARDWARE),
        default=None,
        help="datasheet for sol_ms (default from the GPU name: H100, H200, B200; none for another "
        "GPU or a CPU run, whose SOL columns stay empty)",
    )
    p.add_argument(
        "--breakdown",
        type=int,
        default=None,
        help="profiled calls per impl and case for the per-kernel breakdown (kernels/<run_id>.csv; "
        "default 3 on a GPU, 0 on the CPU; 0: none)",
    )
    p.add_argument("--seed", type=int, default=BENCHMARK_SEED, help=f"input seed (default {BENCHMARK_SEED})")
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help=f"cuda (default when a GPU is present) or cpu: a tiny smoke run (H={CPU_SHAPE[0]}, I={CPU_SHAPE[1]}, host timers)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--reindex",
        action="store_true",
        help="only rebuild <out>/runs.csv from the complete runs' JSON files (after copying runs "
        "in from the GPU machine), then exit; no GPU needed",
    )
    return p


def _fmt(frame: pd.DataFrame) -> str:
    return frame.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-")


def format_summary(rows: pd.DataFrame, metadata: dict) -> str:
    """The closing report: per-case medians, then geometric means per implementation (last). A
    CPU run shows the GEMM-only lower bound as "gemms-only" (torch.matmul there, not cuBLAS) and
    no SOL columns (no datasheet for a CPU)."""
    protocol = metadata["protocol"]
    hw = metadata["hardware"]
    cpu = protocol["name"] == "cpu-smoke"
    if cpu:
        rows = rows.assign(impl=rows["impl"].replace("cublas-gemms", "gemms-only"))
    lines = [
        "",
        "per-case median latency (ms); sol_ms = datasheet SOL "
        + (
            f"({hw['name']}: {hw['peak_tflops']} TFLOP/s, {hw['peak_tbps']} TB/s)"
            if hw.get("key")
            else "(none: no datasheet for the device this ran on)"
        ),
    ]
    per_case = per_case_table(rows).reset_index().rename(columns={"index": "case"})
    summary = summary_table(rows)
    if cpu:  # no datasheet: the SOL columns would be all NaN
        per_case = per_case.drop(columns=[c for c in per_case if c.startswith("sol")])
        summary = summary.drop(columns=[c for c in summary if c.startswith("sol_fraction")])
    lines.append(per_case.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-"))
    sol = rows.drop_duplicates("case")
    gm = lambda s: roofline.geometric_mean(s.dropna()) if s.notna().any() else float("nan")  # noqa: E731
    lines += [
        "",
        f"SUMMARY run {metadata.get('run_id', '')} | {metadata['gpu']['name']} | protocol "
        f"{protocol['name'].upper()} ({protocol['warmup']} warm-ups, {protocol['iters']} iterations) | "
        f"{len(sol)} cases | H={metadata['shape']['hidden_size']} I={metadata['shape']['intermediate_size']}",
        "geometric means over the cases each impl timed; "
        + (
            "gemms-only is a LOWER BOUND (the six GEMMs alone, torch.matmul on the CPU)"
            if cpu
            else "sol_fraction = gmean SOL / gmean latency (datasheet; _measured: from this run's copy/GEMM "
            "ceilings); cublas-gemms is a LOWER BOUND"
        ),
        _fmt(summary),
        (
            "speed of light: none (CPU run)"
            if cpu
            else f"speed of light, gmean: datasheet {gm(sol['sol_ms']):.3f} ms, measured ceilings "
            f"{gm(sol['sol_ms_measured']):.3f} ms"
        ),
    ]
    power = power_summary(rows)
    record = metadata.get("power") or {}
    if power is None:
        lines.append(f"power: not recorded ({record.get('status', 'no power data')})")
    else:
        top = f"{record['max_sm_clock_mhz']:.0f} MHz" if record.get("max_sm_clock_mhz") else "?"
        lines += [
            "",
            f"power per case: J = energy per backward (L2 flush subtracted), W = mean board power, "
            f"MHz = mean SM clock (max {top}); {record.get('backend')}, "
            f"{record.get('power_source')}; energy: {record.get('energy_source')}",
            power.reset_index()
            .rename(columns={"index": "case"})
            .to_string(index=False, float_format=lambda v: f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}", na_rep="-"),
        ]
    if protocol["name"] != "full":
        lines.append(f"NOTE: protocol {protocol['name'].upper()}: not the benchmark protocol.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 usage error such as no GPU without
    ``--device cpu``)."""
    raw = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--tp" or a.startswith("--tp=") for a in raw):  # tensor parallel: its own CLI (swiglu_lab.bench.tp)
        return tp_main(raw, exit_now=argv is None)
    parser = build_parser()
    args = parser.parse_args(argv)
    argv_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))

    if args.reindex:
        print(f"rebuilt {rebuild_index(args.out or GPU_OUT)}")
        return 0
    if args.device is None:
        if not torch.cuda.is_available():
            parser.error(
                "no CUDA GPU found. This harness times GPU implementations; for a tiny CPU "
                "smoke run of the harness itself pass --device cpu"
            )
        args.device = "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA GPU (use --device cpu for the smoke mode)")
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    out = args.out or (GPU_OUT if device.type == "cuda" else SCRATCH_OUT)
    committed = (repo_root() / GPU_OUT).resolve()
    if device.type != "cuda" and committed in (Path(out).resolve(), *Path(out).resolve().parents):
        parser.error(
            f"--out {out}: {GPU_OUT}/ holds GPU measurements only; a {device.type} run goes to "
            f"{SCRATCH_OUT}/ (the default) or another folder"
        )
    if device.type != "cuda" and args.hardware:
        parser.error(
            f"--hardware {args.hardware} with --device {device.type}: the speed of light of a GPU the "
            "run was not made on would mislead"
        )

    if args.model:
        default_h, default_i = MODEL_SHAPES[args.model].hidden_size, MODEL_SHAPES[args.model].intermediate_size
    elif device.type == "cpu":
        default_h, default_i = CPU_SHAPE
    else:
        default_h, default_i = MODEL_SHAPES["hermes-4-405b"].hidden_size, MODEL_SHAPES["hermes-4-405b"].intermediate_size
    hidden = default_h if args.hidden_size is None else args.hidden_size
    inter = default_i if args.intermediate_size is None else args.intermediate_size
    if hidden <= 0 or inter <= 0:
        parser.error(f"--hidden-size and --intermediate-size must be positive, got {hidden}, {inter}")
    try:
        cases = select_cases(args.cases if args.cases is not None else (CPU_CASES if device.type == "cpu" else None))
    except ValueError as exc:
        parser.error(f"--cases: {exc}")

    if args.impls:
        requested = [s.strip() for s in args.impls.split(",") if s.strip()]
        unknown = [n for n in requested if n not in IMPLS]
        if unknown:
            parser.error(f"--impls: unknown {unknown}; expected some of {list(ORDER)}")
        if args.max_autotune and "compile-max-autotune" not in requested:
            requested.append("compile-max-autotune")
    else:
        requested = [n for n in ORDER if (n != "compile-max-autotune" or args.max_autotune) and n not in EXPLICIT_ONLY]
    requested = [n for n in ORDER if n in requested]  # run order: eager first
    skipped = {n: r for n in requested if (r := unavailable_reason(n, device))}
    impls = [n for n in requested if n not in skipped]
    if not impls:
        parser.error(f"nothing to run: {skipped}")

    protocol = "cpu-smoke" if device.type == "cpu" else ("quick" if args.quick else "full")
    hardware = args.hardware or (pick_hardware(torch.cuda.get_device_name(device)) if device.type == "cuda" else "")
    warmup, iters = PROTOCOLS[protocol]
    print(BANNERS[protocol].format(w=warmup, n=iters))
    print(
        f"device {device} | H={hidden} I={inter} | {len(cases)} cases | "
        f"impls {','.join(display_name(n, device) for n in impls)} | "
        f"datasheet {hardware or 'none (SOL columns empty)'} | writing to {out}"
    )
    for name, reason in skipped.items():
        print(f"note: skipping {name}: {reason}")

    config = BenchConfig(
        cases=cases,
        hidden_size=hidden,
        intermediate_size=inter,
        impls=impls,
        device=device,
        protocol=protocol,
        seed=args.seed,
        hardware=hardware,
        skipped=skipped,
        breakdown=(3 if device.type == "cuda" else 0) if args.breakdown is None else max(0, args.breakdown),
    )
    command = f"python -m swiglu_lab.bench {argv_text}".strip()
    writer: list[RunWriter] = []

    def on_start(metadata: dict) -> None:  # reserve the run id; rows are saved case by case
        writer.append(RunWriter(out, environment.make_run_id(metadata["utc"], metadata["git_commit"])))
        writer[0].write_metadata(dict(metadata, command=command), complete=False)
        tqdm.write(f"writing {writer[0].csv_path} (case by case) and {writer[0].json_path.name}")

    kernels_csv: list[Path] = []
    result = run_benchmark(
        config,
        progress=not args.no_progress,
        on_start=on_start,
        on_case=lambda f: writer[0].append(f),
        on_kernels=lambda f: kernels_csv.append(writer[0].append_kernels(f)),
    )
    metadata = dict(result.metadata, command=command)
    writer[0].finish(metadata)
    metadata["run_id"] = writer[0].run_id
    print(
        f"\nwrote {writer[0].csv_path} ({writer[0].n_rows} rows), {writer[0].json_path}; "
        f"indexed in {writer[0].out_dir / 'runs.csv'}"
    )
    print(format_summary(result.rows, metadata))
    if result.kernels is not None:
        table = per_role(result.kernels)
        print(
            f"\nkernel breakdown (ms per backward: kernels, median of {config.breakdown} profiled calls; idle = lead + "
            f"gaps, measured in the profiled loop; timed_minus_busy: timed median - busy): {kernels_csv[-1]}"
        )
        print(_fmt(table))
    return 0
