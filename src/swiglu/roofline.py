"""Roofline and speed-of-light (SOL) figures for the SwiGLU MLP backward.

Formulas (``docs/problem.md``):

* FLOPs: six GEMMs of T x H x I, each ``2*T*H*I``: ``12 * T * H * I``.
* Minimum bytes (each input read once, each output written once, bf16 = 2 bytes):
  ``2 * (4*T*H + 3*T*I + 6*I*H)``: reads grad_output, x, gate/up/activated_gate and three weights;
  writes grad_x and three weight gradients.
* SOL time: ``T_SOL = max(FLOPs / peak_flops, bytes / peak_bandwidth)``.
* Score per case (SOL-ExecBench): ``S = 1 / (1 + (T_k - T_SOL) / (T_b - T_SOL))``; 0.5 at the
  baseline T_b, 1.0 at the speed of light.
* Aggregation over cases: geometric mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from .workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE

BYTES_PER_ELEMENT = 2  # bf16


@dataclass(frozen=True)
class Hardware:
    """Peak rates of one GPU: dense bf16 tensor-core TFLOP/s and memory bandwidth in TB/s."""

    name: str
    peak_tflops: float
    peak_tbps: float
    source: str

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte where the roofline turns from memory- to compute-bound."""
        return self.peak_tflops / self.peak_tbps


#: Peak rates with their sources. Dense (not 2:4-sparse) bf16 figures throughout.
HARDWARE: dict[str, Hardware] = {
    "H100-SXM": Hardware(
        "H100 SXM",
        989.4,
        3.35,
        "NVIDIA H100 Tensor Core GPU datasheet: 1,979 TFLOPS bf16 with sparsity (989.4 dense), 3.35 TB/s HBM3",
    ),
    "H200-SXM": Hardware(
        "H200 SXM",
        989.4,
        4.8,
        "NVIDIA H200 Tensor Core GPU datasheet: 1,979 TFLOPS bf16 with sparsity (989.4 dense), 4.8 TB/s HBM3e",
    ),
    "B200-HGX": Hardware(
        "B200 (HGX, datasheet)",
        2250.0,
        7.7,
        "NVIDIA HGX B200 datasheet: 4.5 PFLOPS bf16 per GPU with sparsity (2.25 dense); 7.7 TB/s as docs/problem.md quotes it",
    ),
    "B200-benchmark": Hardware(
        "B200 (SOL-ExecBench, 1.5 GHz lock)",
        1811.0,
        7.67,
        "SOL-ExecBench peak rates for B200 with the SM clock locked at 1.5 GHz (docs/problem.md)",
    ),
}


def at_sm_clock(hardware: Hardware | str, sm_clock_mhz: float, max_sm_clock_mhz: float, name: str | None = None) -> Hardware:
    """``hardware`` with its tensor-core peak scaled to an SM clock: ``peak_tflops * sm_clock_mhz /
    max_sm_clock_mhz`` (the datasheet peak assumes the maximum boost clock; the tensor cores'
    rate is proportional to the SM clock). The memory bandwidth is kept (HBM has its own clock).

    Raises ``ValueError`` unless ``0 < sm_clock_mhz`` and ``0 < max_sm_clock_mhz``.
    """
    hw = HARDWARE[hardware] if isinstance(hardware, str) else hardware
    if not (sm_clock_mhz > 0 and max_sm_clock_mhz > 0):
        raise ValueError(f"clocks must be positive, got sm_clock_mhz={sm_clock_mhz}, max_sm_clock_mhz={max_sm_clock_mhz}")
    scale = sm_clock_mhz / max_sm_clock_mhz
    return Hardware(
        name or f"{hw.name} at {sm_clock_mhz:.0f} of {max_sm_clock_mhz:.0f} MHz SM clock",
        hw.peak_tflops * scale,
        hw.peak_tbps,
        f"{hw.source}; tensor-core peak x {sm_clock_mhz:.0f} / {max_sm_clock_mhz:.0f} MHz",
    )


def flops(tokens: int, hidden_size: int = HIDDEN_SIZE, intermediate_size: int = INTERMEDIATE_SIZE) -> int:
    """Floating-point operations of the backward: ``12 * T * H * I`` (six T x H x I GEMMs)."""
    return 12 * tokens * hidden_size * intermediate_size


def min_bytes(tokens: int, hidden_size: int = HIDDEN_SIZE, intermediate_size: int = INTERMEDIATE_SIZE) -> int:
    """Fewest bytes moved through device memory: ``2 * (4*T*H + 3*T*I + 6*I*H)``."""
    T, H, I = tokens, hidden_size, intermediate_size
    return BYTES_PER_ELEMENT * (4 * T * H + 3 * T * I + 6 * I * H)


def arithmetic_intensity(tokens: int, hidden_size: int = HIDDEN_SIZE, intermediate_size: int = INTERMEDIATE_SIZE) -> float:
    """FLOP per byte of the minimum traffic."""
    return flops(tokens, hidden_size, intermediate_size) / min_bytes(tokens, hidden_size, intermediate_size)


def sol_time_s(
    tokens: int,
    hardware: Hardware | str = "H200-SXM",
    hidden_size: int = HIDDEN_SIZE,
    intermediate_size: int = INTERMEDIATE_SIZE,
) -> float:
    """Speed-of-light time in seconds: ``max(FLOPs / peak_flops, bytes / peak_bandwidth)``."""
    hw = HARDWARE[hardware] if isinstance(hardware, str) else hardware
    compute = flops(tokens, hidden_size, intermediate_size) / (hw.peak_tflops * 1e12)
    memory = min_bytes(tokens, hidden_size, intermediate_size) / (hw.peak_tbps * 1e12)
    return max(compute, memory)


def bound(
    tokens: int,
    hardware: Hardware | str = "H200-SXM",
    hidden_size: int = HIDDEN_SIZE,
    intermediate_size: int = INTERMEDIATE_SIZE,
) -> str:
    """``"compute"`` or ``"memory"``: which term sets the SOL time."""
    hw = HARDWARE[hardware] if isinstance(hardware, str) else hardware
    return "compute" if arithmetic_intensity(tokens, hidden_size, intermediate_size) >= hw.ridge_intensity else "memory"


def sol_score(t_kernel: float, t_baseline: float, t_sol: float) -> float:
    """SOL-ExecBench score ``1 / (1 + (T_k - T_SOL) / (T_b - T_SOL))`` (any one time unit).

    Raises ``ValueError`` when ``t_baseline <= t_sol`` (the score is undefined there).
    """
    if t_baseline <= t_sol:
        raise ValueError(f"t_baseline ({t_baseline}) must exceed t_sol ({t_sol})")
    return 1.0 / (1.0 + (t_kernel - t_sol) / (t_baseline - t_sol))


def geometric_mean(values: Iterable[float]) -> float:
    """Geometric mean of positive values (the benchmark's aggregation over cases).

    Raises ``ValueError`` for an empty input or a non-positive value.
    """
    vals = list(values)
    if not vals:
        raise ValueError("geometric_mean of no values")
    if any(not (v > 0) for v in vals):
        raise ValueError(f"geometric_mean needs positive values, got {vals}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
