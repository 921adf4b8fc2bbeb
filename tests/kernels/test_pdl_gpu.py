"""Programmatic dependent launch (``swiglu.kernels.launch.PDL``) on the GPU: the same bits as plain
launches in every kernel of the forward and the backward, eagerly and replayed from a CUDA graph
(``pytest -m gpu``; the CPU side is in tests/kernels/test_direct_launch.py and the sm_90 compile tests)."""

from __future__ import annotations

import pytest
import torch

from swiglu import make_inputs, reference_backward
from swiglu.accuracy import benchmark_criterion
from swiglu.kernels import backward, forward, launch
from swiglu_lab.bench.tables import FUSED_CANDIDATES

pytestmark = pytest.mark.gpu
NAMES = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")


@pytest.fixture
def restore_pdl():
    saved = launch.PDL
    yield
    launch.set_pdl(saved)


def _poisoned(T, H, I):
    return tuple(torch.full(s, float("nan"), device="cuda", dtype=torch.bfloat16) for s in ((T, H), (I, H), (I, H), (H, I)))


def _poison_pool(T, H, I):
    """NaN in the caching allocator's free blocks of the backward's internal sizes ([T, I] d_gate,
    d_up, h): a kernel reading one before its producer finished would then see NaN, not the
    previous run's equal values."""
    bufs = [torch.full((T, I), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    bufs += [torch.full((T, H), float("nan"), device="cuda", dtype=torch.bfloat16)]
    del bufs


def _backward(tensors, T, H, I, lean=False):
    _poison_pool(T, H, I)
    args = list(tensors)
    if lean:
        args[4] = None  # activated_gate recomputed in the dSwiGLU epilogue
    return backward.triton_swiglu_backward(*args, out=_poisoned(T, H, I))


@pytest.mark.parametrize(
    "T, H, I", [(1, 520, 1176), (77, 384, 520), (300, 1000, 1176), (1500, 4096, 14336), (128, 16384, 53248), (512, 16384, 53248)]
)
def test_pdl_gives_the_bits_of_plain_launches(restore_pdl, T, H, I):
    """The backward (both dSwiGLU kernels' buckets, lean and not) and the fused forward in every
    PDL mode: bitwise equal, every output written, and right by the benchmark's criterion."""
    tensors = make_inputs(1, T, H, I, seed=T + I, device="cuda").as_tuple()
    x, weights = tensors[1], tensors[5:]
    results = {}
    for pdl in launch.PDL_MODES:
        launch.set_pdl(pdl)
        results[pdl] = (
            *_backward(tensors, T, H, I),
            *_backward(tensors, T, H, I, lean=True),
            *forward.triton_swiglu_forward(x, *weights, config=FUSED_CANDIDATES["fused_128"], return_activated_gate=True),
        )
    torch.cuda.synchronize()
    for mode in launch.PDL_MODES[1:]:
        for i, (a, b) in enumerate(zip(results[0], results[mode])):
            assert not torch.isnan(b).any(), f"output {i} with PDL {mode} left NaN (unwritten)"
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"output {i} differs with PDL {mode}, T={T} H={H} I={I}"
    for name, got, ref in zip(NAMES, results[1], reference_backward(*tensors)):
        assert benchmark_criterion(got, ref, 0.13).passed, name


@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("T, H, I", [(300, 1000, 1176), (256, 16384, 53248)])
def test_pdl_launches_replay_from_a_cuda_graph(restore_pdl, T, H, I, mode):
    """The backward captured in a CUDA graph with PDL launches (programmatic edges) and replayed on
    new inputs copied into the captured buffers: the eager backward's bits on those inputs."""
    launch.set_pdl(mode)
    static = [t.clone() for t in make_inputs(1, T, H, I, seed=T, device="cuda").as_tuple()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compiles, plans, fills the launch cache
        _backward(static, T, H, I)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = backward.triton_swiglu_backward(*static)
    fresh = make_inputs(1, T, H, I, seed=T + 1, device="cuda").as_tuple()
    for buf, new in zip(static, fresh):
        buf.copy_(new)
    for out in captured:
        out.fill_(float("nan"))
    graph.replay()
    want = _backward(fresh, T, H, I)
    torch.cuda.synchronize()
    for name, got, w in zip(NAMES, captured, want):
        assert torch.equal(got.view(torch.int16), w.view(torch.int16)), f"{name}: the replay differs, T={T}"
