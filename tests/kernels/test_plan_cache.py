"""The cached decisions (backend per (impl, device, dtype, H, I), launch plan per (T, H, I,
device)) never serve a call they were not made for: calls alternate shapes, token counts across
buckets, strides, frozen inputs, memory modes, backends and threads, and every result is checked
against the float64 formula (bf16 bound) and, for the Triton path, against a fresh process state
(the caches cleared) bit for bit. A plan keyed on less than it depends on fails here."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

import swiglu
from swiglu import ops

# (T, H, I): token counts in different buckets and sizes that change every tile count.
SHAPES = [(7, 16, 48), (130, 32, 64), (1, 16, 48), (7, 32, 64), (260, 16, 48), (0, 32, 64)]


def _inputs(T, H, I, seed, device, transposed=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(H, T, generator=g).T if transposed else torch.randn(T, H, generator=g)
    w = [torch.randn(s, generator=g) / s[1] ** 0.5 for s in ((I, H), (I, H), (H, I))]
    go = torch.randn(T, H, generator=g)
    return [t.bfloat16().to(device) for t in (x, go, *w)]


def _grads(x, go, w, impl, frozen, save):
    x = x.detach().requires_grad_("x" not in frozen)
    w = [t.detach().requires_grad_(name not in frozen) for t, name in zip(w, ("gate", "up", "down"))]
    out = swiglu.swiglu_mlp(x, *w, impl=impl, save_activated_gate=save)
    out.backward(go)
    return [t.grad for t in (x, *w)]


def _oracle(x, go, w):
    x, go, *w = (t.double().requires_grad_() for t in (x, go, *w))
    out = torch.nn.functional.linear(torch.nn.functional.silu(x @ w[0].T) * (x @ w[1].T), w[2])
    out.backward(go)
    return [t.grad for t in (x, *w)]


def _check(got, want, label):
    for name, g, o in zip(("grad_x", "grad_gate", "grad_up", "grad_down"), got, want):
        if g is None:
            continue
        assert g.shape == o.shape, f"{label} {name}: shape {list(g.shape)} != {list(o.shape)}"
        o = o.cpu()
        err = (g.double().cpu() - o).norm() / max(o.norm(), 1e-30)
        assert err < 3e-2 or o.norm() == 0, f"{label} {name}: relative error {err:.3g}"


def test_alternating_calls_match_the_oracle_and_a_fresh_state(device):
    frozen_sets = [(), ("gate",), ("x", "down")]
    runs = []
    for i, ((T, H, I), frozen, save, transposed, impl) in enumerate(
        zip(
            SHAPES * 2,
            itertools.cycle(frozen_sets),
            itertools.cycle([False, True]),
            itertools.cycle([False, False, True]),
            itertools.cycle(["triton", "triton", "reference"]),
        )
    ):
        x, go, *w = _inputs(T, H, I, i, device, transposed)
        got = _grads(x, go, w, impl, frozen, save)
        label = f"call {i} (T={T}, H={H}, I={I}, {impl}, frozen={frozen}, save={save}, transposed={transposed})"
        for g, name in zip(got, ("x", "gate", "up", "down")):
            assert (g is None) == (name in frozen), f"{label}: {name} gradient presence"
        _check(got, _oracle(x, go, w), label)
        runs.append((x, go, w, impl, frozen, save, got))
    # The same calls from an empty cache: bit for bit what the warm caches gave.
    ops.clear_plans()
    for x, go, w, impl, frozen, save, got in reversed(runs):
        again = _grads(x, go, w, impl, frozen, save)
        for a, b in zip(got, again):
            assert (a is None and b is None) or torch.equal(a, b)


def test_threads_deciding_at_once(device):
    """Eight threads resolving and planning different keys from an empty cache at the same
    moment get what one thread gets alone. (Whole backwards in threads: the GPU test below; the
    Triton interpreter is not thread-safe.)"""
    from swiglu.kernels import backward

    keys = [(T, H, I) for T, H, I in SHAPES] + [(4096, 16, 48), (9000, 32, 64)]
    dev = backward.plan_device(torch.device(device))

    def answers():
        return [
            (
                backward.backward_plan(T, H, I, dev),
                ops.resolve_impl(
                    "triton",
                    torch.empty(1, H, dtype=torch.bfloat16, device=device),
                    torch.empty(I, H, dtype=torch.bfloat16, device=device),
                ),
            )
            for T, H, I in keys
        ]

    alone = answers()
    ops.clear_plans()
    barrier, results = threading.Barrier(8), []

    def work():
        barrier.wait()
        results.append(answers())

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r == alone for r in results)


@pytest.mark.gpu
def test_threads_running_backwards_at_once():
    """Four threads on one GPU, each its own shape and CUDA stream, from an empty cache (the
    kernels compiled first: Triton's JIT is not ours to test)."""
    barrier, errors = threading.Barrier(4), []
    for T, H, I in SHAPES[:4]:
        x, go, *w = _inputs(T, H, I, 0, "cuda")
        _grads(x, go, w, "triton", (), False)
    torch.cuda.synchronize()

    def work(k):
        T, H, I = SHAPES[k]
        x, go, *w = _inputs(T, H, I, 100 + k, "cuda")
        barrier.wait()
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                for _ in range(3):
                    got = _grads(x, go, w, "triton", (), False)
                torch.cuda.current_stream().synchronize()
            _check(got, _oracle(x, go, w), f"thread {k}")
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"thread {k}: {type(e).__name__}: {e}")

    ops.clear_plans()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_auto_decision_follows_dtype_and_sizes(device):
    """One cache entry per key: bf16 and float32, aligned and unaligned sizes, resolved apart."""
    w16 = torch.empty(48, 16, dtype=torch.bfloat16, device=device)
    w44 = torch.empty(44, 16, dtype=torch.bfloat16, device=device)
    x = torch.empty(3, 16, dtype=torch.bfloat16, device=device)
    assert ops.resolve_impl("triton", x, w16) == "triton"
    with pytest.raises(ValueError, match="multiple of 8"):
        ops.resolve_impl("triton", x, w44)
    with pytest.raises(TypeError, match="bfloat16"):
        ops.resolve_impl("triton", x.float(), w16.float())
    assert ops.resolve_impl("triton", x, w16) == "triton"
    assert ops.resolve_impl("reference", x.float(), w16.float()) == "reference"
    want = "triton" if torch.cuda.is_available() and swiglu.backend_reason(x.device) is None else "reference"
    assert ops.resolve_impl("auto", x, w16) == want
    assert ops.resolve_impl("auto", x.float(), w16.float()) == "reference"


def test_launch_reuses_the_compiled_kernel_with_the_same_arguments(monkeypatch):
    """launch.launch: Triton's path once per key, then the compiled kernel's runner with every
    argument in signature order (positional, then keyword constexprs); another key compiles again."""
    from swiglu.kernels import devices, launch

    monkeypatch.setattr(devices, "INTERPRET", False)
    monkeypatch.setattr(launch, "_LAUNCHES", {})
    jit_calls, runner_calls = [], []

    class Compiled:
        packed_metadata = object()

        def __getitem__(self, grid):
            return lambda *args: runner_calls.append((grid, args))

    class Kernel:
        arg_names = ["a", "b", "n", "BLOCK", "FLAG"]

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                jit_calls.append((grid, args, kwargs))
                return Compiled()

            return run

    k = Kernel()
    launch.launch(k, (3,), ("k", 10), "A", "B", 10, BLOCK=64, FLAG=True, num_warps=4)
    launch.launch(k, (3,), ("k", 10), "A2", "B2", 10, BLOCK=64, FLAG=True, num_warps=4)
    launch.launch(k, (5,), ("k", 20), "A3", "B3", 20, BLOCK=64, FLAG=True, num_warps=4)
    assert [c[0] for c in jit_calls] == [(3,), (5,)]
    assert runner_calls == [((3, 1, 1), ("A2", "B2", 10, 64, True))]


def test_plan_programs_follow_reserved_sms(monkeypatch):
    """The persistent programs planned per launch are keyed by ``devices.RESERVED_SMS`` (the TP
    bench changes it between runs): a plan made before the change is not served after it."""
    from swiglu.kernels import backward, devices

    monkeypatch.setattr(devices, "num_programs", lambda device, tiles, persistent=True: min(tiles, 132 - devices.RESERVED_SMS))
    ops.clear_plans()
    dev = torch.device("cpu")
    before = backward.backward_plan(4096, 16384, 53248, dev)
    monkeypatch.setattr(devices, "RESERVED_SMS", 8)
    after = backward.backward_plan(4096, 16384, 53248, dev)
    programs = ("dswiglu_programs", "grad_weight_programs_hi", "grad_weight_programs_ih", "grad_x_programs")
    assert [getattr(before, f) for f in programs] == [132] * 4
    assert [getattr(after, f) for f in programs] == [124] * 4
    ops.clear_plans()


def test_grad_x_tiles_fill_the_gpu_where_the_table_would_not():
    """grad_x's table (tuned at H = 16384) keeps its tiles wherever they fill the GPU, Hermes' 18
    cases included (the recorded runs), and narrower ones take over where they would leave SMs
    idle: at Llama-3-8B's H = 4096 the choices measured fastest there (backward.GRAD_X_NARROW)."""
    from swiglu.kernels import backward
    from swiglu.workloads import CASES

    wide, narrow = backward.GRAD_X_NARROW
    table = lambda T: backward.config_for("grad_x", T)  # noqa: E731
    fill = backward.grad_x_config_filling
    for case in CASES:
        assert fill(case.tokens, 16384, table(case.tokens), 132) == table(case.tokens), case
    assert fill(256, 4096, table(256), 132) == narrow  # 32 tiles of 128x256, 64 of 64x256, 128 of 64x128
    assert fill(512, 4096, table(512), 132) == wide  # 64 of 128x256, 128 of 64x256
    assert fill(1024, 4096, table(1024), 132) == table(1024)  # 128 of 128x256
    assert fill(512, 8192, table(512), 132) == table(512)  # Llama-3-70B's layer: 128 of 128x256
    assert fill(1, 4096, table(1), 132) == narrow  # none fills it: the most tiles


def test_the_plan_takes_the_filling_grad_x_tiles_on_cuda_only_when_not_given(monkeypatch):
    from swiglu.kernels import backward, devices

    for name in ("gluon_config_for", "gluon_dswiglu_config_for"):
        monkeypatch.setattr(backward, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(backward, "check_shared_memory", lambda kernel, cfg, device: None)
    monkeypatch.setattr(devices, "_num_sms", lambda index: 132)
    cuda = torch.device("cuda", 0)
    table = backward.config_for("grad_x", 256)
    assert backward._make_plan(256, 4096, 14336, cuda, {}).grad_x == backward.GRAD_X_NARROW[1]
    assert backward._make_plan(256, 16384, 53248, cuda, {}).grad_x == table
    assert backward._make_plan(256, 4096, 14336, cuda, {"grad_x": table}).grad_x == table
    assert backward._make_plan(256, 4096, 14336, torch.device("cpu"), {}).grad_x == table
