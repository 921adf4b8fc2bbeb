"""Per-rank timelines of a tensor-parallel backward: which kernels (ours, the collectives') ran
when on each rank, from ``torch.profiler``, and how much of the communication no compute covered.
Each rank's times count from its own profiler start, which the TP bench puts right after a barrier
and a 1-element all-reduce on every rank: ranks line up within that collective's skew. The TP bench's ``timeline`` part records them
(``tp_<run_id>_timeline.csv``); notebook 05 draws them (``plots.tp_timeline_plot``)."""

from __future__ import annotations

import pandas as pd

#: Names of communication kernels / ops (NCCL's kernels on a GPU; gloo's and c10d's ops on a CPU).
COMM_MARKERS = ("nccl", "gloo", "c10d::", "allreduce", "all_reduce", "reduce_scatter", "allgather", "all_gather")
TIMELINE_COLUMNS = ("case", "tokens", "variant", "rank", "name", "kind", "start_us", "end_us")


def kind_of(name: str) -> str:
    """ "comm" for a collective's kernel or op, else "compute"."""
    lowered = name.lower()
    return "comm" if any(m in lowered for m in COMM_MARKERS) else "compute"


def profiler_events(prof, device_type: str) -> list[dict]:
    """``(name, start_us, end_us)`` of the kernels a ``torch.profiler.profile`` saw: the device's
    kernels on a GPU (``device_type`` "cuda"), the top-level ops on a CPU; microseconds from the
    profiler's start (``FunctionEvent.time_range``)."""
    rows = []
    for e in prof.events():
        if device_type == "cuda":
            if e.device_type.name != "CUDA":
                continue
        elif e.cpu_parent is not None or e.device_type.name != "CPU":
            continue
        start = e.time_range.start
        rows.append(dict(name=e.name, start_us=float(start), end_us=float(e.time_range.end)))
    return rows


def align(events: pd.DataFrame) -> pd.DataFrame:
    """Times relative to the earliest event of each (case, variant) over all ranks, so the ranks'
    rows of one backward start at 0 together."""
    events = events.copy()
    zero = events.groupby(["case", "variant"])["start_us"].transform("min")
    events["start_us"] -= zero
    events["end_us"] -= zero
    return events


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals merged where they overlap or touch, in order."""
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def length(intervals) -> float:
    """The summed length of ``union``'s disjoint intervals."""
    return sum(hi - lo for lo, hi in intervals)


def _overlap(a, b) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summary(events: pd.DataFrame) -> pd.DataFrame:
    """Per (case, variant, rank): span (first start to last end), compute busy time, communication
    busy time, the communication no compute overlapped (``exposed_comm_us``) and the idle time
    (span minus the union of all), in microseconds."""
    rows = []
    for (case, variant, rank), g in events.groupby(["case", "variant", "rank"], sort=False):
        compute = union(list(zip(g.loc[g["kind"] == "compute", "start_us"], g.loc[g["kind"] == "compute", "end_us"])))
        comm = union(list(zip(g.loc[g["kind"] == "comm", "start_us"], g.loc[g["kind"] == "comm", "end_us"])))
        span = g["end_us"].max() - g["start_us"].min()
        busy = length(union(compute + comm))
        rows.append(
            dict(
                case=case,
                variant=variant,
                rank=rank,
                span_us=span,
                compute_us=length(compute),
                comm_us=length(comm),
                exposed_comm_us=length(comm) - _overlap(compute, comm),
                idle_us=span - busy,
            )
        )
    return pd.DataFrame(rows)
