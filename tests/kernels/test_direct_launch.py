"""``swiglu.kernels.launch.direct_runner``: the C launcher gets the very arguments triton 3.6's own
runner would give it (checked against triton 3.6's descriptor wrapper with a fake C launcher, in a
subprocess with that triton on the path); on the GPU, the whole-backward tests run through it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swiglu.kernels import configs, devices, launch, tma

ROOT = Path(__file__).resolve().parents[2]
EXTRA_TRITON_DIR = os.environ.get("SWIGLU_EXTRA_TRITON_DIR")


def test_expand_descriptors_replaces_each_descriptor_by_its_map_shape_and_strides():
    t = torch.empty(40, 24, dtype=torch.bfloat16)
    d = tma.Tma(t, [8, 16])
    seen = []
    out = launch.expand_descriptors(
        ("x", d, 5, d), ((1, 128, 2, 9, [8, 16]), (3, 64, 2, 9, [8, 16])), lambda *a: seen.append(a) or f"map{len(seen)}"
    )
    assert out == ["x", "map2", 40, 24, 24, 1, 5, "map1", 40, 24, 24, 1]  # filled last position first
    assert seen[1] == (t.data_ptr(), 128, 2, 9, [8, 16], t.shape, t.stride(), 0)


def test_expand_descriptors_binds_a_cuda_context_and_retries_once(monkeypatch):
    """A fill that fails (no CUDA context on this thread) binds the device's context and fills
    again; where nothing was bound (a context was already current, or no driver) the error stands."""
    t = torch.empty(16, 16, dtype=torch.bfloat16)
    meta = ((0, 128, 2, 9, [8, 16]),)
    calls, bound = [], []

    def fill(*args):
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("Triton Error [CUDA]: Failed to create tensor map descriptor: invalid device context")
        return "map"

    monkeypatch.setattr(launch, "ensure_cuda_context", lambda index: bound.append(index) or True)
    assert launch.expand_descriptors((tma.Tma(t, [8, 16]),), meta, fill)[0] == "map"
    assert len(calls) == 2 and bound == [t.device.index]
    calls.clear()
    monkeypatch.setattr(launch, "ensure_cuda_context", lambda index: False)
    with pytest.raises(RuntimeError, match="invalid device context"):
        launch.expand_descriptors((tma.Tma(t, [8, 16]),), meta, fill)
    assert len(calls) == 1


def test_ensure_cuda_context_without_a_driver_binds_nothing(monkeypatch):
    monkeypatch.setattr(launch, "_libcuda", lambda: None)
    assert launch.ensure_cuda_context(0) is False


def test_expand_descriptors_fills_once_per_address_and_geometry(monkeypatch):
    """The memo: the same memory and geometry at a position reuse its map; another address,
    shape, stride or position fills a new one (a stale map would point a kernel elsewhere)."""
    base = torch.empty(64, 32, dtype=torch.bfloat16)
    seen = []

    def fill(ptr, *rest):
        seen.append((ptr, rest[4], rest[5]))
        return f"map{len(seen)}"

    maps = {}
    meta = ((0, 128, 2, 9, [8, 16]),)

    def expand(t, position_meta=meta):
        return launch.expand_descriptors((tma.Tma(t, [8, 16]),), position_meta, fill, maps)

    first = expand(base)
    assert expand(base) == first and len(seen) == 1
    assert expand(base.clone())[0] == "map2"  # another address
    assert expand(base[:40])[0] == "map3"  # another shape, same address
    assert expand(base[:, :16])[0] == "map4"  # same address, other shape and row stride kept
    assert expand(base.view(32, 64))[0] == "map5"  # same address and size, other strides
    assert (
        launch.expand_descriptors((0, tma.Tma(base, [8, 16])), ((1, 128, 2, 9, [8, 16]),), fill, maps)[1] == "map6"
    )  # another position
    assert expand(base) == first and len(seen) == 6
    monkeypatch.setattr(launch, "_MAPS_MAX", 8)
    filled = len(seen)
    for i in range(20):  # bounded: 20 new geometries, never more than 8 kept
        expand(base[: i + 1])
        assert len(maps) <= 8
    assert len(seen) == filled + 20


def test_as_descriptors_builds_tritons_descriptors_for_its_own_path():
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = torch.empty(16, 32, dtype=torch.bfloat16)
    plain, n = tma.as_descriptors((tma.Tma(t, [8, 16]), 7))
    assert isinstance(plain, TensorDescriptor) and plain.base is t and list(plain.block_shape) == [8, 16] and n == 7
    assert tuple(plain.shape) == (16, 32) and tuple(plain.strides) == (32, 1)


def test_no_direct_runner_on_another_triton_or_when_switched_off(monkeypatch):
    import triton

    compiled = SimpleNamespace(run=None)
    if devices.triton_minor(triton.__version__) != launch.DIRECT_LAUNCH_TRITON:
        assert launch.direct_runner(compiled, (1, 1, 1)) is None
    monkeypatch.setattr(launch, "DIRECT_LAUNCH", False)
    assert launch.direct_runner(compiled, (1, 1, 1)) is None


def test_direct_runner_hands_the_c_launcher_what_triton_36_does(tmp_path):
    if not EXTRA_TRITON_DIR:
        pytest.skip("SWIGLU_EXTRA_TRITON_DIR unset (make test-gpu-triton sets it to the GPU machine's triton)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([EXTRA_TRITON_DIR, str(ROOT / "src")])
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "direct_launch_worker.py")], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert devices.triton_minor(report["triton"]) == launch.DIRECT_LAUNCH_TRITON and report["direct"]
    assert report["n_calls"] == 5
    assert report["direct_call"] == report["triton_call"]
    assert len(report["triton_call"]) == 13 + (1 + 4) + 1 + 1 + 1 + (1 + 4)  # base, a, n, BM, b, c
    # Triton's call, the first direct one; the second none; new memory one; a new runner (rest) its own
    assert len(report["fills"]) == 2 + 2 + 1 + 2
    assert report["repeat_call"] == report["direct_call"]
    assert report["moved_call"] != report["direct_call"] and report["moved_call"][13:] != report["direct_call"][13:]
    assert report["rest_call"] == report["direct_call"] + ["'rest'"]
    assert report["hooked"] == ["slow"]  # a hook added (a profiler): Triton's runner takes the call


# --------------------------------------------------------------------------------------- GPU
def _backward(tensors, direct: bool):
    from swiglu import swiglu_mlp_backward

    launch.DIRECT_LAUNCH = direct
    launch.clear_launches()
    try:
        first = swiglu_mlp_backward(*tensors, impl="triton")  # Triton's own launch path
        again = swiglu_mlp_backward(*tensors, impl="triton")  # the cached launch (direct or runner)
        torch.cuda.synchronize()
        runners = list(launch._LAUNCHES.values())
        return first, again, runners
    finally:
        launch.DIRECT_LAUNCH = True
        launch.clear_launches()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "T, H, I", [(1, 520, 1176), (77, 384, 520), (300, 1000, 1176), (2048, 1024, 2816), (128, 16384, 53248), (256, 16384, 53248)]
)
def test_direct_launches_give_the_bits_of_tritons_runner(T, H, I):
    """Every gradient bitwise the same through the direct C launch, Triton's runner and Triton's
    first (JIT) launch, at odd T, in the tl and the Gluon buckets; every cached launch direct."""
    import triton

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from swiglu import make_inputs, reference_backward
    from swiglu.accuracy import benchmark_criterion

    tensors = make_inputs(1, T, H, I, seed=T, device="cuda").as_tuple()
    first, direct, runners = _backward(tensors, True)
    _, slow, slow_runners = _backward(tensors, False)
    if devices.triton_minor(triton.__version__) == launch.DIRECT_LAUNCH_TRITON:
        assert runners and all(r.__name__ == "run" for r in runners)
    assert not any(getattr(r, "__name__", "") == "run" for r in slow_runners)
    for name, a, b, c, ref in zip(
        ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight"), first, direct, slow, reference_backward(*tensors)
    ):
        assert torch.equal(a, b) and torch.equal(b, c), name
        assert benchmark_criterion(b, ref, 0.13).passed, name


def test_launch_refuses_a_descriptor_passed_by_keyword(monkeypatch):
    """Keyword values are kept from a key's first launch, so a tensor there would go stale."""
    monkeypatch.setattr(launch, "_LAUNCHES", {})
    with pytest.raises(TypeError, match="positionally"):
        launch.launch(object(), (1,), ("k",), desc=tma.Tma(torch.empty(8, 8), [8, 8]))


# ------------------------------------------------------------------ PDL and the cached keywords
class _FakeKernel:
    """``kernel[grid](*args, **kwargs)`` records the keywords; ``arg_names`` as a JITFunction's."""

    arg_names = ["a", "BM", "PDL"]

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(kwargs)


@pytest.mark.parametrize(
    "pdl, interpret, expect",
    [
        (1, False, {"BM": 64, "PDL": 1, "launch_pdl": True}),
        (2, False, {"BM": 64, "PDL": 2, "launch_pdl": True}),
        (0, False, {"BM": 64, "PDL": 0}),
        (1, True, {"BM": 64, "PDL": 0}),
    ],
)
def test_launch_passes_pdl_to_every_kernel(monkeypatch, pdl, interpret, expect):
    """Every kernel launched through ``launch.launch`` gets the PDL constexpr, and triton's
    launch_pdl option with it; never in the interpreter (a recorder patches INTERPRET at call time)."""
    monkeypatch.setattr(launch, "_LAUNCHES", {})
    monkeypatch.setattr(launch, "PDL", pdl)
    monkeypatch.setattr(devices, "INTERPRET", interpret)
    kernel = _FakeKernel()
    launch.launch(kernel, (1,), ("fake", pdl, interpret), 7, BM=64)
    assert kernel.calls == [expect]


def test_each_pdl_setting_keeps_its_own_launches(monkeypatch):
    """A compiled launch of one setting is never run under the other (its launch attribute and
    PDL constexpr are the compiled kernel's), and switching back finds the first one's launches."""
    monkeypatch.setattr(devices, "INTERPRET", False)
    monkeypatch.setattr(launch, "PDL", True)
    on = {("k",): "compiled with PDL"}
    monkeypatch.setattr(launch, "_LAUNCHES", on)
    monkeypatch.setattr(launch, "_LAUNCHES_BY_PDL", {True: on})
    launch.set_pdl(False)
    assert launch.PDL == 0 and launch._LAUNCHES == {}
    launch._LAUNCHES[("k",)] = "plain"
    launch.set_pdl(True)
    assert launch.PDL == 1 and launch._LAUNCHES is on and on == {("k",): "compiled with PDL"}
    launch.set_pdl(False)
    assert launch._LAUNCHES == {("k",): "plain"}
    for bad in (3, 1.0, "1"):
        with pytest.raises(ValueError, match="mode must be one of"):
            launch.set_pdl(bad)


def test_a_bad_swiglu_pdl_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(devices, "INTERPRET", False)  # as on a GPU: the value is used
    monkeypatch.setenv("SWIGLU_PDL", "yes")
    with pytest.raises(ValueError, match="SWIGLU_PDL must be one of 0, 1, 2"):
        launch._pdl_from_env()
    monkeypatch.setenv("SWIGLU_PDL", "2")
    assert launch._pdl_from_env() == 2
    monkeypatch.setattr(devices, "INTERPRET", True)
    assert launch._pdl_from_env() == 0  # never in the interpreter


def test_launch_kwargs_follow_the_interpreter_switch(monkeypatch):
    """UPCAST follows ``devices.INTERPRET`` at each call: the compile tests' recorder patches it to
    True while collecting, and a dict cached then would give every later GPU launch of that config
    fp32 operands (TF32 dots: other bits)."""
    cfg = configs.KernelConfig(BM=64, BN=64, BK=32, GROUP_M=3)  # a config of this test alone
    for flag in (True, False, True, False):
        monkeypatch.setattr(devices, "INTERPRET", flag)
        assert launch.launch_kwargs(cfg)["UPCAST"] is flag


def test_launch_asks_for_every_argument_after_the_positional_ones_by_keyword():
    """The cached runner replays the keyword arguments in signature order: a constexpr left at
    its default (not passed) would be missing there at the second launch on a GPU, so the first
    launch, in the interpreter too, names it. The same kernel with it passed runs."""
    import triton
    import triton.language as tl

    @triton.jit
    def _fill(out_ptr, BLOCK: tl.constexpr, PDL: tl.constexpr, TWICE: tl.constexpr = False):
        i = tl.arange(0, BLOCK)
        tl.store(out_ptr + i, tl.full((BLOCK,), 2.0 if TWICE else 1.0, tl.float32))

    out = torch.zeros(16)
    with pytest.raises(TypeError, match=r"_fill needs \['TWICE'\] by keyword"):
        launch.launch(_fill, (1,), ("t", 16), out, BLOCK=16)
    if devices.INTERPRET:
        launch.launch(_fill, (1,), ("t", 16, True), out, BLOCK=16, TWICE=True)
        assert torch.equal(out, torch.full((16,), 2.0))
