"""Where one backward's time goes: the kernels each implementation launches, from ``torch.profiler``.

Protocol (apart from the timed iterations, which it never disturbs): per implementation and case,
``iters`` calls, each after the L2 flush and a synchronize, inside a ``record_function`` range
that ends with a synchronize, so every kernel that starts inside the range belongs to the call.
Per call: the kernels in start order (on a CPU, the top-level ops under the range), their busy
time (the union of their intervals), the lead (range start to the first kernel: the host's work
before its first launch, the GPU idle meanwhile) and the span (range start to the last kernel's
end). The profiler slows the host, so lead and span overstate the host's share; the GPU's idle
time inside the benchmark's own timed span is ``timed_ms`` (that row's median from the timed
loop, unprofiled) minus ``busy_ms``. Rows: one per kernel position, medians over the calls;
``bench/kernels/<run_id>.csv``.
"""

from __future__ import annotations

import statistics
from typing import Callable

import pandas as pd
import torch

from . import timeline

#: The range name around each profiled call.
MARK = "swiglu_bench::call"
COLUMNS = ("run_id", "case", "tokens", "impl", "position", "kernel", "role", "ms", "seen",
           "busy_ms", "lead_ms", "span_ms", "profiled_calls", "timed_ms")

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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def call_kernels(prof, device_type: str) -> tuple[list[list[tuple[str, float, float]]], list[float]]:
    """Per ``MARK`` range of a finished ``torch.profiler.profile`` (in time order): its start
    (us) and the ``(name, start_us, end_us)`` of the device kernels that started inside it (``device_type``
    "cuda"), or of the CPU ops directly under it (otherwise), in start order. Returns (per-range kernel lists, range starts)."""
    events = list(prof.events())
    marks = sorted((e for e in events if e.name == MARK and e.device_type.name == "CPU"),
                   key=lambda e: e.time_range.start)
    if device_type == "cuda":
        # Device events less the ranges of record_function annotations (ours and any library's),
        # which the profiler also puts on the device's timeline.
        kernels = [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in events
                   if e.device_type.name == "CUDA" and e.name != MARK and not getattr(e, "is_user_annotation", False)]
        calls = [[k for k in kernels if m.time_range.start <= k[1] <= m.time_range.end] for m in marks]
    else:
        calls = [[(c.name, float(c.time_range.start), float(c.time_range.end)) for c in m.cpu_children] for m in marks]
    return [sorted(c, key=lambda k: k[1]) for c in calls], [float(m.time_range.start) for m in marks]


def _busy_us(kernels: list[tuple[str, float, float]]) -> float:
    return timeline.length(timeline.union([(start, end) for _, start, end in kernels]))


def summarize(calls: list[list[tuple[str, float, float]]], starts: list[float]) -> list[dict]:
    """Rows (``COLUMNS`` from ``position`` on) from ``call_kernels``' output: per kernel position
    the name seen most often there, its median duration over the calls that launched it (ms) and
    in how many calls it was seen; per call busy, lead and span medians (ms, repeated per row)."""
    calls_with = [(c, s) for c, s in zip(calls, starts) if c]
    if not calls_with:
        return []
    busy = statistics.median(_busy_us(c) for c, _ in calls_with) / 1e3
    lead = statistics.median(c[0][1] - s for c, s in calls_with) / 1e3
    span = statistics.median(max(k[2] for k in c) - s for c, s in calls_with) / 1e3
    rows = []
    for position in range(max(len(c) for c, _ in calls_with)):
        names = [c[position][0] for c, _ in calls_with if len(c) > position]
        name = statistics.mode(names)
        durations = [(c[position][2] - c[position][1]) / 1e3 for c, _ in calls_with
                     if len(c) > position and c[position][0] == name]
        rows.append(dict(position=position, kernel=name, role=kernel_role(name), ms=statistics.median(durations),
                         seen=len(durations), busy_ms=busy, lead_ms=lead, span_ms=span,
                         profiled_calls=len(calls_with)))
    return rows


def profile_calls(fn: Callable, make_args: Callable[[], tuple], iters: int, device: torch.device,
                  flush: Callable[[], None] = lambda: None) -> list[dict]:
    """Profile ``iters`` calls of ``fn(*make_args())`` as the module docstring says; returns
    ``summarize``'s rows."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(iters):
            args = make_args()
            flush()
            _sync(device)
            with record_function(MARK):
                out = fn(*args)
                _sync(device)
            del out, args
    calls, starts = call_kernels(prof, device.type)
    return summarize(calls, starts)


def frame(rows: list[dict], **fields) -> pd.DataFrame:
    """``rows`` as a DataFrame in ``COLUMNS`` order, ``fields`` (run_id, case, tokens, impl,
    timed_ms) set on each."""
    return pd.DataFrame([{**fields, **r} for r in rows], columns=list(COLUMNS))


def first_case_per_tokens(kernels: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first case of each token count (cases of equal tokens do the same work)."""
    return kernels.merge(kernels.drop_duplicates(["tokens"])[["tokens", "case"]], on=["tokens", "case"])


def per_role(kernels: pd.DataFrame) -> pd.DataFrame:
    """Milliseconds per (tokens, impl, role), summed over positions, from the first case of each
    token count (``first_case_per_tokens``), with each impl's busy time, the timed median and the
    GPU idle time inside it (``idle_ms`` = timed - busy), and the profiled lead."""
    k = first_case_per_tokens(kernels)
    table = k.pivot_table(index=["tokens", "impl"], columns="role", values="ms", aggfunc="sum", fill_value=0.0)
    extra = k.groupby(["tokens", "impl"])[["busy_ms", "timed_ms", "lead_ms"]].first()
    extra.insert(2, "idle_ms", extra["timed_ms"] - extra["busy_ms"])
    return table.join(extra).reset_index()
