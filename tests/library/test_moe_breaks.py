"""Adversarial probes of ``swiglu.swiglu_moe`` and its Hugging Face backend, as a hostile but
realistic user would call them (CPU; the Triton path under TRITON_INTERPRET=1, tiny shapes).

The first group are problems these probes found (each fixed, its test kept; one known limit stays
``xfail(strict=True)`` with the reason); the others cover behaviours probed and found right where no
other test covers them."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import swiglu
import swiglu.kernels.moe as kmoe

from moe_checks import check_impl, make_moe

T, H, I, E, K = 6, 32, 32, 4, 2


def _inputs(seed=3, **kwargs):
    inp = make_moe(seed, kwargs.pop("T", T), H, I, E, K, **kwargs)
    return inp


def _leaves(inp, grads=(True, True, True, True)):
    x, idx, w, gu, dp = (t.detach().clone() for t in inp.args())
    x, w, gu, dp = (t.requires_grad_(g) for t, g in zip((x, w, gu, dp), grads))
    return x, idx, w, gu, dp


def _clear_or_works(fn, check, words=("swiglu", "moe")):
    """Either ``fn()`` works and ``check(result)`` holds, or it raises an error whose message names
    the op (a clear error); anything else (a wrong result, an error from torch's internals that
    does not say which op is at fault) fails."""
    try:
        res = fn()
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
        assert any(w in str(exc) for w in words), f"unclear error: {type(exc).__name__}: {str(exc)[:300]}"
        return
    check(res)


# --------------------------------------------------------------------------- problems found


@pytest.mark.parametrize("how", ["func.jvp", "forward_ad"])
def test_forward_mode_ad_triton_is_right_or_raises(how):
    inp = _inputs()
    x, idx, w, gu, dp = inp.args()
    tangent = torch.randn_like(x)

    def jvp(impl):
        f = lambda xx: swiglu.swiglu_moe(xx, idx, w, gu, dp, impl=impl)  # noqa: E731
        if how == "func.jvp":
            return torch.func.jvp(f, (x.clone(),), (tangent,))[1]
        import torch.autograd.forward_ad as fwAD

        with fwAD.dual_level():
            return fwAD.unpack_dual(f(fwAD.make_dual(x.clone(), tangent))).tangent

    expected = jvp("reference")

    def check(got):
        assert got is not None, "tangent dropped (None)"
        assert torch.allclose(got.float(), expected.float(), rtol=0.05, atol=0.05), (
            f"tangent max {got.float().abs().max()} vs reference {expected.float().abs().max()}"
        )

    _clear_or_works(lambda: jvp("triton"), check)


def test_frozen_expert_weights_do_not_launch_weight_gradient_kernels(monkeypatch):
    launches = []
    real = kmoe.launch_wgrad
    monkeypatch.setattr(kmoe, "launch_wgrad", lambda *a, **kw: (launches.append(1), real(*a, **kw))[1])
    x, idx, w, gu, dp = _leaves(_inputs(), grads=(True, False, False, False))
    swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton").float().sum().backward()
    assert x.grad is not None and gu.grad is None and dp.grad is None
    assert launches == [], f"{len(launches)} weight-gradient launches for frozen weights"


@pytest.mark.parametrize("grads", [(False, True, False, False), (False, False, True, False), (False, True, True, True)])
def test_frozen_x_gives_the_other_gradients(grads):
    # x without grad (frozen embeddings, experts trained alone): the backward must not launch
    # grad_x's token sum on an absent operand; the gradients asked for are the reference's.
    inp = _inputs()
    grad_out = torch.randn(T, H, dtype=inp.x.dtype)
    got, want = (_leaves(inp, grads) for _ in range(2))
    swiglu.swiglu_moe(*got, impl="triton").backward(grad_out)
    swiglu.swiglu_moe(*want, impl="reference").backward(grad_out)
    for g, r, needed in zip((got[0], *got[2:]), (want[0], *want[2:]), grads):
        assert (g.grad is not None) == needed and (r.grad is not None) == needed
        if needed:
            err = (g.grad.double() - r.grad.double()).norm() / r.grad.double().norm()
            assert err < 0.05, err


@pytest.mark.parametrize("impl", ["reference", "auto", "triton"])
def test_meta_tensors_propagate_shapes(impl):
    inp = _inputs()
    args = [t.to("meta") for t in inp.args()]
    out = swiglu.swiglu_moe(*args, impl=impl)
    assert out.shape == inp.x.shape and out.device.type == "meta"


@pytest.mark.parametrize("impl", ["reference", "auto", "triton"])
def test_fake_tensor_mode_gives_fake_output_and_gradients(impl):
    # The reference's loop reads the routing's values, which fake tensors do not have: under a
    # dispatch mode it runs as its op (shapes from the op's fakes), as the Triton path does.
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    inp = _inputs()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        args = [mode.from_tensor(t) for t in inp.args()]
        x, idx, w, gu, dp = args
        leaves = [t.requires_grad_() for t in (x, w, gu, dp)]
        out = swiglu.swiglu_moe(x, idx, w, gu, dp, impl=impl)
        grads = torch.autograd.grad(out, leaves, mode.from_tensor(inp.grad_out))
    assert isinstance(out, FakeTensor) and out.shape == inp.x.shape
    for g, t in zip(grads, leaves):
        assert isinstance(g, FakeTensor) and g.shape == t.shape and g.dtype == t.dtype


@pytest.mark.parametrize(
    "dtype, router_dtype",
    [(torch.float64, torch.float64), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)],
    ids=["float64", "bfloat16", "bfloat16_fp32_router"],
)
@pytest.mark.parametrize("grads", [(True, True, True, True), (False, True, False, True)], ids=["all", "some"])
def test_reference_compiles_fullgraph_forward_and_backward(grads, dtype, router_dtype):
    # impl="reference" is what "auto" runs on CPU and for non-bf16 CUDA tensors (apply(model) in
    # fp32): its loop over the experts present reads the routing, so compiled it runs as two ops
    # (forward; gradients by hand), checked against float64 and, in bf16, the eager reference's error.
    inp = _inputs(kind="dup")
    x, idx, w, gu, dp = (t.to(dtype) if t.is_floating_point() else t for t in inp.args())
    w, go = w.to(router_dtype), inp.grad_out.to(dtype)

    def run(fn):
        leaves = [t.clone().requires_grad_(g) for t, g in zip((x, w, gu, dp), grads)]
        out = fn(leaves[0], idx, *leaves[1:])
        out.backward(go)
        return [out] + [t.grad for t, g in zip(leaves, grads) if g]

    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: swiglu.swiglu_moe(*a, impl="reference"), fullgraph=True)
    got, eager = run(compiled), run(lambda *a: swiglu.swiglu_moe(*a, impl="reference"))
    assert torch.equal(got[0], eager[0])  # the same forward
    assert [t.dtype for t in got] == [t.dtype for t in eager]  # the router's gradient in its dtype
    oracle = swiglu.moe.moe_float64(x, idx, w, gu, dp, go)
    oracle = [oracle[0]] + [o for o, g in zip(oracle[1:], grads) if g]
    for c, e, o in zip(got, eager, oracle, strict=True):
        err = lambda t: ((t.double() - o).norm() / o.norm()).item()  # noqa: E731
        assert err(c) <= (1e-13 if dtype == torch.float64 else 2 * err(e)), (err(c), err(e))


@pytest.mark.parametrize("how", ["func.jvp", "forward_ad"])
def test_compiled_forward_mode_ad_of_the_reference_keeps_its_tangents(how):
    # Compiled, the reference runs as custom ops, which have no forward-mode rule: under
    # torch.func and forward-mode AD it stays plain ops (a zero tangent otherwise).
    import torch.autograd.forward_ad as fwAD

    inp = _inputs()
    x, idx, w, gu, dp = (t.float() if t.is_floating_point() else t for t in inp.args())
    tangent = torch.randn_like(x)

    def f():
        moe = lambda xx: swiglu.swiglu_moe(xx, idx, w, gu, dp, impl="reference")  # noqa: E731
        if how == "func.jvp":
            return torch.func.jvp(moe, (x,), (tangent,))[1]
        with fwAD.dual_level():
            return fwAD.unpack_dual(moe(fwAD.make_dual(x, tangent))).tangent

    want = f()
    torch._dynamo.reset()
    got = torch.compile(f, backend="eager")()
    assert want.abs().sum() > 0 and torch.equal(got, want)


@pytest.mark.parametrize("how", ["grad", "vjp"])
def test_func_grad_over_triton_works_or_names_the_op(how):
    inp = _inputs()
    x, idx, w, gu, dp = inp.args()
    f = lambda xx: swiglu.swiglu_moe(xx, idx, w, gu, dp, impl="triton")  # noqa: E731
    ref = torch.func.vjp(lambda xx: swiglu.swiglu_moe(xx, idx, w, gu, dp, impl="reference"), x.clone())[1](inp.grad_out)[0]

    def run():
        if how == "grad":
            return torch.func.grad(lambda xx: (f(xx).float() * inp.grad_out.float()).sum())(x.clone())
        return torch.func.vjp(f, x.clone())[1](inp.grad_out)[0]

    _clear_or_works(run, lambda g: torch.testing.assert_close(g.float(), ref.float(), rtol=0.05, atol=0.05))


@pytest.mark.parametrize("how", ["is_grads_batched", "jacobian"])
def test_batched_backward_through_triton_is_the_per_row_one(how):
    """``autograd.grad(..., is_grads_batched=True)`` and ``jacobian(vectorize=True)`` run the backward
    under torch's older vmap (batched grad_out, no storage): the op per example, bitwise each
    row's own backward."""
    inp = _inputs()
    leaves = _leaves(inp)
    x, idx, w, gu, dp = leaves
    grads = torch.randn(3, *inp.grad_out.shape, generator=torch.Generator().manual_seed(7)).to(inp.grad_out.dtype)
    out = swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton")
    wrt = [x, w, gu, dp]
    if how == "is_grads_batched":
        got = torch.autograd.grad(out, wrt, grads, is_grads_batched=True, retain_graph=True)
    else:  # d out / d x for three elements of out (one backward each: the interpreter is slow)
        first3 = lambda a: swiglu.swiglu_moe(a, idx, w, gu, dp, impl="triton").reshape(-1)[:3]  # noqa: E731
        got = [torch.autograd.functional.jacobian(first3, x.detach(), vectorize=True)]
        grads = torch.eye(out.numel(), dtype=out.dtype)[:3].reshape(3, *out.shape)
        wrt = [x]
    for b in range(3):
        want = torch.autograd.grad(out, wrt, grads[b], retain_graph=True)
        for g, r in zip(got, want):
            assert r.abs().sum() > 0 and torch.equal(g[b], r)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_vmap_over_per_sample_routing_is_the_per_sample_call(impl):
    """torch.func.vmap over x and its routing together (a batch of samples, each routed its own
    way; a duplicate id and an id past E among them, which the eager call refuses on a CPU and
    the formula leaves out), and per-sample gradients with the router inside (vmap of grad): the
    reference formula's per-sample results; fp32 to float rounding, bf16 (impl="triton") within
    twice the loop's own error against float64."""
    from torch.func import grad, vmap

    from swiglu.moe import moe_float64, moe_reference

    B, k = 3, 2
    dtype = torch.bfloat16 if impl == "triton" else torch.float32
    g = torch.Generator().manual_seed(11)
    X = torch.randn(B, T, H, generator=g).to(dtype)
    W, IDX = torch.softmax(torch.randn(B, T, E, generator=g), -1).topk(k)
    IDX[0, 1, 1] = IDX[0, 1, 0]  # a duplicate expert in a row counts twice
    IDX[1, 2, 0] = E  # an expert-parallel sentinel contributes nothing
    gu = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).to(dtype)
    dp = (torch.randn(E, H, I, generator=g) / I**0.5).to(dtype)
    router = torch.randn(E, H, generator=g).to(dtype)
    moe = lambda x, i, w, gu_=gu: swiglu.swiglu_moe(x, i, w, gu_, dp, impl=impl)  # noqa: E731
    got = vmap(moe)(X, IDX, W)
    want = torch.stack([moe_reference(X[b], IDX[b], W[b], gu, dp) for b in range(B)])
    assert want.abs().sum() > 0
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:
        exact = torch.stack([moe_float64(X[b], IDX[b], W[b], gu, dp) for b in range(B)])
        err = lambda a: float((a.double() - exact).norm() / exact.norm())  # noqa: E731
        assert err(got) <= 2 * err(want), (err(got), err(want))
        return

    def loss(gu_, x):
        w, i = torch.softmax(x @ router.T, -1).topk(k)
        return moe(x, i, w, gu_).square().sum()

    got = vmap(grad(loss), in_dims=(None, 0))(gu, X)
    for b in range(B):
        leaf = gu.clone().requires_grad_()
        w, i = torch.softmax(X[b] @ router.T, -1).topk(k)
        want = torch.autograd.grad(swiglu.swiglu_moe(X[b], i, w, leaf, dp, impl="reference").square().sum(), leaf)[0]
        assert want.abs().sum() > 0  # fp32 sums over other token orders: 1e-5 of the largest gradient
        torch.testing.assert_close(got[b], want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_vmap_over_routing_keeps_an_unrouted_experts_overflow_out_of_the_gradients():
    """fp16, an expert that overflows on every token but gets none of them: vmap over per-sample
    routing (every expert over every token, masked) gives the per-sample reference's output and
    finite routing-weight gradients, as the per-sample calls do; a NaN routing weight at an
    out-of-range id stays out as well."""
    from torch.func import grad, vmap

    from swiglu.moe import moe_reference

    B, k = 2, 2
    g = torch.Generator().manual_seed(0)
    X = torch.randn(B, 3, H, generator=g).half()
    gu = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).half()
    dp = (torch.randn(E, H, I, generator=g) / I**0.5).half()
    gu[3] *= 400  # expert 3 overflows fp16 on every token; no token routes to it
    gate, up = torch.nn.functional.linear(X[0], gu[3]).chunk(2, -1)
    assert torch.isinf(torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, dp[3])).any()
    IDX = torch.tensor([[0, 1], [1, 2], [2, 0]]).repeat(B, 1, 1)
    W = torch.full((B, 3, k), 0.5, dtype=torch.float16)
    IDX[1, 0, 1], W[1, 0, 1] = E, float("nan")  # a sentinel id whose weight is NaN contributes nothing
    moe = lambda w, x, i: swiglu.swiglu_moe(x, i, w, gu, dp, impl="reference")  # noqa: E731
    out = vmap(lambda w, x, i: moe(w, x, i))(W, X, IDX)
    assert torch.equal(out, torch.stack([moe_reference(X[b], IDX[b], W[b], gu, dp) for b in range(B)]))
    got = vmap(grad(lambda w, x, i: moe(w, x, i).float().sum()))(W, X, IDX)
    loop = grad(lambda w, x, i: moe_reference(x, i, w, gu, dp).float().sum())  # the eager call refuses id E on a CPU
    want = torch.stack([loop(W[b], X[b], IDX[b]) for b in range(B)])
    routed = IDX < E
    assert torch.isfinite(got[routed]).all() and torch.equal(got[routed], want[routed])


def test_compiling_triton_is_the_eager_result_and_still_rejects_what_cannot_run():
    """torch.compile of impl="triton" (fullgraph): the eager result bitwise; fp32 inputs the eager
    TypeError, not one of Dynamo's."""
    torch._dynamo.reset()
    x, idx, w, gu, dp = _inputs().args()
    assert x.dtype == torch.bfloat16
    got = torch.compile(lambda *a: swiglu.swiglu_moe(*a, impl="triton"), backend="eager", fullgraph=True)(x, idx, w, gu, dp)
    assert torch.equal(got, swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton"))
    torch._dynamo.reset()
    with pytest.raises(TypeError, match="needs bfloat16"):
        torch.compile(lambda *a: swiglu.swiglu_moe(*a, impl="triton"), backend="eager")(x.float(), idx, w, gu.float(), dp.float())


def test_messages_name_numpy_flags_and_the_shapes_a_single_token_takes():
    """A numpy bool flag is refused naming numpy's type (numpy 2 calls its bool ``bool``); for x of
    one token ([H]) the message lists the routing shapes it takes, [k] and [1, k]."""
    np = pytest.importorskip("numpy")
    x, idx, w, gu, dp = _inputs().args()
    with pytest.raises(TypeError, match=r"reuse_saved_buffers must be a bool \(True or False\), got numpy\.bool"):
        swiglu.swiglu_moe(x, idx, w, gu, dp, reuse_saved_buffers=np.bool_(True))
    with pytest.raises(TypeError, match=r"reuse_saved_buffers must be a bool \(True or False\), got numpy\.bool"):
        swiglu.SwiGLUExperts(E, H, I, reuse_saved_buffers=np.bool_(True))
    with pytest.raises(ValueError, match=r"top_k_index must be \[k\] or \[1, k\] to match x \(32,\), got \(2, 2\)"):
        swiglu.swiglu_moe(x[0], idx[:2], w[:2], gu, dp)


def test_dtensor_weights_raise_clearly(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        inp = _inputs()
        x, idx, w, gu, dp = inp.args()
        mesh = init_device_mesh("cpu", (1,))
        gu_d, dp_d = distribute_tensor(gu, mesh, [Shard(0)]), distribute_tensor(dp, mesh, [Shard(0)])
        with pytest.raises((TypeError, ValueError), match="gate_up_proj|down_proj"):
            swiglu.swiglu_moe(x, idx, w, gu_d, dp_d, impl="reference")
    finally:
        dist.destroy_process_group()


def test_autocast_leaves_float64_alone():
    inp = _inputs()
    x, idx, w, gu, dp = (t.double() if t.is_floating_point() else t for t in inp.args())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = swiglu.swiglu_moe(x, idx, w, gu, dp, impl="reference")
        assert torch.nn.functional.linear(x, gu[0]).dtype == torch.float64
    assert out.dtype == torch.float64


# --------------------------------------------------------------------------- probed and right


@pytest.mark.parametrize(
    "shape",
    [(7, 24, 40, 4, 2), (5, 40, 72, 3, 2), (6, 72, 8, 4, 2), (3, 32, 32, 1, 1), (5, 32, 32, 3, 3), (5, 24, 40, 3, 5)],
    ids=str,
)
def test_triton_odd_shapes_against_float64(shape):
    """H, I not multiples of 16, I < 16, E = 1, k = E, k > E (duplicates)."""
    t, h, i, e, k = shape
    inp = make_moe(11, t, h, i, e, k, kind="balanced" if k <= e else "one")
    if k > e:
        inp.top_k_index = torch.randint(0, e, (t, k), generator=torch.Generator().manual_seed(1))
    check_impl(inp, "triton", 11)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_permuting_tokens_permutes_outputs_bitwise(impl):
    inp = _inputs(T=9)
    x, idx, w, gu, dp = inp.args()
    p = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    a = swiglu.swiglu_moe(x, idx, w, gu, dp, impl=impl)
    b = swiglu.swiglu_moe(x[p], idx[p], w[p], gu, dp, impl=impl)
    assert torch.equal(a[p], b)


def test_triton_nan_inf_in_x_where_the_reference_puts_them_and_unused_nan_expert_does_not_leak():
    inp = _inputs()
    x, idx, w, gu, dp = inp.args()
    x = x.clone()
    x[2, 5], x[3, 1] = float("nan"), float("inf")
    got, ref = (swiglu.swiglu_moe(x, idx, w, gu, dp, impl=i) for i in ("triton", "reference"))
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.isinf(), ref.isinf())
    # NaN weights in an expert no token routes to: nothing of it reaches out or the gradients.
    gun = gu.clone()
    gun[3] = float("nan")
    idx = torch.where(idx == 3, 0, idx)
    xx, _, _, g, d = _leaves(inp)
    g = gun.requires_grad_()
    out = swiglu.swiglu_moe(xx, idx, w, g, d, impl="triton")
    out.float().sum().backward()
    assert not out.isnan().any() and not xx.grad.isnan().any() and not g.grad.isnan().any()


def test_triton_unused_nan_expert_does_not_leak_when_intermediate_size_is_not_a_k_tile_multiple():
    # H = 16, I = 24 (the interpreter plan's K tile 16: 2I = 48 a multiple, I not): grad_x's K
    # loop over d_gate | d_up must not take B's last K box across the expert's end.
    inp = make_moe(11, 8, 16, 24, E, K)
    tile = kmoe.moe_plan(8 * K, E, 16, 24).grad_x
    assert tile.BK == 16 and tile.TMA_B  # the case: B by TMA, K tile 16
    x, idx, w, gu, dp = inp.args()
    idx = torch.where(idx == 1, 2, idx)  # expert 1: no token
    grads = []
    for fill in (0.5, float("nan")):
        g, d = gu.clone(), dp.clone()
        g[1], d[1] = fill, fill
        xx, ww, g, d = (t.clone().requires_grad_() for t in (x, w, g, d))
        out = swiglu.swiglu_moe(xx, idx, ww, g, d, impl="triton")
        out.backward(inp.grad_out)
        grads.append((out, xx.grad, ww.grad, g.grad[[0, 2, 3]], d.grad[[0, 2, 3]]))
    for finite, poisoned in zip(*grads):
        assert torch.equal(finite, poisoned)


@pytest.mark.parametrize("reuse", [False, True])
def test_create_graph_gives_the_reference_formulas_differentiable_gradients(reuse):
    # A gradient penalty: the first-order gradients' own gradients, as the reference's autograd
    # gives them (the kernels' backward has no graph; the op's backward runs the reference there).
    inp = _inputs(seed=9)

    def penalty(impl):
        x, idx, w, gu, dp = _leaves(inp)
        kw = {"reuse_saved_buffers": reuse} if impl == "triton" else {}
        out = swiglu.swiglu_moe(x, idx, w, gu, dp, impl=impl, **kw)
        first = torch.autograd.grad(out, (x, w, gu, dp), inp.grad_out, create_graph=True)
        second = torch.autograd.grad(sum(g.float().pow(2).sum() for g in first), (x, w, gu, dp))
        return first + second

    for got, ref in zip(penalty("triton"), penalty("reference")):
        assert torch.equal(got, ref)


def test_triton_gradient_accumulation_retain_graph_and_frozen_weights():
    inp = _inputs()
    once = _leaves(inp)
    swiglu.swiglu_moe(*once, impl="triton").backward(inp.grad_out)
    twice = _leaves(inp)
    out = swiglu.swiglu_moe(*twice, impl="triton")
    out.backward(inp.grad_out, retain_graph=True)
    out.backward(inp.grad_out)
    for a, b in zip(once[:1] + once[2:], twice[:1] + twice[2:]):
        assert torch.equal(b.grad, 2 * a.grad)
    frozen = _leaves(inp, grads=(True, False, False, False))
    swiglu.swiglu_moe(*frozen, impl="triton").backward(inp.grad_out)
    assert torch.equal(frozen[0].grad, once[0].grad)
    assert frozen[2].grad is None and frozen[3].grad is None and frozen[4].grad is None


def test_triton_stride_zero_routing_x_and_weights():
    inp = _inputs()
    x, idx, w, gu, dp = inp.args()
    views = (x[:1].expand(T, H), idx[:1].expand(T, K), w[:1].expand(T, K), gu[:1].expand(E, -1, -1), dp[:1].expand(E, -1, -1))
    got = swiglu.swiglu_moe(*views, impl="triton")
    assert torch.equal(got, swiglu.swiglu_moe(*(v.contiguous() for v in views), impl="triton"))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_three_leading_dims_and_no_grad_inference_mode(impl):
    inp = _inputs()
    x, idx, w, gu, dp = inp.args()
    flat = swiglu.swiglu_moe(x, idx, w, gu, dp, impl=impl)
    out = swiglu.swiglu_moe(x.reshape(1, 2, 3, H), idx.reshape(1, 2, 3, K), w.reshape(1, 2, 3, K), gu, dp, impl=impl)
    assert out.shape == (1, 2, 3, H) and torch.equal(out.reshape(T, H), flat)
    with torch.inference_mode():
        assert torch.equal(swiglu.swiglu_moe(x, idx, w, gu, dp, impl=impl), flat)


# --------------------------------------------------------------------------- the Hugging Face backend

transformers = pytest.importorskip("transformers", minversion="5.3")
from swiglu.integrations import transformers as swiglu_hf  # noqa: E402

from test_moe_hf import assert_same, batch, build, step  # noqa: E402


@pytest.mark.parametrize("reentrant", [False, True])
def test_hf_gradient_checkpointing_matches_unpatched(reentrant, moe_calls):
    base = build("qwen3_moe")
    ours = copy.deepcopy(base)
    swiglu_hf.apply(ours, impl="reference")
    for m in (base, ours):
        m.train()
        m.config.use_cache = False
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ids = batch()
    got = step(ours, ids)
    assert len(moe_calls) >= 2
    assert_same(got, step(base, ids), 1e-5, "gradient checkpointing")


def test_hf_pickle_and_to_float32_after_apply(moe_calls):
    base = build("qwen3_moe", dtype=torch.bfloat16)
    ours = copy.deepcopy(base)
    swiglu_hf.apply(ours, impl="reference")
    ours = pickle.loads(pickle.dumps(ours)).to(torch.float32)
    base = base.to(torch.float32)
    assert ours.config._experts_implementation == "swiglu"
    ids = batch()
    got = step(ours, ids)
    assert len(moe_calls) == 2
    assert_same(got, step(base, ids), 1e-5, "pickled, then float32")


def test_hf_peft_lora_on_expert_parameters(moe_calls):
    peft = pytest.importorskip("peft")
    base = build("qwen3_moe")
    cfg = peft.LoraConfig(
        r=4,
        target_modules=["q_proj"],
        init_lora_weights=False,
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    )
    lora = peft.get_peft_model(base, cfg)
    ours = copy.deepcopy(lora)
    swiglu_hf.apply(ours, impl="reference")
    ids = batch()
    got = step(ours, ids)
    assert len(moe_calls) == 2
    assert_same(got, step(lora, ids), 1e-5, "peft target_parameters")


@pytest.fixture
def moe_calls(monkeypatch):
    calls = []
    real = swiglu_hf._swiglu_moe
    monkeypatch.setattr(swiglu_hf, "_swiglu_moe", lambda *a, **kw: (calls.append(kw), real(*a, **kw))[1])
    return calls


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("lead", [(T,), (2, T // 2)], ids=["2d", "3d"])
def test_output_is_not_a_view_and_takes_in_place_ops(impl, lead):
    # A module's output that is a view loses FSDP2's backward hook to an in-place op on it
    # (tests/fsdp_worker.py runs that case); autograd must also see the in-place op.
    inp = _inputs()
    x, idx, w, gu, dp = _leaves(inp)
    x2 = x.detach().reshape(*lead, H).requires_grad_()
    idx2, w2 = idx.reshape(*lead, K), w.detach().reshape(*lead, K).requires_grad_()
    out = swiglu.swiglu_moe(x2, idx2, w2, gu, dp, impl=impl)
    assert not out._is_view() and out.shape == x2.shape
    shift = torch.randn_like(out)
    out += shift
    go = inp.grad_out.reshape(*lead, H)
    got = torch.autograd.grad(out, (x2, w2, gu, dp), go)
    ref = swiglu.swiglu_moe(x2, idx2, w2, gu, dp, impl=impl) + shift
    want = torch.autograd.grad(ref, (x2, w2, gu, dp), go)
    for g, r in zip(got, want):
        assert torch.equal(g, r)
