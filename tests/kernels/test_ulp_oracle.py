"""The ulp oracle's shift check (c) on its own, with synthetic sums: the floor for the tensor
cores' accumulation shift scales with the summed terms on CUDA only, and a 0.1% scaling still
fails there at grad_x's K (tests/ulp_oracle.py, TC_SHIFT_PER_TERM)."""

from __future__ import annotations

import pytest
import torch

from ulp_oracle import TC_SHIFT_PER_TERM, check_ulps

K_GRAD_X = 2 * 53248  # grad_x's summed products at Hermes' size


def _shifted(shift: float, n: int = 1 << 20, seed: int = 0):
    """A same-rounding reference (bf16 of fp32 sums) and an output whose fp32 sums are scaled by
    (1 - shift) before the same rounding, as a truncating accumulation does."""
    g = torch.Generator().manual_seed(seed)
    sums = torch.randn(n, generator=g)
    return (sums * (1 - shift)).to(torch.bfloat16), sums.to(torch.bfloat16)


def test_the_measured_tensor_core_shift_passes_at_grad_x_terms_on_cuda():
    got, ref = _shifted(1.19e-4)  # the shift measured for grad_x at seed 1507450251 on the H200
    check_ulps("grad_x", got, ref, 0, device_type="cuda", terms=K_GRAD_X)


def test_without_terms_or_on_the_cpu_or_growing_the_same_shift_fails():
    got, ref = _shifted(1.19e-4)
    for kwargs in (dict(device_type="cuda"), dict(device_type="cpu", terms=K_GRAD_X)):
        with pytest.raises(AssertionError, match="systematic shift"):
            check_ulps("grad_x", got, ref, 0, **kwargs)
    grown, ref = _shifted(-1.19e-4)  # truncation shrinks sums: growth gets no allowance
    with pytest.raises(AssertionError, match="systematic shift"):
        check_ulps("grad_x", grown, ref, 0, device_type="cuda", terms=K_GRAD_X)


def test_a_tenth_of_a_percent_scaling_fails_at_grad_x_terms():
    assert TC_SHIFT_PER_TERM * K_GRAD_X < 1e-3 / 3
    got, ref = _shifted(1e-3)
    with pytest.raises(AssertionError, match="systematic shift"):
        check_ulps("grad_x", got, ref, 0, device_type="cuda", terms=K_GRAD_X)
