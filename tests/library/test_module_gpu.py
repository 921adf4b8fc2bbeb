"""SwiGLUMLP with the Triton backward on the GPU (H200): gradients, a short training loop,
torch.compile with inductor, and the step timer. Skipped without CUDA (conftest).

Tolerance for bf16: our deviation from the float64 run is at most twice the plain bf16 module's
own deviation from it, plus a small floor (the same rule as tests/library/test_module.py).
"""

import math

import pytest
import torch

import swiglu
from swiglu import ops, relative_error
from swiglu.module import PlainSwiGLUMLP, measure_step_time

from ulp_oracle import BackwardSpy, ulp_norm

pytestmark = pytest.mark.gpu

H, I, T = 1024, 2816, 512
STEPS = 5
BF16_FACTOR, BF16_FLOOR = 2.0, 1e-3
# Relative loss deviation floor: the plain bf16 curve is ~4e-4 from float64 at this shape.
LOSS_FLOOR = 1e-4
PARAM_NAMES = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")


def _init_state(seed, hidden_size=H, intermediate_size=I):
    """float64 weights with std 1/sqrt(fan_in), the Llama layout."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shapes = {
        "gate_proj.weight": (intermediate_size, hidden_size),
        "up_proj.weight": (intermediate_size, hidden_size),
        "down_proj.weight": (hidden_size, intermediate_size),
    }
    return {k: torch.randn(s, generator=gen, device="cuda", dtype=torch.float64) / math.sqrt(s[1]) for k, s in shapes.items()}


def _models(seed, impl="triton", save_activated_gate=False):
    state = _init_state(seed)
    ours = swiglu.SwiGLUMLP(H, I, impl=impl, save_activated_gate=save_activated_gate, device="cuda", dtype=torch.bfloat16)
    plain = PlainSwiGLUMLP(H, I, device="cuda", dtype=torch.bfloat16)
    plain64 = PlainSwiGLUMLP(H, I, device="cuda", dtype=torch.float64)
    ours.load_state_dict({k: v.bfloat16() for k, v in state.items()})
    plain.load_state_dict({k: v.bfloat16() for k, v in state.items()})
    plain64.load_state_dict({k: v.bfloat16().double() for k, v in state.items()})  # same start as the bf16 ones
    return ours, plain, plain64


def test_auto_is_triton_on_hopper():
    x = torch.randn(4, H, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(I, H, device="cuda", dtype=torch.bfloat16)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("Triton backward needs sm_90+")
    assert ops.resolve_impl("auto", x, w) == "triton"


@pytest.mark.parametrize("leading", [(T,), (4, T // 4)], ids=str)
@pytest.mark.parametrize("frozen", [(), ("gate_proj.weight",), ("x", "down_proj.weight")], ids=str)
@pytest.mark.parametrize("mode", ["lean", "saved"])
def test_gradients_within_bf16_tolerance(leading, frozen, mode):
    ours, plain, plain64 = _models(seed=1, save_activated_gate=mode == "saved")
    for m in (ours, plain, plain64):
        for n, p in m.named_parameters():
            p.requires_grad_(n not in frozen)
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(leading + (H,), generator=gen, device="cuda", dtype=torch.bfloat16)
    go = torch.randn(leading + (H,), generator=gen, device="cuda", dtype=torch.bfloat16)

    def grads(model, dtype):
        xl = x.to(dtype, copy=True).requires_grad_("x" not in frozen)
        model(xl).backward(go.to(dtype))
        return [xl.grad] + [dict(model.named_parameters())[n].grad for n in PARAM_NAMES]

    with BackwardSpy() as spy:
        ours_g = grads(ours, torch.bfloat16)
    plain_g, oracle = grads(plain, torch.bfloat16), grads(plain64, torch.float64)
    spy.check(ours_g, seed=2)  # the ulp oracle ("cuda" thresholds) on the inputs the backward got
    for name, o, p, r in zip(("x",) + PARAM_NAMES, ours_g, plain_g, oracle):
        if name in frozen:
            assert o is None, name
            continue
        assert o.dtype == torch.bfloat16 and torch.isfinite(o).all(), name
        err, plain_err = relative_error(o, r), relative_error(p, r)
        assert err <= plain_err + ulp_norm(r), f"{name}: {err:.2e} vs plain bf16 {plain_err:.2e} + one ulp"


def _train(model, dtype, xs, ys):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for x, y in zip(xs, ys):
        loss = (model(x.to(dtype)).to(torch.float64) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_training_loop_loss_curve_matches_plain():
    """5 AdamW steps on a teacher-student regression (random inputs, targets from a random
    float64 teacher MLP): the loss curve and final weights of SwiGLUMLP (Triton backward) stay
    within the bf16 tolerance of the float64 run."""
    ours, plain, plain64 = _models(seed=3)
    teacher = PlainSwiGLUMLP(H, I, device="cuda", dtype=torch.float64)
    teacher.load_state_dict(_init_state(seed=4))
    gen = torch.Generator(device="cuda").manual_seed(5)
    xs = [torch.randn(T, H, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(STEPS)]
    with torch.no_grad():
        ys = [teacher(x.double()) for x in xs]
    curves = {
        "ours": _train(ours, torch.bfloat16, xs, ys),
        "plain": _train(plain, torch.bfloat16, xs, ys),
        "float64": _train(plain64, torch.float64, xs, ys),
    }
    ref = curves["float64"]
    assert ref[-1] < 0.95 * ref[0], f"the float64 run does not train: {ref}"
    dev = {k: max(abs(a - b) / b for a, b in zip(c, ref)) for k, c in curves.items() if k != "float64"}
    assert all(math.isfinite(v) for c in curves.values() for v in c), curves
    assert dev["ours"] <= BF16_FACTOR * dev["plain"] + LOSS_FLOOR, f"loss curves {curves}, max rel dev {dev}"
    for n in PARAM_NAMES:
        w, p, r = (dict(m.named_parameters())[n].detach() for m in (ours, plain, plain64))
        err, plain_err = relative_error(w, r), relative_error(p, r)
        assert err <= BF16_FACTOR * plain_err + BF16_FLOOR, f"{n} after {STEPS} steps: {err:.2e} vs {plain_err:.2e}"


class Residual(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(x * 0.5)


@pytest.mark.parametrize("mode", ["lean", "saved"])
def test_torch_compile_inductor_matches_eager(mode):
    """fullgraph=True with inductor (no graph break); inductor may fuse the surrounding
    elementwise ops differently, so compare to eager within bf16 rounding (a wrong gradient
    would be off by ~1)."""
    ours, _, _ = _models(seed=6, save_activated_gate=mode == "saved")
    model = Residual(ours)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(2, T // 2, H, generator=gen, device="cuda", dtype=torch.bfloat16)
    go = torch.randn(2, T // 2, H, generator=gen, device="cuda", dtype=torch.bfloat16)

    def grads(m):
        xl = x.clone().requires_grad_(True)
        m(xl).backward(go)
        out = [xl.grad] + [p.grad.clone() for p in ours.parameters()]
        ours.zero_grad(set_to_none=True)
        return out

    got, want = grads(compiled), grads(model)
    for name, g, w in zip(("x",) + PARAM_NAMES, got, want):
        assert relative_error(g, w) < 1e-2, name


def test_measure_step_time_runs():
    r = measure_step_time(H, I, T, warmup=1, iters=3)
    assert r["impl"] == "triton"
    for k in ("ms_swiglu", "ms_plain", "tflops_swiglu", "tflops_plain"):
        assert math.isfinite(r[k]) and r[k] > 0, (k, r)


@pytest.mark.parametrize("reuse", [False, True], ids=["default", "reuse_saved_buffers"])
@pytest.mark.parametrize("tokens", [1, 300], ids=str)
def test_training_step_never_synchronizes(reuse, tokens):
    """Forward and backward enqueue their work without one host-device synchronization
    (``torch.cuda.set_sync_debug_mode("error")`` raises on any), once compiled and planned."""
    mlp = swiglu.SwiGLUMLP(H, I, impl="triton", reuse_saved_buffers=reuse, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    go = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    mlp(x).backward(go)  # Triton compiles and the plan is made (both may synchronize)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            mlp.zero_grad(set_to_none=True)
            x.grad = None
            mlp(x).backward(go)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(x.grad.float()).all() and x.grad.abs().max() > 0
