"""Run the protocol: every selected case x implementation, rows plus the run's metadata.

Per case: one input set from ``swiglu.make_inputs`` (benchmark mode, generator seeded with
``seed``) and a clone of it at other addresses; iterations alternate between the two, so no
iteration sees the previous one's input addresses (values are equal, so every call does the same
work). The eager reference runs once on set 0 and is the correctness reference of the case.

Per implementation (in ``impls.ORDER``): build (untimed), one first call timed on the host with
synchronization (``first_call_s``: compile / autotune happen here), the warm-ups (any further
autotuning), the timed iterations (``timing.time_iterations``, L2 flushed before each; the
implementation's ``prepare`` before each too, or, for a read-only layout, once per input set with
a check afterwards that the calls left it unchanged, else an ERROR row without timings), then one
more call on set 0 under ``torch.cuda.max_memory_allocated`` (``peak_mem_gb``: the call's own
allocations, outputs included) whose outputs are checked against the reference with the
benchmark's criterion. An implementation that raises yields a row with NaN timings,
``correct = False`` and the error in ``note``; the run goes on.

Power (GPU runs, ``swiglu_lab.bench.power``): per case, a flush-only loop gives the energy of one L2
flush; per implementation, a window around the timed iterations (stretched with untimed
iterations of the same call to the monitor's ``min_window_s``) gives mean board power, mean SM
clock, sample count and energy per iteration. CPU runs leave these columns NaN.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd
import torch
from tqdm import tqdm  # text bar: tqdm.auto warns "IProgress not found" in a kernel without ipywidgets

from swiglu import roofline
from swiglu.accuracy import benchmark_criterion
from swiglu.inputs import BENCHMARK_SEED, make_inputs
from swiglu.reference import reference_backward
from swiglu.workloads import Case
from . import environment
from .breakdown import frame as kernel_frame, profile_calls
from .impls import IMPLS, BenchImpl
from .power import PowerMonitor, empty_power_columns, extension_iterations, measure_flush_energy, open_monitor, with_flush_energy
from .schema import coerce, rows_to_frame
from .stats import Ceilings, add_speedups, nan_stats, sol_columns, time_stats
from .timing import L2Flusher, alternating, measure_ceilings, synchronize, time_iterations

#: protocol name -> (warm-ups, timed iterations)
PROTOCOLS = {"full": (10, 50), "quick": (2, 5), "cpu-smoke": (2, 5)}
OUTPUT_NAMES = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")


@dataclass
class BenchConfig:
    """What to run. ``impls`` are names in ``impls.IMPLS`` (or in the ``impls`` mapping given to
    ``run_benchmark``), run in the given order; ``protocol`` is a ``PROTOCOLS`` key; ``hardware`` a
    ``roofline.HARDWARE`` key for the datasheet SOL, ``None`` for the device's own (``pick_hardware``
    of a CUDA GPU's name) or ``""`` for none: a run is only compared with the datasheet of the
    hardware it ran on, so a CPU run has no datasheet SOL (``ValueError`` if one is named)."""

    cases: list[Case]
    hidden_size: int
    intermediate_size: int
    impls: list[str]
    device: torch.device
    protocol: str = "full"
    seed: int = BENCHMARK_SEED
    hardware: str | None = None
    measure_ceilings: bool = True
    breakdown: int = 0  # profiled calls per impl and case for the per-kernel breakdown (0: none)
    skipped: dict[str, str] = field(default_factory=dict)  # impl -> why it is not run

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {list(PROTOCOLS)}, got {self.protocol!r}")
        if self.hardware is None:
            self.hardware = pick_hardware(torch.cuda.get_device_name(self.device)) if self.device.type == "cuda" else ""
        if self.hardware and self.hardware not in roofline.HARDWARE:
            raise ValueError(f"hardware must be one of {list(roofline.HARDWARE)} or '', got {self.hardware!r}")
        if self.hardware and self.device.type != "cuda":
            raise ValueError(
                f"hardware={self.hardware!r} for a {self.device.type} run: a GPU's speed of light "
                "says nothing about a run that was not made on it (leave hardware unset)"
            )
        if not self.cases:
            raise ValueError("cases must not be empty")


@dataclass
class BenchResult:
    """The tidy rows (``schema.COLUMNS``; ``run_id`` still empty) and the metadata record."""

    rows: pd.DataFrame
    metadata: dict
    kernels: pd.DataFrame | None = None  # breakdown.COLUMNS rows; None without a breakdown


def pick_hardware(gpu_name: str) -> str:
    """Datasheet entry for a GPU name: H100 -> H100-SXM, H200 -> H200-SXM, B200 -> B200-HGX,
    anything else (another GPU, ``""`` for no GPU) -> ``""``: no datasheet SOL, since a fraction
    of another card's speed of light would mislead."""
    name = gpu_name.upper()
    for tag, key in (("H100", "H100-SXM"), ("H200", "H200-SXM"), ("B200", "B200-HGX")):
        if tag in name and key in roofline.HARDWARE:
            return key
    return ""


def display_name(impl: str, device: torch.device) -> str:
    """The name printed for ``impl``: on a CPU the GEMM-only lower bound runs torch.matmul, not
    cuBLAS, so it is shown as "gemms-only" (the recorded ``impl`` stays "cublas-gemms")."""
    return "gemms-only" if impl == "cublas-gemms" and torch.device(device).type != "cuda" else impl


def _cleanup(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_outputs(outputs, reference, case: Case) -> tuple[bool, float, str]:
    """Benchmark criterion (case atol, rtol) on each of the four outputs against the eager
    reference's. Returns (all passed, smallest match fraction, text naming failed outputs)."""
    if len(outputs) != len(reference):
        return False, math.nan, f"returned {len(outputs)} outputs, expected {len(reference)}"
    results = [benchmark_criterion(o, r, case.atol, case.rtol) for o, r in zip(outputs, reference)]
    failed = [
        f"{name} (match {res.match_fraction:.4f}, nonfinite {res.nonfinite})"
        for name, res in zip(OUTPUT_NAMES, results)
        if not res.passed
    ]
    text = "criterion failed: " + ", ".join(failed) if failed else ""
    return not failed, min(r.match_fraction for r in results), text


class InputsChanged(RuntimeError):
    """A call wrote into arguments the harness prepared once and reused (``unchanged``)."""


def unchanged(used: tuple, snapshot: tuple) -> None:
    """Raise ``InputsChanged`` when a once-prepared argument set (``used``, after the timed loop)
    differs bit for bit from ``snapshot``, its copy taken before the first timed call (tensors
    compared with ``torch.equal``, so a NaN written anywhere counts as a change; other arguments
    are not compared). A call that writes into its arguments must be prepared before every call
    (``BenchImpl.prepare_every_call``), else its later iterations time other inputs."""
    for i, (a, b) in enumerate(zip(used, snapshot)):
        if isinstance(a, torch.Tensor) and not torch.equal(a, b):
            raise InputsChanged(
                f"argument {i} changed during the timed calls: the call writes into its inputs, "
                "so its prepare must run before every call (prepare_every_call=True)"
            )


def measure_impl(
    impl: BenchImpl,
    sets: list[tuple],
    reference,
    case: Case,
    device: torch.device,
    warmup: int,
    iters: int,
    flush: Callable[[], None],
    monitor: PowerMonitor | None = None,
    breakdown: int = 0,
) -> dict:
    """Build, first call, warm-ups, timed iterations (with a power window when ``monitor`` is
    given), memory and correctness of one impl on one case (see the module docstring); with
    ``breakdown`` > 0 also that many profiled calls (``breakdown.profile_calls``; their rows under
    the key ``"kernels"``). Never raises: errors end up in the returned ``note``."""
    result = {
        **nan_stats(),
        **empty_power_columns(),
        "first_call_s": math.nan,
        "host_ms": math.nan,
        "peak_mem_gb": math.nan,
        "correct": pd.NA if not impl.checks_correctness else False,
        "min_match_fraction": math.nan,
        "note": impl.note,
    }
    stage = "build"
    try:
        fn = impl.build(device)
        stage = "first call"
        args = impl.prepare(sets[0])
        synchronize(device)
        t0 = time.perf_counter()
        out = fn(*args)
        synchronize(device)
        result["first_call_s"] = time.perf_counter() - t0
        del out, args
        stage = "timing"
        if impl.prepare_every_call:
            cycle = alternating(sets[1:] + sets[:1])  # the first call used set 0
            make_args = lambda: impl.prepare(cycle())  # noqa: E731
        else:  # read-only layout: made once per set, outside the power window too
            prepared = [impl.prepare(s) for s in sets]
            make_args = alternating(prepared[1:] + prepared[:1])
            snapshot = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in prepared[0])
        time_iterations(fn, make_args, warmup, device, flush)  # ends synchronized
        window = monitor.open_window() if monitor is not None else None
        host_ms: list[float] = []
        result.update(time_stats(time_iterations(fn, make_args, iters, device, flush, host_ms)))
        result["host_ms"] = statistics.median(host_ms)
        if window is not None:
            stage = "power window"
            extra = 0
            # Untimed, energy only. The median only estimates a round's length (a loaded host runs
            # slower or faster than in the timed loop), so rounds repeat until the window is long enough.
            for _ in range(1000):
                more = extension_iterations(window.elapsed_s(), result["median_ms"], monitor.min_window_s)
                if not more:
                    break
                time_iterations(fn, make_args, more, device, flush)
                extra += more
            result.update(monitor.close_window(window, iters + extra))
        if breakdown:
            try:  # a profiler failure costs the breakdown, not the row's timings
                result["kernels"] = profile_calls(fn, make_args, breakdown, device, flush)
            except Exception as exc:  # noqa: BLE001
                result["note"] += f"; kernel breakdown failed: {' '.join(f'{type(exc).__name__}: {exc}'.split())[:200]}"
        if not impl.prepare_every_call:
            stage = "prepared inputs check"
            unchanged(prepared[0], snapshot)
            del prepared, snapshot, make_args  # the prepared copies are not needed past here
        stage = "correctness call"
        args = impl.prepare(sets[0])
        synchronize(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        out = fn(*args)
        synchronize(device)
        if device.type == "cuda":
            result["peak_mem_gb"] = (torch.cuda.max_memory_allocated(device) - base) / 1e9
        if impl.checks_correctness:
            stage = "correctness check"
            correct, fraction, text = check_outputs(out, reference, case)
            result.update(correct=correct, min_match_fraction=fraction)
            if text:
                result["note"] += f"; {text}"
        del out, args, fn
    except Exception as exc:  # noqa: BLE001 - one failing impl must not end the run
        if monitor is not None:
            monitor.cancel()
        message = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
        result["note"] = f"ERROR in {stage}: {message}; {impl.note}"
        if impl.checks_correctness:
            result["correct"] = False
        if isinstance(exc, InputsChanged):  # the timed calls saw other inputs: no timings
            result.update(**nan_stats(), **empty_power_columns(), host_ms=math.nan)
            result.pop("kernels", None)
    return result


def build_metadata(
    config: BenchConfig,
    impls: dict[str, BenchImpl],
    started,
    flush_nbytes: int,
    ceiling_record: dict,
    power_record: dict | None = None,
) -> dict:
    """The run's metadata record: flat summary keys (``gpu_name``, ``git_commit``, ... as
    ``swiglu_lab.research.analysis`` reads them), then GPU, software, git, protocol, shape, cases, impls,
    datasheet and measured ceilings."""
    device = config.device
    warmup, iters = PROTOCOLS[config.protocol]
    gpu, software, git = environment.gpu_info(device), environment.software_info(), environment.git_info()
    hw = roofline.HARDWARE.get(config.hardware)
    power_record = power_record or {"backend": None}
    return {
        "gpu_name": gpu["name"],
        "sm_count": gpu.get("sm_count"),
        "driver": gpu.get("nvidia_smi", {}).get("driver_version"),
        "cuda": software["cuda"],
        "torch": software["torch"],
        "triton": software["triton"],
        "python": software["python"],
        "git_commit": git["commit"],
        "git_dirty": git["dirty"],
        "max_sm_clock_mhz": power_record.get("max_sm_clock_mhz"),
        "power_limit_w": power_record.get("power_limit_w"),
        "utc": started.strftime(environment.UTC_FORMAT),
        "finished_utc": None,
        "gpu": gpu,
        "software": software,
        "git": git,
        "protocol": {
            "name": config.protocol,
            "warmup": warmup,
            "iters": iters,
            "statistic": "median (also p20, p80, mean, min)",
            "timer": "CUDA events on the current stream around each call"
            if device.type == "cuda"
            else "host wall clock (CPU smoke: says nothing about GPU speed)",
            "l2_flush_bytes": flush_nbytes,
            "l2_flush": "a 2 x L2-size buffer zeroed before every iteration" if flush_nbytes else "none (CPU)",
            "cuda_graphs": False,
            "input_sets": "2 (set 0 from make_inputs, set 1 a clone at other addresses), alternating",
            "input_mode": "benchmark",
            "seed": config.seed,
            "first_call": "one call before the warm-ups, host-timed with synchronize: first_call_s",
            "side_streams": "implementations must join the current stream before returning",
            "kernel_breakdown": (
                f"{config.breakdown} calls per impl and case under torch.profiler after the timed "
                "iterations, on a GPU in a loop like the timed one (flush, call; split at the flush "
                "kernels), on a CPU each call in its own range (swiglu_lab.bench.breakdown): "
                "kernels/<run_id>.csv"
            )
            if config.breakdown
            else "none",
        },
        "shape": {"hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size},
        "cases": [c.name for c in config.cases],
        "impls": list(config.impls),
        "impl_notes": {n: impls[n].note for n in config.impls},
        "skipped_impls": dict(config.skipped),
        "hardware": (
            {
                "key": config.hardware,
                "name": hw.name,
                "peak_tflops": hw.peak_tflops,
                "peak_tbps": hw.peak_tbps,
                "source": hw.source,
            }
            if hw
            else {
                "key": "",
                "name": "none (no datasheet for this device: SOL columns empty)",
                "peak_tflops": None,
                "peak_tbps": None,
                "source": "",
            }
        ),
        "ceilings": ceiling_record,
        "power": power_record,
    }


def run_benchmark(
    config: BenchConfig,
    *,
    impls: dict[str, BenchImpl] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = tqdm.write,
    on_start: Callable[[dict], None] | None = None,
    on_case: Callable[[pd.DataFrame], None] | None = None,
    monitor: PowerMonitor | None | str = "auto",
    on_kernels: Callable[[pd.DataFrame], None] | None = None,
) -> BenchResult:
    """Measure the ceilings, then every case x implementation of ``config``.

    Args:
        config: what to run. impls: name -> ``BenchImpl`` (default ``impls.IMPLS``; tests add
            their own). progress: show a tqdm bar over case x impl. log: one line per row.
        on_start: called with the metadata once the ceilings are measured (``finished_utc``
            still None). on_case: called with each finished case's rows (speed-ups filled), so
            a caller can save them before the next case. on_kernels: the same for each case's
            kernel breakdown (``config.breakdown`` > 0; ``breakdown.COLUMNS``).
        monitor: "auto" opens ``power.open_monitor(config.device)`` (None on CPU) and closes it
            at the end; a ``PowerMonitor`` is used as given (and left open); None: no power data.

    Returns: ``BenchResult`` (rows in case-major order, metadata without ``run_id``/argv, the
    kernel breakdown when ``config.breakdown`` > 0).

    Raises: ``ValueError`` for an implementation name missing from ``impls``.
    """
    impls = IMPLS if impls is None else impls
    unknown = [n for n in config.impls if n not in impls]
    if unknown:
        raise ValueError(f"unknown impls {unknown}; expected some of {list(impls)}")
    device = config.device
    warmup, iters = PROTOCOLS[config.protocol]
    H, I = config.hidden_size, config.intermediate_size
    flush = L2Flusher(device)
    started = environment.utc_now()

    own_monitor = isinstance(monitor, str)
    if own_monitor:
        if monitor != "auto":
            raise ValueError(f"monitor must be 'auto', a PowerMonitor or None, got {monitor!r}")
        monitor, why = open_monitor(device)
    else:
        why = "given by the caller" if monitor is not None else "no monitor (monitor=None)"
    power_record = {**monitor.describe(), "status": why} if monitor is not None else {"backend": None, "status": why}
    log(
        f"power: {why}"
        + (f"; {power_record['power_source']}; energy: {power_record['energy_source']}" if monitor is not None else "")
    )
    try:
        return _run(
            config,
            impls,
            device,
            warmup,
            iters,
            H,
            I,
            flush,
            started,
            monitor,
            power_record,
            progress,
            log,
            on_start,
            on_case,
            on_kernels,
        )
    finally:
        if own_monitor and monitor is not None:
            monitor.close()


def _run(
    config,
    impls,
    device,
    warmup,
    iters,
    H,
    I,
    flush,
    started,
    monitor,
    power_record,
    progress,
    log,
    on_start,
    on_case,
    on_kernels=None,
) -> BenchResult:
    """The body of ``run_benchmark``, apart so that the monitor it opened is closed on any exit."""
    ceilings, ceiling_record = Ceilings(), {"skipped": True}
    if config.measure_ceilings and device.type != "cuda":
        # A CPU's copy and 512^3 GEMM rates bound nothing here (the smoke run beat its "SOL" by 1.9x).
        ceiling_record = {"skipped": "not a CUDA device: no speed of light for this op"}
    elif config.measure_ceilings:
        ceilings, ceiling_record = measure_ceilings(device, quick=config.protocol != "full", flush=flush)
        log(
            f"ceilings: copy {ceilings.copy_tbps:.3f} TB/s, bf16 GEMM {ceilings.gemm_tflops:.1f} TFLOP/s "
            f"at {ceiling_record['gemm_shape'][0]}^3"
        )
    metadata = build_metadata(config, impls, started, flush.nbytes, ceiling_record, power_record)
    if on_start is not None:
        on_start(dict(metadata))

    frames, kernel_frames = [], []
    bar = tqdm(total=len(config.cases) * len(config.impls), desc="bench", unit="run", disable=not progress)
    for case in config.cases:
        set0 = make_inputs(case.batch_size, case.seq_len, H, I, mode="benchmark", seed=config.seed, device=device)
        sets = [set0.as_tuple()]
        sets.append(tuple(t.clone() for t in sets[0]))
        del set0
        reference = reference_backward(*sets[0])
        synchronize(device)
        flush_energy_j = measure_flush_energy(monitor, flush, device) if monitor is not None else math.nan
        rows, case_kernels = [], []
        for name in config.impls:
            bar.set_postfix_str(f"{case.name} {name}")
            measured = measure_impl(impls[name], sets, reference, case, device, warmup, iters, flush, monitor, config.breakdown)
            kernels = measured.pop("kernels", None)
            if kernels:
                case_kernels.append(
                    kernel_frame(
                        kernels, run_id="", case=case.name, tokens=case.tokens, impl=name, timed_ms=measured["median_ms"]
                    )
                )
            if math.isfinite(measured["energy_j"]):
                measured = with_flush_energy(measured, flush_energy_j)
            _cleanup(device)
            row = {
                "run_id": "",
                "case": case.name,
                "seq_len": case.seq_len,
                "batch_size": case.batch_size,
                "tokens": case.tokens,
                "hidden_size": H,
                "intermediate_size": I,
                "impl": name,
                "protocol": config.protocol,
                "warmup": warmup,
                "iters": iters,
                "hardware": config.hardware,
                "speedup_vs_eager": math.nan,
                "speedup_vs_compile": math.nan,
                **measured,
                **sol_columns(case.tokens, H, I, measured["median_ms"], config.hardware, ceilings),
            }
            rows.append(row)
            sol = f"SOL {row['sol_fraction']:.3f}  " if math.isfinite(row["sol_fraction"]) else ""  # none on a CPU
            log(
                f"{case.name:>10} {display_name(name, config.device):<22} median {row['median_ms']:9.3f} ms  "
                f"{sol}correct {'n/a' if row['correct'] is pd.NA else row['correct']}"
                + (
                    f"  {row['power_w']:.0f} W {row['sm_clock_mhz']:.0f} MHz {row['energy_per_backward_j']:.3f} J"
                    if math.isfinite(row["power_w"])
                    else ""
                )
                + ("  ERROR" if row["note"].startswith("ERROR") else "")
            )
            bar.update()
        del sets, reference
        _cleanup(device)
        frames.append(add_speedups(rows_to_frame(rows)))
        if on_case is not None:
            on_case(frames[-1])
        if case_kernels:
            kernel_frames += case_kernels
            if on_kernels is not None:
                on_kernels(pd.concat(case_kernels, ignore_index=True))
    bar.close()
    metadata["finished_utc"] = environment.utc_now().strftime(environment.UTC_FORMAT)
    kernels = pd.concat(kernel_frames, ignore_index=True) if kernel_frames else None
    return BenchResult(coerce(pd.concat(frames, ignore_index=True)), metadata, kernels)
