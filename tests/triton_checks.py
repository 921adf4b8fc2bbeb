"""Shared helpers for the Triton tests (test_triton_cpu.py, test_triton_adversarial.py and others):
guarded NaN output buffers, small tile configs, fresh seeds, and (re-exported from
tests/ulp_oracle.py) the accuracy checks.

Outputs go into views of larger NaN-filled buffers: an unwritten tile stays NaN and a store outside
its output changes the padding (the interpreter does not catch out-of-bounds stores itself).
"""

from __future__ import annotations

import random

from swiglu.kernels.backward import KernelConfig, triton_swiglu_backward

import torch

from ulp_oracle import (  # noqa: F401  (re-exported for the test files)
    NAMES,
    NEEDS,
    BackwardSpy,
    check,
    check_args,
    check_output,
    check_ulps,
    same_rounding_fp32,
    ulp_norm,
    ulp_stats,
)

PAD = 64  # guard elements around each output (128 bytes: keeps the output 16-byte aligned)
# Small tiles keep interpreter runs short and give many tiles (and partial edge tiles) per shape.
SMALL = KernelConfig(BM=64, BN=64, BK=64, EPI_SPLIT=2)
SMALL_CONFIGS = {"dswiglu": SMALL, "grad_weights": SMALL, "grad_x": SMALL}


def fresh_seed() -> int:
    """A new seed per check (fresh inputs every run); tests print it on failure."""
    return random.SystemRandom().randrange(1 << 31)


def guarded(rows, cols, device):
    """A NaN buffer with PAD elements before and after a rows x cols output (flat); returns
    (out, buffer)."""
    buf = torch.full((rows * cols + 2 * PAD,), float("nan"), device=device, dtype=torch.bfloat16)
    return buf[PAD : PAD + rows * cols], buf


def guards_untouched(buf) -> bool:
    """Whether the PAD elements around ``guarded``'s output are all still NaN."""
    return bool(torch.isnan(buf[:PAD]).all() and torch.isnan(buf[-PAD:]).all())


def guarded_outputs(T, H, I, device):
    """NaN buffers with PAD elements before and after each output; returns (outs, buffers)."""
    outs, bufs = zip(*(guarded(rows, cols, device) for rows, cols in [(T, H), (I, H), (I, H), (H, I)]))
    return outs, list(bufs)


def assert_guards(bufs, seed):
    for name, b in zip(NAMES, bufs):
        assert guards_untouched(b), f"{name}: store outside its output, seed={seed}"


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
