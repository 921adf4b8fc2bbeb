"""SwiGLUMLP / swiglu_mlp autograd against a plain nn.Linear SwiGLU MLP (CPU, small shapes).

float64 checks are tight (same formula, only summation order differs); bf16 checks bound our error
against the float64 oracle by the bf16 plain module's own error plus one bf16 ulp per element in
norm (``triton_checks.ulp_norm``). The Triton path runs under TRITON_INTERPRET=1 (set by conftest)
and is skipped only when swiglu.kernels.backward cannot be imported; its gradients also pass the
ulp oracle (``triton_checks.check_args``) on the inputs the module's backward received.
"""

import itertools
import zlib

import pytest
import torch
from torch import nn

import swiglu
from swiglu import ops, relative_error
from swiglu import reference as reference_module
from swiglu.reference import reference_backward

from ulp_oracle import BackwardSpy, ulp_norm

H, I = 48, 80
LEADING = [(1,), (7,), (13,), (2, 5)]
F64_RTOL = 1e-10
NEED_FLAGS = ("need_grad_x", "need_grad_gate_weight", "need_grad_up_weight", "need_grad_down_weight")
PARAM_NAMES = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")


class PlainMLP(nn.Module):
    """The oracle: out = down(silu(gate(x)) * up(x)) with plain nn.Linear and PyTorch autograd."""

    def __init__(self, hidden_size, intermediate_size, dtype):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False, dtype=dtype)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def _gen(request, salt=""):
    g = torch.Generator().manual_seed(zlib.crc32((request.node.nodeid + salt).encode()))
    return g


def _pair(request, dtype, impl="reference", hidden_size=H, intermediate_size=I):
    """A SwiGLUMLP and a PlainMLP with the same random weights (std 1/sqrt(fan_in) as in
    swiglu.inputs), the plain one's state dict loaded into ours unchanged."""
    gen = _gen(request, "weights")
    plain = PlainMLP(hidden_size, intermediate_size, dtype)
    with torch.no_grad():
        for p in plain.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / p.shape[1] ** 0.5)
    ours = swiglu.SwiGLUMLP(hidden_size, intermediate_size, impl=impl, dtype=dtype)
    ours.load_state_dict(plain.state_dict(), strict=True)
    return ours, plain


def _randn(gen, shape, dtype):
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def _grads(module, x, grad_output, **backward_kw):
    out = module(x)
    out.backward(grad_output, **backward_kw)
    return [x.grad] + [dict(module.named_parameters())[n].grad for n in PARAM_NAMES]


def _run(module, x, grad_output):
    """Fresh leaf copy of x, backward with grad_output, return (out, [grad_x, grad_gate, grad_up, grad_down])."""
    x = x.detach().clone().requires_grad_(True)
    out = module(x)
    out.backward(grad_output)
    return out, [x.grad] + [dict(module.named_parameters())[n].grad for n in PARAM_NAMES]


def _float64_oracle(plain_bf16, x, grad_output):
    plain64 = PlainMLP(H, I, torch.float64)
    plain64.load_state_dict({k: v.double() for k, v in plain_bf16.state_dict().items()})
    return _run(plain64, x.double(), grad_output.double())


def _assert_bf16_close(ours, plain, oracle, what="", names=("grad_x",) + PARAM_NAMES):
    for name, o, p, r in zip(names, ours, plain, oracle, strict=True):
        assert o.dtype == torch.bfloat16 and o.shape == r.shape, name
        assert torch.isfinite(o).all(), name
        err, plain_err = relative_error(o, r), relative_error(p, r)
        assert err <= plain_err + ulp_norm(r), f"{what}{name}: {err:.2e} vs plain bf16 {plain_err:.2e} + one ulp"


# --------------------------------------------------------------------------- layout, forward


def test_state_dict_is_llama_layout(request):
    ours, plain = _pair(request, torch.float32)
    assert set(ours.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    assert ours.gate_proj.weight.shape == (I, H) and ours.up_proj.weight.shape == (I, H)
    assert ours.down_proj.weight.shape == (H, I)
    for k, v in plain.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    assert all(isinstance(m, nn.Linear) and m.bias is None for m in (ours.gate_proj, ours.up_proj, ours.down_proj))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("leading", LEADING, ids=str)
def test_forward_matches_plain_bit_for_bit(request, leading, dtype):
    ours, plain = _pair(request, dtype)
    x = _randn(_gen(request), leading + (H,), dtype)
    out = ours(x)
    assert out.shape == x.shape and out.dtype == dtype
    assert torch.equal(out, plain(x))  # same ops in the same order


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("leading", LEADING, ids=str)
def test_float64_grads_match_plain(request, leading):
    ours, plain = _pair(request, torch.float64)
    gen = _gen(request)
    x, go = _randn(gen, leading + (H,), torch.float64), _randn(gen, leading + (H,), torch.float64)
    out, grads = _run(ours, x, go)
    out_ref, refs = _run(plain, x, go)
    for name, g, r in zip(("grad_x",) + PARAM_NAMES, grads, refs):
        assert g.shape == r.shape and g.dtype == torch.float64, name
        assert r.abs().max() > 1e-3, name  # the oracle is not ~0
        torch.testing.assert_close(g, r, rtol=F64_RTOL, atol=F64_RTOL * r.abs().max().item(), msg=name)


@pytest.mark.parametrize("leading", LEADING, ids=str)
def test_bf16_grads_within_plain_bf16_error(request, leading):
    ours, plain = _pair(request, torch.bfloat16)
    gen = _gen(request)
    x, go = _randn(gen, leading + (H,), torch.bfloat16), _randn(gen, leading + (H,), torch.bfloat16)
    _, grads = _run(ours, x, go)
    _, plain_grads = _run(plain, x, go)
    _, oracle = _float64_oracle(plain, x, go)
    _assert_bf16_close(grads, plain_grads, oracle)


def _saved_inputs(gen, leading, dtype):
    x = _randn(gen, leading + (H,), dtype)
    w = [_randn(gen, s, dtype) / s[1] ** 0.5 for s in ((I, H), (I, H), (H, I))]
    gate = x @ w[0].t()
    return [_randn(gen, leading + (H,), dtype), x, gate, x @ w[1].t(), nn.functional.silu(gate)] + w


@pytest.mark.parametrize("needs", list(itertools.product([False, True], repeat=4)), ids=str)
def test_reference_skips_gemms_of_unneeded_gradients(request, monkeypatch, needs):
    args = _saved_inputs(_gen(request), (7,), torch.float32)
    full = reference_backward(*args)
    calls = []
    real_gemm = reference_module._gemm
    monkeypatch.setattr(reference_module, "_gemm", lambda a, b: calls.append((a.shape, b.shape)) or real_gemm(a, b))
    keys = ("need_grad_x", "need_grad_gate_weight", "need_grad_up_weight", "need_grad_down_weight")
    part = reference_backward(*args, **dict(zip(keys, needs)))
    need_x, need_gate, need_up, need_down = needs
    # g = go @ down_weight feeds every gradient but grad_down_weight; grad_x is two GEMMs.
    expected = int(need_x or need_gate or need_up) + 2 * need_x + need_gate + need_up + need_down
    assert len(calls) == expected
    for p, f, need in zip(part, full, needs):
        assert (p is None) != need
        if need:
            assert torch.equal(p, f)


def test_grads_accumulate_into_existing_grad(request):
    ours, plain = _pair(request, torch.float64)
    gen = _gen(request)
    x, go = _randn(gen, (13, H), torch.float64), _randn(gen, (13, H), torch.float64)
    _, fresh = _run(plain, x, go)
    previous = [_randn(gen, g.shape, torch.float64) for g in fresh]
    xl = x.clone().requires_grad_(True)
    xl.grad = previous[0].clone()
    for n, prev in zip(PARAM_NAMES, previous[1:]):
        dict(ours.named_parameters())[n].grad = prev.clone()
    grads = _grads(ours, xl, go)
    for g, prev, f in zip(grads, previous, fresh):
        torch.testing.assert_close(g, prev + f, rtol=F64_RTOL, atol=1e-12)


FROZEN_CASES = {
    "gate": ("gate_proj.weight",),
    "up": ("up_proj.weight",),
    "down": ("down_proj.weight",),
    "gate+up": ("gate_proj.weight", "up_proj.weight"),
    "all_weights": PARAM_NAMES,
    "x": ("x",),
    "x+down": ("x", "down_proj.weight"),
}


@pytest.mark.parametrize("frozen", list(FROZEN_CASES), ids=str)
def test_frozen_inputs_skip_their_gradients(request, monkeypatch, frozen):
    frozen = FROZEN_CASES[frozen]
    ours, plain = _pair(request, torch.float64)
    for module in (ours, plain):
        for n, p in module.named_parameters():
            p.requires_grad_(n not in frozen)
    gen = _gen(request)
    x, go = _randn(gen, (2, 5, H), torch.float64), _randn(gen, (2, 5, H), torch.float64)
    needs = []
    real_run = ops.run_backward
    monkeypatch.setattr(
        ops,
        "run_backward",
        lambda tensors, needs_, *a: needs.append(dict(zip(NEED_FLAGS, needs_))) or real_run(tensors, needs_, *a),
    )
    gemms = []
    real_gemm = reference_module._gemm
    monkeypatch.setattr(reference_module, "_gemm", lambda a, b: gemms.append(1) or real_gemm(a, b))

    def grads(module):
        xl = x.clone().requires_grad_("x" not in frozen)
        module(xl).backward(go)
        return [xl.grad] + [dict(module.named_parameters())[n].grad for n in PARAM_NAMES]

    ours_grads = grads(ours)
    ref_grads = grads(plain)
    assert needs == [
        dict(
            need_grad_x="x" not in frozen,
            need_grad_gate_weight="gate_proj.weight" not in frozen,
            need_grad_up_weight="up_proj.weight" not in frozen,
            need_grad_down_weight="down_proj.weight" not in frozen,
        )
    ]
    nx, ng, nu, nd = needs[0].values()
    assert len(gemms) == int(nx or ng or nu) + 2 * nx + ng + nu + nd < 6
    for name, g, r in zip(("x",) + PARAM_NAMES, ours_grads, ref_grads):
        if name in frozen:
            assert g is None and r is None, name
        else:
            torch.testing.assert_close(g, r, rtol=F64_RTOL, atol=1e-12, msg=name)


def test_no_backward_call_when_nothing_requires_grad(request, monkeypatch):
    """Frozen weights and an x that needs no gradient: the output needs none, and a backward through
    a graph around the MLP (another leaf needs a gradient) never calls the MLP's backward."""
    ours, plain = _pair(request, torch.float64)
    ours.requires_grad_(False)

    def fail(*args, **kwargs):
        raise AssertionError("swiglu's backward was called although nothing of the MLP requires grad")

    monkeypatch.setattr(ops, "run_backward", fail)
    gen = _gen(request)
    x = _randn(gen, (7, H), torch.float64)
    out = ours(x)
    assert not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(out, plain(x), rtol=0, atol=0)
    scale = _randn(gen, (7, H), torch.float64).requires_grad_(True)
    (ours(x) * scale).sum().backward()
    torch.testing.assert_close(scale.grad, out, rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["expanded", "transposed", "sliced"])
def test_non_contiguous_grad_output(request, layout):
    ours, plain = _pair(request, torch.float64)
    gen = _gen(request)
    x = _randn(gen, (2, 5, H), torch.float64)
    if layout == "expanded":
        go = _randn(gen, (H,), torch.float64).expand(2, 5, H)  # zero strides
    elif layout == "transposed":
        go = _randn(gen, (5, 2, H), torch.float64).transpose(0, 1)
    else:
        go = _randn(gen, (2, 5, 2 * H), torch.float64)[..., ::2]
    assert not go.is_contiguous()
    go_before = go.clone()
    _, grads = _run(ours, x, go)
    _, refs = _run(plain, x, go.contiguous())
    assert torch.equal(go, go_before)
    for g, r in zip(grads, refs):
        torch.testing.assert_close(g, r, rtol=F64_RTOL, atol=1e-12)


def test_retain_graph_second_backward_accumulates(request):
    ours, _ = _pair(request, torch.float64)
    gen = _gen(request)
    x = _randn(gen, (13, H), torch.float64).requires_grad_(True)
    go = _randn(gen, (13, H), torch.float64)
    out = ours(x)
    out.backward(go, retain_graph=True)
    first = [x.grad.clone()] + [p.grad.clone() for p in (ours.gate_proj.weight, ours.up_proj.weight, ours.down_proj.weight)]
    out.backward(go)
    second = [x.grad] + [p.grad for p in (ours.gate_proj.weight, ours.up_proj.weight, ours.down_proj.weight)]
    for f, s in zip(first, second):
        assert f.abs().max() > 0
        torch.testing.assert_close(s, 2 * f, rtol=F64_RTOL, atol=1e-12)


def test_activation_checkpointing(request):
    ours, plain = _pair(request, torch.float64)
    gen = _gen(request)
    x, go = _randn(gen, (2, 5, H), torch.float64), _randn(gen, (2, 5, H), torch.float64)
    xl = x.clone().requires_grad_(True)
    out = torch.utils.checkpoint.checkpoint(ours, xl, use_reentrant=False)
    out.backward(go)
    grads = [xl.grad] + [dict(ours.named_parameters())[n].grad for n in PARAM_NAMES]
    _, refs = _run(plain, x, go)
    for g, r in zip(grads, refs):
        torch.testing.assert_close(g, r, rtol=F64_RTOL, atol=1e-12)


def test_inputs_unchanged_and_outputs_fresh(request):
    ours, _ = _pair(request, torch.bfloat16)
    gen = _gen(request)
    x = _randn(gen, (7, H), torch.bfloat16).requires_grad_(True)
    go = _randn(gen, (7, H), torch.bfloat16)
    before = [t.detach().clone() for t in (x, go, *ours.parameters())]
    out = ours(x)
    out.backward(go)
    for b, a in zip(before, (x, go, *ours.parameters())):
        assert torch.equal(b, a)
    storages = {t.untyped_storage().data_ptr() for t in (x, go, *ours.parameters())}
    for t in (out, x.grad, *(p.grad for p in ours.parameters())):
        assert t.untyped_storage().data_ptr() not in storages


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_float32_weights(request, dtype):
    """Mixed precision: float32 weights under torch.autocast(dtype) compute in autocast's dtype,
    return it, and give float32 gradients within the tolerance of the plain module under the same
    autocast (float16: the reference path in float16; the kernels are bf16-only)."""
    ours, plain = _pair(request, torch.float32)
    gen = _gen(request)
    x, go = _randn(gen, (2, 5, H), torch.float32), _randn(gen, (2, 5, H), dtype)
    results = []
    for module in (ours, plain):
        xl = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=dtype):
            out = module(xl)
        assert out.dtype == dtype
        out.backward(go)
        results.append([xl.grad] + [dict(module.named_parameters())[n].grad for n in PARAM_NAMES])
    plain_low = PlainMLP(H, I, dtype)
    plain_low.load_state_dict(plain.state_dict())  # the weights autocast computes with
    _, oracle = _float64_oracle(plain_low, x.to(dtype), go)
    for name, o, p, r in zip(("grad_x",) + PARAM_NAMES, *results, oracle):
        assert o.dtype == torch.float32, name
        err, plain_err = relative_error(o, r), relative_error(p, r)
        assert err <= plain_err + ulp_norm(r), f"{name}: {err:.2e} vs plain autocast {plain_err:.2e} + one ulp"


# --------------------------------------------------------------------------- errors


def _weights(dtype=torch.float32):
    return torch.randn(I, H, dtype=dtype), torch.randn(I, H, dtype=dtype), torch.randn(H, I, dtype=dtype)


BAD_CALLS = {
    "x_not_tensor": (lambda w: ([[1.0] * H], *w), {}, TypeError, "x must be a torch.Tensor"),
    "x_int": (lambda w: (torch.ones(3, H, dtype=torch.int32), *w), {}, TypeError, "x must have a floating dtype"),
    "up_weight_dtype": (lambda w: (torch.randn(3, H), w[0], w[1].double(), w[2]), {}, TypeError, "up_weight has dtype"),
    "x_hidden": (
        lambda w: (torch.randn(3, H + 1), *w),
        {},
        ValueError,
        rf"hidden_size {H + 1} from x.*weights agree on hidden_size {H}",
    ),
    "gate_weight_rank": (lambda w: (torch.randn(3, H), w[0][None], w[1], w[2]), {}, ValueError, "gate_weight must be 2-D"),
    "up_weight_shape": (lambda w: (torch.randn(3, H), w[0], w[1][:-1], w[2]), {}, ValueError, "up_weight must have shape"),
    "down_weight_shape": (lambda w: (torch.randn(3, H), w[0], w[1], w[2].t()), {}, ValueError, "down_weight must have shape"),
    "empty_hidden": (
        lambda w: (torch.randn(3, 0), torch.randn(I, 0), torch.randn(I, 0), torch.randn(0, I)),
        {},
        ValueError,
        "hidden_size must be positive",
    ),
    "device": (lambda w: (torch.randn(3, H, device="meta"), *w), {}, ValueError, "on cpu but x is on meta"),
    "impl_name": (lambda w: (torch.randn(3, H), *w), {"impl": "cuda"}, ValueError, "impl must be one of"),
    "triton_fp32": (lambda w: (torch.randn(3, H), *w), {"impl": "triton"}, TypeError, "needs bfloat16"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=str)
def test_bad_inputs_raise_at_forward(case):
    make_args, kw, exc, match = BAD_CALLS[case]
    with pytest.raises(exc, match=match):
        swiglu.swiglu_mlp(*make_args(_weights()), **kw)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(hidden_size=0, intermediate_size=I), "hidden_size"),
        (dict(hidden_size=H, intermediate_size=I, impl="fast"), "impl must be one of"),
    ],
)
def test_bad_module_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        swiglu.SwiGLUMLP(**kwargs)


def test_module_input_dtype_mismatch_names_argument():
    with pytest.raises(TypeError, match="gate_weight has dtype torch.float32 but x has torch.float64"):
        swiglu.SwiGLUMLP(H, I)(torch.randn(3, H, dtype=torch.float64))


# --------------------------------------------------------------------------- custom ops


def test_opcheck_forward_and_backward(request):
    gen = _gen(request)
    x = _randn(gen, (2, 5, H), torch.float64).requires_grad_(True)
    w = [(_randn(gen, s, torch.float64) / s[1] ** 0.5).requires_grad_(True) for s in ((I, H), (I, H), (H, I))]
    torch.library.opcheck(ops.mlp_forward, (x, *w, "reference"))
    saved = _saved_inputs(gen, (7,), torch.float64)
    for needs in [(True, True, True, True), (False, True, False, True)]:
        torch.library.opcheck(ops.mlp_backward, (*saved, *needs, "reference"))


def test_auto_backward_is_reference_on_cpu():
    x, w = torch.randn(3, H, dtype=torch.bfloat16), torch.randn(I, H, dtype=torch.bfloat16)
    assert ops.resolve_impl("auto", x, w) == "reference"
    assert ops.resolve_impl("triton", x, w) == "triton"


def test_torch_compile_fullgraph_keeps_custom_ops(request):
    """A model with SwiGLUMLP compiles with fullgraph=True (no graph break), the forward graph
    calls swiglu.mlp_forward and the backward graph swiglu.mlp_backward, and the gradients match
    eager, including with a frozen down_proj."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {"fw": [], "bw": []}

    def capture(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(str(gm.graph))
            return make_boxed_func(gm.forward)

        return compiler

    backend = aot_autograd(fw_compiler=capture("fw"), bw_compiler=capture("bw"))
    torch._dynamo.reset()
    ours, plain = _pair(request, torch.float64)
    ours.down_proj.weight.requires_grad_(False)
    plain.down_proj.weight.requires_grad_(False)
    model = nn.Sequential(nn.Linear(H, H, dtype=torch.float64), ours)
    ref_model = nn.Sequential(nn.Linear(H, H, dtype=torch.float64), plain)
    ref_model[0].load_state_dict(model[0].state_dict())
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    gen = _gen(request)
    x, go = _randn(gen, (2, 5, H), torch.float64), _randn(gen, (2, 5, H), torch.float64)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compiled(x1).backward(go)
    ref_model(x2).backward(go)
    assert len(graphs["fw"]) == 1 and len(graphs["bw"]) == 1
    assert "swiglu.mlp_forward" in graphs["fw"][0]
    assert "swiglu.mlp_backward" in graphs["bw"][0]
    torch.testing.assert_close(x1.grad, x2.grad, rtol=F64_RTOL, atol=1e-12)
    for (n, p), (_, r) in zip(model.named_parameters(), ref_model.named_parameters()):
        if n.endswith("down_proj.weight"):
            assert p.grad is None and r.grad is None
        else:
            torch.testing.assert_close(p.grad, r.grad, rtol=F64_RTOL, atol=1e-12, msg=n)


# --------------------------------------------------------------------------- Triton path (interpreter on CPU)


@pytest.fixture
def triton_backward():
    return pytest.importorskip("swiglu.kernels.backward")


@pytest.mark.parametrize("leading", [(7,), (2, 5), (2, 1, 3)], ids=str)
def test_triton_path_bf16_grads(request, monkeypatch, triton_backward, leading, device):
    spy = BackwardSpy()
    monkeypatch.setattr(triton_backward, "launch_backward", spy)
    ours, plain = _pair(request, torch.bfloat16, impl="triton")
    ours.to(device)
    gen = _gen(request)
    x, go = _randn(gen, leading + (H,), torch.bfloat16), _randn(gen, leading + (H,), torch.bfloat16)
    _, grads = _run(ours, x.to(device), go.to(device))
    _, plain_grads = _run(plain, x, go)
    _, oracle = _float64_oracle(plain, x, go)
    spy.check(grads, seed=request.node.nodeid)  # the ulp oracle on what the backward was given
    _assert_bf16_close([g.cpu() for g in grads], plain_grads, oracle, "triton ")


@pytest.mark.parametrize("save_activated_gate", [False, True])
@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("leading", [(7,), (2, 5)], ids=str)
def test_output_is_not_a_view_and_takes_in_place_ops(request, leading, impl, save_activated_gate):
    # A module's output that is a view loses FSDP2's backward hook to an in-place op on it (a
    # shared expert's or residual's +=); autograd must see the in-place op.
    mlp = swiglu.SwiGLUMLP(H, I, impl=impl, save_activated_gate=save_activated_gate, dtype=torch.bfloat16)
    gen = _gen(request)
    x = _randn(gen, leading + (H,), torch.bfloat16).requires_grad_()
    shift, go = _randn(gen, leading + (H,), torch.bfloat16), _randn(gen, leading + (H,), torch.bfloat16)
    out = mlp(x)
    assert not out._is_view() and out.shape == x.shape
    out += shift
    got = torch.autograd.grad(out, [x, *mlp.parameters()], go)
    want = torch.autograd.grad(mlp(x) + shift, [x, *mlp.parameters()], go)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_triton_path_frozen_weights(request, monkeypatch, triton_backward, device):
    spy = BackwardSpy()
    monkeypatch.setattr(triton_backward, "launch_backward", spy)
    ours, plain = _pair(request, torch.bfloat16, impl="triton")
    ours.to(device)
    for m in (ours, plain):
        m.gate_proj.weight.requires_grad_(False)
    gen = _gen(request)
    x, go = _randn(gen, (13, H), torch.bfloat16), _randn(gen, (13, H), torch.bfloat16)
    _, grads = _run(ours, x.to(device), go.to(device))
    _, plain_grads = _run(plain, x, go)
    _, oracle = _float64_oracle(plain, x, go)
    assert [{k: v for k, v in kw.items() if k.startswith(("need", "overwrite", "release"))} for _, kw, _ in spy.calls] == [
        dict(
            need_grad_x=True,
            need_grad_gate_weight=False,
            need_grad_up_weight=True,
            need_grad_down_weight=True,
            overwrite_activations=False,
            release_activations=False,
        )
    ]  # lean, saved tensors never written
    assert grads[1] is None and plain_grads[1] is None
    spy.check(grads, seed=request.node.nodeid)
    keep = [0, 2, 3]
    _assert_bf16_close(
        [grads[i].cpu() for i in keep],
        [plain_grads[i] for i in keep],
        [oracle[i] for i in keep],
        "triton ",
        names=("grad_x", "up_proj.weight", "down_proj.weight"),
    )


def test_triton_path_errors_at_forward(monkeypatch, triton_backward, device):
    x = torch.randn(3, 44, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="multiples of 8"):
        swiglu.SwiGLUMLP(44, I, impl="triton", dtype=torch.bfloat16).to(device)(x)
    # The kernels were decorated for the interpreter at import; switching it off is what a
    # process without TRITON_INTERPRET=1 sees.
    monkeypatch.setattr(pytest.importorskip("swiglu.kernels.devices"), "INTERPRET", False)
    ops.clear_plans()  # the decisions are cached per process; this test changes the process
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            swiglu.SwiGLUMLP(H, I, impl="triton", dtype=torch.bfloat16)(torch.randn(3, H, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        ((32.0, 64), {}, TypeError, r"hidden_size must be a positive int, got 32.0 \(float\)"),
        ((32, True), {}, TypeError, r"intermediate_size must be a positive int, got True \(bool\)"),
        ((0, 64), {}, ValueError, "hidden_size must be a positive int, got 0"),
        ((32, 64), {"dtype": torch.int32}, TypeError, "dtype must be one of"),
        ((32, 64), {"dtype": "bfloat16"}, TypeError, "dtype must be one of"),
        ((32, 64), {"dtype": torch.float8_e4m3fn}, TypeError, "dtype must be one of"),  # floating, no matmul
        ((32, 64), {"device": "bogus"}, ValueError, "device must be a torch.device, a device string or None, got 'bogus'"),
    ],
)
def test_bad_constructor_arguments_name_the_argument(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        swiglu.SwiGLUMLP(*args, **kwargs)
