"""Device timing: the L2 flush, per-iteration timers, and the device ceilings.

Protocol (SOL-ExecBench's, ``docs/problem.md``): before every iteration a buffer of twice
the L2 size is zeroed; the latency of an iteration is the time between CUDA events recorded on
the current stream right before and right after the call, so it spans all GPU work the call
enqueues on that stream, gaps included. Implementations may use side streams but must join the
current stream before returning (otherwise work escapes the events). No CUDA graphs. On CPU (smoke
mode only) host wall-clock timers replace events and nothing is flushed.
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Callable

import torch

from .stats import Ceilings


class L2Flusher:
    """Zeroes a buffer of ``2 * L2_cache_size`` bytes (read from the device) when called; a
    no-op on CPU."""

    def __init__(self, device: torch.device):
        self.nbytes = 0
        self.buffer = None
        if device.type == "cuda":
            self.nbytes = 2 * torch.cuda.get_device_properties(device).L2_cache_size
            self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer.zero_()


def time_iterations(
    call: Callable,
    make_args: Callable[[], tuple],
    iters: int,
    device: torch.device,
    flush: Callable[[], None] = lambda: None,
    host_ms: list[float] | None = None,
) -> list[float]:
    """Run ``call(*make_args())`` ``iters`` times; return each iteration's latency in ms.
    ``host_ms``, when given, receives each call's host wall time (entering the call to its
    return: the time the host needs to enqueue it), ms.

    ``make_args`` and ``flush`` run before each iteration, outside the timed span. On CUDA the
    span is between events on the current stream (one synchronize at the end, so the host may
    run ahead: only GPU time counts); on CPU it is host wall clock. Outputs are dropped after each
    iteration, so the allocator reuses their memory.
    """
    if device.type != "cuda":
        times = []
        for _ in range(iters):
            args = make_args()
            flush()
            t0 = time.perf_counter()
            out = call(*args)
            times.append((time.perf_counter() - t0) * 1e3)
            if host_ms is not None:
                host_ms.append(times[-1])
            del out, args
        return times
    stream = torch.cuda.current_stream(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        args = make_args()
        flush()
        start.record(stream)
        t0 = time.perf_counter()
        out = call(*args)
        if host_ms is not None:
            host_ms.append((time.perf_counter() - t0) * 1e3)
        end.record(stream)
        del out, args
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def synchronize(device: torch.device) -> None:
    """Wait for the device (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_step_ms(call: Callable[[], object], warmup: int, iters: int, device: torch.device | str) -> float:
    """Median latency in ms of ``call()`` over ``iters`` iterations after ``warmup`` untimed ones,
    the device idle before each: the step timers' protocol (training steps, forwards), where the
    host's time to launch the call counts; no L2 flush. ``time_iterations`` underneath: CUDA
    events on a GPU, host wall clock elsewhere."""
    device = torch.device(device)
    for _ in range(warmup):
        call()
    return statistics.median(time_iterations(call, tuple, iters, device, flush=lambda: synchronize(device)))


def alternating(sets: list[tuple]) -> Callable[[], tuple]:
    """A ``make_args`` that cycles through ``sets``: with two input sets at different addresses,
    consecutive iterations never see the same input address."""
    cycle = itertools.cycle(sets)
    return lambda: next(cycle)


def measure_copy_tbps(device: torch.device, nbytes: int, iters: int, warmup: int = 2) -> float:
    """Device-to-device copy bandwidth in TB/s: ``2 * nbytes`` (read + write) over the median
    time of ``dst.copy_(src)`` on ``nbytes``-byte buffers."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    make = lambda: (dst, src)  # noqa: E731
    copy = lambda d, s: d.copy_(s)  # noqa: E731
    time_iterations(copy, make, warmup, device)
    times = sorted(time_iterations(copy, make, iters, device))
    return 2 * nbytes / (times[len(times) // 2] * 1e-3) / 1e12


def measure_gemm_tflops(device: torch.device, n: int, iters: int, warmup: int = 2, flush=lambda: None) -> float:
    """bf16 GEMM rate in TFLOP/s: ``2 * n**3`` over the median time of ``torch.matmul`` of two
    random n x n bf16 matrices into a preallocated output, L2 flushed before each iteration."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    make = lambda: (a, b)  # noqa: E731
    gemm = lambda a_, b_: torch.matmul(a_, b_, out=c)  # noqa: E731
    time_iterations(gemm, make, warmup, device, flush)
    times = sorted(time_iterations(gemm, make, iters, device, flush))
    return 2 * n**3 / (times[len(times) // 2] * 1e-3) / 1e12


def measure_ceilings(device: torch.device, quick: bool, flush=lambda: None) -> tuple[Ceilings, dict]:
    """Measure the copy bandwidth and GEMM rate; returns the ceilings and a metadata record.

    CUDA: 4 GiB copy buffers (less when free memory is short) and an 8192^3 GEMM; 20 timed
    iterations each (5 in quick mode). CPU: 64 MiB and 512^3, 5 iterations (smoke only).
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        nbytes = min(4 << 30, (free // 4) >> 20 << 20)
        n, iters = 8192, (5 if quick else 20)
    else:
        nbytes, n, iters = 64 << 20, 512, 5
    copy_tbps = measure_copy_tbps(device, nbytes, iters)
    gemm_tflops = measure_gemm_tflops(device, n, iters, flush=flush)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    record = {
        "copy_tbps": copy_tbps,
        "copy_bytes_per_buffer": nbytes,
        "copy_definition": "bytes read + written / median time of dst.copy_(src)",
        "gemm_tflops": gemm_tflops,
        "gemm_shape": [n, n, n],
        "gemm_definition": "2*n^3 / median time of torch.matmul(bf16 randn, bf16 randn, out=c), L2 flushed",
        "iters": iters,
        "timer": "cuda-events" if device.type == "cuda" else "host",
    }
    return Ceilings(copy_tbps=copy_tbps, gemm_tflops=gemm_tflops), record
