"""swiglu_moe inside the tools users wrap around it: torch.compile, the custom ops' contracts
(opcheck), FlopCounterMode, autocast."""

import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import swiglu
from swiglu.moe import moe_backward, moe_forward, moe_reference_backward, moe_reference_op

T, H, I, E, K = 11, 32, 48, 4, 2


def _inputs(seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    w, idx = torch.softmax(torch.randn(T, E, generator=g), -1).topk(K)
    gu = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).to(dtype)
    dp = (torch.randn(E, H, I, generator=g) / I**0.5).to(dtype)
    return x, idx, w, gu, dp


def _grads(fn, x, idx, w, gu, dp, go):
    leaves = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
    out = fn(leaves[0], idx, leaves[1], leaves[2], leaves[3])
    return (out, *torch.autograd.grad(out, leaves, go))


def test_compile_fullgraph_is_bitwise_the_eager_triton_path():
    """... and warns of nothing (Dynamo warns where it traces a call of an lru_cache-wrapped
    function: the cached device checks run uncached while compiling)."""
    x, idx, w, gu, dp = _inputs(11)
    go = torch.randn(T, H).bfloat16()
    eager = _grads(lambda *a: swiglu.swiglu_moe(*a, impl="triton"), x, idx, w, gu, dp, go)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: swiglu.swiglu_moe(*a, impl="triton"), fullgraph=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _grads(compiled, x, idx, w, gu, dp, go)
    assert not [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph_breaks_allowed"])
def test_compiled_autograd_is_bitwise_the_eager_triton_path(fullgraph):
    """An eager forward, its backward traced by compiled autograd (the eager carrier's backward
    takes the backward op there)."""
    x, idx, w, gu, dp = _inputs(14)
    go = torch.randn(T, H).bfloat16()
    eager = _grads(lambda *a: swiglu.swiglu_moe(*a, impl="triton"), x, idx, w, gu, dp, go)
    leaves = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
    out = swiglu.swiglu_moe(leaves[0], idx, leaves[1], leaves[2], leaves[3], impl="triton")
    torch._dynamo.reset()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=fullgraph)):
        out.backward(go)
    torch._dynamo.reset()
    for name, leaf, want in zip(("x", "top_k_weights", "gate_up_proj", "down_proj"), leaves, eager[1:]):
        assert torch.equal(leaf.grad, want), name


def test_flop_counter_around_the_backward_alone_counts_its_gemms():
    """A forward outside the mode (the eager carrier), its backward inside: the backward op runs."""
    x, idx, w, gu, dp = _inputs(15)
    x.requires_grad_()
    out = swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton")
    with FlopCounterMode(display=False) as counter:
        out.sum().backward()
    assert counter.get_total_flops() == 6 * T * K * H * I  # g and grad_x's two: only x is trained


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_flop_counter_with_trained_biases_counts_the_gemms(impl):
    """Both biases trained beside every input: the backward ops get the biases' flags after the
    four weights' (the reference's once failed to unpack them); the biases add no GEMM."""
    x, idx, w, gu, dp = _inputs(19)
    g = torch.Generator().manual_seed(20)
    biases = [(0.5 * torch.randn(*shape, generator=g)).bfloat16().requires_grad_() for shape in ((E, 2 * I), (E, H))]
    leaves = [t.requires_grad_() for t in (x, w, gu, dp)]
    with FlopCounterMode(display=False) as counter:
        out = swiglu.swiglu_moe(*leaves[:1], idx, *leaves[1:], impl=impl, gate_up_proj_bias=biases[0], down_proj_bias=biases[1])
        out.sum().backward()
    assert counter.get_total_flops() == 9 * 2 * T * K * H * I  # three forward GEMMs, six backward
    assert all(b.grad is not None and b.grad.abs().sum() > 0 for b in biases)


@pytest.mark.parametrize("limit, alpha", [(0.25, None), (None, 1.702), (0.25, 1.702)], ids=["limit", "alpha", "both"])
def test_swiglu_limit_and_alpha_through_the_ops_and_compile(limit, alpha):
    """``swiglu_limit`` and ``swiglu_alpha`` as the ops' float arguments: opcheck of all four ops
    with them, and torch.compile(fullgraph=True) of the Triton path bitwise its eager result (the
    limit binding), of the reference close to its eager result."""
    x, idx, w, gu, dp = _inputs(16)
    act = {"swiglu_limit": limit, "swiglu_alpha": alpha}
    torch.library.opcheck(
        moe_forward,
        (x, idx, w, gu, dp, limit, alpha),
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )
    out, gate, up, order, start = moe_forward(x, idx, w, gu, dp, limit, alpha)
    torch.library.opcheck(
        moe_backward,
        (torch.randn_like(out), x, idx, w, gu, dp, gate, up, order, start, True, True, True, True, limit, alpha),
        test_utils=("test_schema", "test_faketensor"),
    )
    leaves = [t.detach().requires_grad_() for t in (x, w, gu, dp)]
    torch.library.opcheck(
        moe_reference_op, (leaves[0], idx, *leaves[1:], limit, alpha), test_utils=("test_schema", "test_faketensor")
    )
    grad_out = torch.randn(x.shape).to(x.dtype)
    torch.library.opcheck(
        moe_reference_backward, (grad_out, idx, leaves, [True] * 4, limit, alpha), test_utils=("test_schema", "test_faketensor")
    )
    go = torch.randn(T, H).bfloat16()
    eager = _grads(lambda *a: swiglu.swiglu_moe(*a, impl="triton", **act), x, idx, w, gu, dp, go)
    free = _grads(lambda *a: swiglu.swiglu_moe(*a, impl="triton"), x, idx, w, gu, dp, go)
    assert not torch.equal(eager[0], free[0])
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: swiglu.swiglu_moe(*a, impl="triton", **act), fullgraph=True)
    for a, b in zip(_grads(compiled, x, idx, w, gu, dp, go), eager):
        assert torch.equal(a, b)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: swiglu.swiglu_moe(*a, impl="reference", **act), fullgraph=True)
    want = _grads(lambda *a: swiglu.swiglu_moe(*a, impl="reference", **act), x, idx, w, gu, dp, go)
    for a, b in zip(_grads(compiled, x, idx, w, gu, dp, go), want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_compiled_calls_with_changing_limit_and_alpha(impl):
    """torch.compile(fullgraph=True) with swiglu_limit and swiglu_alpha as arguments that change
    between calls (a float traced after the first: the checks are comparisons it can trace):
    every call bitwise its eager result."""
    x, idx, w, gu, dp = _inputs(16)
    torch._dynamo.reset()

    def f(x, limit, alpha):
        return swiglu.swiglu_moe(x, idx, w, gu, dp, impl=impl, swiglu_limit=limit, swiglu_alpha=alpha)

    compiled = torch.compile(f, fullgraph=True)
    for limit, alpha in ((1.0, 1.702), (0.5, 0.9), (2.0, 3.0)):
        assert torch.equal(compiled(x, limit, alpha), f(x, limit, alpha)), (limit, alpha)
    torch._dynamo.reset()


@pytest.mark.parametrize("weights", ["contiguous", "column_major"])
def test_opcheck_forward_and_backward_ops(weights):
    x, idx, w, gu, dp = _inputs(12)
    if weights == "column_major":  # each expert's matrix stored transposed: the gradients keep that layout
        gu, dp = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (gu, dp))
    torch.library.opcheck(
        moe_forward, (x, idx, w, gu, dp), test_utils=("test_schema", "test_faketensor", "test_autograd_registration")
    )
    out, gate, up, order, start = moe_forward(x, idx, w, gu, dp)
    torch.library.opcheck(
        moe_backward,
        (torch.randn_like(out), x, idx, w, gu, dp, gate, up, order, start),
        test_utils=("test_schema", "test_faketensor"),
    )
    # The reference's ops, as compiled: bf16 tokens and experts, an fp32 router, x column-major too.
    if weights == "column_major":
        x = x.t().contiguous().t()
    x, w, gu, dp = (t.detach().requires_grad_() for t in (x, w, gu, dp))
    torch.library.opcheck(
        moe_reference_op, (x, idx, w, gu, dp), test_utils=("test_schema", "test_faketensor", "test_autograd_registration")
    )
    grad_out = torch.randn(x.shape).to(x.dtype)
    torch.library.opcheck(
        moe_reference_backward,
        (grad_out, idx, [x, w, gu, dp], [True, False, True, True]),
        test_utils=("test_schema", "test_faketensor"),
    )
    with FlopCounterMode(display=False) as counter:  # as a compiled graph's ops are counted
        moe_reference_op(x, idx, w, gu, dp)
        moe_reference_backward(grad_out, idx, [x, w, gu, dp], [True] * 4)
    assert counter.get_total_flops() == 18 * T * K * H * I


@pytest.mark.parametrize("trained, backward_gemms", [("all", 6), ("x", 3), ("down_proj", 2)])
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_flop_counter_counts_the_gemms_that_run(impl, trained, backward_gemms):
    """Forward: three GEMMs of 2 H I FLOPs per routed pair. Backward: those the requested
    gradients run (Triton: g always, grad_x's two, grad_gate_up_proj's two, grad_down_proj's
    one), so frozen experts (LoRA) are not counted as trained."""
    x, idx, w, gu, dp = _inputs(13)
    leaves = {"x": x, "w": w, "gate_up_proj": gu, "down_proj": dp}
    for name in leaves if trained == "all" else [trained]:
        leaves[name].requires_grad_()
    with FlopCounterMode(display=False) as counter:
        out = swiglu.swiglu_moe(x, idx, w, gu, dp, impl=impl)
    assert counter.get_total_flops() == 6 * T * K * H * I
    with FlopCounterMode(display=False) as counter:
        out.float().sum().backward()
    if impl == "triton" or trained != "down_proj":  # the reference's autograd needs no g for grad_down_proj
        assert counter.get_total_flops() == backward_gemms * 2 * T * K * H * I


def test_autocast_casts_x_and_the_expert_weights():
    x, idx, w, gu, dp = _inputs(14, torch.float32)
    leaves = [t.clone().requires_grad_() for t in (x, gu, dp)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = swiglu.swiglu_moe(leaves[0], idx, w, leaves[1], leaves[2], impl="reference")
    assert out.dtype == torch.bfloat16
    expected = swiglu.swiglu_moe(x.bfloat16(), idx, w, gu.bfloat16(), dp.bfloat16(), impl="reference")
    assert torch.equal(out, expected)
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in leaves)


def test_biases_and_interleaved_rows_through_the_ops_and_compile():
    """gpt-oss's arguments (both biases, interleaved rows, limit and alpha): opcheck of all four
    ops with them; torch.compile(fullgraph=True) and compiled autograd of the Triton path bitwise
    its eager gradients, the biases' included; the compiled reference close to its eager result.
    (Concatenated rows with biases differ only in the kernels' constexprs: test_moe_bias.py.)"""
    interleaved = True
    x, idx, w, gu, dp = _inputs(17)
    g = torch.Generator().manual_seed(18)
    bgu = (0.5 * torch.randn(E, 2 * I, generator=g)).bfloat16()
    bd = (0.5 * torch.randn(E, H, generator=g)).bfloat16()
    limit, alpha = 7.0, 1.702
    torch.library.opcheck(
        moe_forward,
        (x, idx, w, gu, dp, limit, alpha, bgu, bd, interleaved),
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )
    out, gate, up, order, start = moe_forward(x, idx, w, gu, dp, limit, alpha, bgu, bd, interleaved)
    back = (torch.randn_like(out), x, idx, w, gu, dp, gate, up, order, start, True, True, True, True, limit, alpha)
    torch.library.opcheck(moe_backward, (*back, interleaved, True, bd, True), test_utils=("test_schema", "test_faketensor"))
    leaves = [t.detach().requires_grad_() for t in (x, w, gu, dp)]
    torch.library.opcheck(
        moe_reference_op,
        (leaves[0], idx, *leaves[1:], limit, alpha, bgu, bd, interleaved),
        test_utils=("test_schema", "test_faketensor"),
    )
    kw = dict(swiglu_limit=limit, swiglu_alpha=alpha, interleaved=interleaved)
    go = torch.randn(T, H).bfloat16()

    def grads(fn, impl):
        ts = [t.clone().requires_grad_() for t in (x, w, gu, dp, bgu, bd)]
        y = fn(ts[0], idx, *ts[1:4], impl=impl, gate_up_proj_bias=ts[4], down_proj_bias=ts[5], **kw)
        return (y, *torch.autograd.grad(y, ts, go))

    eager = grads(swiglu.swiglu_moe, "triton")
    plain = swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton", swiglu_limit=limit, swiglu_alpha=alpha)
    assert not torch.equal(eager[0], plain)
    torch._dynamo.reset()
    compiled = torch.compile(swiglu.swiglu_moe, fullgraph=True)
    for name, a, b in zip(("out", "x", "w", "gu", "dp", "bgu", "bd"), grads(compiled, "triton"), eager):
        assert torch.equal(a, b), name
    torch._dynamo.reset()
    ts = [t.clone().requires_grad_() for t in (x, w, gu, dp, bgu, bd)]
    y = swiglu.swiglu_moe(ts[0], idx, *ts[1:4], impl="triton", gate_up_proj_bias=ts[4], down_proj_bias=ts[5], **kw)
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=True)):
        y.backward(go)
    torch._dynamo.reset()
    for name, t, want in zip(("x", "w", "gu", "dp", "bgu", "bd"), ts, eager[1:]):
        assert torch.equal(t.grad, want), name
    want = grads(swiglu.swiglu_moe, "reference")
    for a, b in zip(grads(torch.compile(swiglu.swiglu_moe, fullgraph=True), "reference"), want):
        torch.testing.assert_close(a, b)
    torch._dynamo.reset()
