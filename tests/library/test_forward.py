"""The memory-lean mode and the Triton forward (swiglu.kernels.forward) at small shapes: under
TRITON_INTERPRET=1 on a CPU, on the GPU when present.

* The fused forward (and its cuBLAS alternative) against float64 and the plain bf16 forward: the
  benchmark's criterion against nn.Linear's bf16 output, and an error against float64 no worse
  than twice the plain bf16 forward's. Outputs start as NaN (an unwritten tile stays NaN).
* The activation the memory-lean backward recomputes is bitwise the forward's: the same
  ``kernels._activated_gate`` in the fused epilogue, the product kernel and the dSwiGLU epilogue;
  on the PyTorch path the same ``reference.activated_gate_of``.
* Saved activations per layer: plain nn.Linear module 4 [T, I], saved mode 3, memory-lean 2.
* Both modes keep working under activation checkpointing, autocast, frozen weights and
  torch.compile(fullgraph=True).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import swiglu
from swiglu import CASES, make_inputs, relative_error
from swiglu.kernels import forward as fwd
from swiglu.memory import saved_activations
from swiglu.module import PlainSwiGLUMLP
from swiglu.kernels.backward import KernelConfig, triton_swiglu_backward
from swiglu_lab.bench import tables

from triton_checks import NAMES, SMALL_CONFIGS, BackwardSpy, check_args, check_output, fresh_seed, ulp_norm

# Small tiles: several tiles and partial edge tiles per shape, two K steps at H = 64.
FUSED_SMALL = KernelConfig(BM=64, BN=64, BK=32, EPI_SPLIT=2)
FORWARD_CONFIGS = {"fused": FUSED_SMALL, "fused_split1": KernelConfig(BM=64, BN=32, BK=32, EPI_SPLIT=1), "cublas": None}
ATOL = min(c.atol for c in CASES)  # the strictest of the benchmark's tolerances
MODES = {"lean": False, "saved": True}


def _weights(inp):
    return inp.gate_weight, inp.up_weight, inp.down_weight


def _plain_forward(x, gw, uw, dw):
    """nn.Linear's forward: out, gate_output, up_output, activated_gate in x's dtype."""
    gate = F.linear(x, gw)
    act = F.silu(gate)
    up = F.linear(x, uw)
    return F.linear(act * up, dw), gate, up, act


@pytest.fixture
def nan_outputs(monkeypatch):
    """Every output of the Triton forward starts as NaN."""
    monkeypatch.setattr(fwd, "_empty", lambda shape, device: torch.full(shape, float("nan"), device=device, dtype=torch.bfloat16))


@pytest.mark.parametrize("config", list(FORWARD_CONFIGS), ids=str)
@pytest.mark.parametrize(
    "batch_size,seq_len,hidden_size,intermediate_size",
    [(1, 1, 64, 128), (1, 7, 200, 344), (1, 77, 64, 136), (2, 5, 72, 200)],
    ids=["T1", "T7_H200_I344", "T77", "b2_s5"],
)
def test_forward_against_float64_and_plain_bf16(device, nan_outputs, config, batch_size, seq_len, hidden_size, intermediate_size):
    seed = fresh_seed()
    inp = make_inputs(batch_size, seq_len, hidden_size, intermediate_size, seed=seed, device=device)
    args = (inp.x, *_weights(inp))
    before = [t.clone() for t in args]
    got = fwd.triton_swiglu_forward(*args, config=FORWARD_CONFIGS[config], return_activated_gate=True)
    for t, b in zip(args, before):
        assert torch.equal(t, b), "an input was modified"
    plain = _plain_forward(*args)
    oracle = _plain_forward(*(t.double() for t in args))
    # Same-rounding references for the ulp oracle: gate/up are nn.Linear's; activated_gate and out
    # are the plain formulas applied to the Triton forward's own gate/up (an output flipped by an
    # ulp there would otherwise count against every element downstream of it).
    _, gate, up, act = got
    same = (F.linear(act * up, inp.down_weight), plain[1], plain[2], F.silu(gate))
    for name, g, p, s, o in zip(("out", "gate_output", "up_output", "activated_gate"), got, plain, same, oracle):
        assert g.dtype == torch.bfloat16 and g.is_contiguous(), name
        check_output(name, g, p, o, ATOL, seed, same=s)  # the plain bf16 forward is the benchmark's reference here


@pytest.mark.parametrize("config", list(FORWARD_CONFIGS), ids=str)
def test_recomputed_activation_is_bitwise_the_forwards(device, config):
    """The Triton forward's activated_gate (fused epilogue or product kernel) is bitwise what the
    product kernel computes again from its gate_output, and the backward that recomputes it in its
    epilogue (activated_gate=None) gives bitwise the gradients of the backward given it."""
    seed = fresh_seed()
    inp = make_inputs(1, 45, 64, 136, seed=seed, device=device)
    out, gate, up, act = fwd.triton_swiglu_forward(
        inp.x, *_weights(inp), config=FORWARD_CONFIGS[config], return_activated_gate=True
    )
    act2, h2 = (torch.full((45, 136), float("nan"), device=device, dtype=torch.bfloat16) for _ in range(2))
    fwd.launch_swiglu_product(gate.reshape(45, 136), up.reshape(45, 136), h2, act2)
    assert torch.equal(act2, act.reshape(45, 136)), f"product kernel's activation differs, seed={seed}"
    assert torch.equal(F.linear(h2, inp.down_weight), out.reshape(45, 64)), f"h differs, seed={seed}"
    go = inp.grad_output
    given = triton_swiglu_backward(go, inp.x, gate, up, act, *_weights(inp), configs=SMALL_CONFIGS)
    recomputed = triton_swiglu_backward(go, inp.x, gate, up, None, *_weights(inp), configs=SMALL_CONFIGS)
    for name, a, b in zip(NAMES, recomputed, given):
        assert torch.equal(a, b), f"{name}: recomputing activated_gate changed the result, seed={seed}"
    assert given[2].abs().max() > 0  # grad_up_weight = (g * act).T @ x: a wrong act would show
    # grad_down_weight alone: h from the product kernel instead of the epilogue.
    down_only = triton_swiglu_backward(
        go,
        inp.x,
        gate,
        up,
        None,
        *_weights(inp),
        configs=SMALL_CONFIGS,
        need_grad_x=False,
        need_grad_gate_weight=False,
        need_grad_up_weight=False,
    )
    assert torch.equal(down_only[3], given[3]), f"grad_down_weight alone differs, seed={seed}"


@pytest.mark.parametrize(
    "needs",
    [
        (True, True, True, True),
        (True, False, False, False),
        (False, True, False, True),
        (False, False, True, False),
        (False, False, False, True),
    ],
    ids=str,
)
def test_overwrite_activations_is_bitwise_and_writes_only_gate_up(device, needs):
    """overwrite_activations=True (the lean autograd path): d_gate/d_up go into the given gate/up
    buffers; every gradient is bitwise the default's, which leaves its inputs as they were; no
    other input is written; gate/up are left unchanged where dSwiGLU does not run (only
    grad_down_weight wanted). release_activations=True besides: the same gradients, and the
    storage of a tensor that is all of its storage is freed (a view into a larger one is not)."""
    seed = fresh_seed()
    inp = make_inputs(1, 45, 64, 136, seed=seed, device=device)
    gate, up = inp.gate_output, inp.up_output
    others = [inp.grad_output, inp.x, *_weights(inp)]
    before = [t.clone() for t in (*others, gate, up)]
    flags = dict(zip(("need_grad_x", "need_grad_gate_weight", "need_grad_up_weight", "need_grad_down_weight"), needs))
    want = triton_swiglu_backward(inp.grad_output, inp.x, gate, up, None, *_weights(inp), configs=SMALL_CONFIGS, **flags)
    for t, b in zip((*others, gate, up), before):
        assert torch.equal(t, b), "the default backward wrote an input"
    g2, u2 = gate.clone(), up.clone()
    got = triton_swiglu_backward(
        inp.grad_output, inp.x, g2, u2, None, *_weights(inp), configs=SMALL_CONFIGS, overwrite_activations=True, **flags
    )
    for name, a, b, need in zip(NAMES, got, want, needs):
        assert (a is None) == (b is None) == (not need), name
        if need:
            assert torch.equal(a, b), f"{name} differs when overwriting, seed={seed}"
    for t, b in zip(others, before):
        assert torch.equal(t, b), "overwrite_activations wrote an input other than gate/up"
    dswiglu_ran = any(needs[:3])
    assert torch.equal(g2, gate) != dswiglu_ran and torch.equal(u2, up) != dswiglu_ran
    with pytest.raises(ValueError, match="separate memory"):
        triton_swiglu_backward(
            inp.grad_output, inp.x, g2, g2, None, *_weights(inp), configs=SMALL_CONFIGS, overwrite_activations=True
        )
    # release_activations: same gradients; gate/up's own storage freed, a view of a larger buffer kept.
    g3 = gate.clone()
    both = torch.stack([up, up])
    got = triton_swiglu_backward(
        inp.grad_output,
        inp.x,
        g3,
        both[0],
        None,
        *_weights(inp),
        configs=SMALL_CONFIGS,
        overwrite_activations=True,
        release_activations=True,
        **flags,
    )
    for name, a, b, need in zip(NAMES, got, want, needs):
        assert not need or torch.equal(a, b), f"{name} differs when releasing, seed={seed}"
    assert g3.untyped_storage().nbytes() == 0, "gate_output's storage was not released"
    assert both.untyped_storage().nbytes() == both.numel() * 2 and torch.equal(both[1], up)
    with pytest.raises(ValueError, match="needs overwrite_activations"):
        triton_swiglu_backward(inp.grad_output, inp.x, gate, up, None, *_weights(inp), release_activations=True)


def test_retain_graph_backpropagates_twice_unless_buffers_are_reused(device):
    """Lean and saved modes backpropagate twice (gradients accumulate to exactly twice the
    first); with reuse_saved_buffers=True the first backward wrote over the saved gate/up, so a
    second one is a RuntimeError naming the remedy."""
    gen = torch.Generator().manual_seed(fresh_seed())
    x = torch.randn(9, 48, generator=gen).bfloat16().to(device)
    go = torch.randn(9, 48, generator=gen).bfloat16().to(device)
    for save, reuse in ((False, False), (True, False), (False, True)):
        mlp = swiglu.SwiGLUMLP(
            48, 80, impl="triton", save_activated_gate=save, reuse_saved_buffers=reuse, device=device, dtype=torch.bfloat16
        )
        out = mlp(x)
        out.backward(go, retain_graph=True)
        first = mlp.down_proj.weight.grad.clone()
        if not reuse:
            out.backward(go)
            assert torch.equal(mlp.down_proj.weight.grad, first * 2)
        else:
            with pytest.raises(RuntimeError, match="reuse_saved_buffers=False.*retain_graph=True"):
                out.backward(go)


def test_lean_module_on_triton_is_the_backward_of_its_forward(device):
    """SwiGLUMLP(impl="triton") in the lean mode: out is the Triton forward's, and the
    gradients are bitwise the Triton backward's given that forward's activated_gate."""
    seed = fresh_seed()
    inp = make_inputs(2, 7, 64, 136, seed=seed, device=device)
    mlp = swiglu.SwiGLUMLP(64, 136, impl="triton", device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        for p, w in zip((mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight), _weights(inp)):
            p.copy_(w)
    x = inp.x.clone().requires_grad_(True)
    out = mlp(x)
    out.backward(inp.grad_output)
    want_out, gate, up, act = fwd.triton_swiglu_forward(inp.x, *_weights(inp), return_activated_gate=True)
    assert torch.equal(out, want_out)
    want = triton_swiglu_backward(inp.grad_output, inp.x, gate, up, act, *_weights(inp))
    got = (x.grad, mlp.gate_proj.weight.grad, mlp.up_proj.weight.grad, mlp.down_proj.weight.grad)
    for name, g, w in zip(NAMES, got, want):
        assert torch.equal(g, w), f"{name}, seed={seed}"
    # ... and those are right: the ulp oracle on the lean backward's inputs (act recomputed).
    check_args((inp.grad_output, inp.x, gate, up, None, *_weights(inp)), got, seed)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_lean_equals_saved_on_the_reference_path(dtype):
    """PyTorch path: both modes compute activated_gate with reference.activated_gate_of, so the
    forward and all four gradients are bitwise equal."""
    seed = fresh_seed()
    results = []
    for save in (False, True):
        torch.manual_seed(seed)  # the same fresh weights for both modes
        mlp = swiglu.SwiGLUMLP(48, 80, impl="reference", save_activated_gate=save, dtype=dtype)
        x = torch.randn(3, 5, 48, generator=torch.Generator().manual_seed(seed)).to(dtype).requires_grad_(True)
        out = mlp(x)
        out.backward(torch.ones_like(out))
        results.append([out, x.grad] + [p.grad for p in mlp.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b), f"seed={seed}"


@pytest.mark.parametrize("tokens", [1, 13])
def test_saved_activations_per_layer(tokens):
    """Distinct saved tensors besides the weights: x plus 4 [T, I] (nn.Linear module: gate_output,
    activated_gate, up_output, h), 3 (saved mode) or 2 (memory-lean mode)."""
    H, I = 48, 80
    x = torch.randn(tokens, H, requires_grad=True)
    counts = {}
    for name, module in [
        ("plain", PlainSwiGLUMLP(H, I)),
        ("saved", swiglu.SwiGLUMLP(H, I, save_activated_gate=True)),
        ("lean", swiglu.SwiGLUMLP(H, I)),
    ]:
        saved = saved_activations(module, x)
        counts[name] = saved.count((tokens, I))
        assert saved.count((tokens, H)) == 1, name
        assert saved.bytes == 4 * (tokens * H + counts[name] * tokens * I), name
    assert counts == {"plain": 4, "saved": 3, "lean": 2}


def test_triton_forward_errors(device):
    inp = make_inputs(1, 8, 64, 136, seed=1, device=device)
    w = _weights(inp)
    with pytest.raises(TypeError, match="x must be bfloat16"):
        fwd.triton_swiglu_forward(inp.x.float(), *w)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fwd.triton_swiglu_forward([1.0], *w)
    with pytest.raises(ValueError, match="down_weight"):
        fwd.triton_swiglu_forward(inp.x, w[0], w[1], w[2].t())
    with pytest.raises(ValueError, match="x must have shape"):
        fwd.triton_swiglu_forward(inp.x[..., :32], *w)
    with pytest.raises(ValueError, match="multiple of 8"):
        small = make_inputs(1, 8, 60, 136, seed=1, device=device)
        fwd.triton_swiglu_forward(small.x, *_weights(small))
    with pytest.raises(ValueError, match="EPI_SPLIT 1 or 2"):
        fwd.triton_swiglu_forward(inp.x, *w, config=KernelConfig(BM=64, BN=64, BK=32, EPI_SPLIT=4))
    with pytest.raises(ValueError, match="config must be"):
        fwd.triton_swiglu_forward(inp.x, *w, config="fused")
    with pytest.raises(TypeError, match="save_activated_gate must be a bool"):
        swiglu.swiglu_mlp(inp.x, *w, save_activated_gate="lean")
    with pytest.raises(TypeError, match="save_activated_gate must be a bool"):
        swiglu.SwiGLUMLP(64, 136, save_activated_gate=None)


def test_triton_forward_no_tokens(device):
    inp = make_inputs(1, 8, 64, 136, seed=1, device=device)
    out, gate, up, act = fwd.triton_swiglu_forward(inp.x[:, :0], *_weights(inp), return_activated_gate=True)
    assert out.shape == (1, 0, 64) and gate.shape == up.shape == act.shape == (1, 0, 136)


def test_forward_config_table():
    """Every token bucket has an entry, and a T past the last bound uses the last one."""
    from swiglu.kernels.backward import TOKEN_BUCKETS

    assert set(fwd.FORWARD_CONFIGS) == set(TOKEN_BUCKETS)
    assert fwd.forward_config_for(1 << 40) is fwd.FORWARD_CONFIGS[TOKEN_BUCKETS[-1]]
    for cfg in fwd.FORWARD_CONFIGS.values():
        assert cfg is None or cfg.EPI_SPLIT in (1, 2)
    for (hidden, inter), buckets in fwd.FORWARD_CONFIGS_BY_SHAPE.items():  # the per-shape entries alike
        assert hidden % 8 == 0 and inter % 8 == 0 and set(buckets) <= set(TOKEN_BUCKETS)
        for cfg in buckets.values():
            assert cfg is None or cfg.EPI_SPLIT in (1, 2)


def test_a_shape_entry_replaces_the_bucket_choice_at_that_shape_only(monkeypatch):
    """``configs_by_shape``: its bucket's choice at its (hidden_size, intermediate_size), the
    shape-agnostic table's everywhere else (other shapes, other buckets, no shape given)."""
    from swiglu.kernels.configs import bucket_for

    fused = tables.FUSED_SMALL
    monkeypatch.setitem(fwd.FORWARD_CONFIGS, bucket_for(300), fused)
    monkeypatch.setitem(fwd.FORWARD_CONFIGS_BY_SHAPE, (64, 96), {bucket_for(300): None})
    assert fwd.forward_config_for(300, 64, 96) is None
    assert fwd.forward_config_for(300, 64, 104) is fused and fwd.forward_config_for(300, 96, 64) is fused
    assert fwd.forward_config_for(300) is fused
    assert fwd.forward_config_for(5000, 64, 96) is fwd.FORWARD_CONFIGS[bucket_for(5000)]
    with pytest.raises(TypeError, match="both hidden_size and intermediate_size"):
        fwd.forward_config_for(300, 64)
    # The shipped entry: Llama-3-8B's layer at 2048 tokens runs the cuBLAS path (measured in-step).
    assert fwd.forward_config_for(2048, 4096, 14336) is None


def test_the_forward_takes_its_shapes_entry(device, monkeypatch):
    """``triton_swiglu_forward(config="auto")`` looks the shape up: the fused kernel where the
    bucket's entry is fused, cuBLAS where the shape's own entry says so, with the same values."""
    from swiglu.kernels.configs import bucket_for

    inp = make_inputs(1, 40, 64, 136, seed=3, device=device)
    monkeypatch.setitem(fwd.FORWARD_CONFIGS, bucket_for(40), tables.FUSED_SMALL)
    fused_calls = []
    real = fwd.launch_fused_forward
    monkeypatch.setattr(fwd, "launch_fused_forward", lambda *a: fused_calls.append(1) or real(*a))
    want = fwd.triton_swiglu_forward(inp.x, *_weights(inp))
    assert fused_calls == [1]
    monkeypatch.setitem(fwd.FORWARD_CONFIGS_BY_SHAPE, (64, 136), {bucket_for(40): None})
    got = fwd.triton_swiglu_forward(inp.x, *_weights(inp))
    assert fused_calls == [1]  # the cuBLAS path this time
    for w, g in zip(want, got):
        assert relative_error(g, w) < 2e-2


# ------------------------------------------------------------------ both modes keep working


def _grads(module, x, go, wrap=lambda m, x: m(x)):
    xl = x.clone().requires_grad_(True)
    wrap(module, xl).backward(go)
    return [xl.grad] + [p.grad for p in module.parameters()]


def _same_weights(save, dtype=torch.float64, impl="reference", device="cpu"):
    torch.manual_seed(3)
    ours = swiglu.SwiGLUMLP(48, 80, impl=impl, save_activated_gate=save, dtype=dtype, device=device)
    plain = PlainSwiGLUMLP(48, 80, dtype=dtype, device=device)
    plain.load_state_dict(ours.state_dict())
    return ours, plain


@pytest.mark.parametrize("mode", list(MODES))
def test_modes_checkpointing_frozen_and_compile(mode):
    """float64 on the reference path: activation checkpointing, a frozen weight and
    torch.compile(fullgraph=True) give the plain module's gradients in both modes."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    gen = torch.Generator().manual_seed(fresh_seed())
    x = torch.randn(2, 5, 48, generator=gen, dtype=torch.float64)
    go = torch.randn(2, 5, 48, generator=gen, dtype=torch.float64)
    checkpoint = lambda m, x: torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False)  # noqa: E731
    for wrap in (lambda m, x: m(x), checkpoint):
        ours, plain = _same_weights(MODES[mode])
        ours.up_proj.weight.requires_grad_(False)
        plain.up_proj.weight.requires_grad_(False)
        for g, r in zip(_grads(ours, x, go, wrap), _grads(plain, x, go)):
            assert (g is None) == (r is None)
            if r is not None:
                torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    torch._dynamo.reset()
    ours, plain = _same_weights(MODES[mode])
    backend = aot_autograd(
        fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=lambda gm, _: make_boxed_func(gm.forward)
    )
    compiled = torch.compile(ours, backend=backend, fullgraph=True)
    for g, r in zip(_grads(compiled, x, go), _grads(plain, x, go)):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", list(MODES))
def test_modes_triton_autocast(mode, device):
    """float32 weights under autocast(bf16) on the Triton path (interpreter on CPU): float32
    gradients within one bf16 ulp per element (in norm) of the plain module's float64 error under
    the same autocast, and the ulp oracle on what the backward received."""
    ours, plain = _same_weights(MODES[mode], torch.float32, "triton", device)
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(13, 48, generator=gen).to(device)
    go = torch.randn(13, 48, generator=gen).bfloat16().to(device)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        with BackwardSpy() as spy:
            got = _grads(ours, x, go)
        want = _grads(plain, x, go)
    plain64 = PlainSwiGLUMLP(48, 80, dtype=torch.float64, device=device)
    plain64.load_state_dict({k: v.bfloat16().double() for k, v in plain.state_dict().items()})
    oracle = _grads(plain64, x.bfloat16().double(), go.double())
    for g, p, o in zip(got, want, oracle):
        assert g.dtype == torch.float32
        assert relative_error(g, o) <= relative_error(p, o) + ulp_norm(o)
    spy.check(got, seed)  # the ulp oracle on the bf16 inputs the backward was given


def test_opcheck_lean_ops():
    """The custom ops' schemas, fake implementations and autograd hold in the lean mode too
    (activated_gate comes back empty from the forward and is None in the backward)."""
    from swiglu import ops

    gen = torch.Generator().manual_seed(fresh_seed())
    x = torch.randn(2, 5, 48, generator=gen, dtype=torch.float64).requires_grad_(True)
    w = [
        (torch.randn(s, generator=gen, dtype=torch.float64) / s[1] ** 0.5).requires_grad_(True)
        for s in ((80, 48), (80, 48), (48, 80))
    ]
    torch.library.opcheck(ops.mlp_forward, (x, *w, "reference", False))
    out, gate, up, act = ops.mlp_forward(x, *w, "reference", False)
    assert act.shape == (0,)
    go = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    for needs in [(True, True, True, True), (False, False, True, False)]:
        torch.library.opcheck(ops.mlp_backward, (go, x.detach(), gate, up, None, *(t.detach() for t in w), *needs, "reference"))


@pytest.mark.parametrize("mode", list(MODES))
def test_modes_triton_checkpointing_is_bitwise(mode, device):
    """Triton path (interpreter on CPU): activation checkpointing reruns the forward, so the
    gradients are bitwise those without it, in both modes."""
    gen = torch.Generator().manual_seed(fresh_seed())
    x = torch.randn(2, 7, 48, generator=gen).bfloat16().to(device)
    go = torch.randn(2, 7, 48, generator=gen).bfloat16().to(device)
    ours, _ = _same_weights(MODES[mode], torch.bfloat16, "triton", device)
    plain_grads = _grads(ours, x, go)
    for p in ours.parameters():
        p.grad = None
    checkpoint = lambda m, x: torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False)  # noqa: E731
    for g, r in zip(_grads(ours, x, go, checkpoint), plain_grads):
        assert torch.equal(g, r)
