"""The bench's quack-kernels peer (swiglu_lab.bench.quack_peer) without quack: registration, the
unavailable reason, metadata fields, the interleaved layouts, the backward wiring against the
reference through fakes that follow quack 0.6.5's backward contract, the search restriction and
its configuration through fake quack modules, and scripts/tune_quack.py's CPU-side behaviour.
The one GPU test needs quack installed and an SM90 GPU."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from swiglu import make_inputs, reference_backward
from swiglu_lab.bench import environment, quack_peer
from swiglu_lab.bench.impls import EXPLICIT_ONLY, IMPLS, default_impls, unavailable_reason

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_configuration(monkeypatch):
    """Each test starts unconfigured, and the env vars configure() sets are restored."""
    monkeypatch.setattr(quack_peer, "_configured", {})
    for name in (
        "QUACK_CACHE_DIR",
        "QUACK_CACHE_AUTOTUNING",
        "QUACK_COMPILE_WORKERS",
        "QUACK_CACHE_ENABLED",
        quack_peer.SEARCH_ENV,
        quack_peer.CACHE_ENV,
        quack_peer.KERNEL_CACHE_ENV,
    ):
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------------------------ registration
def test_registered_opt_in_and_described():
    impl = IMPLS["quack"]
    assert impl.build is quack_peer.build and impl.prepare is quack_peer.to_quack_layout
    assert impl.checks_correctness
    for words in ("tuned=True", "untimed prepare", "interleaved", "silu(gate_output)", "fails the reference check"):
        assert words in impl.note
    assert "quack" in EXPLICIT_ONLY
    assert "quack" not in default_impls(CPU) and "quack" not in default_impls(torch.device("cuda"))


def test_cli_runs_quack_only_when_named(monkeypatch, tmp_path, capsys):
    from swiglu_lab.bench import cli

    seen = []

    def fake_run(config, **kwargs):
        seen.append((list(config.impls), dict(config.skipped)))
        raise SystemExit(0)

    monkeypatch.setattr(cli, "run_benchmark", fake_run)
    base = ["--device", "cpu", "--cases", "s128_b1", "--out", str(tmp_path)]
    for argv, named in ((base, False), (base + ["--impls", "eager,quack"], True)):
        with pytest.raises(SystemExit):
            cli.main(argv)
        impls, skipped = seen.pop()
        assert "quack" not in impls and "eager" in impls
        assert ("quack" in skipped) == named  # named: skipped on CPU with its reason; else not asked for
        if named:
            assert "GPU" in skipped["quack"]


def test_unavailable_reasons(monkeypatch):
    assert "GPU" in unavailable_reason("quack", CPU)
    cuda = torch.device("cuda")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "quack" else real(name, *a))
    why = unavailable_reason("quack", cuda)
    assert "quack-kernels is not installed" in why and "[quack] extra" in why
    assert f"quack-kernels=={quack_peer.QUACK_VERSION}" in why and quack_peer.CUTLASS_DSL_VERSION in why
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cutlass" else object())
    assert "nvidia-cutlass-dsl is not installed" in quack_peer.unavailable_reason(cuda)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert quack_peer.unavailable_reason(cuda) is None


def test_pins_match_the_lab_pyproject():
    text = (REPO / "lab" / "pyproject.toml").read_text()
    assert f'"quack-kernels=={quack_peer.QUACK_VERSION}"' in text
    assert f'"nvidia-cutlass-dsl[cu13]=={quack_peer.CUTLASS_DSL_VERSION}"' in text


# ---------------------------------------------------------------------------------- metadata
def test_metadata_fields(monkeypatch):
    info = environment.software_info()
    for key in ("quack_kernels", "nvidia_cutlass_dsl", "quack_peer"):
        assert key in info
    from importlib import metadata

    def fake_version(dist):
        if dist in ("quack-kernels", "nvidia-cutlass-dsl"):
            return {"quack-kernels": "0.6.5", "nvidia-cutlass-dsl": "4.7.1"}[dist]
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata, "version", fake_version)
    monkeypatch.setattr(quack_peer, "_configured", {"search": "reduced", "tuning_cache_dir": "/x"})
    v = quack_peer.versions()
    assert v == {
        "quack_kernels": "0.6.5",
        "nvidia_cutlass_dsl": "4.7.1",
        "quack_peer": {"search": "reduced", "tuning_cache_dir": "/x"},
    }
    monkeypatch.setattr(metadata, "version", lambda dist: (_ for _ in ()).throw(metadata.PackageNotFoundError(dist)))
    monkeypatch.setattr(quack_peer, "_configured", {})
    assert quack_peer.versions() == {"quack_kernels": None, "nvidia_cutlass_dsl": None, "quack_peer": None}


# ----------------------------------------------------------------------------------- layouts
def test_interleave_layouts():
    gate, up = torch.arange(12.0).reshape(3, 4), 100 + torch.arange(12.0).reshape(3, 4)
    rows = quack_peer.interleave(gate, up, dim=0)  # W1 [2I, H]
    assert rows.shape == (6, 4) and rows.is_contiguous()
    assert torch.equal(rows[0::2], gate) and torch.equal(rows[1::2], up)
    cols = quack_peer.interleave(gate, up, dim=-1)  # preact [T, 2I]
    assert cols.shape == (3, 8) and torch.equal(cols[:, 0::2], gate) and torch.equal(cols[:, 1::2], up)
    g3, u3 = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    p3 = quack_peer.interleave(g3, u3, dim=-1)
    assert p3.shape == (2, 3, 10)
    back = quack_peer.deinterleave(p3, dim=-1)
    assert torch.equal(back[0], g3) and torch.equal(back[1], u3)
    g, u = quack_peer.deinterleave(rows, dim=0)
    assert torch.equal(g, gate) and torch.equal(u, up) and g.data_ptr() == rows.data_ptr()  # views


def test_to_quack_layout_drops_activated_gate():
    inputs = make_inputs(2, 3, 8, 4, seed=0)
    go, x, preact, w1, w2 = quack_peer.to_quack_layout(inputs.as_tuple())
    assert go is inputs.grad_output and x is inputs.x and w2 is inputs.down_weight
    assert torch.equal(preact[..., 0::2], inputs.gate_output) and torch.equal(preact[..., 1::2], inputs.up_output)
    assert torch.equal(w1[0::2], inputs.gate_weight) and torch.equal(w1[1::2], inputs.up_weight)


# ------------------------------------------------- the backward wiring, through quack-like fakes
def _gemm(A, B, out_dtype=None, **kw):
    return (A @ B).to(out_dtype or A.dtype)


def _gemm_dgated(A, B, PreAct, activation=None, **kw):
    """quack's gemm_dgated contract: dout @ B, dSwiGLU on the interleaved preact; returns the
    interleaved dpreact and the recomputed postact silu(gate) * up."""
    assert activation == "swiglu"
    g = A @ B
    gate, up = PreAct[..., 0::2], PreAct[..., 1::2]
    s = torch.sigmoid(gate)
    d_gate, d_up = g * up * s * (1 + gate * (1 - s)), g * F.silu(gate)
    return torch.stack((d_gate, d_up), -1).flatten(-2), F.silu(gate) * up


FAKE_DGATED_OPS = SimpleNamespace(matmul_bwd_dx=_gemm_dgated, matmul_bwd_dw=_gemm)
FAKE_GATED_OPS = SimpleNamespace(matmul_bwd_dx=_gemm, matmul_bwd_dw=_gemm)


def fake_dact_linear_backward(ctx, dout):
    """quack 0.6.5's DActLinearFunc.backward, with no bias and no fused accumulation."""
    assert ctx.ops is FAKE_DGATED_OPS and ctx.activation == "swiglu"
    assert ctx.needs_input_grad[:2] == (True, True) and not ctx.fuse_grad_accum and not ctx.compute_dbias
    preact, weight, weight_og = ctx.saved_tensors
    assert weight_og is None
    batch_shape = dout.shape[:-1]
    dout = dout.flatten(0, -2)
    dpreact, x = ctx.ops.matmul_bwd_dx(dout, weight, preact.flatten(0, -2), activation=ctx.activation)
    dweight = ctx.ops.matmul_bwd_dw(dout.T, x, out_dtype=ctx.weight_dtype)
    return dpreact.reshape(*batch_shape, dpreact.shape[-1]), dweight, None, None, None, None, None


def fake_linear_act_backward(ctx, dout):
    """quack 0.6.5's LinearActFunc.backward, with no bias and no fused accumulation."""
    assert ctx.ops is FAKE_GATED_OPS and ctx.needs_input_grad[:2] == (True, True) and not ctx.compute_dbias
    x, weight, weight_og = ctx.saved_tensors
    assert x.dim() == 2 and weight_og is None
    batch_shape = dout.shape[:-1]
    dout = dout.flatten(0, -2)
    dx = ctx.ops.matmul_bwd_dx(dout, weight).reshape(*batch_shape, weight.shape[-1])
    dweight = ctx.ops.matmul_bwd_dw(dout.T, x, out_dtype=ctx.weight_dtype)
    return dx, dweight, None, None, None, None, None


FAKE_BACKWARD = quack_peer.make_quack_backward(
    fake_dact_linear_backward, FAKE_DGATED_OPS, fake_linear_act_backward, FAKE_GATED_OPS
)


@pytest.mark.parametrize("batch_size,seq_len", [(1, 5), (2, 3)])
def test_backward_wiring_matches_reference_on_consistent_inputs(batch_size, seq_len):
    inputs = make_inputs(batch_size, seq_len, 16, 24, mode="forward", seed=3, dtype=torch.float64)
    out = FAKE_BACKWARD(*quack_peer.to_quack_layout(inputs.as_tuple()))
    ref = reference_backward(*inputs.as_tuple())
    assert [o.shape for o in out] == [r.shape for r in ref]
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-10, atol=1e-10)


def test_backward_differs_like_liger_on_independent_inputs():
    """Recomputing silu(gate_output): only grad_gate_weight (no activated_gate in it) agrees."""
    inputs = make_inputs(2, 3, 16, 24, mode="benchmark", seed=3, dtype=torch.float64)
    out = FAKE_BACKWARD(*quack_peer.to_quack_layout(inputs.as_tuple()))
    ref = reference_backward(*inputs.as_tuple())
    agrees = [torch.allclose(o, r, rtol=1e-8, atol=1e-8) for o, r in zip(out, ref)]
    assert agrees == [False, True, False, False]


# -------------------------------------------------------------------------- search restriction
@dataclass(frozen=True)
class FakeGemmConfig:
    tile_m: int
    tile_n: int
    pingpong: bool
    cluster_m: int = 2
    cluster_n: int = 1
    swap_ab: bool = False
    device_capacity: int = 9


def quack_sm90_configs(epilogue=None):
    """A replica of quack 0.6.5's gemm_config._get_sm90_configs."""
    tile_n_vals = [128, 160, 192, 208]
    coop = [(256, n) for n in tile_n_vals] + [(128, 224), (128, 256)]
    pingpong = [(128, n) for n in tile_n_vals] + [(192, 128)]
    if epilogue == "gated":
        coop = [(m, n) for m, n in coop if n % 32 == 0 and m != 192]
        pingpong = [(m, n) for m, n in pingpong if n % 32 == 0]
    tiles = [(m, n, False) for m, n in coop] + [(m, n, True) for m, n in pingpong]
    swaps = [False] if epilogue == "gated" else [False, True]
    return [
        FakeGemmConfig(m, n, pp, cm, cn, sab) for (m, n, pp), (cm, cn), sab in itertools.product(tiles, [(1, 2), (2, 1)], swaps)
    ]


def test_reduced_search_sizes():
    plain, gated = quack_sm90_configs(), quack_sm90_configs("gated")
    assert (len(plain), len(gated)) == (44, 18)
    assert len([c for c in plain if quack_peer.keep_config(c, "reduced")]) == 24
    assert len([c for c in gated if quack_peer.keep_config(c, "reduced")]) == 10
    assert all(quack_peer.keep_config(c, "full") for c in plain)
    other_arch = FakeGemmConfig(64, 64, False, device_capacity=10)
    assert quack_peer.keep_config(other_arch, "reduced")
    default = FakeGemmConfig(128, 192, True)  # quack's SM90 default config
    assert quack_peer.keep_config(default, "reduced")


def test_search_space_env(monkeypatch):
    assert quack_peer.search_space() == "reduced"
    monkeypatch.setenv(quack_peer.SEARCH_ENV, "full")
    assert quack_peer.search_space() == "full"
    monkeypatch.setenv(quack_peer.SEARCH_ENV, "tiny")
    with pytest.raises(ValueError, match="SWIGLU_QUACK_SEARCH"):
        quack_peer.search_space()


def test_cache_dirs(monkeypatch, tmp_path):
    assert quack_peer.tuning_cache_dir() == REPO / "data" / "tuning" / "quack_cache"
    monkeypatch.setenv(quack_peer.CACHE_ENV, str(tmp_path / "t"))
    monkeypatch.setenv(quack_peer.KERNEL_CACHE_ENV, str(tmp_path / "k"))
    assert quack_peer.tuning_cache_dir() == tmp_path / "t" and quack_peer.kernel_cache_dir() == tmp_path / "k"


@pytest.fixture
def fake_quack(monkeypatch):
    """quack, quack.cache, quack.gemm_interface, quack.gemm_runtime(.autotune) as stand-ins with
    the attributes configure() touches."""
    AutotuneConfig = lambda c: SimpleNamespace(kwargs={"config": c})  # noqa: E731
    quack = types.ModuleType("quack")
    quack.__path__ = []
    cache = types.ModuleType("quack.cache")
    cache.CACHE_DIR = None
    gi = types.ModuleType("quack.gemm_interface")
    gi.gemm_tuned = SimpleNamespace(
        configs=[AutotuneConfig(c) for c in quack_sm90_configs() + [FakeGemmConfig(256, 256, False, device_capacity=10)]]
    )
    runtime = types.ModuleType("quack.gemm_runtime")
    runtime.__path__ = []
    rt = types.ModuleType("quack.gemm_runtime.autotune")
    rt._MOD_TUNERS = {}
    rt._config_space = lambda mod, device: quack_sm90_configs("gated")
    quack.cache, quack.gemm_interface, quack.gemm_runtime, runtime.autotune = cache, gi, runtime, rt
    for name, module in (
        ("quack", quack),
        ("quack.cache", cache),
        ("quack.gemm_interface", gi),
        ("quack.gemm_runtime", runtime),
        ("quack.gemm_runtime.autotune", rt),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    return SimpleNamespace(cache=cache, gi=gi, rt=rt)


def test_configure_points_quack_at_the_cache_and_restricts(fake_quack, tmp_path):
    got = quack_peer.configure("reduced", tmp_path / "tune", tmp_path / "kernels")
    assert got == {
        "search": "reduced",
        "tuning_cache_dir": str(tmp_path / "tune"),
        "kernel_cache_dir": str(tmp_path / "kernels"),
        "sm90_gemm_candidates": 24,
    }
    assert os.environ["QUACK_CACHE_DIR"] == str(tmp_path / "tune") and os.environ["QUACK_CACHE_AUTOTUNING"] == "1"
    assert fake_quack.cache.CACHE_DIR == str(tmp_path / "kernels") and (tmp_path / "tune").is_dir()
    assert len(fake_quack.gi.gemm_tuned.configs) == 25  # 24 SM90 + the SM100 one, left alone
    assert len(fake_quack.rt._config_space(None, None)) == 10
    # idempotent: build()'s bare configure() keeps it; a different explicit one is refused
    assert quack_peer.configure() == got and len(fake_quack.gi.gemm_tuned.configs) == 25
    assert quack_peer.configure("reduced", tmp_path / "tune") == got
    with pytest.raises(RuntimeError, match="one configuration per process"):
        quack_peer.configure("full", tmp_path / "tune")
    assert quack_peer.versions()["quack_peer"] == got


def test_configure_full_and_late(fake_quack, tmp_path, monkeypatch):
    monkeypatch.setenv(quack_peer.SEARCH_ENV, "full")
    monkeypatch.setenv(quack_peer.CACHE_ENV, str(tmp_path / "env-tune"))
    got = quack_peer.configure(kernel_dir=tmp_path / "k")
    assert got["search"] == "full" and got["sm90_gemm_candidates"] == 44
    assert got["tuning_cache_dir"] == str(tmp_path / "env-tune")
    assert len(fake_quack.rt._config_space(None, None)) == 18
    monkeypatch.setattr(quack_peer, "_configured", {})
    fake_quack.rt._MOD_TUNERS["x"] = object()  # a tuner built before configure(): refused
    with pytest.raises(RuntimeError, match="before configure"):
        quack_peer.configure("reduced", tmp_path / "tune", tmp_path / "k")


def test_the_bench_refuses_to_tune_a_shape_the_cache_lacks(monkeypatch, tmp_path):
    monkeypatch.setenv(quack_peer.CACHE_ENV, str(tmp_path / "cache"))
    autotuner = types.SimpleNamespace(_gpu_warmup=lambda duration_ms=200: None)
    quack_peer.refuse_tuning(autotuner)
    with pytest.raises(RuntimeError, match=r"no tuned choice for this shape in .*cache: tune it first"):
        autotuner._gpu_warmup()


def test_the_refusal_names_the_repository_cache_by_its_relative_path(monkeypatch):
    """The message lands in a run's committed notes: no path of the machine that ran it."""
    monkeypatch.delenv(quack_peer.CACHE_ENV, raising=False)
    autotuner = types.SimpleNamespace(_gpu_warmup=lambda duration_ms=200: None)
    quack_peer.refuse_tuning(autotuner)
    with pytest.raises(RuntimeError, match=r"shape in data/tuning/quack_cache: tune it first") as err:
        autotuner._gpu_warmup()
    assert str(REPO) not in str(err.value)


# ----------------------------------------------------------------------- scripts/tune_quack.py
def _tune_script():
    spec = importlib.util.spec_from_file_location("tune_quack", REPO / "scripts" / "tune_quack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tune_script_defaults():
    args = _tune_script().parse_args([])
    assert args.tokens == [128, 256, 512, 1024] and (args.hidden_size, args.intermediate_size) == (16384, 53248)
    assert Path(args.cache_dir) == REPO / "data" / "tuning" / "quack_cache"
    assert args.max_minutes > 0 and args.verify_tokens == []


def test_tune_script_refuses_without_quack(monkeypatch, capsys):
    script = _tune_script()
    monkeypatch.setattr(quack_peer, "unavailable_reason", lambda device: "no quack here")
    assert script.main(["--tokens", "128"]) == 2
    assert "no quack here" in capsys.readouterr().out


# ------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_quack_peer_on_gpu(tmp_path):
    """Small shape, forward-consistent inputs: quack's backward passes the benchmark criterion
    (tunes this small shape into a scratch cache: minutes of compilation)."""
    device = torch.device("cuda")
    if quack_peer.unavailable_reason(device):
        pytest.skip(quack_peer.unavailable_reason(device))
    from swiglu import benchmark_criterion

    quack_peer.configure("reduced", tmp_path / "tune", tmp_path / "kernels")
    fn = quack_peer.build(device, allow_tuning=True)
    inputs = make_inputs(2, 64, 1024, 2048, mode="forward", seed=0, device=device)
    out = fn(*quack_peer.to_quack_layout(inputs.as_tuple()))
    ref = reference_backward(*inputs.as_tuple())
    for o, r in zip(out, ref):
        assert benchmark_criterion(o, r, 0.13).passed
    assert list(Path(tmp_path / "tune").rglob("*.autotune.json"))


@pytest.mark.parametrize("extern", [True, False])
def test_check_install_location(monkeypatch, extern):
    cutlass, cute = types.ModuleType("cutlass"), types.ModuleType("cutlass.cute")
    cute.make_layout, cute.__file__ = (lambda: None), "/somewhere/cutlass/cute/__init__.py"
    cutlass.__path__, cutlass.cute = [], cute
    identity = types.ModuleType("quack.gemm_runtime.identity")
    identity._is_extern_function = lambda fn: extern
    quack, runtime = types.ModuleType("quack"), types.ModuleType("quack.gemm_runtime")
    quack.__path__, runtime.__path__ = [], []
    quack.gemm_runtime, runtime.identity = runtime, identity
    for name, module in (
        ("cutlass", cutlass),
        ("cutlass.cute", cute),
        ("quack", quack),
        ("quack.gemm_runtime", runtime),
        ("quack.gemm_runtime.identity", identity),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    if extern:
        quack_peer.check_install_location()
    else:
        with pytest.raises(RuntimeError, match="site-packages"):
            quack_peer.check_install_location()
