"""The stream-K dSwiGLU kernel (``KernelConfig.stream_k``, ``tl_kernels.dswiglu_streamk_kernel``):
the (tile, k-step) iterations shared equally among the programs, so tiles are split between two
programs and finished by whichever arrives second. Under TRITON_INTERPRET=1 on a CPU (CI), on the
GPU when present; the shapes are chosen so that program boundaries fall inside tiles, and the test
checks that they do (a shape without a split would test nothing new).
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


def _split_tiles(device, T, H, I, cfg=STREAM_K) -> int:
    """How many tiles the launch splits between two programs (the launcher's program count)."""
    tiles, k_tiles = cdiv(T, cfg.BM) * cdiv(I, cfg.BN), cdiv(H, cfg.BK)
    nprog = tile_programs(torch.device(device), T, I, cfg)
    total = tiles * k_tiles
    return sum((p * total // nprog) % k_tiles != 0 for p in range(1, nprog))


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


# (T, H, I): 7 column tiles of 4 k-steps over 3 programs (CPU) split two tiles; a ragged last
# row tile and column tile; two row tiles.
SHAPES = [(7, 200, 440), (70, 136, 200), (100, 264, 200)]


@pytest.mark.parametrize("T,H,I", SHAPES, ids=[f"T{t}_H{h}_I{i}" for t, h, i in SHAPES])
@pytest.mark.parametrize("recompute", [False, True], ids=["act_read", "act_recomputed"])
def test_split_tiles_against_float64(device, kernels_launched, T, H, I, recompute):
    if device == "cpu":  # on the GPU the programs are the SMs: whether a tile splits depends on the GPU
        assert _split_tiles(device, T, H, I) > 0, "no tile is split: the shape tests nothing new"
    seed = fresh_seed()
    inp = make_inputs(1, T, H, I, seed=seed, device=device)
    args = list(inp.as_tuple())
    if recompute:
        args[4] = None
    before = [None if t is None else t.clone() for t in args]
    outs, bufs = guarded_outputs(T, H, I, device)
    got = triton_swiglu_backward(*args, configs={**SMALL_CONFIGS, "dswiglu": STREAM_K}, out=outs)
    assert "dswiglu_streamk_kernel" in kernels_launched and "dswiglu_gemm_kernel" not in kernels_launched
    for b in bufs:
        assert torch.isnan(b[:PAD]).all() and torch.isnan(b[-PAD:]).all(), f"store outside its output, seed={seed}"
    for t, b in zip(args, before):
        assert t is None or torch.equal(t, b), "an input was modified"
    check_args(before, got, seed)  # activated_gate None: against bf16(silu(gate_output))


def test_repeated_runs_are_bitwise_equal(device):
    """The finisher adds two fp32 parts, which commutes: the same bits whichever program arrives
    second."""
    T, H, I = SHAPES[0]
    inp = make_inputs(1, T, H, I, seed=fresh_seed(), device=device)
    runs = [triton_swiglu_backward(*inp.as_tuple(), configs={**SMALL_CONFIGS, "dswiglu": STREAM_K})
            for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_overwriting_activations_gives_the_same_bits(device):
    """overwrite_activations: d_gate and d_up over gate_output and up_output. A split tile's
    epilogue runs once, after both parts: it reads each gate/up element before writing there."""
    T, H, I = SHAPES[0]
    inp = make_inputs(1, T, H, I, seed=fresh_seed(), device=device)
    cfg = {**SMALL_CONFIGS, "dswiglu": STREAM_K}
    want = triton_swiglu_backward(*inp.as_tuple(), configs=cfg)
    args = [t.clone() for t in inp.as_tuple()]
    got = triton_swiglu_backward(*args, configs=cfg, overwrite_activations=True)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


def test_fewer_tiles_than_programs_runs_the_tiled_kernel(device, kernels_launched):
    """A launch with fewer tiles than programs (each range shorter than a tile's k-steps would
    split a tile three ways): the tiled kernel runs instead."""
    T, H, I = 5, 200, 64
    inp = make_inputs(1, T, H, I, seed=fresh_seed(), device=device)
    flat = [t.reshape(T, -1) for t in (inp.grad_output, inp.gate_output, inp.up_output, inp.activated_gate)]
    d = [torch.empty((T, I), device=device, dtype=torch.bfloat16) for _ in range(3)]
    backward.launch_dswiglu(flat[0], inp.down_weight, *flat[1:], *d, STREAM_K, nprog=2)  # 2 programs, 1 tile
    assert kernels_launched == ["dswiglu_gemm_kernel"]


@pytest.mark.gpu
@pytest.mark.parametrize("T", [128, 256, 300])
def test_full_size_against_float64(T):
    """Hermes' size with the table's tl dSwiGLU tile made stream-K: 132 programs split tiles of
    256 k-steps (checked), the other kernels as the table has them."""
    seed = fresh_seed()
    cfg = replace(config_for("dswiglu", T), stream_k=True)
    assert _split_tiles("cuda", T, HIDDEN_SIZE, INTERMEDIATE_SIZE, cfg) > 0
    inp = make_inputs(1, T, HIDDEN_SIZE, INTERMEDIATE_SIZE, seed=seed, device="cuda")
    got = triton_swiglu_backward(*inp.as_tuple(), configs={"dswiglu": cfg})
    check(inp, got, seed)
