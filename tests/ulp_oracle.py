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
# bf16 neighbours: in the final GEMMs, or in g = grad_output @ down_weight (an ulp of g then moves
# d_gate or d_up at that element, and every final GEMM that reads it), or where sigmoid/silu in
# fp32 lands next to a rounding boundary. ``same_rounding_fp32`` bounds all of these per element
# (its allowance), so on the CPU the check is exact: every element must be a bf16 value that some
# fp32 sum within the allowance rounds to (d). Measured on the CPU interpreter (``python
# scripts/measure_ulps.py 6``: 156 shape x mode x config x seed runs per output, the tests' shapes,
# activated_gate given and recomputed): at most 0.39% of elements not bitwise equal, 0.08% more
# than 1 ulp off (up to 8 ulps at elements of heavy cancellation), all within the allowance plus
# the final rounding (excess at most 0.996 ulp), none unexplained, |mean shift| / s.e. at most 2.8.
# (Without the flips of g and of the transcendentals in the allowance, the excess reaches 19 ulps
# on some seeds, e.g. 1315388796 in test_config_options.)
#
# An output passes when (per device type, ULP_LIMITS):
# (a) every element: |got - ref| <= max_excess_ulps * ulp + allowance, the allowance being
#     2 gamma_K S + (the intermediates' flips, ``intermediate_flips``), where S = |A| @ |B|
#     (the sum of the absolute terms) and gamma_K = K u / (1 - K u), u = 2**-24: the bound on the
#     difference of two fp32 sums of K terms in any order (Higham, Accuracy and Stability of
#     Numerical Algorithms, 2nd ed., Thm 3.1 / eq. 3.5). Sound on any device that accumulates in
#     fp32, whatever the order: the CPU interpreter (numpy fp32 dot on fp32-upcast tiles) and the
#     H200 (wgmma bf16 products, exact, accumulated in fp32; cuBLAS likewise). The ulp is that of
#     max(|got|, |ref|, RMS_FRACTION x the output's rms), at least 2**-133 (bf16 subnormal
#     spacing): an element of heavy cancellation (|ref| << its terms) carries the absolute error
#     of its terms, not of its own small value.
# (b) (GPU only) the fraction of elements more than 1 ulp off is small (plus SLACK_ELEMENTS for
#     outputs of a few dozen elements): a systematic error moves many elements by one ulp. On the
#     CPU (d) is stricter.
# (c) no systematic shift: the mean of (got - ref) / ref over the nonzero reference elements is
#     within MEAN_Z standard errors of 0, or below MIN_SHIFT. A 0.1% scaling of the fp32 result
#     moves it by 1e-3 (rounding to bf16 keeps the shift in expectation) with a standard error of
#     ~3e-3 / sqrt(n): the check that catches scaling bugs on both devices. (A 0.1% scaling of the
#     already rounded bf16 output changes nothing: 0.999 x a bf16 value rounds back to it.)
# (d) (CPU) every element lies between bf16(sum - allowance) and bf16(sum + allowance), sum being
#     the same-rounding reference's fp32 value: no element that rounding alone cannot explain
#     (SLACK_ELEMENTS aside). A 0.1% scaling leaves about 10-25% of elements unexplained.

U_FP32 = 2.0**-24
#: Per device type. cpu: the interpreter: (a) at the final rounding's one ulp, (d) exact (numbers
#: above); the off fractions are not limited there ((d) allows exactly the explained ones).
#: cuda: Triton's wgmma and cuBLAS sum in different orders (and cuBLAS may split K), so more
#: elements flip to the other bf16 neighbour: a flip needs the fp32 sum within ~sqrt(K) u S of a
#: rounding tie, about 1% of elements at K = 4096; g (K = hidden_size) flips as often and moves
#: d_gate/d_up by an ulp there. So no bound on the bitwise fraction there and 5% more than 1 ulp
#: off; (a) holds as on the CPU (its allowance grows with K), and (c) is the check with teeth.
#: (d) is recorded there (tests/kernels/test_triton_gpu.py) but not yet enforced: it assumes IEEE fp32
#: accumulation, which Hopper's wgmma is not documented to do; the limits were set before the
#: allowance covered flips, and the GPU tests pass with them.
ULP_LIMITS = {
    "cpu": dict(max_excess_ulps=1.0, max_off_fraction=None, max_gt1_fraction=None, max_unexplained_fraction=0.0),
    "cuda": dict(max_excess_ulps=16.0, max_off_fraction=None, max_gt1_fraction=0.05, max_unexplained_fraction=None),
}
#: Elements allowed off beyond the fractions above (outputs of a few dozen elements).
SLACK_ELEMENTS = 2
MEAN_Z, MIN_SHIFT = 6.0, 1e-4
#: (c) on CUDA: the tensor cores' fp32 accumulation shrinks a sum's magnitude by about 1e-9 of it
#: per summed product (truncation toward zero), against the same-rounding reference's IEEE fp32
#: sums. Measured on the H200 over the 18 full-size cases (data/validation/triton_full_size_5ff2792.csv):
#: the mean relative shift per summed term was -9.5e-10 to -1.05e-9 for the weight gradients
#: (K = T, 128-8192) and -7.1e-10 for grad_x (K = 2I = 106496; at most -1.4e-9, -1.51e-4 in all),
#: so grad_x sits at MIN_SHIFT. The floor allows 2.5e-9 per term (2.7e-4 for grad_x) for a
#: negative shift only: a 0.1% scaling (1e-3) still fails at every K below 400,000, and any
#: growth above MIN_SHIFT fails.
TC_SHIFT_PER_TERM = 2.5e-9
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
    unexplained_fraction: float = math.nan  # outside [bf16(sum - allowance), bf16(sum + allowance)]

    def __str__(self):
        return (
            f"n={self.n} max={self.max_ulps:.0f} ulp (excess {self.max_excess_ulps:.2f}) "
            f"off={self.off_fraction:.2e} >1ulp={self.gt1_fraction:.2e} "
            f"mean rel={self.mean_rel:.2e} +- {self.se_rel:.1e} unexplained={self.unexplained_fraction:.2e}"
        )


def ulp_stats(
    got: torch.Tensor, ref: torch.Tensor, allowance: torch.Tensor | None = None, sum32: torch.Tensor | None = None
) -> UlpStats:
    """``UlpStats`` of bf16-valued ``got`` against ``ref`` (any float dtypes, same shape), on their
    device: float32 elementwise (differences of nearby bf16 values are exact there), float64 sums.
    With ``sum32`` (the fp32 sum that ``ref`` rounds) and ``allowance``, also the fraction of
    elements that no fp32 sum within the allowance rounds to (``unexplained_fraction``)."""
    g, r = got.detach().flatten().float(), ref.detach().flatten().float()
    n = g.numel()
    if n == 0:
        return UlpStats(0, 0.0, 0.0, 0.0, 0.0, 0.0, math.inf, 0.0)
    unexplained = math.nan
    if sum32 is not None and allowance is not None:
        lo, hi = _neighbours(sum32.detach().flatten().float(), allowance.detach().flatten().float())
        unexplained = int(((g < lo.float()) | (g > hi.float())).sum()) / n
        del lo, hi
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
    return UlpStats(
        n=n,
        max_ulps=max_ulps,
        max_excess_ulps=max_excess,
        off_fraction=off / n,
        gt1_fraction=gt1 / n,
        mean_rel=mean,
        se_rel=se,
        unexplained_fraction=unexplained,
    )


def check_ulps(name, got, ref, seed, allowance=None, device_type=None, sum32=None, terms=None) -> UlpStats:
    """Assert the ulp oracle (a), (b), (c), (d) for one bf16 output ``got`` against its same-rounding
    reference ``ref`` (same shape; ``allowance``: ``same_rounding_fp32``'s, or None for none;
    ``sum32``: the fp32 sums ``ref`` rounds, for (d); ``terms``: the products summed into each
    element (K), which on CUDA raises (c)'s floor to ``TC_SHIFT_PER_TERM`` per term)."""
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: NaN/Inf in output, seed={seed}"
    limits = ULP_LIMITS[device_type or got.device.type]
    s = ulp_stats(got, ref, allowance, sum32)
    where = f"{name}: {s}, seed={seed}"
    assert s.max_excess_ulps <= limits["max_excess_ulps"], f"{where}: beyond {limits['max_excess_ulps']} ulp + fp32 order"
    slack = SLACK_ELEMENTS / max(1, s.n)
    if limits["max_unexplained_fraction"] is not None and sum32 is not None:
        assert s.unexplained_fraction <= limits["max_unexplained_fraction"] + slack, (
            f"{where}: elements that no fp32 sum within the allowance rounds to"
        )
    if limits["max_gt1_fraction"] is not None:
        assert s.gt1_fraction <= limits["max_gt1_fraction"] + slack, f"{where}: too many elements > 1 ulp off"
    if limits["max_off_fraction"] is not None:
        assert s.off_fraction <= limits["max_off_fraction"] + slack, f"{where}: too many elements not bitwise equal"
    floor = MIN_SHIFT
    if terms is not None and (device_type or got.device.type) == "cuda" and s.mean_rel < 0:
        floor = max(MIN_SHIFT, TC_SHIFT_PER_TERM * terms)  # truncation only shrinks
    assert abs(s.mean_rel) <= max(MEAN_Z * s.se_rel, floor), f"{where}: systematic shift (mean > {MEAN_Z} s.e. and > {floor:.2g})"
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


#: Relative distance (of the fp32 value before rounding) from a bf16 rounding boundary within which
#: an elementwise fp32 formula with a transcendental (sigmoid in d_gate, silu when activated_gate
#: is recomputed) may round to the other bf16 neighbour on another device: the kernels' exp and
#: the reference's differ by a few fp32 ulps (2**-23 relative); 2**-18 is 32 of them.
TRANSCENDENTAL_EPS = 2.0**-18


def _neighbours(v32: torch.Tensor, radius: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 roundings of ``v32 - radius`` and ``v32 + radius`` (float32 tensors): every bf16
    value that a float32 within ``radius`` of ``v32`` can round to lies between them."""
    return (v32 - radius).to(torch.bfloat16), (v32 + radius).to(torch.bfloat16)


def _spread(candidates, ref) -> torch.Tensor:
    """max |candidate - ref| elementwise (float32; one candidate at a time: full-size tensors)."""
    out = torch.zeros(ref.shape, dtype=torch.float32, device=ref.device)
    for c in candidates:
        out = torch.maximum(out, (c.float() - ref.float()).abs())
    return out


def intermediate_flips(args, g_ref, g_sum, g_allowance, recomputed_act):
    """How far the kernels' bf16 intermediates may lie from the reference's, elementwise (float32
    [T, I] tensors ``(d_gate, d_up, h)``; None where not needed; and, last, d_gate as recomputed
    here, for the caller to compare with the reference's), from rounding alone:
    g = bf16(grad_output @ down_weight) may round to either neighbour wherever its fp32 sum lies
    within ``g_allowance`` of a rounding boundary, and that moves d_gate = bf16(bf16(g up) silu'(gate))
    and d_up = bf16(g act) at that element; sigmoid/silu in fp32 may round to the other neighbour
    within TRANSCENDENTAL_EPS of a boundary. Each intermediate is recomputed here with the
    reference's formulas (swiglu.reference.reference_backward) from every extreme of its inputs'
    ranges; the formulas are monotone in g and in act, so the extremes bound everything between."""
    _, _, gate, up, act = (reference._flat(a) for a in args[:5])
    gs = [g_ref]
    if g_ref is not None:
        gs += list(_neighbours(g_sum, g_allowance))
    acts = [act]
    if recomputed_act:
        gf = gate.float()
        v = gf * torch.sigmoid(gf)
        acts += list(_neighbours(v, v.abs() * TRANSCENDENTAL_EPS))
    d_gate = d_up = ref_gate = None
    if g_ref is not None:
        s = torch.sigmoid(gate.float())
        slope = 1 + gate * (1 - s)  # the reference's expression, multiplied in its order below

        def pre_round(g):
            return (g * up).float() * s * slope

        ref_gate = pre_round(g_ref).to(torch.bfloat16)

        def gate_candidates():
            for g in gs:
                v = pre_round(g)
                yield v.to(torch.bfloat16)
                yield from _neighbours(v, v.abs() * TRANSCENDENTAL_EPS)

        d_gate = _spread(gate_candidates(), ref_gate)
        d_up = _spread((g * a for g in gs for a in acts), g_ref * act)
    h = _spread([a * up for a in acts], act * up)
    return d_gate, d_up, h, ref_gate


def same_rounding_fp32(args, **needs):
    """``(sums, allowances)``: the bf16 reference's outputs with every final GEMM accumulated in
    fp32 and left unrounded (float32; None where not needed), and each one's allowance for
    ``check_ulps``: the fp32-order bound 2 gamma_K |A| @ |B| plus what an intermediate that may
    round to its other bf16 neighbour can move the sum (``intermediate_flips``: |delta A| @ |B|).
    ``args``: the 8 backward inputs (activated_gate None: ``F.silu(gate_output)``, as the Triton
    path recomputes it).

    The reference's own intermediates (g, d_gate, d_up, h) are used as they are: its GEMMs are
    recorded through ``swiglu.reference._gemm`` (in call order: g; grad_down_weight; grad_x's two;
    grad_gate_weight; grad_up_weight, each only when needed)."""
    args = list(args)
    recomputed_act = args[4] is None
    if recomputed_act:
        args[4] = reference.activated_gate_of(args[2])
    calls, results = [], []
    real = reference._gemm
    reference._gemm = lambda a, b: calls.append((a, b)) or results.append(real(a, b)) or results[-1]
    try:
        out = reference.reference_backward(*args, **needs)
    finally:
        reference._gemm = real
    need_x, need_gate, need_up, need_down = (needs.get(k, True) for k in NEEDS)
    has_g = need_x or need_gate or need_up
    pairs = iter(calls[1:] if has_g else calls)
    groups = {}
    for name, count, flag in (
        ("grad_down_weight", 1, need_down),
        ("grad_x", 2, need_x),
        ("grad_gate_weight", 1, need_gate),
        ("grad_up_weight", 1, need_up),
    ):
        if flag:
            groups[name] = [next(pairs) for _ in range(count)]
    assert next(pairs, None) is None, "swiglu.reference changed its GEMM order: update same_rounding_fp32"
    g_ref = results[0] if has_g else None
    g_pair = [calls[0]] if has_g else None
    flips = intermediate_flips(
        args, g_ref, _fp32_gemm(*calls[0]) if has_g else None, fp32_order_allowance(g_pair) if has_g else None, recomputed_act
    )
    d_gate, d_up, h, ref_gate = flips
    recorded = (
        groups["grad_x"][0][0]
        if "grad_x" in groups
        else groups["grad_gate_weight"][0][0].t()
        if "grad_gate_weight" in groups
        else None
    )
    assert recorded is None or torch.equal(recorded, ref_gate), (
        "swiglu.reference changed its d_gate formula: update intermediate_flips"
    )
    # Which operand of each final GEMM is an intermediate ([T, I]; the weight gradients read it
    # transposed), and how far it may move.
    t = lambda d: None if d is None else d.t()
    moved = {
        "grad_down_weight": [(None, h)],
        "grad_x": [(d_gate, None), (d_up, None)],
        "grad_gate_weight": [(t(d_gate), None)],
        "grad_up_weight": [(t(d_up), None)],
    }
    sums, allowances = [], []
    for name, o in zip(NAMES, out):
        ps = groups.get(name)
        if o is None:
            sums.append(None)
            allowances.append(None)
            continue
        sums.append(sum(_fp32_gemm(a, b) for a, b in ps).reshape(o.shape))
        allowance = fp32_order_allowance(ps)
        for (a, b), (da, db) in zip(ps, moved[name]):
            if da is not None:  # a is the intermediate (or its transpose)
                allowance = allowance + da @ b.float().abs()
            if db is not None:
                allowance = allowance + a.float().abs() @ db
        allowances.append(allowance.reshape(o.shape))
    return sums, allowances


def ulp_norm(o: torch.Tensor) -> float:
    """||bf16 ulp at every element of o|| / ||o||: one rounding step everywhere, relative."""
    return float(bf16_ulp(o).double().norm() / o.double().norm())


def check_output(name, g, r, o, atol, seed, same=None, allowance=None, sum32=None):
    """One output ``g`` against its bf16 reference ``r`` (the benchmark's criterion), its
    same-rounding reference ``same`` (``check_ulps``; default ``r``, for outputs that ``r``
    already rounds once after fp32 accumulation) and its float64 oracle ``o`` (relative error at
    most the worse reference's plus ``ulp_norm(o)``)."""
    same = r if same is None else same
    assert g.shape == r.shape, f"{name}: shape {tuple(g.shape)}, expected {tuple(r.shape)}"
    assert torch.isfinite(g).all(), f"{name}: NaN/Inf in output (unwritten tile?), seed={seed}"
    crit = benchmark_criterion(g, r, atol)
    assert crit.passed, f"{name}: benchmark criterion failed {crit}, seed={seed}"
    check_ulps(name, g, same, seed, allowance, sum32=sum32)
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
    sums, allowances = same_rounding_fp32(args, **needs)  # before args[4] is filled in: it notes the recompute
    args = list(args)
    if args[4] is None:
        args[4] = reference.activated_gate_of(args[2])
    ref = reference_backward(*args, **needs)
    # On a GPU the references wait on the host while the float64 oracle runs, and come back one
    # output at a time: at Hermes' size all at once they need ~78 GB (more than an H100 has).
    ref, sums, allowances = (on_host(ts) for ts in (ref, sums, allowances))
    oracle = on_host(float64_backward(*args))
    for name, g, r, f, a, o in zip(NAMES, got, ref, sums, allowances, oracle):
        assert (g is None) == (r is None), f"{name}: computed={g is not None}, reference computed={r is not None}"
        if g is not None:
            r, f, a, o = (t.to(g.device) for t in (r, f, a, o))
            check_output(name, g.reshape(r.shape), r, o, atol, seed, same=f.to(torch.bfloat16), allowance=a, sum32=f)
            del r, f, a, o


def on_host(tensors) -> list:
    """``tensors`` (None allowed) with the CUDA ones copied to the host: references parked there
    while the float64 oracle needs the GPU's memory."""
    return [t.cpu() if t is not None and t.is_cuda else t for t in tensors]


class BackwardSpy:
    """Wraps ``swiglu.kernels.backward.launch_backward`` (the launcher every Triton backward goes
    through; ``swiglu.ops`` looks it up at each call) and records each call's inputs as they were
    before it (clones: a consuming backward overwrites gate/up), its flags (need_grad_*,
    overwrite_activations, release_activations) and its outputs. Use as a context manager or with ``monkeypatch.setattr(backward_module,
    "launch_backward", spy)``."""

    def __init__(self):
        import swiglu.kernels.backward as module

        self.module, self.real, self.calls = module, module.launch_backward, []

    def __call__(self, tensors, **kw):
        before = [None if a is None else a.detach().clone() for a in tensors]
        out = self.real(tensors, **kw)
        flags = dict(
            zip(NEEDS, kw.get("needs", (True,) * 4)),
            **{k: kw.get(k, False) for k in ("overwrite_activations", "release_activations")},
        )
        self.calls.append((before, flags, out))
        return out

    def __enter__(self):
        self.module.launch_backward = self
        return self

    def __exit__(self, *exc):
        self.module.launch_backward = self.real

    def check_own(self, seed, atol=0.13):
        """Every recorded call's outputs against its own inputs (e.g. a rank's local backward
        under tensor parallelism, before the all-reduce)."""
        assert self.calls, "launch_backward was not called"
        for args, kw, out in self.calls:
            check_args(args, out, seed, atol, **{k: kw[k] for k in NEEDS})

    def check(self, got, seed, atol=0.13):
        """The one recorded call's inputs against ``got`` (the gradients as the caller received
        them, e.g. x.grad and the parameters' .grad, in NAMES order; None where not computed)."""
        assert len(self.calls) == 1, f"{len(self.calls)} calls of launch_backward, expected 1"
        args, kw, _ = self.calls[0]
        check_args(args, got, seed, atol, **{k: kw[k] for k in NEEDS})
