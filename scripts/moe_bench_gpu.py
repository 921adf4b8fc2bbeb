"""Time the SwiGLU experts of a mixture-of-experts layer (``swiglu.swiglu_moe``) against its peers
on one GPU, forward, backward and both, at four models' shapes; check every implementation's
output and gradients against float64 first.

    PYTHONPATH=src:lab python3 scripts/moe_bench_gpu.py --out $OUT          # ~6-8 min on an H200
    PYTHONPATH=src:lab python3 scripts/moe_bench_gpu.py --out $OUT --quick  # ~1 min smoke
    PYTHONPATH=src:lab python3 scripts/moe_bench_gpu.py --shapes mixtral-8x7b --tokens 8192 --out $OUT
    TRITON_INTERPRET=1 PYTHONPATH=src:lab python3 scripts/moe_bench_gpu.py --device cpu --shapes tiny \\
        --tokens 32 --out build/moe_bench                                    # the CPU test's run

Shapes (``--shapes``, ``swiglu_lab.research.moe.MOE_SHAPES``: H, I, E, k): qwen3-30b-a3b (2048,
768, 128, 8), qwen3-235b-a22b (4096, 1536, 128, 8), mixtral-8x7b (4096, 14336, 8, 2), deepseek-v3
(its routed experts: 7168, 2048, 256, 8); tokens (``--tokens``) 2048, 8192, 32768; routing
(``--routings``) ``balanced``: softmax of randn logits [T, E] in fp32, top-k, the fp32 weights as
transformers' routers give them, and ``skewed``: the same with a third of the tokens (a random
third) given expert 0 among their k (its logit set just above the row's largest). bf16 x
(randn), gate_up_proj [E, 2I, H] (randn / sqrt(H)), down_proj [E, H, I] (randn / sqrt(I)),
grad_out (randn).

Implementations, in one process, on the same leaf tensors (gradients by ``torch.autograd.grad``,
never accumulated): ``triton``, ours (``swiglu_moe(..., impl="triton")``; ``--ours-impl``, on a CPU
``reference`` unless TRITON_INTERPRET=1); ``grouped_mm``, transformers'
``grouped_mm_experts_forward`` on a stand-in experts module (the attributes it reads, its default
``_apply_gate``); ``liger``, Liger-Kernel's ``LigerFusedMoEFunction`` (same weight layout; int32
expert ids; skipped with the reason when ``liger_kernel`` does not import). Liger's Triton
autotune is off by default (``LIGER_FUSED_MOE_AUTOTUNE=0``, its own switch: one fixed
configuration per kernel): a quick run on the H200 spent 210 s in its first shape's float64 check,
most of it compiling Liger's autotune candidates, which alone would pass the 8-minute budget;
``--liger-autotune`` turns it on (keyed on H and I, it then tunes at each shape's check, at
``--check-tokens`` tokens; give the run more time). An explicit ``LIGER_FUSED_MOE_AUTOTUNE`` in the
environment wins; the metadata records which ran;
``eager``, transformers' loop over experts (the eager forward of ``Qwen3MoeExperts``, unwrapped
from its experts-interface dispatch; ``swiglu.moe.moe_reference``, the same order of operations,
where that class is missing), only at ``--eager-max-tokens`` tokens or fewer and only when one
untimed forward + backward took at most ``--eager-max-ms``. Ours runs the library's Gluon kernels
where its plan chooses them (metadata ``gluon``: "on" or why not; ``SWIGLU_GLUON=0`` measures the tl
kernels alone). ``--lab-moe-gluon pairs,up_gather,dswiglu_gather``: ours with the lab's
warp-specialized Gluon down projection / grad_x, or its up projection and dSwiGLU GEMM gathering
x's / grad_out's rows themselves (``swiglu_lab.experiments.moe_gluon_<name>``, its ``install``;
metadata ``lab_moe_gluon``).

Modes: ``forward`` (the training forward: autograd records the graph), ``backward`` (gradients of
x, top_k_weights, gate_up_proj and down_proj from one forward kept outside the timed region,
``retain_graph=True``), ``forward+backward``. Timing: the dense bench's protocol
(``swiglu_lab.bench.timing.time_iterations``): CUDA events around each call, a buffer of twice the
L2 zeroed before each, ``--warmup`` untimed calls per implementation and mode, ``--reps`` timed
ones split into ``--rounds`` blocks (``first_call_s``: the host time of the first forward +
backward, compilation and autotuning included); the implementations' order rotates by one per case and per
round; median, p20, p80. ``tflops``: 6 (forward), 12 (backward), 18 (both) x T*k*H*I over the
median. ``peak_gib``: ``torch.cuda.max_memory_allocated`` over one forward + backward minus what
was allocated before it (the inputs), gradients included. Power: mean board power and SM clock,
energy per call (L2 flush included) over each implementation's timed blocks, through NVML when
``pynvml`` imports (``swiglu_lab.bench.power``; windows are not stretched, so energy is coarse at
short ones: ``energy_window_s``).

Correctness, per shape before its timings: at ``--check-tokens`` tokens (balanced routing), every
implementation's out and four gradients against ``swiglu.moe.moe_float64``: relative error
(Frobenius) and its ratio to transformers' eager bf16 loop's error. Where the float64 weights and
their gradients would pass ``--check-gib``, the check keeps the first E' experts that fit
(``check_experts``; DeepSeek-V3's 256 need ~170 GiB).

A (shape, tokens) that runs out of memory is recorded (``oom`` True, per implementation or for
the case) and the run goes on; a case that would start after ``--time-budget-s`` is recorded as
skipped. The files are rewritten after every shape's check and every case (``complete`` false in
the metadata until the end), so a run that is stopped keeps what it measured. Writes ``moe_bench.csv`` (one row per case x implementation x mode), ``moe_check.csv``
(one row per shape x implementation x output) and ``moe_bench.json`` (run id, GPU, driver, NVML
clocks and power limit before and after, versions, git commit from SWIGLU_GIT_COMMIT when set,
arguments, what was skipped and why, this protocol) under ``--out``; prints a table last.
``--fake-oom-tokens N`` (tests only) raises torch's out-of-memory error for more than N tokens.
"""

from __future__ import annotations

import argparse
import importlib
import csv
import gc
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

from swiglu.kernels.devices import gluon_unavailable_reason
from swiglu.moe import moe_float64, moe_reference, swiglu_moe
from swiglu_lab.bench import power
from swiglu_lab.bench.environment import (
    UTC_FORMAT,
    dist_version,
    git_info,
    gpu_info,
    make_run_id,
    nvml_info,
    software_info,
    utc_now,
)
from swiglu_lab.bench.stats import time_stats
from swiglu_lab.bench.timing import L2Flusher, synchronize, time_iterations
from swiglu_lab.research import moe as moe_research

REPO = Path(__file__).resolve().parents[1]

IMPLS = ("triton", "grouped_mm", "liger", "eager")
MODES = moe_research.MODES
ROUTINGS = ("balanced", "skewed")
OUTPUTS = ("out", "grad_x", "grad_top_k_weights", "grad_gate_up_proj", "grad_down_proj")
ERR_COLUMNS = [f"err_{o}" for o in OUTPUTS]
FIELDS = [
    "shape",
    "H",
    "I",
    "E",
    "k",
    "tokens",
    "routing",
    "impl",
    "mode",
    "status",
    "ms",
    "p20_ms",
    "p80_ms",
    "min_ms",
    "reps",
    "tflops",
    "peak_gib",
    "first_call_s",
    "oom",
    "max_expert_pairs",
    *ERR_COLUMNS,
    "max_ratio_vs_eager",
    "power_w",
    "sm_clock_mhz",
    "energy_j",
    "energy_window_s",
    "device",
    "error",
]
CHECK_FIELDS = [
    "shape",
    "H",
    "I",
    "E",
    "k",
    "check_experts",
    "check_tokens",
    "routing",
    "impl",
    "output",
    "status",
    "rel_err",
    "eager_rel_err",
    "ratio_vs_eager",
    "error",
]
QUICK = dict(
    shapes="qwen3-30b-a3b,mixtral-8x7b", tokens="2048,8192", routings="balanced", warmup=1, reps=4, rounds=1, check_tokens=128
)


# ------------------------------------------------------------------------------ implementations
class StandInExperts(torch.nn.Module):
    """What transformers' experts functions read of an experts module (``use_experts_implementation``
    sets these flags; 5.17 reads no ``has_post_expert_norm`` and 5.25 does: both are here)."""

    def __init__(self, gate_up_proj: torch.Tensor, down_proj: torch.Tensor):
        super().__init__()
        self.gate_up_proj, self.down_proj = gate_up_proj, down_proj  # plain tensors: the caller's leaves
        self.num_experts = gate_up_proj.shape[0]
        self.hidden_dim, self.intermediate_dim = gate_up_proj.shape[2], gate_up_proj.shape[1] // 2
        self.has_gate, self.has_bias, self.is_transposed, self.is_concatenated = True, False, False, True
        self._is_expert_parallel, self.has_post_expert_norm = False, False
        self.act_fn = torch.nn.SiLU()

    def _apply_gate(self, gate_up_out: torch.Tensor) -> torch.Tensor:
        try:
            from transformers.integrations.moe import _default_apply_gate
        except ImportError:  # the same formula
            gate, up = gate_up_out.chunk(2, dim=-1)
            return self.act_fn(gate) * up
        return _default_apply_gate(self, gate_up_out)


def eager_forward():
    """transformers' eager experts loop (Qwen3MoeExperts' own forward, unwrapped from the
    experts-interface dispatch) and where it came from; ``moe_reference`` when that is missing."""
    try:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

        fn = getattr(Qwen3MoeExperts.forward, "__wrapped__", None)
        if fn is not None:
            return fn, "transformers Qwen3MoeExperts.forward (eager loop)"
    except ImportError:
        pass
    return None, "swiglu.moe.moe_reference (transformers' eager loop, its order of operations)"


def build_impls(names: list[str], ours_impl: str, skipped: dict, liger_autotune: bool = False) -> dict:
    """``name -> fn(x, idx, w, gate_up_proj, down_proj)`` for the implementations that can run;
    those that cannot are put in ``skipped`` with the reason."""
    out = {}
    for name in names:
        if name == "triton":
            out[name] = lambda x, i, w, gu, dp: swiglu_moe(x, i, w, gu, dp, impl=ours_impl)
        elif name == "grouped_mm":
            try:
                from transformers.integrations.moe import grouped_mm_experts_forward
            except ImportError as exc:
                skipped[name] = f"transformers.integrations.moe not importable ({exc})"
                continue
            out[name] = lambda x, i, w, gu, dp, f=grouped_mm_experts_forward: f(StandInExperts(gu, dp), x, i, w)
        elif name == "liger":
            if not liger_autotune:  # read when liger_kernel's kernels module is imported
                os.environ.setdefault("LIGER_FUSED_MOE_AUTOTUNE", "0")
            try:
                from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
            except Exception as exc:  # noqa: BLE001 - not installed, or no GPU Triton backend
                skipped[name] = f"liger_kernel.ops.fused_moe not importable ({type(exc).__name__}: {exc})"
                continue
            # int32 ids (its routing kernels' dtype): converted inside the call, a [T, k] copy.
            out[name] = lambda x, i, w, gu, dp, f=LigerFusedMoEFunction: f.apply(x, gu, dp, i.to(torch.int32), w)
        elif name == "eager":
            fn, _ = eager_forward()
            if fn is None:
                out[name] = lambda x, i, w, gu, dp: moe_reference(x, i, w, gu, dp)
            else:
                out[name] = lambda x, i, w, gu, dp, f=fn: f(StandInExperts(gu, dp), x, i, w)
        else:
            raise ValueError(f"unknown implementation {name!r}; have {', '.join(IMPLS)}")
    return out


# ------------------------------------------------------------------------------ inputs
def routing(tokens: int, experts: int, k: int, kind: str, device, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """(top_k_index int64 [T, k], top_k_weights fp32 [T, k]) of softmax(randn logits), top-k;
    ``skewed``: a random third of the tokens get expert 0 among their k."""
    logits = torch.randn(tokens, experts, device=device, generator=gen)
    if kind == "skewed":
        rows = torch.randperm(tokens, device=device, generator=gen)[: tokens // 3]
        logits[rows, 0] = logits[rows].max(dim=-1).values + 1.0
    elif kind != "balanced":
        raise ValueError(f"routing must be one of {ROUTINGS}, got {kind!r}")
    weights, index = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    return index, weights


def make_inputs(tokens: int, shape, experts: int, kind: str, device, seed: int) -> dict:
    """Leaf tensors x, top_k_weights, gate_up_proj, down_proj (requires_grad), top_k_index and
    grad_out, for ``experts`` of the shape's experts."""
    gen = torch.Generator(device=device).manual_seed(seed)
    H, I, k = shape.hidden_size, shape.intermediate_size, shape.top_k
    bf16 = dict(device=device, dtype=torch.bfloat16, generator=gen)
    index, weights = routing(tokens, experts, k, kind, device, gen)
    x = torch.randn(tokens, H, **bf16)
    gate_up = torch.randn(experts, 2 * I, H, **bf16).mul_(H**-0.5)
    down = torch.randn(experts, H, I, **bf16).mul_(I**-0.5)
    grad_out = torch.randn(tokens, H, **bf16)
    return dict(
        x=x.requires_grad_(),
        idx=index,
        w=weights.requires_grad_(),
        gu=gate_up.requires_grad_(),
        dp=down.requires_grad_(),
        go=grad_out,
    )


def leaves(inp: dict) -> tuple:
    return inp["x"], inp["w"], inp["gu"], inp["dp"]


def call(fn, inp: dict) -> torch.Tensor:
    return fn(inp["x"], inp["idx"], inp["w"], inp["gu"], inp["dp"])


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_experts(shape, budget_gib: float) -> int:
    """Experts the float64 check keeps: all when their float64 weights and gradients (16 bytes per
    element) fit ``budget_gib``, else the most that do (at least one)."""
    per_expert = 3 * shape.hidden_size * shape.intermediate_size * 16
    return max(1, min(shape.num_experts, int(budget_gib * 2**30 // per_expert)))


# ------------------------------------------------------------------------------ the check
def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    denom = torch.linalg.vector_norm(ref).item()
    diff = torch.linalg.vector_norm(got.double() - ref).item()
    return diff / denom if denom > 0 else (0.0 if diff == 0 else math.inf)


def spot_check(shape, impls: dict, args, device) -> list[dict]:
    """Every implementation's out and gradients against float64 at ``--check-tokens`` tokens
    (balanced routing), ratio to the eager loop's error (the eager loop always runs here)."""
    experts = check_experts(shape, args.check_gib)
    tokens = args.check_tokens
    base = dict(
        shape=shape.name,
        H=shape.hidden_size,
        I=shape.intermediate_size,
        E=shape.num_experts,
        k=shape.top_k,
        check_experts=experts,
        check_tokens=tokens,
        routing="balanced",
    )
    rows = []
    try:
        inp = make_inputs(tokens, shape, experts, "balanced", device, seed=args.seed + 1)
        oracle = moe_float64(inp["x"], inp["idx"], inp["w"], inp["gu"], inp["dp"], inp["go"])
        results = {}
        runners = dict(impls)
        runners.setdefault("eager", build_impls(["eager"], "reference", {})["eager"])
        for name in ["eager", *[n for n in runners if n != "eager"]]:
            try:
                out = call(runners[name], inp)
                grads = torch.autograd.grad(out, leaves(inp), inp["go"])
                results[name] = [relative_error(t, r) for t, r in zip((out, *grads), oracle)]
                del out, grads
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                results[name] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            synchronize(device)
        del oracle, inp
        eager = results.get("eager")
        for name, res in results.items():
            if name not in impls and name != "eager":
                continue
            for j, output in enumerate(OUTPUTS):
                if isinstance(res, str):
                    rows.append(dict(base, impl=name, output=output, status="error", error=res))
                    continue
                ref = eager[j] if isinstance(eager, list) else math.nan
                rows.append(
                    dict(
                        base,
                        impl=name,
                        output=output,
                        status="ok",
                        rel_err=res[j],
                        eager_rel_err=ref,
                        ratio_vs_eager=res[j] / ref if ref and ref > 0 else math.nan,
                        error="",
                    )
                )
    except torch.cuda.OutOfMemoryError as exc:
        for name in impls:
            rows.append(dict(base, impl=name, output="all", status="oom", error=str(exc).splitlines()[0][:200]))
    release(device)
    return rows


# ------------------------------------------------------------------------------ timing
class Timed:
    """One implementation's timings in one case: per mode the times of every block, power blocks."""

    def __init__(self):
        self.times = {m: [] for m in MODES}
        self.power: list[dict] = []


def combine_power(blocks: list[dict]) -> dict:
    """Power columns over several windows: sample-weighted means, energy per call over all calls."""
    empty = dict(power_w=math.nan, sm_clock_mhz=math.nan, energy_j=math.nan, energy_window_s=math.nan)
    blocks = [b for b in blocks if b.get("energy_iters")]
    if not blocks:
        return empty
    n = sum(b["power_samples"] for b in blocks)

    def mean(key):
        vals = [(b[key], b["power_samples"]) for b in blocks if b["power_samples"] and math.isfinite(b[key])]
        return sum(v * w for v, w in vals) / sum(w for _, w in vals) if vals else math.nan

    calls = sum(b["energy_iters"] for b in blocks)
    return dict(
        power_w=mean("power_w") if n else math.nan,
        sm_clock_mhz=mean("sm_clock_mhz") if n else math.nan,
        energy_j=sum(b["energy_j"] * b["energy_iters"] for b in blocks) / calls,
        energy_window_s=sum(b["energy_window_s"] for b in blocks),
    )


def time_mode(fn, inp: dict, mode: str, iters: int, device, flush, monitor) -> tuple[list[float], dict | None]:
    """``iters`` timed calls of ``mode`` (module docstring); the power columns of their window."""
    xs = leaves(inp)
    if mode == "forward":
        run, make = (lambda: call(fn, inp)), tuple
    elif mode == "backward":
        out = call(fn, inp)
        run, make = (lambda: torch.autograd.grad(out, xs, inp["go"], retain_graph=True)), tuple
    else:
        run, make = (lambda: torch.autograd.grad(call(fn, inp), xs, inp["go"])), tuple
    synchronize(device)
    window = monitor.open_window() if monitor else None
    try:
        times = time_iterations(run, make, iters, device, flush)
    except BaseException:
        if monitor:
            monitor.cancel()
        raise
    synchronize(device)
    columns = monitor.close_window(window, iters) if monitor else None
    return times, columns


def peak_gib(fn, inp: dict, device) -> float:
    """Peak allocated GiB of one forward + backward above what was allocated before it."""
    if device.type != "cuda":
        return math.nan
    synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    grads = torch.autograd.grad(call(fn, inp), leaves(inp), inp["go"])
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del grads
    return peak / 2**30


def blocks(total: int, rounds: int) -> list[int]:
    rounds = max(1, min(rounds, total))
    return [total // rounds + (1 if r < total % rounds else 0) for r in range(rounds)]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_case(
    shape, tokens: int, kind: str, impls: dict, args, device, flush, monitor, case_index: int, eager_ok: dict
) -> list[dict]:
    """Every implementation and mode in one case; one row each."""
    base = dict(
        shape=shape.name,
        H=shape.hidden_size,
        I=shape.intermediate_size,
        E=shape.num_experts,
        k=shape.top_k,
        tokens=tokens,
        routing=kind,
        device=args.device_name,
    )
    rows = []

    def mark(names, status, error="", oom=False):
        for name in names:
            for mode in MODES:
                rows.append(dict(base, impl=name, mode=mode, status=status, oom=oom, error=error))

    if args.fake_oom_tokens and tokens > args.fake_oom_tokens:
        mark(impls, "oom", f"fake: {tokens} > {args.fake_oom_tokens}", oom=True)
        return rows
    try:
        inp = make_inputs(tokens, shape, shape.num_experts, kind, device, seed=args.seed)
    except torch.cuda.OutOfMemoryError as exc:
        release(device)
        mark(impls, "oom", first_line(exc), oom=True)
        return rows
    max_pairs = int(torch.bincount(inp["idx"].flatten(), minlength=shape.num_experts).max())
    base["max_expert_pairs"] = max_pairs
    live, timed, peaks, failed, first = {}, {}, {}, {}, {}
    names = list(impls)
    for name in names:
        if name == "eager":
            if tokens > args.eager_max_tokens:
                failed[name] = ("skipped", f"eager runs at {args.eager_max_tokens} tokens or fewer", False)
                continue
            if eager_ok.get((shape.name, kind)) is False:
                failed[name] = ("skipped", "eager was over --eager-max-ms at fewer tokens", False)
                continue
        try:
            start = time.perf_counter()
            torch.autograd.grad(call(impls[name], inp), leaves(inp), inp["go"])  # first call: compiles, autotunes
            synchronize(device)
            first[name] = time.perf_counter() - start
            if name == "eager":
                took = (time.perf_counter() - start) * 1e3
                torch.autograd.grad(call(impls[name], inp), leaves(inp), inp["go"])  # the compiled one
                synchronize(device)
                took = min(took, (time.perf_counter() - start) * 1e3 - took)
                if took > args.eager_max_ms:
                    eager_ok[(shape.name, kind)] = False
                    failed[name] = (
                        "skipped",
                        f"one forward + backward took {took:.0f} ms > --eager-max-ms {args.eager_max_ms:.0f}",
                        False,
                    )
                    continue
            for mode in MODES:
                for _ in range(args.warmup):
                    time_mode(impls[name], inp, mode, 1, device, flush, None)
            peaks[name] = peak_gib(impls[name], inp, device)
            live[name], timed[name] = impls[name], Timed()
        except torch.cuda.OutOfMemoryError as exc:
            failed[name] = ("oom", first_line(exc), True)
        except Exception as exc:  # noqa: BLE001 - a peer that fails is recorded, the run goes on
            traceback.print_exc()
            failed[name] = ("error", first_line(exc), False)
        release(device)
    order = [n for n in names if n in live]
    for r, iters in enumerate(blocks(args.reps, args.rounds)):
        shift = (case_index + r) % max(1, len(order))
        for name in order[shift:] + order[:shift]:
            if name in failed:
                continue
            try:
                for mode in MODES:
                    times, columns = time_mode(live[name], inp, mode, iters, device, flush, monitor)
                    timed[name].times[mode] += times
                    if columns:
                        timed[name].power.append(dict(columns, mode=mode))
            except torch.cuda.OutOfMemoryError as exc:
                failed[name] = ("oom", first_line(exc), True)
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                failed[name] = ("error", first_line(exc), False)
            release(device)
    S = tokens * shape.top_k
    for name in names:
        if name in failed:
            status, error, oom = failed[name]
            for mode in MODES:
                rows.append(dict(base, impl=name, mode=mode, status=status, oom=oom, error=error))
            continue
        for mode in MODES:
            stats = time_stats(timed[name].times[mode])
            flop = {"forward": 6, "backward": 12, "forward+backward": 18}[mode] * S * shape.hidden_size * shape.intermediate_size
            pw = combine_power([b for b in timed[name].power if b["mode"] == mode])
            rows.append(
                dict(
                    base,
                    impl=name,
                    mode=mode,
                    status="ok",
                    ms=stats["median_ms"],
                    p20_ms=stats["p20_ms"],
                    p80_ms=stats["p80_ms"],
                    min_ms=stats["min_ms"],
                    reps=len(timed[name].times[mode]),
                    tflops=flop / (stats["median_ms"] * 1e-3) / 1e12,
                    peak_gib=peaks[name],
                    first_call_s=first.get(name, math.nan),
                    oom=False,
                    error="",
                    **pw,
                )
            )
    del inp
    release(device)
    return rows


# ------------------------------------------------------------------------------ output
def write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="", extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})


def attach_errors(rows: list[dict], checks: list[dict]) -> None:
    """Copy each shape x implementation's check errors onto its timing rows (``err_*`` columns)."""
    by = {}
    for c in checks:
        if c["status"] == "ok":
            by.setdefault((c["shape"], c["impl"]), {})[f"err_{c['output']}"] = c["rel_err"]
            key = (c["shape"], c["impl"])
            ratio = c.get("ratio_vs_eager", math.nan)
            prev = by[key].get("max_ratio_vs_eager", -math.inf)
            by[key]["max_ratio_vs_eager"] = max(prev, ratio) if math.isfinite(ratio) else prev
    for row in rows:
        found = by.get((row["shape"], row["impl"]), {})
        row.update({k: v for k, v in found.items() if not (k == "max_ratio_vs_eager" and v == -math.inf)})


def write_outputs(out: Path, rows: list[dict], checks: list[dict], meta: dict) -> None:
    """The CSVs (error columns attached to copies of the rows) and the metadata, rewritten whole."""
    rows = [dict(r) for r in rows]
    attach_errors(rows, checks)
    write_csv(out / moe_research.BENCH_CSV, FIELDS, rows)
    write_csv(out / moe_research.CHECK_CSV, CHECK_FIELDS, checks)
    (out / moe_research.META_JSON).write_text(json.dumps(meta, indent=2, default=str) + "\n")


def print_table(rows: list[dict], checks: list[dict]) -> None:
    print("\n| shape | T | routing | impl | fwd ms | bwd ms | fwd+bwd ms | fwd+bwd TFLOP/s | peak GiB | max err ratio |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    table: dict = {}
    for r in rows:
        table.setdefault((r["shape"], r["tokens"], r["routing"], r["impl"]), {})[r["mode"]] = r
    for (shape, tokens, kind, impl), modes in table.items():
        both = modes.get("forward+backward", {})
        if both.get("status") != "ok":
            print(
                f"| {shape} | {tokens} | {kind} | {impl} | {both.get('status', '?')}: "
                f"{str(both.get('error', ''))[:60].replace('|', '/')} | | | | | |"
            )
            continue
        ms = lambda m: f"{modes[m]['ms']:.3f}" if modes.get(m, {}).get("status") == "ok" else "-"  # noqa: E731
        ratio = both.get("max_ratio_vs_eager", math.nan)
        peak = both.get("peak_gib", math.nan)
        print(
            f"| {shape} | {tokens} | {kind} | {impl} | {ms('forward')} | {ms('backward')} | {ms('forward+backward')} "
            f"| {both['tflops']:.0f} | {peak:.2f} | {ratio:.2f} |"
        )
    bad = [c for c in checks if c["status"] != "ok" or (c.get("ratio_vs_eager", 0) or 0) > 2]
    if bad:
        print("\nCHECK: out or gradients more than 2x the eager loop's error against float64, or failed:")
        for c in bad:
            print(f"  {c['shape']} {c['impl']} {c['output']}: {c['status']} ratio {c.get('ratio_vs_eager')} {c.get('error', '')}")


def parse_list(text: str, known: tuple | dict | None, what: str, parser) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in items if known is not None and s not in known]
    if unknown or not items:
        parser.error(f"--{what}: unknown {unknown or text!r}; choose from {', '.join(known)}")
    return items


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "build/moe_bench")
    parser.add_argument(
        "--shapes",
        default=",".join(moe_research.DEFAULT_SHAPES),
        help=f"comma-separated, of: {', '.join(moe_research.MOE_SHAPES)}",
    )
    parser.add_argument("--tokens", default=",".join(map(str, moe_research.DEFAULT_TOKENS)))
    parser.add_argument("--routings", default=",".join(ROUTINGS))
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated, of: {', '.join(IMPLS)}")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per implementation and mode")
    parser.add_argument("--reps", type=int, default=10, help="timed calls per implementation and mode")
    parser.add_argument("--rounds", type=int, default=2, help="blocks the timed calls are split into (order rotated)")
    parser.add_argument("--check-tokens", type=int, default=512)
    parser.add_argument("--check-gib", type=float, default=40.0, help="float64 weights + gradients of the check, at most")
    parser.add_argument("--eager-max-tokens", type=int, default=2048)
    parser.add_argument("--eager-max-ms", type=float, default=300.0)
    parser.add_argument(
        "--ours-impl", default="", help="impl= of swiglu_moe (default: triton; reference on a CPU without TRITON_INTERPRET=1)"
    )
    parser.add_argument("--time-budget-s", type=float, default=470.0, help="no case starts after this")
    parser.add_argument("--quick", action="store_true", help="~1 minute: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument(
        "--liger-autotune",
        action="store_true",
        help="let Liger's fused MoE autotune (minutes of compilation per run; default off)",
    )
    parser.add_argument(
        "--lab-moe-gluon",
        default="",
        help="comma-separated, of: pairs (the down projection and grad_x), up_gather (the up projection "
        "without x's copy), dswiglu_gather (dSwiGLU without grad_out's): ours with the lab's "
        "warp-specialized Gluon kernel for those GEMMs (swiglu_lab.experiments.moe_gluon_<name>.install())",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-power", action="store_true", help="no NVML power/clock sampling")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--fake-oom-tokens", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        defaults = {a.dest: a.default for a in parser._actions}
        for key, value in QUICK.items():
            if getattr(args, key) == defaults[key]:  # an option given on the command line wins
                setattr(args, key, value)
    shapes = [moe_research.shape_of(s) for s in parse_list(args.shapes, moe_research.MOE_SHAPES, "shapes", parser)]
    tokens = [int(t) for t in parse_list(args.tokens, None, "tokens", parser)]
    routings = parse_list(args.routings, ROUTINGS, "routings", parser)
    names = parse_list(args.impls, IMPLS, "impls", parser)
    lab_gluon = (
        parse_list(args.lab_moe_gluon, ("pairs", "up_gather", "dswiglu_gather"), "lab-moe-gluon", parser)
        if args.lab_moe_gluon
        else []
    )
    if min(args.reps, args.rounds, args.check_tokens) < 1 or args.warmup < 0:
        parser.error("--reps, --rounds and --check-tokens must be >= 1, --warmup >= 0")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("moe_bench_gpu.py: no CUDA GPU (use --device cpu with --shapes tiny for a smoke run)")
    if not args.ours_impl:
        interpreted = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
        args.ours_impl = "triton" if device.type == "cuda" or interpreted else "reference"
    args.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    started = utc_now()
    deadline = time.monotonic() + args.time_budget_s
    nvml_before = nvml_info(device) if device.type == "cuda" else {}
    skipped: dict = {}
    for name in lab_gluon:
        importlib.import_module(f"swiglu_lab.experiments.moe_gluon_{name}").install()
    impls = build_impls(names, args.ours_impl, skipped, args.liger_autotune)
    for name, why in skipped.items():
        print(f"{name} skipped: {why}", file=sys.stderr, flush=True)
    flush = L2Flusher(device)
    monitor, monitor_line = (None, "--no-power") if args.no_power else power.open_monitor(device)
    git = git_info(REPO)
    meta = dict(
        script="scripts/moe_bench_gpu.py",
        run_id=make_run_id(started, git["commit"]),
        date_utc=started.strftime(UTC_FORMAT),
        complete=False,
        seconds=None,
        git_commit=git["commit"],
        git_dirty=git["dirty"],
        gpu=gpu_info(device),
        nvml_before=nvml_before,
        nvml_after=None,
        software=software_info(),
        transformers=dist_version("transformers"),
        liger_kernel=dist_version("liger-kernel", "liger_kernel"),
        liger_autotune=os.environ.get("LIGER_FUSED_MOE_AUTOTUNE", "1 (liger's default)") if "liger" in impls else None,
        lab_moe_gluon=lab_gluon,
        gluon=(gluon_unavailable_reason(device) or "on") if args.ours_impl == "triton" else None,
        python=platform.python_version(),
        ours_impl=args.ours_impl,
        eager_source=eager_forward()[1],
        power=monitor.describe() if monitor else None,
        power_backend=monitor_line,
        shapes={s.name: dict(H=s.hidden_size, I=s.intermediate_size, E=s.num_experts, k=s.top_k) for s in shapes},
        args=dict(vars(args)),
        skipped=skipped,
        protocol=__doc__,
    )
    rows, checks, eager_ok = [], [], {}

    def not_run(shape, t, kind, names, why):
        for name in names:
            for mode in MODES:
                rows.append(
                    dict(
                        shape=shape.name,
                        H=shape.hidden_size,
                        I=shape.intermediate_size,
                        E=shape.num_experts,
                        k=shape.top_k,
                        tokens=t,
                        routing=kind,
                        impl=name,
                        mode=mode,
                        status="skipped",
                        oom=False,
                        device=args.device_name,
                        error=why,
                    )
                )

    case_index = 0
    try:
        for shape in shapes:
            if time.monotonic() > deadline:
                print(f"--- {shape.name}: check skipped (time budget)", file=sys.stderr, flush=True)
            else:
                t0 = time.perf_counter()
                checks += spot_check(shape, impls, args, device)
                print(f"--- {shape.name}: float64 check {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
                write_outputs(out, rows, checks, meta)
            for t in tokens:
                for kind in routings:
                    case_index += 1
                    if time.monotonic() > deadline:
                        not_run(shape, t, kind, [*impls, *skipped], f"time budget ({args.time_budget_s:.0f} s) spent")
                        continue
                    t0 = time.perf_counter()
                    case = run_case(shape, t, kind, impls, args, device, flush, monitor, case_index, eager_ok)
                    rows += case
                    for name, why in skipped.items():
                        not_run(shape, t, kind, [name], why)
                    firsts = ", ".join(
                        f"{r['impl']} {r['first_call_s']:.1f}"
                        for r in case
                        if r["mode"] == "forward" and r.get("first_call_s", math.nan) > 1
                    )
                    print(
                        f"--- {shape.name} T={t} {kind}: {time.perf_counter() - t0:.1f} s"
                        + (f" (first calls, s: {firsts})" if firsts else ""),
                        file=sys.stderr,
                        flush=True,
                    )
                    write_outputs(out, rows, checks, meta)
    finally:
        if monitor:
            monitor.close()
        meta.update(
            complete=True,
            seconds=round((utc_now() - started).total_seconds(), 1),
            nvml_after=nvml_info(device) if device.type == "cuda" else {},
        )
        write_outputs(out, rows, checks, meta)
    attach_errors(rows, checks)
    print(
        f"\nCSV: {out / moe_research.BENCH_CSV}, checks: {out / moe_research.CHECK_CSV}, metadata: {out / moe_research.META_JSON}"
    )
    print(
        f"{args.device_name}, torch {torch.__version__}, transformers {meta['transformers']}, liger "
        f"{meta['liger_kernel']} (autotune {meta['liger_autotune']}), commit {meta['git_commit']}, "
        f"ours impl={args.ours_impl}, {meta['seconds']:.0f} s"
    )
    print_table(rows, checks)
    return 0 if any(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
