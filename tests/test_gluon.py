"""The Gluon weight-gradient kernel (swiglu.kernels.gluon_wgrad): where it runs, that the backward
dispatches to it per token bucket, that every table config compiles for sm_90, and (GPU) that it
is right at full size and odd shapes.

Gluon kernels cannot run in the Triton interpreter, so the CPU tests check the dispatch with the
launch replaced by a recorder and compile each config for sm_90 with the GPU machine's triton
(``SWIGLU_EXTRA_TRITON_DIR``, installed by ``make test``); the numbers are checked on the H200
(``-m gpu``), where every table bucket runs through the whole backward as well
(tests/test_triton_gpu.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swiglu import make_inputs, reference_backward
from swiglu.kernels import backward, common
from swiglu.kernels.common import GLUON_TRITON, GluonConfig

ROOT = Path(__file__).resolve().parents[1]
EXTRA_TRITON_DIR = os.environ.get("SWIGLU_EXTRA_TRITON_DIR")


# --------------------------------------------------------------------------- where it runs


def test_gluon_needs_cuda_and_the_pinned_triton(monkeypatch):
    monkeypatch.setattr(common, "INTERPRET", False)
    assert "CUDA" in common.gluon_unavailable_reason(torch.device("cpu"))
    monkeypatch.setattr(common, "INTERPRET", True)
    assert "interpreter" in common.gluon_unavailable_reason(torch.device("cuda", 0))
    monkeypatch.setattr(common, "INTERPRET", False)
    import triton

    monkeypatch.setattr(triton, "__version__", "3.7.1")
    assert f"triton {GLUON_TRITON}.x" in common.gluon_unavailable_reason(torch.device("cuda", 0))
    monkeypatch.setenv("SWIGLU_GLUON", "0")
    assert common.gluon_unavailable_reason(torch.device("cuda", 0)) == "SWIGLU_GLUON=0"


def test_table_buckets_and_shared_memory():
    """The table holds Gluon configs for the small-T buckets, each within the H200's 227 KiB."""
    chosen = {b: g for b, g in backward.GLUON_CONFIGS.items() if g is not None}
    assert set(chosen) == {128, 256, 512, 1024}
    for g in chosen.values():
        assert g.smem_bytes() <= 232448


# --------------------------------------------------------------------------- dispatch (CPU)


class _FakeProps:
    shared_memory_per_block_optin = 232448


@pytest.fixture
def gluon_recorded(monkeypatch):
    """Gluon 'available' with its launch replaced by a matmul that records its config: the CPU
    check of the backward's wiring (which products, which config, which outputs)."""
    calls = []

    def fake_any(a, b, out, c, g):
        calls.append((tuple(a.shape), tuple(b.shape), g))
        out.copy_((a.float().T @ b.float()).to(out.dtype))

    monkeypatch.setattr(backward, "gluon_unavailable_reason", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _FakeProps())
    real_any = backward.launch_grad_weight_any
    monkeypatch.setattr(backward, "launch_grad_weight_any",
                        lambda a, b, out, c, g: fake_any(a, b, out, c, g) if g is not None else real_any(a, b, out, c, g))
    return calls


@pytest.mark.parametrize("tokens, bucket", [(5, 128), (300, 512)])
def test_backward_takes_gluon_for_table_buckets(gluon_recorded, tokens, bucket):
    inp = make_inputs(1, tokens, 16, 48, seed=tokens)
    grads = backward.triton_swiglu_backward(*inp.as_tuple())
    assert [c[2] for c in gluon_recorded] == [backward.GLUON_CONFIGS[bucket]] * 3
    # grad_down_weight (go.T @ h), grad_gate_weight (d_gate.T @ x), grad_up_weight (d_up.T @ x)
    assert [c[:2] for c in gluon_recorded] == [((tokens, 16), (tokens, 48)), ((tokens, 48), (tokens, 16)),
                                               ((tokens, 48), (tokens, 16))]
    ref = reference_backward(*inp.as_tuple())
    for got, want in zip(grads[1:], ref[1:]):
        assert got.shape == want.shape and torch.isfinite(got).all()


def test_backward_keeps_tl_for_other_buckets_and_overrides(gluon_recorded):
    inp = make_inputs(1, 2100, 16, 48, seed=3)  # bucket 4096: no Gluon entry
    backward.triton_swiglu_backward(*inp.as_tuple(), need_grad_x=False)
    inp = make_inputs(1, 6, 16, 48, seed=4)
    backward.triton_swiglu_backward(*inp.as_tuple(), configs={"grad_weights": backward.config_for("grad_weights", 6)})
    assert gluon_recorded == []


def test_gluon_config_too_big_for_the_device_is_skipped(monkeypatch):
    class Small:
        shared_memory_per_block_optin = 101376  # consumer Blackwell (sm_120): 99 KiB

    monkeypatch.setattr(backward, "gluon_unavailable_reason", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Small())
    assert backward.gluon_config_for(128, torch.device("cuda", 0)) is None


# --------------------------------------------------------------------------- compiles for sm_90 (CPU)


def test_table_configs_compile_for_sm90(tmp_path):
    """Every table config compiles with the triton the kernels are written for: wgmma, TMA loads and
    stores, register reallocation (warp specialization), no spills, shared memory within the
    estimate and the H200's limit."""
    if not EXTRA_TRITON_DIR:
        pytest.skip("SWIGLU_EXTRA_TRITON_DIR unset (make test sets it to the GPU machine's triton)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([EXTRA_TRITON_DIR, str(ROOT / "src")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gluon_compile_worker.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["triton"].startswith(GLUON_TRITON + ".")
    assert report["results"]
    for r in report["results"]:
        assert r["error"] is None, r["error"]
        cfg = GluonConfig(**r["config"])
        assert r["shared"] <= cfg.smem_bytes() <= 232448, (cfg, r["shared"])
        assert r["wgmma"] > 0 and r["tma_store"] > 0 and r["tma_load"] > 0 and r["setmaxnreg"] > 0, r
        if r["spills"] is not None:
            assert r["spills"] == 0, r


# --------------------------------------------------------------------------- numbers (GPU)


def _gluon_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    reason = common.gluon_unavailable_reason(torch.device("cuda"))
    if reason:
        pytest.skip(reason)


@pytest.mark.gpu
@pytest.mark.parametrize("bucket", [128, 256, 512, 1024])
@pytest.mark.parametrize("K, M, N", [(None, 53248, 16384), (None, 16384, 53248), (1, 1000, 1176), (200, 1000, 1176),
                                     (77, 384, 520)])
def test_gluon_weight_gradient_matches_fp32(bucket, K, M, N):
    """out = a.T @ b against the fp32 product: within one bf16 ulp plus the fp32 summation-order
    bound (K * 2**-23 * |a|.T @ |b|, Higham's gamma_K), NaN-poisoned output fully written, no
    systematic error, bitwise repeatable."""
    _gluon_or_skip()
    g = backward.GLUON_CONFIGS[bucket]
    K = bucket if K is None else K
    gen = torch.Generator(device="cuda").manual_seed(bucket * 7 + K)
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    backward.launch_grad_weight_any(a, b, out, backward.config_for("grad_weights", K), g)
    want = (a.float().T @ b.float())
    assert torch.isfinite(out).all()
    err = (out.float() - want).abs()
    bound = want.abs() * 2.0 ** -7 + K * 2.0 ** -23 * (a.float().abs().T @ b.float().abs())
    assert (err <= bound).all(), f"max error {(err / bound).max().item():.2f} x the bound"
    # A systematic error (a scale) moves the signed mean: within 4 standard errors of 0.
    rel = ((out.float() - want) / want.abs().clamp_min(1e-3)).flatten()
    assert rel.mean().abs() <= 4 * rel.std() / rel.numel() ** 0.5 + 1e-6
    again = torch.full_like(out, float("nan"))
    backward.launch_grad_weight_any(a, b, again, backward.config_for("grad_weights", K), g)
    assert torch.equal(out, again)
