"""make_inputs: shapes, dtypes, distributions, seeding, and the two modes."""

import math
import zlib

import pytest
import torch

from swiglu import make_inputs
from swiglu.inputs import BENCHMARK_SEED
from swiglu.checks import ARG_NAMES, validate_backward_inputs


def _seed(request) -> int:
    return zlib.crc32(request.node.nodeid.encode())


@pytest.mark.parametrize("mode", ["benchmark", "forward"])
def test_shapes_dtypes_and_order(request, mode):
    B, S, H, I = 3, 11, 72, 40
    inp = make_inputs(B, S, H, I, mode=mode, seed=_seed(request))
    shapes = {
        "grad_output": (B, S, H),
        "x": (B, S, H),
        "gate_output": (B, S, I),
        "up_output": (B, S, I),
        "activated_gate": (B, S, I),
        "gate_weight": (I, H),
        "up_weight": (I, H),
        "down_weight": (H, I),
    }
    tensors = inp.as_tuple()
    assert len(tensors) == 8
    for name, t in zip(ARG_NAMES, tensors):
        assert t is getattr(inp, name)  # as_tuple follows the benchmark's argument order
        assert tuple(t.shape) == shapes[name], name
        assert t.dtype == torch.bfloat16, name
        assert t.device.type == "cpu", name
        assert t.is_contiguous(), name
        assert torch.isfinite(t).all(), name
    validate_backward_inputs(*tensors)
    assert make_inputs(1, 2, 8, 16, dtype=torch.float32).x.dtype == torch.float32


def test_benchmark_distributions(request):
    """Activations N(0, 1); weights randn / sqrt(fan_in), fan_in = last dim (loose statistics)."""
    H, I = 256, 576
    inp = make_inputs(4, 64, H, I, seed=_seed(request))
    for name in ("grad_output", "x", "gate_output", "up_output", "activated_gate"):
        t = getattr(inp, name).float()
        assert abs(t.mean().item()) < 0.02, name
        assert t.std().item() == pytest.approx(1.0, rel=0.03), name
    for name, fan_in in (("gate_weight", H), ("up_weight", H), ("down_weight", I)):
        t = getattr(inp, name).float()
        assert abs(t.mean().item()) * math.sqrt(fan_in) < 0.02, name
        assert t.std().item() == pytest.approx(1 / math.sqrt(fan_in), rel=0.03), name


def test_benchmark_activations_are_independent(request):
    inp = make_inputs(2, 128, 64, 96, seed=_seed(request))
    gate, up, act = (t.float().flatten() for t in (inp.gate_output, inp.up_output, inp.activated_gate))
    # activated_gate is its own N(0, 1) draw, not silu(gate_output)
    silu = torch.nn.functional.silu(inp.gate_output)
    assert not torch.equal(inp.activated_gate, silu)
    assert (inp.activated_gate < 0).float().mean() > 0.4  # silu is >= -0.279; N(0,1) often isn't
    assert inp.activated_gate.float().min() < -1.0
    # and uncorrelated with the other activations (|r| ~ 1/sqrt(24576) = 0.006)
    for a, b in ((gate, act), (gate, up), (up, act)):
        r = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
        assert abs(r) < 0.05
    assert not torch.equal(inp.x, inp.grad_output)


def test_forward_mode_is_a_real_forward_pass(request):
    """gate_output, up_output and activated_gate are the forward pass over x, checked against the
    same formula in float64 (not make_inputs' own bf16 expressions): each element the correctly
    rounded bf16 of the exact value, up to the fp32 summation-order bound and an ulp (ulp oracle)."""
    from ulp_oracle import check_ulps, fp32_order_allowance

    inp = make_inputs(2, 9, 72, 40, mode="forward", seed=_seed(request))
    x = inp.x.double().reshape(-1, 72)
    for name, w in (("gate_output", inp.gate_weight), ("up_output", inp.up_weight)):
        exact = x @ w.double().t()
        check_ulps(
            name,
            getattr(inp, name).reshape(-1, 40),
            exact.to(torch.bfloat16),
            _seed(request),
            fp32_order_allowance([(x, w.double().t())]),
        )
    g = inp.gate_output.double()
    check_ulps("activated_gate", inp.activated_gate, (g / (1 + torch.exp(-g))).to(torch.bfloat16), _seed(request))
    assert not torch.equal(inp.gate_output, inp.up_output)
    assert not torch.equal(inp.grad_output, inp.x)


@pytest.mark.parametrize("mode", ["benchmark", "forward"])
def test_seeds_are_reproducible_and_distinct(mode):
    a = make_inputs(2, 5, 24, 40, mode=mode, seed=123)
    b = make_inputs(2, 5, 24, 40, mode=mode, seed=123)
    c = make_inputs(2, 5, 24, 40, mode=mode, seed=124)
    for name, ta, tb, tc in zip(ARG_NAMES, a.as_tuple(), b.as_tuple(), c.as_tuple()):
        assert torch.equal(ta, tb), name
        assert not torch.equal(ta, tc), name
    default = make_inputs(2, 5, 24, 40, mode=mode)  # the benchmark's seed, 200
    assert torch.equal(default.x, make_inputs(2, 5, 24, 40, mode=mode, seed=BENCHMARK_SEED).x)


def test_generator_gives_fresh_inputs_per_call(request):
    gen = torch.Generator().manual_seed(_seed(request))
    first = make_inputs(1, 4, 24, 40, generator=gen, seed=7)  # generator wins over seed
    second = make_inputs(1, 4, 24, 40, generator=gen)
    assert not torch.equal(first.x, second.x)
    replay = torch.Generator().manual_seed(_seed(request))
    assert torch.equal(make_inputs(1, 4, 24, 40, generator=replay).x, first.x)
    assert not torch.equal(make_inputs(1, 4, 24, 40, seed=7).x, first.x)


def test_global_rng_when_seed_is_none():
    torch.manual_seed(99)
    a = make_inputs(1, 3, 8, 16, seed=None)
    torch.manual_seed(99)
    b = make_inputs(1, 3, 8, 16, seed=None)
    c = make_inputs(1, 3, 8, 16, seed=None)
    assert torch.equal(a.x, b.x)
    assert not torch.equal(b.x, c.x)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(batch_size=0), "batch_size must be a positive int, got 0"),
        (dict(seq_len=-3), "seq_len must be a positive int, got -3"),
        (dict(intermediate_size=0), "intermediate_size must be a positive int"),
        (dict(mode="backward"), "mode must be one of .*'backward'"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = dict(batch_size=1, seq_len=2, hidden_size=8, intermediate_size=16)
    args.update(kwargs)
    mode = args.pop("mode", "benchmark")
    with pytest.raises(ValueError, match=message):
        make_inputs(**args, mode=mode)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(hidden_size=2.5), r"hidden_size must be a positive int, got 2.5 \(float\)"),
        (dict(batch_size=True), r"batch_size must be a positive int, got True \(bool\)"),
        (dict(seq_len="4"), r"seq_len must be a positive int, got '4' \(str\)"),
    ],
)
def test_sizes_of_another_type(kwargs, message):
    args = dict(batch_size=1, seq_len=2, hidden_size=8, intermediate_size=16)
    args.update(kwargs)
    with pytest.raises(TypeError, match=message):
        make_inputs(**args)
