"""The split-tail grad_x kernel (``KernelConfig.split_tail``, ``tl_kernels.grad_x_split_tail_kernel``):
whole waves of tiles as in ``grad_x_kernel``, then each tile of a last partial wave split over K
among several programs, its runs added in order by whichever program finishes last. Under
TRITON_INTERPRET=1 on a CPU (CI), on the GPU when present; the CPU shapes are chosen so that a
run boundary falls inside the gate and inside the up half of the k-steps, and the tests check
that they do (a shape without a split tests nothing new).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import swiglu.kernels.backward as backward
from swiglu import make_inputs
from swiglu.kernels.backward import config_for, triton_swiglu_backward
from swiglu.kernels.devices import cdiv, tile_programs
from swiglu.workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE

from triton_checks import PAD, SMALL, SMALL_CONFIGS, check, check_args, fresh_seed, guarded_outputs

SPLIT = replace(SMALL, split_tail=True)


def _plan(device, T, H, I, cfg=SPLIT, nprog=None) -> tuple[int, int, list[int]]:
    """(whole-wave tiles, tail tiles, the runs' first k-steps, as the kernel cuts them) of the
    launch the launcher makes (``backward.grad_x_tail_splits``)."""
    nprog = nprog or tile_programs(torch.device(device), T, H, cfg)
    tail, splits = backward.grad_x_tail_splits(T, H, I, cfg, nprog)
    steps = 2 * cdiv(I, cfg.BK)
    whole = cdiv(T, cfg.BM) * cdiv(H, cfg.BN) - tail
    return whole, tail, [r * steps // splits for r in range(splits)] if splits > 1 else []


@pytest.fixture
def kernels_launched(monkeypatch):
    """The names of the tl kernels launched (``backward.launch``'s first argument)."""
    names = []
    real = backward.launch

    def spy(kernel, *args, **kw):
        names.append(getattr(kernel, "__name__", None) or kernel.fn.__name__)
        return real(kernel, *args, **kw)

    monkeypatch.setattr(backward, "launch", spy)
    return names


# (T, H, I) for 3 programs (CPU), one tail tile in 3 runs each: one whole wave first (runs cut at
# k-steps 2 and 5 of 8: inside the gate half and inside the up half); ragged last row and column
# tiles after three whole waves; a ragged K (I = 440: 7 k-steps per half) after one. (A launch has
# at most one program per tile, so a tail always follows whole waves; test_more_programs_than_k_steps_allow
# runs one tile over more programs.)
SHAPES = [(7, 256, 200), (70, 264, 200), (100, 120, 440)]


@pytest.mark.parametrize("T,H,I", SHAPES, ids=[f"T{t}_H{h}_I{i}" for t, h, i in SHAPES])
def test_split_tiles_against_float64(device, kernels_launched, T, H, I):
    if device == "cpu":  # on the GPU the programs are the SMs: whether the tail splits depends on the GPU
        assert _plan(device, T, H, I)[2], "no tile is split: the shape tests nothing new"
    seed = fresh_seed()
    inp = make_inputs(1, T, H, I, seed=seed, device=device)
    args = list(inp.as_tuple())
    before = [t.clone() for t in args]
    outs, bufs = guarded_outputs(T, H, I, device)
    got = triton_swiglu_backward(*args, configs={**SMALL_CONFIGS, "grad_x": SPLIT}, out=outs)
    if device == "cpu":
        assert "grad_x_split_tail_kernel" in kernels_launched and "grad_x_kernel" not in kernels_launched
    for b in bufs:
        assert torch.isnan(b[:PAD]).all() and torch.isnan(b[-PAD:]).all(), f"store outside its output, seed={seed}"
    for t, b in zip(args, before):
        assert torch.equal(t, b), "an input was modified"
    check_args(before, got, seed)


def test_the_cpu_shapes_cut_both_halves():
    """Between them the shapes cut a tile inside its gate k-steps and inside its up k-steps, after
    one whole wave and after several (what the float64 test relies on)."""
    plans = [(_plan("cpu", T, H, I), cdiv(I, SMALL.BK)) for T, H, I in SHAPES]
    cuts = [(c, half) for (_, _, firsts), half in plans for c in firsts[1:]]
    assert any(c < half for c, half in cuts) and any(c > half for c, half in cuts)
    assert {p[0][0] // 3 for p in plans} >= {1, 3}


@pytest.mark.parametrize("nprog,I", [(8, 200), (8, 64)], ids=["8_runs", "runs_capped_by_k_steps"])
def test_more_programs_than_k_steps_allow(device, kernels_launched, nprog, I):
    """One tile over 8 programs: 8 runs of one k-step each (I = 200), or as many runs as there are
    k-steps (I = 64: 2), the other programs idle; the result is grad_x's to the reference's error."""
    T, H = 7, 64
    seed = fresh_seed()
    inp = make_inputs(1, T, H, I, seed=seed, device=device)
    d = [torch.randn((T, I), device=device, dtype=torch.bfloat16) for _ in range(2)]
    gx = torch.full((T, H), float("nan"), device=device, dtype=torch.bfloat16)
    backward.launch_grad_x(*d, inp.gate_weight, inp.up_weight, gx, SPLIT, nprog=nprog)
    assert kernels_launched == ["grad_x_split_tail_kernel"]
    want = d[0].double() @ inp.gate_weight.double() + d[1].double() @ inp.up_weight.double()
    bf16 = want.to(torch.bfloat16).double()  # the reference's own rounding error, per element
    err, ref_err = (gx.double() - want).abs(), (bf16 - want).abs()
    assert torch.isfinite(gx).all() and (err <= 2 * ref_err + 1e-6 * want.abs().max()).all(), f"seed={seed}"


def test_repeated_runs_are_bitwise_equal(device):
    """The finisher adds the runs in run order: the same bits whichever program arrives last."""
    T, H, I = SHAPES[1]
    inp = make_inputs(1, T, H, I, seed=fresh_seed(), device=device)
    runs = [
        triton_swiglu_backward(
            *inp.as_tuple(),
            configs={**SMALL_CONFIGS, "grad_x": SPLIT},
            need_grad_gate_weight=False,
            need_grad_up_weight=False,
            need_grad_down_weight=False,
        )[0]
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("T,H", [(70, 256), (4, 384)], ids=["tail_over_half_the_programs", "whole_waves"])
def test_tiled_kernel_where_the_tail_has_nothing_to_split(device, kernels_launched, T, H):
    """A last wave of 2 tiles on 3 programs (a split would leave it as long), or whole waves: the
    tiled kernel runs instead, the same bits as without split_tail."""
    I = 128
    inp = make_inputs(1, T, H, I, seed=fresh_seed(), device=device)
    d = [torch.randn((T, I), device=device, dtype=torch.bfloat16) for _ in range(2)]
    gx, want = (torch.full((T, H), float("nan"), device=device, dtype=torch.bfloat16) for _ in range(2))
    assert _plan(device, T, H, I, nprog=3)[2] == []
    backward.launch_grad_x(*d, inp.gate_weight, inp.up_weight, gx, SPLIT, nprog=3)
    backward.launch_grad_x(*d, inp.gate_weight, inp.up_weight, want, SMALL, nprog=3)
    assert kernels_launched == ["grad_x_kernel", "grad_x_kernel"]
    assert torch.equal(gx, want)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [3376, 6284, 8192])
def test_full_size_against_float64(T):
    """Hermes' size with the table's grad_x tile made split-tail (a last wave of 12, 32 and 4
    tiles on the H200's 132 SMs), the other kernels as the table has them; twice, bitwise."""
    seed = fresh_seed()
    cfg = replace(config_for("grad_x", T), split_tail=True)
    assert _plan("cuda", T, HIDDEN_SIZE, INTERMEDIATE_SIZE, cfg)[2]
    inp = make_inputs(1, T, HIDDEN_SIZE, INTERMEDIATE_SIZE, seed=seed, device="cuda")
    got = triton_swiglu_backward(*inp.as_tuple(), configs={"grad_x": cfg})
    check(inp, got, seed)
    again = triton_swiglu_backward(*inp.as_tuple(), configs={"grad_x": cfg})
    assert torch.equal(got[0], again[0]), "grad_x differs between two runs"
