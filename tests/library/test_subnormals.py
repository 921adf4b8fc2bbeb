"""bf16 subnormals (|v| < 2**-126) through impl="triton".

Triton's interpreter converts bf16 subnormals wrongly in both directions, so under
TRITON_INTERPRET=1 (UPCAST) the kernels convert on bit patterns (``kernels._f32``, ``kernels._bf16``).
Checked here: both helpers against torch's conversions on every bf16 bit pattern and on fp32
values around every rounding boundary, then the whole backward with subnormal inputs and
subnormal outputs against float64. On a GPU the same tests run the compiled helpers.
"""

import pytest
import torch
import triton
import triton.language as tl

from swiglu import float64_backward, make_inputs, reference, relative_error
from swiglu.kernels import tl_kernels as kernels

from triton_checks import NAMES, NEEDS, SMALL_CONFIGS, check, fresh_seed, run_guarded

BF16_MIN_NORMAL = 2.0**-126


@triton.jit
def _upcast_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, kernels._f32(tl.load(src + offs, mask=offs < n), True), mask=offs < n)


@triton.jit
def _round_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, kernels._bf16(tl.load(src + offs, mask=offs < n), True), mask=offs < n)


def _launch(kernel, src, dst_dtype):
    dst = torch.full(src.shape, float("nan"), dtype=dst_dtype, device=src.device)
    block = 4096
    kernel[(triton.cdiv(src.numel(), block),)](src, dst, src.numel(), BLOCK=block)
    return dst


def _all_bf16(device):
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).to(device)


def test_upcast_every_bf16_bit_pattern(device):
    """bf16 -> fp32 is exact: every one of the 65536 bit patterns (subnormals, zeros, inf, NaN)."""
    src = _all_bf16(device)
    got = _launch(_upcast_kernel, src, torch.float32)
    want = src.float()
    assert (src.abs() < BF16_MIN_NORMAL).sum() > 250  # 254 nonzero subnormals plus two zeros
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_round_to_bf16_at_every_boundary(device):
    """fp32 -> bf16, round to nearest even: each bf16 pattern as the high half with low halves
    below, at and above the tie (0x7FFF, 0x8000, 0x8001), 0, 1, 0xFFFF and one random: normals,
    subnormals, carries into the exponent (largest subnormal -> smallest normal), overflow to inf."""
    high = torch.arange(0, 1 << 16, dtype=torch.int64)
    gen = torch.Generator().manual_seed(fresh_seed())
    lows = [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, torch.randint(0, 1 << 16, high.shape, generator=gen)]
    bits = torch.cat([(high << 16) + low for low in lows])
    src = ((bits + (1 << 31)) % (1 << 32) - (1 << 31)).to(torch.int32).view(torch.float32).to(device)
    got = _launch(_round_kernel, src, torch.bfloat16).cpu()
    want = src.cpu().to(torch.bfloat16)  # torch's conversion: round to nearest even on the bits
    nan = torch.isnan(src.cpu())
    assert torch.isnan(got[nan]).all()
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    subnormal_out = (want[~nan].float().abs() < BF16_MIN_NORMAL) & (want[~nan] != 0)
    assert subnormal_out.sum() > 1000


def _scaled(t, e):
    """t * 2**e in bf16 (rounded once when the result is subnormal)."""
    return (t.double() * 2.0**e).to(torch.bfloat16)


@pytest.fixture
def gemm_without_flush(monkeypatch):
    """The reference's GEMMs as a GPU runs a bf16 GEMM (fp32 accumulation, one rounding to bf16):
    PyTorch's CPU bf16 GEMM flushes subnormal operands to zero (float64 error 1.0 here), which
    would make the reference useless as a yardstick. Nothing else in the reference changes."""
    monkeypatch.setattr(reference, "_gemm", lambda a, b: (a.float() @ b.float()).to(a.dtype))


def _check_against_float64(inp, got, seed, skip=()):
    """The usual rule (triton_checks.check: benchmark criterion, ulp oracle, float64 bound), after
    making sure the reference itself is usable here (its float64 error below 0.5)."""
    ref = reference.reference_backward(*inp.as_tuple())
    oracle = float64_backward(*inp.as_tuple())
    for name, r, o in zip(NAMES, ref, oracle):
        if name not in skip:
            assert torch.isfinite(o).all(), f"{name}, seed={seed}"
            ref_err = relative_error(r, o)
            assert ref_err < 0.5, f"{name}: the reference itself fails ({ref_err:.3e}): flushed subnormals?"
    check(
        inp,
        tuple(None if n in skip else g for n, g in zip(NAMES, got)),
        seed,
        **{need: n not in skip for need, n in zip(NEEDS, NAMES)},
    )


def test_subnormal_down_weight(device, gemm_without_flush):
    """Every down_weight element subnormal (x 2**-125) and grad_output x 2**125,
    so every product in g = grad_output @ down_weight is unchanged. grad_x, grad_gate_weight and
    grad_up_weight must equal bit for bit those of the unscaled problem (grad_down_weight =
    grad_output.T @ h would overflow at this scale and is not requested)."""
    seed = fresh_seed()
    inp = make_inputs(1, 16, 32, 64, seed=seed, device=device)
    inp.down_weight = _scaled(inp.down_weight, -125)
    assert (inp.down_weight.abs() < BF16_MIN_NORMAL).float().mean() > 0.99
    eq = make_inputs(1, 16, 32, 64, seed=seed, device=device)
    eq.down_weight = _scaled(inp.down_weight, 125)  # exact: a subnormal has fewer bits
    inp.grad_output = _scaled(eq.grad_output, 125)
    got, _ = run_guarded(inp, SMALL_CONFIGS, seed, need_grad_down_weight=False)
    want, _ = run_guarded(eq, SMALL_CONFIGS, seed, need_grad_down_weight=False)
    for name, g, w in zip(NAMES[:3], got, want):
        assert torch.equal(g, w), f"{name}: subnormal down_weight changed the result, seed={seed}"
    _check_against_float64(inp, got, seed, skip=("grad_down_weight",))


@pytest.mark.parametrize("exponent", [-128, -131])
def test_subnormal_outputs(device, gemm_without_flush, exponent):
    """grad_output x 2**exponent scales every gradient into the subnormal range (and g, d_gate,
    d_up on the way, so every rounding lands on the subnormals' coarser spacing)."""
    seed = fresh_seed()
    inp = make_inputs(1, 16, 32, 64, seed=seed, device=device)
    inp.grad_output = _scaled(inp.grad_output, exponent)
    got, _ = run_guarded(inp, SMALL_CONFIGS, seed)
    for name, g in zip(NAMES, got):
        assert (g.abs() < BF16_MIN_NORMAL).float().mean() > 0.5, f"{name}: outputs not subnormal, seed={seed}"
    _check_against_float64(inp, got, seed)
