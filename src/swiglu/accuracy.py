"""Accuracy metrics: the benchmark's per-element criterion and float64 relative errors.

* Benchmark criterion (SOL-ExecBench, ``docs/problem.md``): in fp32, any NaN/Inf fails;
  an element matches if ``|out - ref| <= atol + rtol * |ref|``; at least 99% must match.
* Relative error against the float64 oracle: ``||out - oracle||_F / ||oracle||_F``. A fast
  implementation is accepted when its error is at most ``factor`` (2) times the bf16
  reference's own error against the same oracle (flash-attention's test habit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .workloads import MIN_MATCH_FRACTION, RTOL

# Rows per chunk when reducing big tensors: bounds the float64 temporaries to ~1 GB at H=16384.
_CHUNK_ELEMENTS = 1 << 27


def _row_chunks(*tensors: torch.Tensor):
    flat = [t.detach().reshape(-1, t.shape[-1]) if t.dim() > 1 else t.detach().reshape(1, -1) for t in tensors]
    rows = max(1, _CHUNK_ELEMENTS // max(1, flat[0].shape[-1]))
    for start in range(0, flat[0].shape[0], rows):
        yield tuple(f[start : start + rows] for f in flat)


@dataclass(frozen=True)
class CriterionResult:
    """Outcome of the benchmark criterion on one tensor."""

    passed: bool
    match_fraction: float
    nonfinite: int
    max_abs_error: float


def benchmark_criterion(
    out: torch.Tensor,
    ref: torch.Tensor,
    atol: float,
    rtol: float = RTOL,
    min_fraction: float = MIN_MATCH_FRACTION,
) -> CriterionResult:
    """Apply SOL-ExecBench's check to ``out`` against ``ref`` (same shape, any dtypes). An empty
    pair (a T = 0 backward's grad_x) has no element that mismatches: it passes, fraction 1.0.

    Raises ``ValueError`` when shapes differ.
    """
    if out.shape != ref.shape:
        raise ValueError(f"out has shape {tuple(out.shape)} but ref has {tuple(ref.shape)}")
    matched = 0
    nonfinite = 0
    max_err = 0.0
    for o, r in _row_chunks(out, ref):
        o32, r32 = o.float(), r.float()
        nonfinite += int((~torch.isfinite(o32)).sum())
        err = (o32 - r32).abs()
        matched += int((err <= atol + rtol * r32.abs()).sum())
        if err.numel():
            max_err = max(max_err, float(torch.nan_to_num(err, nan=float("inf")).max()))
    fraction = matched / out.numel() if out.numel() else 1.0
    return CriterionResult(nonfinite == 0 and fraction >= min_fraction, fraction, nonfinite, max_err)


def relative_error(out: torch.Tensor, oracle: torch.Tensor) -> float:
    """``||out - oracle||_F / ||oracle||_F`` computed in float64 (NaN if out has NaN/Inf).

    Raises ``ValueError`` when shapes differ or the oracle is all zeros.
    """
    if out.shape != oracle.shape:
        raise ValueError(f"out has shape {tuple(out.shape)} but oracle has {tuple(oracle.shape)}")
    num = 0.0
    den = 0.0
    for o, r in _row_chunks(out, oracle):
        r64 = r.double()
        num += float(((o.double() - r64) ** 2).sum())
        den += float((r64**2).sum())
    if den == 0.0:
        raise ValueError("oracle is all zeros: relative error undefined (never test on zeros)")
    return (num / den) ** 0.5
