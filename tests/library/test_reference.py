"""The bf16 reference backward against the float64 oracle, its order of operations, and its
input/output contract (inputs untouched, outputs fresh), on small and odd shapes (CPU)."""

import zlib

import pytest
import torch

import swiglu
from swiglu import benchmark_criterion, float64_backward, make_inputs, reference_backward, relative_error
from swiglu.workloads import CASES, RTOL

OUTPUT_NAMES = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")
# (batch_size, seq_len): tokens 1, 7 and 211 (prime, not a tile multiple) and one batch > 1.
LEADING = [(1, 1), (7, 1), (1, 211), (3, 37)]
# (hidden_size, intermediate_size): none a multiple of 64.
SHAPES = [(200, 344), (72, 40)]
# The bf16 reference is ~4e-3 from float64 here (bf16 epsilon 2^-8 = 3.9e-3); 1e-2 leaves room
# for rounding, while a zero, transposed or mis-ordered output lands near 1.
REL_ERROR_BOUND = 1e-2
# The strictest atol among the 18 cases.
ATOL = min(c.atol for c in CASES)


def _seed(request) -> int:
    """A different, reproducible seed for every test (from its id)."""
    return zlib.crc32(request.node.nodeid.encode())


def _inputs(request, batch_size, seq_len, hidden_size, intermediate_size, mode="benchmark", flatten=False):
    inp = make_inputs(batch_size, seq_len, hidden_size, intermediate_size, mode=mode, seed=_seed(request))
    args = list(inp.as_tuple())
    if flatten:
        args[:5] = [t.reshape(-1, t.shape[-1]) for t in args[:5]]
    return args


@pytest.mark.parametrize("mode", ["benchmark", "forward"])
@pytest.mark.parametrize("flatten", [False, True], ids=["bsh", "th"])
@pytest.mark.parametrize("hidden_size,intermediate_size", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("batch_size,seq_len", LEADING, ids=lambda v: str(v))
def test_reference_matches_float64(request, batch_size, seq_len, hidden_size, intermediate_size, flatten, mode):
    args = _inputs(request, batch_size, seq_len, hidden_size, intermediate_size, mode, flatten)
    outs = swiglu.swiglu_mlp_backward(*args, impl="reference")
    oracle = float64_backward(*args)
    T, H, I = batch_size * seq_len, hidden_size, intermediate_size
    expected_shapes = [tuple(args[1].shape), (I, H), (I, H), (H, I)]
    for name, out, ref, shape in zip(OUTPUT_NAMES, outs, oracle, expected_shapes):
        assert tuple(out.shape) == shape, name
        assert out.dtype == torch.bfloat16, name
        assert ref.dtype == torch.float64, name
        # The oracle is far from zero: its RMS is well above the criterion's atol, and an
        # all-zero output fails both checks below.
        assert ref.pow(2).mean().sqrt() > 2 * ATOL, name
        assert relative_error(torch.zeros_like(out), ref) == pytest.approx(1.0)
        assert not benchmark_criterion(torch.zeros_like(out), ref, ATOL).passed, name

        err = relative_error(out, ref)
        assert err < REL_ERROR_BOUND, f"{name}: relative error {err:.3e} (T={T}, H={H}, I={I})"
        crit = benchmark_criterion(out, ref, ATOL, RTOL)
        assert crit.passed, f"{name}: {crit}"
        assert crit.nonfinite == 0


def test_leading_dims_and_flattened_give_the_same_bits(request):
    args = _inputs(request, 3, 37, 200, 344)
    flat = [t.reshape(-1, t.shape[-1]) for t in args[:5]] + args[5:]
    outs_3d = reference_backward(*args)
    outs_2d = reference_backward(*flat)
    assert outs_3d[0].shape == (3, 37, 200)
    assert outs_2d[0].shape == (111, 200)
    assert torch.equal(outs_3d[0].reshape(111, 200), outs_2d[0])
    for a, b in zip(outs_3d[1:], outs_2d[1:]):
        assert torch.equal(a, b)


def _documented_order(go, x, gate, up, act, gate_weight, up_weight, down_weight):
    """docs/problem.md, "The reference computation", written out again step by step."""
    go, x = go.reshape(-1, go.shape[-1]), x.reshape(-1, x.shape[-1])
    gate, up, act = (t.reshape(-1, t.shape[-1]) for t in (gate, up, act))
    g = torch.mm(go, down_weight)  # 1. bf16 GEMM
    h = torch.mul(act, up)  # 2. bf16
    grad_down_weight = torch.mm(go.t(), h)
    d_act = torch.mul(g, up)  # 3. bf16
    d_up = torch.mul(g, act)
    s = torch.sigmoid(gate.to(torch.float32))  # 4. fp32, rounded to bf16 once at the end
    d_gate = (d_act.to(torch.float32) * s * (1 + gate.to(torch.float32) * (1 - s))).to(torch.bfloat16)
    grad_x = torch.add(torch.mm(d_gate, gate_weight), torch.mm(d_up, up_weight))  # 5. bf16 add
    return grad_x, torch.mm(d_gate.t(), x), torch.mm(d_up.t(), x), grad_down_weight, d_up


@pytest.mark.parametrize("mode", ["benchmark", "forward"])
def test_reference_is_the_documented_bf16_order_bit_for_bit(request, mode):
    args = _inputs(request, 2, 53, 200, 344, mode)
    outs = reference_backward(*args)
    *expected, d_up = _documented_order(*args)
    for name, out, exp in zip(OUTPUT_NAMES, outs, expected):
        assert torch.equal(out.reshape(exp.shape), exp), f"{name} differs from the documented bf16 order"

    # d_up = (go @ down_weight) * activated_gate, both in bf16: grad_up_weight is exactly d_up.T @ x.
    go, x = args[0].reshape(-1, 200), args[1].reshape(-1, 200)
    g = go @ args[7]
    assert g.dtype == torch.bfloat16
    assert torch.equal(d_up, g * args[4].reshape(-1, 344))
    assert torch.equal(outs[2], d_up.t() @ x)

    # The comparison can tell orders apart: keeping g * up_output in fp32 (one rounding less)
    # changes the bits of grad_gate_weight.
    gate, up = args[2].reshape(-1, 344).float(), args[3].reshape(-1, 344).float()
    s = torch.sigmoid(gate)
    d_gate_fused = (g.float() * up * s * (1 + gate * (1 - s))).to(torch.bfloat16)
    assert not torch.equal(outs[1], d_gate_fused.t() @ x)


def test_reference_uses_activated_gate_as_given(request):
    """Benchmark inputs have activated_gate independent of gate_output; the reference must not
    recompute silu(gate_output)."""
    args = _inputs(request, 1, 64, 72, 40)
    outs = reference_backward(*args)
    recomputed = list(args)
    recomputed[4] = torch.nn.functional.silu(args[2])
    assert not torch.equal(outs[2], reference_backward(*recomputed)[2])


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("flatten", [False, True], ids=["bsh", "th"])
def test_inputs_unchanged_and_outputs_fresh(request, flatten):
    args = _inputs(request, 2, 7, 200, 344, flatten=flatten)
    before = [t.clone() for t in args]
    outs = swiglu.swiglu_mlp_backward(*args, impl="reference")
    for name, t, b in zip(swiglu.checks.ARG_NAMES, args, before):
        # bitwise: compare the raw 16-bit patterns
        assert torch.equal(t.view(torch.int16), b.view(torch.int16)), f"{name} was modified"
    in_storages = {_storage(t) for t in args}
    out_storages = [_storage(o) for o in outs]
    assert len(set(out_storages)) == len(outs), "outputs alias each other"
    for name, o in zip(OUTPUT_NAMES, outs):
        assert _storage(o) not in in_storages, f"{name} aliases an input"
        for t in args:
            assert o.data_ptr() != t.data_ptr()


@pytest.mark.parametrize("flatten", [False, True], ids=["bsh", "th"])
def test_float64_oracle_is_autograd_of_the_formula_and_leaves_float64_inputs_alone(request, flatten):
    """The oracle against float64 autograd of out = down(silu(gate(x)) * up(x)) (its own
    arithmetic, not ours); with float64 inputs (which it uses without a copy, freeing and
    rewriting its own tensors in place) nothing the caller passed changes and no output aliases
    an input."""
    args = [t.double() for t in _inputs(request, 2, 7, 200, 344, flatten=flatten)]
    grad_output, x, _, _, _, gw, uw, dw = args
    leaves = [t.clone().requires_grad_() for t in (x, gw, uw, dw)]
    gate, up = leaves[0] @ leaves[1].t(), leaves[0] @ leaves[2].t()
    out = (torch.nn.functional.silu(gate) * up) @ leaves[3].t()
    expected = torch.autograd.grad(out, leaves, grad_output)
    args[2:5] = [t.detach() for t in (gate, up, torch.nn.functional.silu(gate))]
    before = [t.clone() for t in args]
    oracle = float64_backward(*args)
    # Inputs that require grad: the same values, and no graph (its in-place steps would break one)
    tracked = float64_backward(*[t.clone().requires_grad_() for t in args])
    assert not any(t.requires_grad for t in tracked)
    assert all(torch.equal(a, b) for a, b in zip(tracked, oracle))
    for name, got, want in zip(OUTPUT_NAMES, oracle, expected):
        assert got.dtype == torch.float64 and got.shape == want.shape, name
        # float64 rounding apart (~1e-16 per step); a 1e-9 change of any term fails
        assert relative_error(got, want) < 1e-12, f"{name}: {relative_error(got, want):.2e}"
    for name, t, b in zip(swiglu.checks.ARG_NAMES, args, before):
        assert torch.equal(t, b), f"{name} was modified"
    in_storages = {_storage(t) for t in args}
    assert not in_storages & {_storage(o) for o in oracle}, "an output aliases an input"


def test_fresh_inputs_per_test(request):
    """Two tests never see the same inputs: seeds come from the test id."""
    a = make_inputs(1, 4, 72, 40, seed=_seed(request))
    b = make_inputs(1, 4, 72, 40, seed=zlib.crc32(b"another test"))
    assert not torch.equal(a.x, b.x)


def test_non_contiguous_inputs(request):
    """Any strides are accepted: transposed-storage weights and sliced activations give the
    reference's answer up to bf16 rounding of a different GEMM summation order."""
    args = _inputs(request, 2, 29, 200, 344)
    strided = list(args)
    # weights stored transposed (column-major)
    strided[5:] = [w.t().contiguous().t() for w in args[5:]]
    # activations as slices of wider buffers (row stride != last dim)
    for i in range(5):
        t = args[i]
        wide = torch.full((*t.shape[:-1], t.shape[-1] + 8), float("nan"), dtype=t.dtype)
        wide[..., 3 : 3 + t.shape[-1]] = t
        strided[i] = wide[..., 3 : 3 + t.shape[-1]]
    assert not any(t.is_contiguous() for t in strided)
    outs = swiglu.swiglu_mlp_backward(*strided, impl="reference")
    oracle = float64_backward(*args)
    for name, out, ref in zip(OUTPUT_NAMES, outs, oracle):
        assert torch.isfinite(out).all(), name
        assert relative_error(out, ref) < REL_ERROR_BOUND, name


def _padded_view(t: torch.Tensor, fill: float, column_major: bool) -> torch.Tensor:
    """t's values in a view into a wider buffer filled with ``fill``: 8 elements before and 32
    after each row (each column when column_major)."""
    if column_major:
        return _padded_view(t.t(), fill, False).t()
    wide = torch.full((*t.shape[:-1], t.shape[-1] + 40), fill, dtype=t.dtype)
    view = wide[..., 8 : 8 + t.shape[-1]]
    view.copy_(t)
    return view


@pytest.mark.parametrize("fill", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("weights", ["row_strided", "column_major"])
@pytest.mark.parametrize("flatten", [False, True], ids=["bsh", "th"])
def test_views_into_non_finite_buffers_give_the_bits_of_finite_ones(request, flatten, weights, fill):
    """All eight inputs as views into wider buffers (activations row-strided, weights row-strided
    or column-major) whose padding is NaN or Inf: the padding is never read, so the outputs are
    finite and bitwise those of the same views into zero-padded buffers. On AMX CPUs the bf16 GEMM
    reads a row-strided first operand past each row's end (here grad_output in grad_output @
    down_weight, K = H = 200): NaN in every output but grad_down_weight."""
    args = _inputs(request, 3, 37, 200, 344, flatten=flatten)
    column_major = [i >= 5 and weights == "column_major" for i in range(8)]
    poisoned = [_padded_view(t, fill, c) for t, c in zip(args, column_major)]
    zeroed = [_padded_view(t, 0.0, c) for t, c in zip(args, column_major)]
    assert not any(t.is_contiguous() for t in poisoned)
    for name, out, want in zip(OUTPUT_NAMES, reference_backward(*poisoned), reference_backward(*zeroed)):
        assert torch.isfinite(out).all(), f"{name}: a strided view's padding reached the result"
        assert torch.equal(out, want), f"{name}: the result depends on what the padding holds"


def test_benchmark_criterion_passes_an_empty_pair_and_still_fails_a_mismatch():
    """A T = 0 backward's grad_x is [0, H]: nothing mismatches, so it passes (it read 0 matched of
    0 as a fraction of 0 and failed); a non-empty pair with too many wrong elements still fails."""
    empty = torch.empty(0, 16, dtype=torch.bfloat16)
    r = benchmark_criterion(empty, empty.float(), atol=1e-3)
    assert r.passed and r.match_fraction == 1.0
    ref = torch.randn(64, 16)
    bad = ref.clone()
    bad.view(-1)[: int(0.02 * bad.numel()) + 1] += 10.0  # more than the 1% the criterion allows
    assert not benchmark_criterion(bad, ref, atol=1e-3).passed
    assert benchmark_criterion(ref.clone(), ref, atol=1e-3).passed
