"""Shared helpers for the tests of ``swiglu.swiglu_moe`` (test_moe.py, test_moe_kernels.py,
test_moe_gpu.py): inputs, one forward and backward through the public op, and the check of a bf16
result against the float64 oracle, bounded by the bf16 reference's own error.

The check (``failures``) takes each output and gradient (and each expert's slice of the weight
gradients) and asks two things of it against the float64 oracle ``o``:

1. **norm**: ``||got - o|| <= 2 ||ref - o|| + floor``, the bf16 reference's error doubled, the
   floor one bf16 rounding (2**-9) per element in norm divided by sqrt(n) (it matters for a
   handful of elements only, where the reference's error is itself a lucky draw); for
   grad_top_k_weights, dot products whose terms can nearly cancel, the floor is in units of the
   terms' size (``top_k_weights_terms``), not of the cancelled result's;
2. **no systematic scale** against the reference (tensors of at least 64 elements):
   the least-squares scale ``s = <got - ref, o> / <o, o>`` of the difference from the bf16
   reference along the oracle within ``SHIFT_Z`` standard errors (``_scale_error``) plus
   ``SHIFT_FLOOR``. Both round the same intermediates (h, the GEMM outputs) alike, so their
   shared error cancels from ``s`` and its noise is small. A 0.1% scaling of an fp32 result before its rounding moves ``s`` by 1e-3,
   which the norm alone cannot see: one bf16 rounding already costs ~1.6e-3 in norm. Scaling an
   already rounded bf16 value by 1.001 changes nothing (the change is below half an ulp).
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, fields

import torch

import swiglu
from swiglu.moe import moe_float64

#: The outputs of one forward and backward, in the order ``moe_float64`` returns them.
NAMES = ("out", "grad_x", "grad_top_k_weights", "grad_gate_up_proj", "grad_down_proj")
FACTOR = 2.0
SHIFT_Z = 5.0
SHIFT_FLOOR = 2e-5
SMALL_N = 16
BF16_U = 2.0**-9


def fresh_seed() -> int:
    """A new seed per check (fresh inputs every run), printed in failure messages;
    ``SWIGLU_TEST_SEED=<seed>`` replays one."""
    return int(os.environ.get("SWIGLU_TEST_SEED") or random.SystemRandom().randrange(1 << 31))


@dataclass
class MoEInputs:
    x: torch.Tensor  # [T, H] (or [B, S, H])
    top_k_index: torch.Tensor  # x's leading dims + [k]
    top_k_weights: torch.Tensor
    gate_up_proj: torch.Tensor  # [E, 2I, H]
    down_proj: torch.Tensor  # [E, H, I]
    grad_out: torch.Tensor  # x's shape

    def args(self):
        return self.x, self.top_k_index, self.top_k_weights, self.gate_up_proj, self.down_proj

    def tensors(self):
        return [getattr(self, f.name) for f in fields(self)]

    def flat(self):
        """(x [T, H], top_k_index [T, k], top_k_weights [T, k], gate_up_proj, down_proj, grad_out [T, H])."""
        H, k = self.x.shape[-1], self.top_k_index.shape[-1]
        return (
            self.x.reshape(-1, H),
            self.top_k_index.reshape(-1, k),
            self.top_k_weights.reshape(-1, k),
            self.gate_up_proj,
            self.down_proj,
            self.grad_out.reshape(-1, H),
        )


def routing(gen, T, E, k, kind="balanced", dtype=torch.int64):
    """[T, k] expert ids: ``balanced`` (k distinct uniform experts per token), ``skewed`` (k distinct
    experts drawn with weights exp(2 * N(0, 1)): a few hot experts, some cold or empty), ``one``
    (every pair on expert 0: with k > 1 a duplicate in every row), or ``dup`` (balanced, then each token's last
    choice replaced by its first: a duplicate in every row)."""
    if kind == "one":
        idx = torch.zeros(T, k, dtype=torch.int64)
    elif kind in ("balanced", "dup"):
        idx = torch.rand(T, E, generator=gen).argsort(dim=1)[:, :k]
        if kind == "dup":
            idx[:, -1] = idx[:, 0]
    elif kind == "skewed":
        probs = torch.exp(2 * torch.randn(E, generator=gen)).expand(T, E)
        idx = torch.multinomial(probs, k, replacement=False, generator=gen) if T else torch.zeros(0, k, dtype=torch.int64)
    else:
        raise ValueError(kind)
    return idx.to(dtype)


def make_moe(
    seed,
    T,
    H,
    I,
    E,
    k,
    *,
    kind="balanced",
    lead=None,
    weights_dtype=torch.float32,
    index_dtype=torch.int64,
    dtype=torch.bfloat16,
    device="cpu",
) -> MoEInputs:
    """Random inputs of a size where every output is O(1): weights ~ N(0, 1/fan_in), routing
    weights a softmax over k (positive, as a router's), grad_out ~ N(0, 1). ``lead``: x's leading
    dims (their product T), default (T,)."""
    gen = torch.Generator().manual_seed(seed)
    lead = tuple(lead) if lead is not None else (T,)
    assert math.prod(lead) == T
    idx = routing(gen, T, E, k, kind, index_dtype)
    x = torch.randn(*lead, H, generator=gen)
    w = torch.softmax(torch.randn(T, k, generator=gen), dim=-1)
    gu = torch.randn(E, 2 * I, H, generator=gen) * H**-0.5
    dp = torch.randn(E, H, I, generator=gen) * I**-0.5
    go = torch.randn(*lead, H, generator=gen)
    return MoEInputs(
        x.to(device, dtype),
        idx.reshape(*lead, k).to(device),
        w.reshape(*lead, k).to(device, weights_dtype),
        gu.to(device, dtype),
        dp.to(device, dtype),
        go.to(device, dtype),
    )


def run(inp: MoEInputs, impl: str, **kwargs):
    """``(out, grad_x, grad_top_k_weights, grad_gate_up_proj, grad_down_proj)`` of one forward
    and backward of ``swiglu.swiglu_moe`` on leaf copies of the inputs."""
    x, idx, w, gu, dp = (t.detach().clone() for t in inp.args())
    leaves = [t.requires_grad_(True) for t in (x, w, gu, dp)]
    out = swiglu.swiglu_moe(x, idx, w, gu, dp, impl=impl, **kwargs)
    out.backward(inp.grad_out)
    return (out.detach(), *(t.grad for t in leaves))


def oracle(inp: MoEInputs, swiglu_limit=None, swiglu_alpha=None, interleaved=False):
    """``moe_float64``'s outputs and gradients, reshaped to the inputs' shapes."""
    x, idx, w, gu, dp, go = inp.flat()
    res = moe_float64(x, idx, w, gu, dp, go, swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha, interleaved=interleaved)
    shapes = (inp.x.shape, inp.x.shape, inp.top_k_weights.shape, gu.shape, dp.shape)
    return tuple(r.reshape(s) for r, s in zip(res, shapes))


def top_k_weights_terms(inp: MoEInputs, swiglu_limit=None, swiglu_alpha=None, gate_up_proj_bias=None,
                        down_proj_bias=None, interleaved=False) -> torch.Tensor:  # fmt: skip
    """float64, top_k_weights' shape: the root-sum-square over H of grad_out[t] * y (y the pair's
    output with its bias, before its weight), the terms that grad_top_k_weights[t, j] sums. The
    sum's rounding errors scale with this, not with the sum, which is small where the terms cancel
    (at T = 1, a 2-element result can sit 8x below it); without cancellation the norms are alike."""
    x, idx, w, gu, dp, go = inp.flat()
    E, k = gu.shape[0], idx.shape[1]
    rss = []
    for j in range(k):  # pair j alone with weight one: the other ids out of range, which the oracle skips
        idx_j = torch.where(torch.arange(k, device=idx.device) == j, idx, E)
        y = moe_float64(x, idx_j, torch.ones_like(w), gu, dp, None, swiglu_limit, swiglu_alpha, gate_up_proj_bias,
                        down_proj_bias, interleaved)  # fmt: skip
        rss.append((go.double() * y).norm(dim=1))
    return torch.stack(rss, dim=1).reshape(inp.top_k_weights.shape)


def binding_limit(inp: MoEInputs, quantile: float = 0.7) -> float:
    """A ``swiglu_limit`` that binds: bf16-exact (a multiple of 1/8, at least 1/8), at the
    ``quantile`` of |gate| and |up| over the first 256 tokens and 4 experts (about a third of the
    values clamped; a sample, so that it fits at full size)."""
    x, idx, w, gu, dp, go = inp.flat()
    q = torch.quantile((x[:256].float() @ gu[:4].float().flatten(0, 1).T).abs().flatten(), quantile)
    return max(0.125, round(float(q) * 8) / 8)


def same_rounding(inp: MoEInputs, swiglu_limit=None, swiglu_alpha=None, gate_up_proj_bias=None, down_proj_bias=None,
                  interleaved=False):  # fmt: skip
    """The formula with the Triton kernels' roundings (fp32 sums, bf16 where they store bf16:
    gate, up, silu(gate), h, the pair's y before and after its routing weight, d_gate, d_up,
    h * w, each pair's grad_x row, the sums over k), in torch: what the kernels compute up to the
    order of their fp32 sums. The scale check compares with it, so its noise is that of the sums'
    order, not that of the bf16 reference's different roundings. ``swiglu_limit``: the clamps,
    against the limit rounded to bf16 as the kernels take it; ``swiglu_alpha``: the gpt-oss form,
    act = bf16(gate * sigmoid(alpha * gate)) times up + 1. The biases (gate_up_proj's added to
    the rounded product and rounded again; down_proj's weighted rows summed per token in fp32 with
    the pairs' y, one rounding into out, here as the [T, E] routing matrix times the bias) append
    their gradients;
    ``interleaved``: gate, up rows alternate."""
    x, idx, w, gu, dp, go = (t.detach() for t in inp.flat())
    L = None if swiglu_limit is None else float(torch.tensor(swiglu_limit, dtype=torch.bfloat16))
    T, H = x.shape
    k, E, I = idx.shape[1], gu.shape[0], dp.shape[2]
    b = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
    xf, gof, wf = x.float(), go.float(), w.float()
    dev = x.device
    y = torch.zeros(T, k, H, device=dev)
    dx = torch.zeros(T, k, H, device=dev)
    gw = torch.zeros(T, k, device=dev)
    ggu, gdp = torch.zeros(gu.shape, device=dev), torch.zeros(dp.shape, device=dev)
    gbgu = torch.zeros(E, 2 * I, device=dev)
    for e in range(E):
        tok, pos = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        we, ge, de = wf[tok, pos, None], gu[e].float(), dp[e].float()
        gi, ui = (slice(0, None, 2), slice(1, None, 2)) if interleaved else (slice(0, I), slice(I, None))
        gate_raw, up_raw = b(xf[tok] @ ge[gi].T), b(xf[tok] @ ge[ui].T)
        if gate_up_proj_bias is not None:
            bgu = gate_up_proj_bias[e].float()
            gate_raw, up_raw = b(gate_raw + bgu[gi]), b(up_raw + bgu[ui])
        gate, up = (gate_raw, up_raw) if L is None else (gate_raw.clamp(max=L), up_raw.clamp(-L, L))
        a = 1.0 if swiglu_alpha is None else swiglu_alpha
        factor = up if swiglu_alpha is None else up + 1
        sg = torch.sigmoid(a * gate)
        act = b(gate * sg)
        h = b(act * factor)
        y[tok, pos] = b(b(h @ de.T) * we)
        g = gof[tok] @ de
        gw[tok, pos] = (g * h).sum(1)
        g = g * we
        d_gate, d_up = g * factor * sg * (1 + a * gate * (1 - sg)), g * act
        if L is not None:
            d_gate, d_up = d_gate * (gate_raw <= L), d_up * (up_raw.abs() <= L)
        dgu = torch.stack([b(d_gate), b(d_up)], dim=-1).flatten(1) if interleaved else torch.cat([b(d_gate), b(d_up)], dim=1)
        ggu[e] = dgu.T @ xf[tok]
        gbgu[e] = dgu.sum(0)
        gdp[e] = gof[tok].T @ b(h * we)
        dx[tok, pos] = b(dgu @ ge)
    bf = torch.bfloat16
    out = y.sum(1)
    extra = [gbgu.to(bf)] if gate_up_proj_bias is not None else []
    if down_proj_bias is not None:
        ids = torch.where((idx >= 0) & (idx < E), idx.long(), E)
        dense = torch.zeros(T, E + 1, device=dev).scatter_add(1, ids, wf)[:, :E]
        bd = down_proj_bias.float()
        out = out + dense @ bd
        gw = gw + (gof @ bd.T).gather(1, idx.long().clamp(0, E - 1)) * ((idx >= 0) & (idx < E))
        extra.append((dense.T @ gof).to(bf))
    res = (out.to(bf), dx.sum(1).to(bf), gw.to(w.dtype), ggu.to(bf), gdp.to(bf))
    shapes = (inp.x.shape, inp.x.shape, inp.top_k_weights.shape, gu.shape, dp.shape)
    return tuple(r.reshape(s) for r, s in zip(res, shapes)) + tuple(extra)


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().double()
    return t.reshape(-1, t.shape[-1]) if t.dim() else t.reshape(1, 1)


def _scale_error(d: torch.Tensor, o: torch.Tensor) -> tuple[float, float]:
    """``(s, se)``: the least-squares scale of the difference ``d`` along ``o`` (``<d, o> / <o, o>``)
    and its standard error from the rest of ``d``, taken as the largest of three estimates: the
    elements as independent, the rows as independent, the columns as independent (a rounding
    error in a shared operand, e.g. one pair's h in a rank-1 weight gradient, moves a whole row
    or column)."""
    oo = float((o * o).sum())
    s = float((d * o).sum()) / oo
    p = (d - s * o) * o
    return s, max(float(p.norm()), float(p.sum(0).norm()), float(p.sum(1).norm())) / oo


def bound_failure(
    name: str,
    got: torch.Tensor,
    ref: torch.Tensor,
    o: torch.Tensor,
    same: torch.Tensor | None = None,
    ref_rel: float = 0.0,
    terms_norm: float = 0.0,
) -> str | None:
    """Why ``got`` fails the check against the oracle ``o`` given the bf16 reference ``ref``
    (None: it passes); the scale check against ``same`` (``same_rounding``'s) when given, else
    ``ref``. ``ref_rel``: a relative error the reference is known to have on the whole tensor this
    is a slice of (the bound takes the larger). ``terms_norm``: the norm of the summed terms
    (``top_k_weights_terms``'), the floor's scale where above the oracle's. See the module's
    docstring."""
    if got.shape != o.shape:
        return f"{name}: shape {tuple(got.shape)}, expected {tuple(o.shape)}"
    if not torch.isfinite(got).all():
        return f"{name}: {int((~torch.isfinite(got)).sum())} non-finite elements"
    n = got.numel()
    if n == 0:
        return None
    g, r, o = _as_2d(got), _as_2d(ref), _as_2d(o)
    err, ref_err, norm = float((g - o).norm()), float((r - o).norm()), float(o.norm())
    ref_err = max(ref_err, ref_rel * norm)
    if norm == 0:
        return None if err == 0 else f"{name}: oracle is zero, got an error of norm {err:.3e}"
    floor = BF16_U * max(norm, terms_norm) * (n**-0.5 + SMALL_N / n)
    if err > FACTOR * ref_err + floor:
        return f"{name}: relative error {err / norm:.3e} > {FACTOR} x reference's {ref_err / norm:.3e} + floor {floor / norm:.1e}"
    if n >= 64:
        s, se = _scale_error(g - (r if same is None else _as_2d(same)), o)
        if abs(s) > SHIFT_Z * se + SHIFT_FLOOR:
            return (
                f"{name}: scaled by {s:+.3e} against the reference along the oracle (s.e. {se:.1e}, "
                f"limit {SHIFT_Z} s.e. + {SHIFT_FLOOR:.0e})"
            )
    return None


def failures(got, ref, oracle_, same=None, *, experts=True, top_k_terms=None) -> list[str]:
    """Every failing check of the outputs ``got`` (``NAMES`` order) against the oracle, bounded by
    the bf16 reference ``ref``; with ``experts``, also each expert's slice of the weight gradients
    on its own (an expert that the oracle gives a zero gradient must have exactly zero). A slice's
    bound is at least the reference's relative error on the whole gradient: an expert with one or
    two pairs has a rank-1 or -2 gradient whose few shared roundings make the reference's error on
    it a noisy sample (2x it failed about one seed in a hundred at 64 experts and 10 pairs), while
    its scale check against ``same`` still catches a 0.1% error in that expert. ``top_k_terms``:
    ``top_k_weights_terms``' result, grad_top_k_weights' floor (None: the oracle's norm)."""
    bad = []
    same = same or (None,) * len(NAMES)
    for name, g, r, o, sr in zip(NAMES, got, ref, oracle_, same):
        if g.dtype != r.dtype:
            bad.append(f"{name}: dtype {g.dtype}, reference has {r.dtype}")
        terms = float(top_k_terms.norm()) if top_k_terms is not None and name == "grad_top_k_weights" else 0.0
        bad.append(bound_failure(name, g, r, o, sr, terms_norm=terms))
        if experts and name in ("grad_gate_up_proj", "grad_down_proj"):
            o64 = o.detach().double()
            norm = float(o64.norm())
            rel = float((r.detach().double() - o64).norm()) / norm if norm else 0.0
            for e in range(o.shape[0]):
                bad.append(bound_failure(f"{name}[{e}]", g[e], r[e], o[e], None if sr is None else sr[e], rel))
    return [b for b in bad if b]


def assert_matches(got, ref, oracle_, seed, same=None, **kwargs):
    bad = failures(got, ref, oracle_, same, **kwargs)
    assert not bad, f"seed={seed}: " + "; ".join(bad)


def check_impl(inp: MoEInputs, impl: str, seed, swiglu_limit=None, swiglu_alpha=None, **kwargs):
    """Run ``impl`` and the reference on ``inp`` and check the former; returns its outputs."""
    got = run(inp, impl, swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha)
    ref = run(inp, "reference", swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha)
    same = same_rounding(inp, swiglu_limit, swiglu_alpha)
    terms = top_k_weights_terms(inp, swiglu_limit, swiglu_alpha)
    assert_matches(got, ref, oracle(inp, swiglu_limit, swiglu_alpha), seed, same, top_k_terms=terms, **kwargs)
    return got, ref
