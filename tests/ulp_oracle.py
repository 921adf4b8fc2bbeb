"""The accuracy oracle of the bf16 Triton path (imports only torch and swiglu: no Triton).

An output is accepted when
1. it passes the benchmark's criterion against the bf16 reference;
2. the ulp oracle (``check_ulps``): elementwise against the same-rounding reference (the bf16
   reference with its final GEMMs accumulated in fp32 and rounded once, as the kernels do): every
   element within a few ulps plus the fp32 summation-order bound, few elements off at all, and no
   systematic shift of the mean relative difference (a 0.1% scaling fails this);
3. its float64 relative error is at most the worse reference's plus one bf16 ulp per element in
   norm (``ulp_norm``): a bound taken from the data, not a fixed factor and floor.

Used by test_triton_cpu.py, test_triton_adversarial.py, test_subnormals.py, test_module.py,
test_forward.py, test_triton_gpu.py and tp_worker.py. Details in the block comment below and in
tests/README.md ("How we know the tests work").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from swiglu import benchmark_criterion, float64_backward, reference, reference_backward, relative_error

NAMES = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")
NEEDS = ("need_grad_x", "need_grad_gate_weight", "need_grad_up_weight", "need_grad_down_weight")

# --------------------------------------------------------------------------- ulp oracle
#
# The Triton backward rounds where the bf16 reference rounds (g, d_act, d_gate, d_up, h: the same
# bf16 formulas, docs/problem.md) and then runs GEMMs that accumulate in fp32 and round once. The
# "same-rounding reference" below is the bf16 reference with its final GEMMs done that way too
# (fp32 GEMM, one rounding; grad_x = bf16(d_gate @ gate_weight + d_up @ up_weight) in fp32, as the
# kernel's one accumulator; the benchmark's reference rounds its two products first). Against it
# the Triton outputs differ only where fp32 sums taken in different orders round to different
# bf16 neighbours (in the final GEMMs, or in g = grad_output @ down_weight, which then moves d_gate
# or d_up by an ulp at that element). Measured on the CPU interpreter (``python
# scripts/measure_ulps.py``, 104 shape x mode x seed runs of the shapes these tests use): at most
# 0.34% of elements not bitwise equal (mostly 0.01-0.1%), at most 0.08% more than 1 ulp off, at
# most 7.9 ulps beyond the allowance below (T = 111, at an element where an intermediate's flip
# met cancellation), |mean shift| / s.e. at most 2.8.
#
# An output passes when (per device type, ULP_LIMITS):
# (a) every element: |got - ref| <= max_excess_ulps * ulp + 2 * gamma_K * S, where S = |A| @ |B|
#     (the sum of the absolute terms) and gamma_K = K u / (1 - K u), u = 2**-24: the bound on the
#     difference of two fp32 sums of K terms in any order (Higham, Accuracy and Stability of
#     Numerical Algorithms, 2nd ed., Thm 3.1 / eq. 3.5). Sound on any device that accumulates in
#     fp32, whatever the order: the CPU interpreter (numpy fp32 dot on fp32-upcast tiles) and the
#     H200 (wgmma bf16 products, exact, accumulated in fp32; cuBLAS likewise). The ulp is that of
#     max(|got|, |ref|, RMS_FRACTION x the output's rms), at least 2**-133 (bf16 subnormal
#     spacing): an element of heavy cancellation (|ref| << its terms) carries the absolute error
#     of its terms, not of its own small value.
# (b) the fraction of elements more than 1 ulp off, and (CPU only) the fraction not bitwise equal,
#     are small (plus SLACK_ELEMENTS for outputs of a few dozen elements): a systematic error
#     moves many elements by one ulp.
# (c) no systematic shift: the mean of (got - ref) / ref over the nonzero reference elements is
#     within MEAN_Z standard errors of 0, or below MIN_SHIFT. A 0.1% scaling of the fp32 result
#     moves it by 1e-3 (rounding to bf16 keeps the shift in expectation) with a standard error of
#     ~3e-3 / sqrt(n): the check that catches scaling bugs on both devices. (A 0.1% scaling of the
#     already rounded bf16 output changes nothing: 0.999 x a bf16 value rounds back to it.)

U_FP32 = 2.0**-24
#: Per device type. cpu: the interpreter, measured (numbers above); thresholds ~3-10x those.
#: cuda: Triton's wgmma and cuBLAS sum in different orders (and cuBLAS may split K), so more
#: elements flip to the other bf16 neighbour: a flip needs the fp32 sum within ~sqrt(K) u S of a
#: rounding tie, about 1% of elements at K = 4096; g (K = hidden_size) flips as often and moves
#: d_gate/d_up by an ulp there. So no bound on the bitwise fraction there and 5% more than 1 ulp
#: off; (a) holds as on the CPU (its allowance grows with K), and (c) is the check with teeth.
ULP_LIMITS = {
    "cpu": dict(max_excess_ulps=16.0, max_off_fraction=0.01, max_gt1_fraction=0.005),
    "cuda": dict(max_excess_ulps=16.0, max_off_fraction=None, max_gt1_fraction=0.05),
}
#: Elements allowed off beyond the fractions above (outputs of a few dozen elements).
SLACK_ELEMENTS = 2
MEAN_Z, MIN_SHIFT = 6.0, 1e-4
#: The ulp of (a) is at least that of RMS_FRACTION x the output's rms (see the block comment).
RMS_FRACTION = 2.0**-4


def bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    """The bf16 spacing at |t| (float32, t's device): 2**(floor(log2|t|) - 7) from the exact
    exponent (frexp), at least 2**-133 (the subnormals' spacing)."""
    _, e = torch.frexp(t.float().abs().clamp_min(2.0**-126))  # |t| = m 2**e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - 8)


@dataclass(frozen=True)
class UlpStats:
    """How ``got`` differs from its same-rounding reference (see the block comment above)."""

    n: int
    max_ulps: float  # plain |got - ref| / ulp, allowance not subtracted
    max_excess_ulps: float  # (|got - ref| - allowance) / ulp
    off_fraction: float  # elements not bitwise equal
    gt1_fraction: float  # elements more than 1 ulp off
    mean_rel: float  # mean of (got - ref) / ref over nonzero ref
    se_rel: float  # its standard error

    def __str__(self):
        return (f"n={self.n} max={self.max_ulps:.0f} ulp (excess {self.max_excess_ulps:.2f}) "
                f"off={self.off_fraction:.2e} >1ulp={self.gt1_fraction:.2e} "
                f"mean rel={self.mean_rel:.2e} +- {self.se_rel:.1e}")


def ulp_stats(got: torch.Tensor, ref: torch.Tensor, allowance: torch.Tensor | None = None) -> UlpStats:
    """``UlpStats`` of bf16-valued ``got`` against ``ref`` (any float dtypes, same shape), on their
    device: float32 elementwise (differences of nearby bf16 values are exact there), float64 sums."""
    g, r = got.detach().flatten().float(), ref.detach().flatten().float()
    n = g.numel()
    if n == 0:
        return UlpStats(0, 0.0, 0.0, 0.0, 0.0, 0.0, math.inf)
    diff = (g - r).abs()
    floor = RMS_FRACTION * float(r.square().sum(dtype=torch.float64).div(n).sqrt())
    unit = bf16_ulp(torch.maximum(torch.maximum(g.abs(), r.abs()), torch.full_like(r, floor)))
    excess = diff if allowance is None else diff - allowance.detach().flatten().float()
    off, gt1 = int((diff > 0).sum()), int((diff > bf16_ulp(r)).sum())
    max_ulps, max_excess = float((diff / unit).max()), float((excess / unit).max())
    del excess, unit
    nz = r != 0
    rel = ((g - r)[nz] / r[nz]).double()
    m = rel.numel()
    mean = float(rel.mean()) if m else 0.0
    se = float(rel.std() / m**0.5) if m > 1 else math.inf
    return UlpStats(n=n, max_ulps=max_ulps, max_excess_ulps=max_excess, off_fraction=off / n, gt1_fraction=gt1 / n,
                    mean_rel=mean, se_rel=se)


def check_ulps(name, got, ref, seed, allowance=None, device_type=None) -> UlpStats:
    """Assert the ulp oracle (a), (b), (c) for one bf16 output ``got`` against its same-rounding
    reference ``ref`` (same shape; ``allowance``: 2 gamma_K |A| @ |B|, or None for none)."""
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: NaN/Inf in output, seed={seed}"
    limits = ULP_LIMITS[device_type or got.device.type]
    s = ulp_stats(got, ref, allowance)
    where = f"{name}: {s}, seed={seed}"
    assert s.max_excess_ulps <= limits["max_excess_ulps"], f"{where}: beyond {limits['max_excess_ulps']} ulp + fp32 order"
    slack = SLACK_ELEMENTS / max(1, s.n)
    assert s.gt1_fraction <= limits["max_gt1_fraction"] + slack, f"{where}: too many elements > 1 ulp off"
    if limits["max_off_fraction"] is not None:
        assert s.off_fraction <= limits["max_off_fraction"] + slack, f"{where}: too many elements not bitwise equal"
    assert abs(s.mean_rel) <= max(MEAN_Z * s.se_rel, MIN_SHIFT), f"{where}: systematic shift (mean > {MEAN_Z} s.e.)"
    return s


def _fp32_gemm(a, b):
    return a.float() @ b.float()


def fp32_order_allowance(pairs) -> torch.Tensor:
    """2 gamma_K sum_pairs |A| @ |B| in float32 (K: all products summed into one element): how far
    two fp32 sums of the same products, in any orders, can be apart."""
    K = sum(a.shape[-1] for a, _ in pairs)
    gamma = K * U_FP32 / (1 - K * U_FP32)
    # float32 is plenty: a sum of positive terms, relative error <= gamma_K; bf16-valued operands are
    # exact even where TF32 is allowed.
    return 2 * gamma * sum(a.float().abs() @ b.float().abs() for a, b in pairs)


def same_rounding_fp32(args, **needs):
    """``(sums, allowances)``: the bf16 reference's outputs with every final GEMM accumulated in
    fp32 and left unrounded (float32; None where not needed), and each one's fp32-order allowance
    for ``check_ulps``. ``args``: the 8 backward inputs (activated_gate None: ``F.silu(gate_output)``,
    which the Triton recompute matches to the bf16 ulp on all but rare elements).

    The reference's own intermediates (g, d_gate, d_up, h) are used as they are: its GEMMs are
    recorded through ``swiglu.reference._gemm`` (in call order: g; grad_down_weight; grad_x's two;
    grad_gate_weight; grad_up_weight, each only when needed)."""
    args = list(args)
    if args[4] is None:
        args[4] = reference.activated_gate_of(args[2])
    calls = []
    real = reference._gemm
    reference._gemm = lambda a, b: calls.append((a, b)) or real(a, b)
    try:
        out = reference.reference_backward(*args, **needs)
    finally:
        reference._gemm = real
    need_x, need_gate, need_up, need_down = (needs.get(k, True) for k in NEEDS)
    pairs = iter(calls[1:] if (need_x or need_gate or need_up) else calls)
    groups = {}
    for name, count, flag in (("grad_down_weight", 1, need_down), ("grad_x", 2, need_x),
                              ("grad_gate_weight", 1, need_gate), ("grad_up_weight", 1, need_up)):
        if flag:
            groups[name] = [next(pairs) for _ in range(count)]
    assert next(pairs, None) is None, "swiglu.reference changed its GEMM order: update same_rounding_fp32"
    sums, allowances = [], []
    for name, o in zip(NAMES, out):
        ps = groups.get(name)
        sums.append(None if o is None else sum(_fp32_gemm(a, b) for a, b in ps).reshape(o.shape))
        allowances.append(None if o is None else fp32_order_allowance(ps).reshape(o.shape))
    return sums, allowances


def same_rounding_reference(args, **needs):
    """``(refs, allowances)``: ``same_rounding_fp32``'s sums rounded once to bf16."""
    sums, allowances = same_rounding_fp32(args, **needs)
    return [None if s is None else s.to(torch.bfloat16) for s in sums], allowances


def ulp_norm(o: torch.Tensor) -> float:
    """||bf16 ulp at every element of o|| / ||o||: one rounding step everywhere, relative."""
    return float(bf16_ulp(o).double().norm() / o.double().norm())


def check_output(name, g, r, o, atol, seed, same=None, allowance=None):
    """One output ``g`` against its bf16 reference ``r`` (the benchmark's criterion), its
    same-rounding reference ``same`` (``check_ulps``; default ``r``, for outputs that ``r``
    already rounds once after fp32 accumulation) and its float64 oracle ``o`` (relative error at
    most the worse reference's plus ``ulp_norm(o)``)."""
    same = r if same is None else same
    assert g.shape == r.shape, f"{name}: shape {tuple(g.shape)}, expected {tuple(r.shape)}"
    assert torch.isfinite(g).all(), f"{name}: NaN/Inf in output (unwritten tile?), seed={seed}"
    crit = benchmark_criterion(g, r, atol)
    assert crit.passed, f"{name}: benchmark criterion failed {crit}, seed={seed}"
    check_ulps(name, g, same, seed, allowance)
    assert float(o.norm()) > 0, f"{name}: oracle is all zeros (test on zeros)"
    e_t = relative_error(g, o)
    e_r = max(relative_error(r, o), relative_error(same, o))
    bound = e_r + ulp_norm(o)
    assert e_t <= bound, f"{name}: rel error {e_t:.3e} > reference {e_r:.3e} + one ulp {ulp_norm(o):.1e}, seed={seed}"


def check(inp, got, seed, atol=0.13, **needs):
    """``check_output`` for every computed output: benchmark criterion against the bf16 reference,
    the ulp oracle against the same-rounding reference, the float64 rule."""
    check_args(inp.as_tuple(), got, seed, atol, **needs)


def check_args(args, got, seed, atol=0.13, **needs):
    """``check`` on the 8 backward inputs ``args`` as given to the backward (activated_gate None:
    recomputed as ``reference.activated_gate_of(gate_output)``); ``got[0]`` may have any shape
    with grad_x's elements (e.g. x's leading dims)."""
    args = list(args)
    if args[4] is None:
        args[4] = reference.activated_gate_of(args[2])
    ref = reference_backward(*args, **needs)
    same, allowances = same_rounding_reference(args, **needs)
    oracle = float64_backward(*args)
    for name, g, r, s, a, o in zip(NAMES, got, ref, same, allowances, oracle):
        assert (g is None) == (r is None), f"{name}: computed={g is not None}, reference computed={r is not None}"
        if g is not None:
            check_output(name, g.reshape(r.shape), r, o, atol, seed, same=s, allowance=a)


class BackwardSpy:
    """Wraps ``swiglu.kernels.backward.triton_swiglu_backward`` (which ``swiglu.ops`` looks up at each
    call) and records each call's inputs as they were before it (clones: the lean path overwrites
    gate/up), its keyword arguments and its outputs. Use as a context manager or with
    ``monkeypatch.setattr(backward_module, "triton_swiglu_backward", spy)``."""

    def __init__(self):
        import swiglu.kernels.backward as module

        self.module, self.real, self.calls = module, module.triton_swiglu_backward, []

    def __call__(self, *args, **kw):
        before = [None if a is None else a.detach().clone() for a in args]
        out = self.real(*args, **kw)
        self.calls.append((before, kw, out))
        return out

    def __enter__(self):
        self.module.triton_swiglu_backward = self
        return self

    def __exit__(self, *exc):
        self.module.triton_swiglu_backward = self.real

    def check_own(self, seed, atol=0.13):
        """Every recorded call's outputs against its own inputs (e.g. a rank's local backward
        under tensor parallelism, before the all-reduce)."""
        assert self.calls, "triton_swiglu_backward was not called"
        for args, kw, out in self.calls:
            check_args(args, out, seed, atol, **{k: kw.get(k, True) for k in NEEDS})

    def check(self, got, seed, atol=0.13):
        """The one recorded call's inputs against ``got`` (the gradients as the caller received
        them, e.g. x.grad and the parameters' .grad, in NAMES order; None where not computed)."""
        assert len(self.calls) == 1, f"{len(self.calls)} calls of triton_swiglu_backward, expected 1"
        args, kw, _ = self.calls[0]
        check_args(args, got, seed, atol, **{k: kw.get(k, True) for k in NEEDS})
