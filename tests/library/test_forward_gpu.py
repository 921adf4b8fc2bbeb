"""The memory-lean mode's forward and recompute on the GPU (H200): ``pytest -m gpu``.

* Bitwise: the activation recomputed by the backward's epilogue (and by the product kernel) is the
  forward's, for the cuBLAS forward and every fused candidate.
* The fused forward's output meets the benchmark's tolerance against nn.Linear's bf16 forward, and
  its error against float64 is at most 2x the plain bf16 forward's, at a mid size and at full size.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from swiglu import CASES, benchmark_criterion, make_inputs, relative_error
from swiglu.kernels import forward as fwd
from swiglu.kernels.backward import triton_swiglu_backward
from swiglu_lab.bench.tables import FUSED_CANDIDATES

from ulp_oracle import check_ulps, ulp_norm

pytestmark = pytest.mark.gpu
CANDIDATES = {"cublas": None, **FUSED_CANDIDATES}
ATOL = min(c.atol for c in CASES)
NAMES = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")


def _seed() -> int:
    return random.SystemRandom().randrange(1 << 31)


def _plain(x, gw, uw, dw):
    gate = F.linear(x, gw)
    return F.linear(F.silu(gate) * F.linear(x, uw), dw)


@pytest.mark.parametrize("tokens", [1, 300])
@pytest.mark.parametrize("candidate", list(CANDIDATES))
def test_recomputed_activation_is_bitwise_the_forwards(candidate, tokens):
    seed = _seed()
    inp = make_inputs(1, tokens, 1024, 2816, device="cuda", seed=seed)
    w = (inp.gate_weight, inp.up_weight, inp.down_weight)
    out, gate, up, act = fwd.triton_swiglu_forward(inp.x, *w, config=CANDIDATES[candidate], return_activated_gate=True)
    act2, h2 = (torch.full((tokens, 2816), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    fwd.launch_swiglu_product(gate.view(tokens, -1), up.view(tokens, -1), h2, act2)
    assert torch.equal(act2, act.view(tokens, -1)), f"seed={seed}"
    assert torch.equal(F.linear(h2, inp.down_weight), out.view(tokens, -1)), f"h differs, seed={seed}"
    given = triton_swiglu_backward(inp.grad_output, inp.x, gate, up, act, *w)
    recomputed = triton_swiglu_backward(inp.grad_output, inp.x, gate, up, None, *w)
    for name, a, b in zip(NAMES, recomputed, given):
        assert torch.equal(a, b), f"{name}: recomputed activated_gate changed the result, seed={seed}"


@pytest.mark.parametrize(
    "shape", [(1, 4096, 14336), (200, 4096, 14336), (1024, 4096, 14336), (256, 16384, 53248)], ids=lambda s: "T%d_H%d_I%d" % s
)
def test_forward_tolerance(shape):
    tokens, H, I = shape
    seed = _seed()
    inp = make_inputs(1, tokens, H, I, device="cuda", seed=seed)
    w = (inp.gate_weight, inp.up_weight, inp.down_weight)
    want = _plain(inp.x, *w)
    oracle = _plain(inp.x.double(), *(t.double() for t in w))
    plain_err = relative_error(want, oracle)
    for name, cfg in CANDIDATES.items():
        got, _, up, act = fwd.triton_swiglu_forward(inp.x, *w, config=cfg, return_activated_gate=True)
        assert torch.isfinite(got).all(), name
        crit = benchmark_criterion(got, want, ATOL)
        assert crit.passed, f"{name}: benchmark criterion failed {crit}, seed={seed}"
        # ulp oracle ("cuda" thresholds) against nn.Linear's down_proj of the forward's own h.
        check_ulps(name, got, F.linear(act * up, inp.down_weight), seed)
        err = relative_error(got, oracle)
        assert err <= plain_err + ulp_norm(oracle), (
            f"{name}: rel error {err:.3e} > plain bf16 {plain_err:.3e} + one ulp, seed={seed}"
        )
