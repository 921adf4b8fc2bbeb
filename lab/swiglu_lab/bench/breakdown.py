"""Where one backward's time goes: the kernels each implementation launches, from ``torch.profiler``.

Protocol (apart from the timed iterations, which it never disturbs), per implementation and case:
on a GPU, ``iters`` calls of the timed loop itself (``timing.time_iterations``: L2 flush, call;
the host runs ahead; the arguments made before the profile, so no preparation kernel lands between
calls), the device timeline split at the flush kernels (``FLUSH_KERNEL``);
on a CPU, each call inside a ``record_function`` range, its top-level ops. Per call: the kernels
in start order, their busy time (the union of their intervals), the lead (the end of the flush,
or the range's start, to the first kernel: the GPU idle before the call's work), the gaps (idle
time between the call's first kernel and its last one) and the span (lead + first kernel to last
end). ``timed_ms`` is that row's median from the timed loop, unprofiled; where it exceeds busy +
lead + gaps the kernels ran longer unprofiled than profiled, which is not idle time. Rows: one
per kernel position, medians over the calls; ``bench/kernels/<run_id>.csv``. Runs recorded before
this protocol have no ``gaps_ms`` and their lead is the host's, from synchronized calls.
"""

from __future__ import annotations

import statistics
from typing import Callable

import pandas as pd
import torch

from . import timeline
from .timing import time_iterations

#: The range name around each profiled call.
MARK = "swiglu_bench::call"
COLUMNS = (
    "run_id",
    "case",
    "tokens",
    "impl",
    "position",
    "kernel",
    "role",
    "ms",
    "seen",
    "busy_ms",
    "lead_ms",
    "gaps_ms",
    "span_ms",
    "profiled_calls",
    "timed_ms",
)
#: The L2 flush's kernel (``timing.L2Flusher`` zeroes a uint8 buffer): where one call ends on
#: the device timeline and the next begins.
FLUSH_KERNEL = "FillFunctor<unsigned char>"

#: Name fragment -> role, first match wins (lower-case): our kernels by name, quack's and the
#: libraries' GEMMs as "GEMM (library)".
ROLES = (
    (("dswiglu", "dgated"), "dSwiGLU GEMM"),
    (("grad_x",), "grad_x GEMM"),
    (("grad_weight", "wgrad"), "weight-gradient GEMM"),
    (("gemm", "xmma", "cutlass", "cublas", "matmul", "aten::mm", "aten::addmm", "sm90_"), "GEMM (library)"),
)


def kernel_role(name: str) -> str:
    """The role a kernel (or op) name plays in the backward (``ROLES``), else "elementwise / other"."""
    lowered = name.lower()
    for fragments, role in ROLES:
        if any(f in lowered for f in fragments):
            return role
    return "elementwise / other"


def call_kernels(prof) -> tuple[list[list[tuple[str, float, float]]], list[float]]:
    """Per ``MARK`` range of a finished CPU ``torch.profiler.profile`` (in time order): its start
    (us) and the ``(name, start_us, end_us)`` of the ops directly under it, in start order.
    Returns (per-range op lists, range starts)."""
    marks = sorted((e for e in prof.events() if e.name == MARK and e.device_type.name == "CPU"), key=lambda e: e.time_range.start)
    calls = [[(c.name, float(c.time_range.start), float(c.time_range.end)) for c in m.cpu_children] for m in marks]
    return [sorted(c, key=lambda k: k[1]) for c in calls], [float(m.time_range.start) for m in marks]


def split_at_flushes(kernels: list[tuple[str, float, float]]) -> tuple[list[list[tuple[str, float, float]]], list[float]]:
    """Device kernels ``(name, start_us, end_us)`` of a profiled loop -> per flush (``FLUSH_KERNEL``,
    in time order) the kernels that start after it and before the next one, and the flush's end
    (us). Kernels before the first flush are dropped."""
    calls, ends = [], []
    for name, start, end in sorted(kernels, key=lambda k: k[1]):
        if FLUSH_KERNEL in name:
            calls.append([])
            ends.append(end)
        elif calls:
            calls[-1].append((name, start, end))
    return calls, ends


def device_kernels(prof) -> list[tuple[str, float, float]]:
    """The device kernels of a finished profile, less the ranges of ``record_function``
    annotations (ours and any library's), which the profiler also puts on the device's timeline."""
    return [
        (e.name, float(e.time_range.start), float(e.time_range.end))
        for e in prof.events()
        if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False)
    ]


def _busy_us(kernels: list[tuple[str, float, float]]) -> float:
    return timeline.length(timeline.union([(start, end) for _, start, end in kernels]))


def summarize(calls: list[list[tuple[str, float, float]]], starts: list[float]) -> list[dict]:
    """Rows (``COLUMNS`` from ``position`` on) from per-call kernel lists and each call's start
    (``split_at_flushes`` or ``call_kernels``): per kernel position the name seen most often
    there, its median duration over the calls that launched it (ms) and in how many calls it was
    seen; per call busy, lead, gaps and span medians (ms, repeated per row)."""
    calls_with = [(c, s) for c, s in zip(calls, starts) if c]
    if not calls_with:
        return []
    busy = statistics.median(_busy_us(c) for c, _ in calls_with) / 1e3
    lead = statistics.median(c[0][1] - s for c, s in calls_with) / 1e3
    span = statistics.median(max(k[2] for k in c) - s for c, s in calls_with) / 1e3
    gaps = statistics.median(max(k[2] for k in c) - c[0][1] - _busy_us(c) for c, _ in calls_with) / 1e3
    rows = []
    for position in range(max(len(c) for c, _ in calls_with)):
        names = [c[position][0] for c, _ in calls_with if len(c) > position]
        name = statistics.mode(names)
        durations = [
            (c[position][2] - c[position][1]) / 1e3 for c, _ in calls_with if len(c) > position and c[position][0] == name
        ]
        rows.append(
            dict(
                position=position,
                kernel=name,
                role=kernel_role(name),
                ms=statistics.median(durations),
                seen=len(durations),
                busy_ms=busy,
                lead_ms=lead,
                gaps_ms=gaps,
                span_ms=span,
                profiled_calls=len(calls_with),
            )
        )
    return rows


def profile_calls(
    fn: Callable, make_args: Callable[[], tuple], iters: int, device: torch.device, flush: Callable[[], None] = lambda: None
) -> list[dict]:
    """Profile ``iters`` calls of ``fn(*make_args())`` as the module docstring says; returns
    ``summarize``'s rows. On a GPU ``flush`` must launch the ``FLUSH_KERNEL`` (``timing.L2Flusher``):
    ValueError when the profile does not hold one per call."""
    from torch.profiler import ProfilerActivity, profile, record_function

    if device.type == "cuda":
        # The arguments made before the profile: an implementation's per-call preparation
        # (Liger's clones) runs between the calls, outside the timed span, and would land in the
        # previous call's slice of the timeline.
        prepared = iter([make_args() for _ in range(iters)])
        torch.cuda.synchronize(device)  # nothing queued before the profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            time_iterations(fn, lambda: next(prepared), iters, device, flush)  # the timed loop itself
        calls, ends = split_at_flushes(device_kernels(prof))
        if len(calls) != iters:
            raise ValueError(
                f"the profile holds {len(calls)} L2 flushes ({FLUSH_KERNEL!r} kernels) for {iters} calls: "
                "profile_calls needs timing.L2Flusher as flush and no such kernel in the calls"
            )
        return summarize(calls, ends)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            args = make_args()
            flush()
            with record_function(MARK):
                out = fn(*args)
            del out, args
    return summarize(*call_kernels(prof))


def frame(rows: list[dict], **fields) -> pd.DataFrame:
    """``rows`` as a DataFrame in ``COLUMNS`` order, ``fields`` (run_id, case, tokens, impl,
    timed_ms) set on each."""
    return pd.DataFrame([{**fields, **r} for r in rows], columns=list(COLUMNS))


def first_case_per_tokens(kernels: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first case of each token count (cases of equal tokens do the same work)."""
    return kernels.merge(kernels.drop_duplicates(["tokens"])[["tokens", "case"]], on=["tokens", "case"])


def per_role(kernels: pd.DataFrame) -> pd.DataFrame:
    """Milliseconds per (tokens, impl, role), summed over positions, from the first case of each
    token count (``first_case_per_tokens``), with each impl's busy time, the timed median, their
    difference (``timed_minus_busy_ms``), the GPU idle time measured in the profiled loop
    (``idle_ms`` = lead + gaps; NaN for runs without ``gaps_ms``) and the lead."""
    k = first_case_per_tokens(kernels)
    if "gaps_ms" not in k:
        k = k.assign(gaps_ms=float("nan"))
    table = k.pivot_table(index=["tokens", "impl"], columns="role", values="ms", aggfunc="sum", fill_value=0.0)
    extra = k.groupby(["tokens", "impl"])[["busy_ms", "timed_ms", "lead_ms", "gaps_ms"]].first()
    extra.insert(2, "timed_minus_busy_ms", extra["timed_ms"] - extra["busy_ms"])
    extra.insert(3, "idle_ms", extra["lead_ms"] + extra["gaps_ms"])
    return table.join(extra.drop(columns="gaps_ms")).reset_index()
