"""The stream-K grad_x kernel (``KernelConfig.stream_k``, ``tl_kernels.grad_x_streamk_kernel``):
whole waves of tiles as in ``grad_x_kernel``, then the last wave and the partial one after it
shared out by k-steps, so tiles are split between two programs and finished by whichever arrives
second. Under TRITON_INTERPRET=1 on a CPU (CI), on the GPU when present; the CPU shapes are chosen
so that program boundaries fall inside tiles, in the gate and in the up half of the k-steps, and
the test checks that they do (a shape without a split would test nothing new).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import swiglu.kernels.backward as backward
from swiglu import make_inputs
from swiglu.kernels.backward import config_for, triton_swiglu_backward
from swiglu.kernels.common import cdiv, tile_programs
from swiglu.workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE

from triton_checks import PAD, SMALL, SMALL_CONFIGS, check, check_args, fresh_seed, guarded_outputs

STREAM_K = replace(SMALL, stream_k=True)


def _splits(device, T, H, I, cfg=STREAM_K) -> tuple[int, int, int]:
    """(whole-wave tiles, stream-K tiles, split tiles in the gate half, in the up half) of the
    launch, as the kernel divides them (the launcher's program count)."""
    tiles = cdiv(T, cfg.BM) * cdiv(H, cfg.BN)
    nprog = tile_programs(torch.device(device), T, H, cfg)
    sk_tiles = nprog + tiles % nprog
    steps = 2 * cdiv(I, cfg.BK)
    total = sk_tiles * steps
    cuts = [(p * total // nprog) % steps for p in range(1, nprog)]
    return tiles - sk_tiles, sum(0 < c < steps // 2 for c in cuts), sum(c >= steps // 2 for c in cuts)


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


# (T, H, I) for 3 programs (CPU): 5 tiles, all stream-K; 10 tiles with ragged last row and column
# tiles, two whole waves first; 8 tiles over a ragged K (I = 440: 7 k-steps per half).
SHAPES = [(7, 264, 200), (70, 264, 200), (100, 200, 440)]


@pytest.mark.parametrize("T,H,I", SHAPES, ids=[f"T{t}_H{h}_I{i}" for t, h, i in SHAPES])
def test_split_tiles_against_float64(device, kernels_launched, T, H, I):
    if device == "cpu":  # on the GPU the programs are the SMs: whether a tile splits depends on the GPU
        _, gate_cuts, up_cuts = _splits(device, T, H, I)
        assert gate_cuts + up_cuts > 0, "no tile is split: the shape tests nothing new"
    seed = fresh_seed()
    inp = make_inputs(1, T, H, I, seed=seed, device=device)
    args = list(inp.as_tuple())
    before = [t.clone() for t in args]
    outs, bufs = guarded_outputs(T, H, I, device)
    got = triton_swiglu_backward(*args, configs={**SMALL_CONFIGS, "grad_x": STREAM_K}, out=outs)
    assert "grad_x_streamk_kernel" in kernels_launched and "grad_x_kernel" not in kernels_launched
    for b in bufs:
        assert torch.isnan(b[:PAD]).all() and torch.isnan(b[-PAD:]).all(), f"store outside its output, seed={seed}"
    for t, b in zip(args, before):
        assert torch.equal(t, b), "an input was modified"
    check_args(before, got, seed)


def test_the_cpu_shapes_split_in_both_halves_and_run_whole_waves():
    """Between them the shapes cut tiles inside the gate k-steps and inside the up k-steps, and
    one runs whole waves before the stream-K part (what the float64 test relies on)."""
    splits = [_splits("cpu", *shape) for shape in SHAPES]
    assert sum(s[1] for s in splits) > 0 and sum(s[2] for s in splits) > 0
    assert any(s[0] > 0 for s in splits)


def test_repeated_runs_are_bitwise_equal(device):
    """The finisher adds two fp32 parts, which commutes: the same bits whichever program arrives
    second."""
    T, H, I = SHAPES[1]
    inp = make_inputs(1, T, H, I, seed=fresh_seed(), device=device)
    runs = [triton_swiglu_backward(*inp.as_tuple(), configs={**SMALL_CONFIGS, "grad_x": STREAM_K}, need_grad_gate_weight=False,
                                   need_grad_up_weight=False, need_grad_down_weight=False)[0] for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("T,H", [(5, 128), (4, 384)], ids=["fewer_tiles_than_programs", "whole_waves"])
def test_tiled_kernel_where_stream_k_has_nothing_to_share(device, kernels_launched, T, H):
    """Fewer tiles than programs (a share shorter than a tile would split it three ways), or
    whole waves (no partial wave to remove): the tiled kernel runs instead."""
    I = 128
    inp = make_inputs(1, T, H, I, seed=fresh_seed(), device=device)
    d = [torch.randn((T, I), device=device, dtype=torch.bfloat16) for _ in range(2)]
    gx = torch.full((T, H), float("nan"), device=device, dtype=torch.bfloat16)
    nprog = 2 if T == 5 else 3  # 2 tiles at H = 128, 6 at 384 (3 programs: two whole waves)
    backward.launch_grad_x(*d, inp.gate_weight, inp.up_weight, gx, STREAM_K, nprog=nprog)
    want = torch.full_like(gx, float("nan"))
    backward.launch_grad_x(*d, inp.gate_weight, inp.up_weight, want, SMALL, nprog=nprog)
    assert kernels_launched == ["grad_x_kernel", "grad_x_kernel"]
    assert torch.equal(gx, want)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2048, 2984, 3376, 8192])
def test_full_size_against_float64(T):
    """Hermes' size with the table's grad_x tile made stream-K (its tiles do not make whole
    waves on 132 SMs at these T), the other kernels as the table has them."""
    seed = fresh_seed()
    cfg = replace(config_for("grad_x", T), stream_k=True)
    dp, gate_cuts, up_cuts = _splits("cuda", T, HIDDEN_SIZE, INTERMEDIATE_SIZE, cfg)
    assert gate_cuts + up_cuts > 0
    inp = make_inputs(1, T, HIDDEN_SIZE, INTERMEDIATE_SIZE, seed=seed, device="cuda")
    got = triton_swiglu_backward(*inp.as_tuple(), configs={"grad_x": cfg})
    check(inp, got, seed)
    again = triton_swiglu_backward(*inp.as_tuple(), configs={"grad_x": cfg})
    assert torch.equal(got[0], again[0]), "grad_x differs between two runs"
