"""Shared checks for the Triton tests (test_triton_cpu.py, test_triton_adversarial.py).

An output is accepted when it passes the benchmark's criterion against the bf16 reference and its
float64 relative error is at most FACTOR x the reference's own (plus FLOOR and a sampling-noise
floor that matters only for outputs of a few elements: ``noise_floor``). Outputs go into views
of larger NaN-filled buffers: an unwritten tile stays NaN and a store outside its output changes
the padding (the interpreter does not catch out-of-bounds stores itself).
"""

from __future__ import annotations

import math
import random

from swiglu import benchmark_criterion, float64_backward, reference_backward, relative_error
from swiglu.kernels.backward import KernelConfig, triton_swiglu_backward

import torch

NAMES = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")
NEEDS = ("need_grad_x", "need_grad_gate_weight", "need_grad_up_weight", "need_grad_down_weight")
FACTOR, FLOOR = 2.0, 1e-6
PAD = 64  # guard elements around each output (128 bytes: keeps the output 16-byte aligned)
# Small tiles keep interpreter runs short and give many tiles (and partial edge tiles) per shape.
SMALL = KernelConfig(BM=64, BN=64, BK=64, EPI_SPLIT=2)
SMALL_CONFIGS = {"dswiglu": SMALL, "grad_weights": SMALL, "grad_x": SMALL}


def noise_floor(numel: int) -> float:
    """Three standard deviations of a relative error's sampling noise over ``numel`` elements: each
    bf16 output element carries up to one rounding step (2**-8 relative), so on an 8-element output
    one element rounded the other way moves the norm-relative error by ~2**-8 / sqrt(8). Without it
    the FACTOR rule failed 1 in ~1200 checks at T = 1, H = I = 8 (one element one ulp off where the
    reference's extra roundings happened to cancel); at 1000+ elements it adds < 4e-4."""
    return 3 * 2.0**-8 / math.sqrt(numel)


def fresh_seed() -> int:
    """A new seed per check (fresh inputs every run); tests print it on failure."""
    return random.SystemRandom().randrange(1 << 31)


def guarded_outputs(T, H, I, device):
    """NaN buffers with PAD elements before and after each output; returns (outs, buffers)."""
    bufs, outs = [], []
    for rows, cols in [(T, H), (I, H), (I, H), (H, I)]:
        buf = torch.full((rows * cols + 2 * PAD,), float("nan"), device=device, dtype=torch.bfloat16)
        bufs.append(buf)
        outs.append(buf[PAD : PAD + rows * cols])
    return tuple(outs), bufs


def assert_guards(bufs, seed):
    for name, b in zip(NAMES, bufs):
        untouched = torch.isnan(b[:PAD]).all() and torch.isnan(b[-PAD:]).all()
        assert untouched, f"{name}: store outside its output, seed={seed}"


def check_output(name, g, r, o, atol, seed):
    """One output ``g`` against its bf16 reference ``r`` (the benchmark's criterion) and its float64
    oracle ``o`` (relative error at most FACTOR x the reference's own, plus the floors)."""
    assert g.shape == r.shape, f"{name}: shape {tuple(g.shape)}, expected {tuple(r.shape)}"
    assert torch.isfinite(g).all(), f"{name}: NaN/Inf in output (unwritten tile?), seed={seed}"
    crit = benchmark_criterion(g, r, atol)
    assert crit.passed, f"{name}: benchmark criterion failed {crit}, seed={seed}"
    e_t, e_r = relative_error(g, o), relative_error(r, o)
    bound = FACTOR * e_r + FLOOR + noise_floor(g.numel())
    assert e_t <= bound, f"{name}: rel error {e_t:.3e} > {FACTOR} x reference {e_r:.3e} + floors, seed={seed}"
    assert float(o.norm()) > 1e3 * FLOOR, f"{name}: oracle too small to test against"


def check(inp, got, seed, atol=0.13, **needs):
    """Benchmark criterion vs the bf16 reference and the FACTOR rule vs float64, per computed output."""
    ref = reference_backward(*inp.as_tuple(), **needs)
    oracle = float64_backward(*inp.as_tuple())
    for name, g, r, o in zip(NAMES, got, ref, oracle):
        assert (g is None) == (r is None), f"{name}: computed={g is not None}, reference computed={r is not None}"
        if g is not None:
            check_output(name, g, r, o, atol, seed)


def run_guarded(inp, configs, seed, **needs):
    """triton_swiglu_backward into guarded NaN buffers; checks the guards and that out= was used."""
    T = inp.x.numel() // inp.x.shape[-1]
    I, H = inp.gate_weight.shape
    outs, bufs = guarded_outputs(T, H, I, inp.x.device)
    got = triton_swiglu_backward(*inp.as_tuple(), configs=configs, out=outs, **needs)
    assert_guards(bufs, seed)
    for name, g, o in zip(NAMES, got, outs):
        if g is not None:
            assert g.data_ptr() == o.data_ptr(), f"{name}: out= buffer was not used"
    return got, outs
