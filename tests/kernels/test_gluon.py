"""The Gluon kernels (swiglu.kernels.gluon_wgrad, gluon_dswiglu): where they run, that the backward
dispatches to them per token bucket, that every table config compiles for sm_90, and (GPU) that it
is right at full size and odd shapes.

Gluon kernels cannot run in the Triton interpreter, so the CPU tests check the dispatch with the
launch replaced by a recorder and compile each config for sm_90 with the GPU machine's triton
(``SWIGLU_EXTRA_TRITON_DIR``, installed by ``make test-gpu-triton``); the numbers are checked on the H200
(``-m gpu``), where every table bucket runs through the whole backward as well
(tests/kernels/test_triton_gpu.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swiglu import make_inputs, reference_backward
from swiglu.kernels import backward, configs, devices, tma
from swiglu.kernels.configs import GluonConfig, KernelConfig
from swiglu.kernels.devices import GLUON_TRITONS, triton_minor

from swiglu_lab.experiments.candidates import DSWIGLU_CANDIDATES, GRAD_X_CANDIDATES, PINGPONG_CANDIDATES, WIDE_CANDIDATES

from compile_worker import pdl_problems
from gluon_workers import WHICH_TRITONS, _stop_unused_workers, compile_report  # noqa: F401 (an autouse fixture)
from gpu_load import matmuls_in_another_process

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- where it runs


def test_gluon_needs_cuda_and_the_pinned_triton(monkeypatch):
    monkeypatch.setattr(devices, "INTERPRET", False)
    assert "CUDA" in devices.gluon_unavailable_reason(torch.device("cpu"))
    monkeypatch.setattr(devices, "INTERPRET", True)
    assert "interpreter" in devices.gluon_unavailable_reason(torch.device("cuda", 0))
    monkeypatch.setattr(devices, "INTERPRET", False)
    import triton

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    for version in ("3.6.0", "3.7.1"):
        monkeypatch.setattr(triton, "__version__", version)
        assert devices.gluon_unavailable_reason(torch.device("cuda", 0)) is None, version
    for version in ("3.5.1", "3.8.0", "3.10.0", "4.6.0"):
        monkeypatch.setattr(triton, "__version__", version)
        assert "triton 3.6.x and 3.7.x" in devices.gluon_unavailable_reason(torch.device("cuda", 0)), version
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (10, 0))
    monkeypatch.setattr(triton, "__version__", "3.7.1")
    assert "sm_90" in devices.gluon_unavailable_reason(torch.device("cuda", 0))
    monkeypatch.setenv("SWIGLU_GLUON", "0")
    assert devices.gluon_unavailable_reason(torch.device("cuda", 0)) == "SWIGLU_GLUON=0"


def test_table_buckets_and_shared_memory():
    """The table holds Gluon configs for the buckets up to 2048 (where they measured faster than the
    tl kernel: data/tuning/wgrad_defer_20261201.csv), each within the H200's 227 KiB."""
    chosen = {b: g for b, g in backward.GLUON_CONFIGS.items() if g is not None}
    assert set(chosen) == {128, 256, 512, 1024, 2048}
    for g in chosen.values():
        assert g.smem_bytes() <= 232448


def test_wide_tiles_count_their_second_chunk_and_reject_bad_widths():
    """A 128 x (128 + 64) tile: 16384 columns are 86 such tiles (the last one partial), which the
    persistent launch's program count must see; BN2 is a power of two below BN, and a wide
    cooperative tile (no pingpong) is neither deferred, st.global-stored nor resident."""
    wide = GluonConfig(BM=128, BN=128, BN2=64, pingpong=True, mma_regs=232)
    assert wide.tile_n == 192
    # 3 stages of A [64, 128] and B [64, 192], one [128, 192] output buffer, the barriers
    assert wide.smem_bytes() == 3 * (64 * 128 + 64 * 192) * 2 + 128 * 192 * 2 + 1024
    assert devices.tile_programs(torch.device("cpu"), 256, 16384, wide, persistent=False) == 2 * 86
    assert GluonConfig(BM=256, BN=128, BN2=64).tile_n == 192  # the wide cooperative tile
    for bad in (
        dict(BN2=64, defer=True),
        dict(BN2=64, plain_store=1),
        dict(BN2=64, resident_k=128),
        dict(BN2=48, pingpong=True),
        dict(BN2=128, pingpong=True),
        dict(BN2=4, pingpong=True),
    ):
        with pytest.raises(ValueError, match="BN2"):
            GluonConfig(BM=128, BN=128, **bad)


# --------------------------------------------------------------------------- dispatch (CPU)


class _FakeProps:
    shared_memory_per_block_optin = 232448


@pytest.fixture
def gluon_recorded(monkeypatch):
    """Gluon 'available' with its launch replaced by a matmul that records its config: the CPU
    check of the backward's wiring (which products, which config, which outputs)."""
    calls = []

    def fake_any(a, b, out, c, g, nprog=None):
        calls.append((tuple(a.shape), tuple(b.shape), g))
        out.copy_((a.float().T @ b.float()).to(out.dtype))

    monkeypatch.setattr(backward, "gluon_unavailable_reason", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _FakeProps())
    monkeypatch.setattr(backward, "GLUON_DSWIGLU", {b: None for b in configs.TOKEN_BUCKETS})  # tl dSwiGLU here
    real_any = backward.launch_grad_weight_gluon_or_tl
    monkeypatch.setattr(
        backward,
        "launch_grad_weight_gluon_or_tl",
        lambda a, b, out, c, g, nprog=None: fake_any(a, b, out, c, g) if g is not None else real_any(a, b, out, c, g, nprog),
    )
    return calls


@pytest.mark.parametrize("tokens, bucket", [(5, 128), (300, 512)])
def test_backward_takes_gluon_for_table_buckets(gluon_recorded, tokens, bucket):
    inp = make_inputs(1, tokens, 16, 48, seed=tokens)
    grads = backward.triton_swiglu_backward(*inp.as_tuple())
    assert [c[2] for c in gluon_recorded] == [backward.GLUON_CONFIGS[bucket]] * 3
    # grad_down_weight (go.T @ h), grad_gate_weight (d_gate.T @ x), grad_up_weight (d_up.T @ x)
    assert [c[:2] for c in gluon_recorded] == [
        ((tokens, 16), (tokens, 48)),
        ((tokens, 48), (tokens, 16)),
        ((tokens, 48), (tokens, 16)),
    ]
    ref = reference_backward(*inp.as_tuple())
    for got, want in zip(grads[1:], ref[1:]):
        assert got.shape == want.shape and torch.isfinite(got).all()


def test_backward_keeps_tl_for_other_buckets_and_overrides(gluon_recorded):
    inp = make_inputs(1, 2100, 16, 48, seed=3)  # bucket 4096: no Gluon entry
    backward.triton_swiglu_backward(*inp.as_tuple(), need_grad_x=False)
    inp = make_inputs(1, 6, 16, 48, seed=4)
    backward.triton_swiglu_backward(*inp.as_tuple(), configs={"grad_weights": backward.config_for("grad_weights", 6)})
    assert gluon_recorded == []


def _gluon_grad_x_everywhere(monkeypatch, launcher) -> None:
    """Gluon 'available' with a grad_x table entry at every bucket (the first candidate) and
    ``launcher`` as its launcher (``backward.GRAD_X_LAUNCHER``, the lab's); the other kernels tl."""
    monkeypatch.setattr(backward, "gluon_unavailable_reason", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _FakeProps())
    for table in ("GLUON_DSWIGLU", "GLUON_CONFIGS"):
        monkeypatch.setattr(backward, table, {b: None for b in configs.TOKEN_BUCKETS})
    monkeypatch.setattr(backward, "GLUON_GRAD_X", {b: GRAD_X_CANDIDATES[0] for b in configs.TOKEN_BUCKETS})
    monkeypatch.setattr(backward, "GRAD_X_LAUNCHER", launcher)


@pytest.fixture
def grad_x_recorded(monkeypatch):
    """``_gluon_grad_x_everywhere`` with a matmul for the launcher that records its arguments."""
    calls = []

    def fake(d_gate, d_up, gw, uw, out, cfg, nprog):
        calls.append((tuple(d_gate.shape), tuple(gw.shape), tuple(out.shape), cfg, nprog))
        out.copy_((d_gate.float() @ gw.float() + d_up.float() @ uw.float()).to(out.dtype))

    _gluon_grad_x_everywhere(monkeypatch, fake)
    backward.clear_plans()
    yield calls
    backward.clear_plans()


def test_backward_takes_the_gluon_grad_x_where_the_table_has_one(grad_x_recorded):

    inp = make_inputs(1, 5, 16, 48, seed=5)
    grads = backward.triton_swiglu_backward(*inp.as_tuple())
    plan = backward.backward_plan(5, 16, 48, torch.device("cpu"))
    assert plan.gluon_grad_x == GRAD_X_CANDIDATES[0] and plan.gluon_grad_x_programs >= 1
    assert grad_x_recorded == [((5, 48), (48, 16), (5, 16), GRAD_X_CANDIDATES[0], plan.gluon_grad_x_programs)]
    want = reference_backward(*inp.as_tuple())[0].float()
    assert grads[0].shape == want.shape and torch.allclose(grads[0].float(), want, rtol=2e-2, atol=2e-2)
    # An explicit grad_x config, grad_x not needed, or no tokens: no Gluon grad_x launch.
    backward.triton_swiglu_backward(*inp.as_tuple(), configs={"grad_x": backward.config_for("grad_x", 5)})
    backward.triton_swiglu_backward(*inp.as_tuple(), need_grad_x=False)
    empty = [t[:, :0] if t.dim() == 3 else t for t in inp.as_tuple()]  # the [1, T, *] tensors with T = 0
    assert backward.triton_swiglu_backward(*empty)[0].shape == (1, 0, 16)
    assert len(grad_x_recorded) == 1


def test_lab_launchers_run_only_once_the_lab_sets_them(monkeypatch):
    """A gluon_grad_x entry, or a weight-gradient config with plain_store, a deferred or a wide
    cooperative tile (``GluonConfig.lab_only``), runs the lab's copy of the kernel
    (``swiglu_lab.experiments.gluon_wgrad_probe``, which sets ``backward.GRAD_X_LAUNCHER`` and
    ``PLAIN_STORE_LAUNCHER`` when imported); unset, the backward says so. The library's own launcher
    refuses such a config."""
    gluon = triton_minor(__import__("triton").__version__) in GLUON_TRITONS
    if gluon:  # imported before anything is patched: the import sets the launchers
        from swiglu.kernels.gluon_wgrad import launch_grad_weight_gluon
        from swiglu_lab.experiments import gluon_wgrad_probe

        assert backward.PLAIN_STORE_LAUNCHER is gluon_wgrad_probe.launch_grad_weight_gluon
        assert backward.GRAD_X_LAUNCHER is gluon_wgrad_probe.launch_grad_x_gluon
    _gluon_grad_x_everywhere(monkeypatch, None)
    backward.clear_plans()
    try:
        with pytest.raises(ValueError, match="sets backward.GRAD_X_LAUNCHER when imported"):
            backward.triton_swiglu_backward(*make_inputs(1, 5, 16, 48, seed=5).as_tuple())
    finally:
        backward.clear_plans()
    cfg = GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=1, plain_store=1)
    a, b, out = torch.zeros(8, 256), torch.zeros(8, 128), torch.empty(256, 128)
    monkeypatch.setattr(backward, "PLAIN_STORE_LAUNCHER", None)
    with pytest.raises(ValueError, match="sets backward.PLAIN_STORE_LAUNCHER when imported"):
        backward.launch_grad_weight_gluon_or_tl(a, b, out, None, cfg, 1)
    ran = []
    monkeypatch.setattr(backward, "PLAIN_STORE_LAUNCHER", lambda *args: ran.append(args[3:]))
    # The deferred and the wide cooperative tiles, and the ping-pong tile without a second column
    # chunk (no BN2), are the lab's too (GluonConfig.lab_only); the library runs the ping-pong tile
    # with BN2, stored by the storer warp or by the MMA warpgroups (wg_store).
    deferred = GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=1, defer=True)
    wide = GluonConfig(BM=256, BN=128, BN2=64, BK=32, STAGES=4, NC=1, GROUP_M=16)
    narrow = GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=2, pingpong=True, mma_regs=232)
    for lab in (cfg, deferred, wide, narrow):
        backward.launch_grad_weight_gluon_or_tl(a, b, out, None, lab, 1)
    assert ran == [(cfg, 1), (deferred, 1), (wide, 1), (narrow, 1)]
    storer = replace(narrow, BN2=64, NC=1)
    assert not storer.lab_only and not replace(storer, wg_store=2, defer=True).lab_only  # ping-pong ignores defer
    if gluon:
        for lab in (cfg, deferred, wide, narrow):
            with pytest.raises(ValueError, match="runs swiglu_lab.experiments.gluon_wgrad_probe"):
                launch_grad_weight_gluon(a, b, out, lab, 1)


def test_gluon_grad_x_gives_way_where_its_tiles_leave_sms_idle(monkeypatch):
    """A gluon_grad_x entry runs where its tiles fill the GPU (Hermes' H = 16384); at a small
    hidden_size (Llama-3-8B's 4096 at T = 256: 16 tiles of 128 x 256 for 132 SMs) the plan takes
    the tl kernel with the filling tile rule instead."""

    class Props(_FakeProps):
        multi_processor_count = 132

    monkeypatch.setattr(backward, "gluon_unavailable_reason", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    monkeypatch.setattr(devices, "device_sms", lambda device: 132)
    monkeypatch.setattr(backward, "GLUON_GRAD_X", {b: GRAD_X_CANDIDATES[0] for b in configs.TOKEN_BUCKETS})
    backward.clear_plans()
    try:
        cuda = torch.device("cuda", 0)
        assert backward._make_plan(256, 16384, 53248, cuda, {}).gluon_grad_x == GRAD_X_CANDIDATES[0]
        small = backward._make_plan(256, 4096, 14336, cuda, {})
        assert small.gluon_grad_x is None and small.gluon_grad_x_programs == 0
        assert small.grad_x == backward.grad_x_config_filling(256, 4096, backward.config_for("grad_x", 256), 132)
    finally:
        backward.clear_plans()


def test_gluon_config_too_big_for_the_device_is_skipped(monkeypatch):
    class Small:
        shared_memory_per_block_optin = 101376  # consumer Blackwell (sm_120): 99 KiB

    monkeypatch.setattr(backward, "gluon_unavailable_reason", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Small())
    assert backward.gluon_config_for(128, torch.device("cuda", 0)) is None


# --------------------------------------------------------------------------- compiles for sm_90 (CPU)


@pytest.mark.parametrize("which", WHICH_TRITONS)
def test_table_configs_compile_for_sm90(tmp_path_factory, which):
    """Every table config compiles with each triton the kernels are written for: wgmma, TMA loads
    and stores, register reallocation (warp specialization), no spills, shared memory within the
    estimate and the H200's limit. The lab's copy with the probes' switches
    (``swiglu_lab.experiments.gluon_wgrad_probe``) compiles each table config, every switch off,
    to the library kernel's PTX (debug lines aside), at each PDL mode: what a probe measures with a
    switch on is the shipped kernel less that part."""
    report = compile_report(tmp_path_factory, which)
    assert triton_minor(report["triton"]) in GLUON_TRITONS
    assert report["results"]
    for r in report["results"]:
        assert r["error"] is None, r["error"]
        cfg = GluonConfig(**r["config"])
        assert r["shared"] <= cfg.smem_bytes() <= 232448, (cfg, r["shared"])
        # The probes' ablations (ABLATE): bit 1 issues no store, bit 4 no wgmma; 2 still loads
        # the ring's first fill.
        # PLAIN_STORE: the MMA warps' (1) or the storer warp's (2) st.global instead of TMA stores.
        stores = 0 if r["ablate"] & 1 or r.get("plain_store") else 1
        assert min(r["wgmma"], 1) == (0 if r["ablate"] & 4 else 1), r
        assert min(r["tma_store"], 1) == stores and r["tma_load"] > 0 and r["setmaxnreg"] > 0, r
        if r.get("plain_store"):
            assert r["st_global"] > 0, r
        assert not pdl_problems(r, r["pdl"]), pdl_problems(r, r["pdl"])
        # The ping-pong kernel with its second MMA warpgroup at maxnreg (168) spills in its
        # epilogue (180-192 bytes with 128x128 tiles); at 232 (``mma_regs``) it must not, 128 x 192
        # tiles included: ptxas allocates each partition under its setmaxnreg.
        if r["spills"] is not None and (not cfg.pingpong or cfg.mma_regs):
            assert r["spills"] == 0, r
    assert any(GluonConfig(**r["config"]).pingpong for r in report["results"])
    assert any(GluonConfig(**r["config"]).BN2 and r["spills"] == 0 for r in report["results"])
    assert any(r["store_delay_ns"] for r in report["results"])
    assert any(GluonConfig(**r["config"]).wg_store and r["spills"] == 0 for r in report["results"])
    assert {r["pdl"] for r in report["results"]} == {0, 1, 2}
    assert {r["ablate"] for r in report["results"]} == {0, 1, 2, 3, 4, 5, 6}
    assert sorted(r.get("plain_store") for r in report["results"] if r.get("plain_store")) == [1, 1, 1, 2]
    # The switches, and the configs only the lab runs, compile in the lab's copy only.
    assert all(
        r["probe"] == bool(r["ablate"] or r["store_delay_ns"] or r.get("plain_store") or GluonConfig(**r["config"]).lab_only)
        for r in report["results"]
    )
    table = {c for c in backward.GLUON_CONFIGS.values() if c is not None}
    compared = {(GluonConfig(**r["config"]), r["pdl"]) for r in report["results"] if "probe_ptx_same" in r}
    assert compared == {(c, pdl) for c in table for pdl in (0, 1, 2)}
    assert all(r["probe_ptx_same"] for r in report["results"] if "probe_ptx_same" in r), [
        (r["config"], r["pdl"]) for r in report["results"] if r.get("probe_ptx_same") is False
    ]


@pytest.mark.parametrize("which", WHICH_TRITONS)
def test_grad_x_candidates_compile_for_sm90(tmp_path_factory, which):
    """The grad_x orientation of the kernel (A [M, K], two K halves) compiles for each grad_x
    candidate: wgmma, TMA loads of both halves' descriptors and the store, register
    reallocation, no spills, shared memory within the estimate and the H200's limit, PDL modes."""

    report = compile_report(tmp_path_factory, which, "grad_x")
    assert triton_minor(report["triton"]) in GLUON_TRITONS
    results = report["results"]
    assert {GluonConfig(**r["config"]) for r in results} == set(GRAD_X_CANDIDATES)
    assert {r["pdl"] for r in results} == {0, 1, 2} and all(r["grad_x"] for r in results)
    for r in results:
        assert r["error"] is None, r["error"]
        cfg = GluonConfig(**r["config"])
        assert r["shared"] <= cfg.smem_bytes() <= 232448, (cfg, r["shared"])
        # Four TMA loads in the loader (two per K half), one TMA store in the storer.
        assert r["wgmma"] > 0 and r["tma_load"] >= 4 and r["tma_store"] > 0 and r["setmaxnreg"] > 0, r
        assert not pdl_problems(r, r["pdl"]), pdl_problems(r, r["pdl"])
        if r["spills"] is not None:
            assert r["spills"] == 0, r


def test_grad_x_launcher_takes_cooperative_configs_only():
    if triton_minor(__import__("triton").__version__) not in GLUON_TRITONS:
        pytest.skip("Gluon's kernels are written for " + ", ".join(GLUON_TRITONS))
    from swiglu_lab.experiments.gluon_wgrad_probe import launch_grad_x_gluon

    t = torch.empty(0)
    for bad in (replace(GRAD_X_CANDIDATES[0], pingpong=True), replace(GRAD_X_CANDIDATES[0], defer=True)):
        with pytest.raises(ValueError, match="cooperative"):
            launch_grad_x_gluon(t, t, t, t, t, bad, 1)


# --------------------------------------------------------------------------- numbers (GPU)


def _gluon_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    reason = devices.gluon_unavailable_reason(torch.device("cuda"))
    if reason:
        pytest.skip(reason)


#: The buckets the table gives the Gluon weight gradient, each tested at the bucket's own K (8192 for "open").
GLUON_WGRAD_BUCKETS = [b for b, g in backward.GLUON_CONFIGS.items() if g is not None]


@pytest.mark.gpu
@pytest.mark.parametrize("bucket", GLUON_WGRAD_BUCKETS)
@pytest.mark.parametrize(
    "K, M, N", [(None, 53248, 16384), (None, 16384, 53248), (1, 1000, 1176), (200, 1000, 1176), (77, 384, 520)]
)
def test_gluon_weight_gradient_matches_fp32(bucket, K, M, N):
    """out = a.T @ b against the fp32 product: within one bf16 ulp plus the fp32 summation-order
    bound (K * 2**-23 * |a|.T @ |b|, Higham's gamma_K), NaN-poisoned output fully written, no
    systematic error, bitwise repeatable."""
    _gluon_or_skip()
    from swiglu_lab.experiments import gluon_wgrad_probe  # noqa: F401 (runs the deferred cooperative epilogue below)

    g = backward.GLUON_CONFIGS[bucket]
    K = min(bucket, 8192) if K is None else K
    gen = torch.Generator(device="cuda").manual_seed(min(bucket, 8192) * 7 + K)
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    backward.launch_grad_weight_gluon_or_tl(a, b, out, backward.config_for("grad_weights", K), g)
    want = a.float().T @ b.float()
    assert torch.isfinite(out).all()
    err = (out.float() - want).abs()
    bound = want.abs() * 2.0**-7 + K * 2.0**-23 * (a.float().abs().T @ b.float().abs())
    assert (err <= bound).all(), f"max error {(err / bound).max().item():.2f} x the bound"
    # A systematic error (a scale) moves the signed mean: within 4 standard errors of 0.
    rel = ((out.float() - want) / want.abs().clamp_min(1e-3)).flatten()
    assert rel.mean().abs() <= 4 * rel.std() / rel.numel() ** 0.5 + 1e-6
    again = torch.full_like(out, float("nan"))
    backward.launch_grad_weight_gluon_or_tl(a, b, again, backward.config_for("grad_weights", K), g)
    assert torch.equal(out, again)
    # The other epilogue placement (GluonConfig.defer) writes the same bits.
    other = torch.full_like(out, float("nan"))
    backward.launch_grad_weight_gluon_or_tl(a, b, other, backward.config_for("grad_weights", K), replace(g, defer=not g.defer))
    assert torch.equal(out, other)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "K, M, N", [(256, 53248, 16384), (1024, 16384, 53248), (1, 1000, 1176), (77, 384, 520), (300, 1000, 1176)]
)
def test_pingpong_weight_gradient_gives_the_cooperative_kernels_bits(K, M, N):
    """The ping-pong kernel, at 168 and 232 registers, with 128 x 128 and 128 x (128 + 64) tiles,
    and the wide cooperative 256 x (128 + 64) tiles: each output element summed over K in the same
    order as the cooperative kernel's, so the same bits, NaN-poisoned output fully written (partial
    tiles and wholly out-of-range second chunks at N = 1176 and 520), for each compile-checked
    candidate."""
    _gluon_or_skip()
    from swiglu_lab.experiments import gluon_wgrad_probe  # noqa: F401 (runs the wide cooperative candidates)

    gen = torch.Generator(device="cuda").manual_seed(K + M)
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    for cfg in PINGPONG_CANDIDATES + WIDE_CANDIDATES:
        want = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        backward.launch_grad_weight_gluon_or_tl(
            a, b, want, backward.config_for("grad_weights", K), replace(cfg, pingpong=False, BN2=0, mma_regs=0, wg_store=0)
        )
        got = torch.full_like(want, float("nan"))
        backward.launch_grad_weight_gluon_or_tl(a, b, got, backward.config_for("grad_weights", K), cfg)
        assert torch.isfinite(got).all() and torch.equal(got, want), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("T, H, I", [(200, 520, 1176), (1, 520, 1176), (77, 384, 1000), (128, 16384, 53248), (512, 16384, 53248)])
def test_gluon_grad_x_gives_the_tl_kernels_bits(T, H, I):
    """grad_x = d_gate @ gate_weight + d_up @ up_weight by each Gluon candidate: the tl grad_x
    kernel's bits (one fp32 accumulator, gate's K range then up's, the same k-steps), partial
    tiles and K halves ending inside a k-step included, NaN-poisoned output fully written, the
    same bits again on a second launch."""
    _gluon_or_skip()
    from swiglu_lab.experiments.gluon_wgrad_probe import launch_grad_x_gluon

    gen = torch.Generator(device="cuda").manual_seed(T * 7 + H)
    d_gate, d_up = (torch.randn(T, I, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    gw, uw = ((torch.randn(I, H, device="cuda", generator=gen) * I**-0.5).to(torch.bfloat16) for _ in range(2))
    for cfg in GRAD_X_CANDIDATES:
        # The tl kernel on the same tile and k-step (3 stages fit every candidate's tile).
        tl_cfg = KernelConfig(BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, num_stages=3, num_warps=cfg.num_warps)
        want = torch.full((T, H), float("nan"), device="cuda", dtype=torch.bfloat16)
        backward.launch_grad_x(d_gate, d_up, gw, uw, want, tl_cfg)
        for _ in range(2):
            got = torch.full_like(want, float("nan"))
            launch_grad_x_gluon(d_gate, d_up, gw, uw, got, cfg, devices.tile_programs(got.device, T, H, cfg))
            assert torch.isfinite(got).all() and torch.equal(got, want), cfg


def _finishes_within(seconds: float) -> None:
    """Fail, naming the hang, unless the work queued on the current stream completes within
    ``seconds``: a barrier protocol that loses a phase deadlocks instead of writing wrong bits."""
    import time

    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + seconds
    while not done.query():
        if time.monotonic() > deadline:
            pytest.fail(f"the kernel has not finished after {seconds} s: hung (a lost barrier phase)")
        time.sleep(0.005)


@pytest.mark.gpu
def test_pingpong_epilogues_wait_for_a_slow_storer():
    """With the storer made slow (``STORE_DELAY_NS``: 20 us before each store) a ping-pong
    warpgroup that wrote its output buffer before the other warpgroup's tile was stored would
    show on every launch: tiles lost or swapped, or (as on the H200 with the turn-taking wait
    removed) a deadlock, reported here after 60 s. With one output buffer (the table's 128 x 192
    tile at T = 129-256) and with two, the ping-pong kernel gives the cooperative kernel's bits.
    (The switch is the lab's copy's, ``swiglu_lab.experiments.gluon_wgrad_probe``.)"""
    _gluon_or_skip()
    from swiglu_lab.experiments.gluon_wgrad_probe import launch_grad_weight_gluon

    K, M, N = 200, 4096, 4096  # 5-6 tiles per program: every warpgroup reaches its second tile
    gen = torch.Generator(device="cuda").manual_seed(11)
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    # wg_store=0: the storer warp stores every tile (the path the delay slows).
    for cfg in (replace(backward.GLUON_CONFIGS[256], wg_store=0), replace(WIDE_CANDIDATES[3], wg_store=0)):
        assert cfg.pingpong
        want = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        backward.launch_grad_weight_gluon_or_tl(
            a, b, want, backward.config_for("grad_weights", K), replace(cfg, pingpong=False, BN2=0, mma_regs=0, wg_store=0)
        )
        got = torch.full_like(want, float("nan"))
        launch_grad_weight_gluon(a, b, got, cfg, devices.tile_programs(got.device, M, N, cfg), store_delay_ns=20_000)
        _finishes_within(60)
        assert torch.isfinite(got).all() and torch.equal(got, want), cfg


@pytest.mark.gpu
def test_probe_ablations_run_to_the_end_and_do_what_they_say():
    """The probes' ABLATE switch (``launch_grad_weight_gluon(..., ablate=)``) on a cooperative
    table config: every mode finishes (a barrier left unbalanced would hang); 1 and 3 store
    nothing (the NaN-poisoned output stays NaN); 2 stores every tile (no NaN left), from operands
    that are stale after the ring's first fill; 4 and 6 (no wgmma) store every tile as zeros; 0
    is the kernel as the backward runs it."""
    _gluon_or_skip()
    from swiglu_lab.experiments.gluon_wgrad_probe import launch_grad_weight_gluon

    cfg = next(g for g in backward.GLUON_CONFIGS.values() if g is not None and not g.pingpong)
    K, M, N = 256, 2048, 1536
    gen = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    want = a.float().T @ b.float()
    for ablate in (0, 1, 2, 3, 4, 5, 6):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch_grad_weight_gluon(a, b, out, cfg, devices.tile_programs(out.device, M, N, cfg), ablate=ablate)
        _finishes_within(60)
        if ablate & 1:
            assert torch.isnan(out).all(), ablate
        elif ablate & 4:  # no wgmma: every tile stored, as zeros
            assert (out == 0).all(), ablate
        else:
            assert torch.isfinite(out).all(), ablate
        if ablate == 0:
            torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(53248 // 8, 16384 // 8, 128), (1000, 1032, 77)], ids=["hermes_slice", "ragged"])
def test_plain_store_gives_the_tma_store_bits(M, N, K):
    """``launch_grad_weight_gluon(..., plain_store=1 or 2)`` and configs with ``plain_store``
    (st.global by the MMA warps or by the storer warp instead of TMA stores): the TMA-store
    kernel's bits at the same tile, every element written (the output NaN-poisoned), nothing past
    it (guard elements around it stay NaN), at ragged sizes."""
    from swiglu.kernels import backward, devices
    from swiglu_lab.experiments.gluon_wgrad_probe import launch_grad_weight_gluon
    from triton_checks import guarded, guards_untouched

    table = next(g for g in backward.GLUON_CONFIGS.values() if g is not None and not g.pingpong)
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    want = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    launch_grad_weight_gluon(a, b, want, table, devices.tile_programs(want.device, M, N, table))
    variants = ((replace(table, NC=1), 1), (replace(table, NC=1, STAGES=5), 1), (table, 2), (replace(table, NC=1), 2))
    for cfg, mode in variants + ((replace(table, NC=1, plain_store=1), 0), (replace(table, plain_store=2), 0)):
        got, guard = guarded(M, N, "cuda")
        got = got.view(M, N)
        launch_grad_weight_gluon(a, b, got, cfg, devices.tile_programs(got.device, M, N, cfg), plain_store=mode)
        _finishes_within(60)
        assert guards_untouched(guard), f"a store outside out, {cfg}, {mode}"
        assert torch.isfinite(got).all() and torch.equal(got, want), (cfg, mode)
    for (cfg, mode), ablate in [(v, m) for v in variants[::2] for m in (2, 4, 6)]:
        # The probes' ablations beside it: they finish; without wgmma, zeros.
        got = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch_grad_weight_gluon(a, b, got, cfg, devices.tile_programs(got.device, M, N, cfg), ablate=ablate, plain_store=mode)
        _finishes_within(60)
        assert (got == 0).all() if ablate & 4 else torch.isfinite(got).all(), (mode, ablate)
    with pytest.raises(ValueError, match="plain_store"):
        launch_grad_weight_gluon(a, b, want, replace(table, defer=True), 1, plain_store=True)


def test_plain_store_configs_check_their_fields():
    """``GluonConfig.plain_store``: 0, 1 or 2; cooperative, not deferred, no resident A; with 1
    the shared-memory estimate counts the layout conversion's scratch (the compile test checks
    it against Triton's)."""
    base = GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=1)
    assert replace(base, plain_store=1).smem_bytes() == base.smem_bytes() + 128 * 128 * 2
    assert replace(base, plain_store=2).smem_bytes() == base.smem_bytes()  # it reads the output buffers
    for bad in (dict(pingpong=True), dict(defer=True), dict(resident_k=128)):
        with pytest.raises(ValueError, match="plain_store"):
            replace(base, plain_store=2, **bad)
    with pytest.raises(ValueError, match="plain_store"):
        replace(base, plain_store=3)


def test_wg_store_configs_check_their_fields():
    """``GluonConfig.wg_store``: chunk buffers per MMA warpgroup of a ping-pong tile with
    BN = 2 * BN2 (three BN2-wide chunks), in place of the NC tile buffers in the shared-memory
    estimate; anything else is refused."""
    wide = GluonConfig(BM=128, BN=128, BN2=64, BK=64, STAGES=4, NC=1, pingpong=True, mma_regs=232)
    assert replace(wide, wg_store=2).smem_bytes() == wide.smem_bytes() - 128 * 192 * 2 + 2 * 2 * 128 * 64 * 2
    for bad in (dict(pingpong=False, BN2=0), dict(BN2=32), dict(wg_store=-1), dict(plain_store=1, NC=2)):
        with pytest.raises(ValueError, match="wg_store"):
            replace(wide, **{"wg_store": 2, **bad})


@pytest.mark.gpu
@pytest.mark.parametrize(
    "M,N,K",
    [(53248 // 8, 16384 // 8, 256), (1000, 1032, 77), (1000, 1000, 300), (136, 200, 1)],
    ids=["hermes_slice", "ragged", "ragged_wide", "one_token"],
)
def test_wg_store_gives_the_storer_bits(M, N, K):
    """The ping-pong kernel with ``wg_store`` (each MMA warpgroup stores its tile by TMA in
    chunks of its own, no storer warp): the storer kernel's bits at the same tile, every element
    written (NaN-poisoned output), nothing past it (guard elements stay NaN), at ragged sizes
    (N = 1000: chunks partly and wholly past N) and one token."""
    from swiglu.kernels import devices
    from swiglu.kernels.gluon_wgrad import launch_grad_weight_gluon
    from swiglu_lab.experiments import gluon_wgrad_probe  # the storer warp's ping-pong kernel
    from triton_checks import guarded, guards_untouched

    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    want = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    nprog = devices.tile_programs(want.device, M, N, WIDE_CANDIDATES[0])
    gluon_wgrad_probe.launch_grad_weight_gluon(a, b, want, WIDE_CANDIDATES[0], nprog)
    # The same bits from 32- and 64-deep k-steps: each element sums the same products in k order.
    for cfg, chunks in ((WIDE_CANDIDATES[0], 2), (WIDE_CANDIDATES[0], 1), (replace(WIDE_CANDIDATES[2], STAGES=8), 2)):
        nprog = devices.tile_programs(want.device, M, N, cfg)
        got, guard = guarded(M, N, "cuda")
        got = got.view(M, N)
        launch_grad_weight_gluon(a, b, got, replace(cfg, wg_store=chunks), nprog)
        _finishes_within(60)
        assert guards_untouched(guard), f"a store outside out, {cfg}"
        assert torch.isfinite(want).all() and torch.isfinite(got).all() and torch.equal(got, want), (cfg, chunks)


def test_resident_configs_check_their_fields_and_tokens(monkeypatch):
    """``GluonConfig.resident_k``: a multiple of BK, cooperative only, counted in the shared-memory
    estimate; the resident launcher refuses more tokens than its block holds (before any launch);
    the library runs such a config only once the lab's experiment is imported."""
    with pytest.raises(ValueError, match="resident_k"):
        GluonConfig(BM=128, BN=128, BK=64, resident_k=100)
    with pytest.raises(ValueError, match="resident_k"):
        GluonConfig(BM=128, BN=128, BK=64, pingpong=True, resident_k=128)
    with pytest.raises(ValueError, match="resident_k"):
        GluonConfig(BM=128, BN=128, BK=64, GROUP_M=65, resident_k=128)
    with pytest.raises(ValueError, match="STAGES must be >= 2"):
        GluonConfig(BM=128, BN=128, BK=64, STAGES=1, resident_k=128)
    cfg = GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=3, resident_k=128)
    assert cfg.smem_bytes() == (128 * 128 + 4 * 64 * 128) * 2 + 3 * 128 * 128 * 2 + 1024
    if triton_minor(__import__("triton").__version__) not in GLUON_TRITONS:
        pytest.skip("Gluon's kernels are written for " + ", ".join(GLUON_TRITONS))
    from swiglu.kernels.gluon_wgrad import launch_grad_weight_gluon
    from swiglu_lab.experiments import gluon_wgrad_resident

    a, b = torch.zeros(129, 256, dtype=torch.bfloat16), torch.zeros(129, 128, dtype=torch.bfloat16)
    assert backward.RESIDENT_LAUNCHER is gluon_wgrad_resident.launch_grad_weight_resident
    with monkeypatch.context() as m:
        m.setattr(backward, "RESIDENT_LAUNCHER", None)
        with pytest.raises(ValueError, match="sets backward.RESIDENT_LAUNCHER when imported"):
            backward.launch_grad_weight_gluon_or_tl(a, b, torch.empty(256, 128, dtype=torch.bfloat16), None, cfg, 1)
    with pytest.raises(ValueError, match="resident_k=128, got 129"):
        backward.launch_grad_weight_gluon_or_tl(a, b, torch.empty(256, 128, dtype=torch.bfloat16), None, cfg, 1)
    with pytest.raises(ValueError, match="runs swiglu_lab.experiments.gluon_wgrad_resident"):
        launch_grad_weight_gluon(a[:128], b[:128], torch.empty(256, 128, dtype=torch.bfloat16), cfg, 1)


def _resident_candidates():
    try:
        from swiglu_lab.experiments.gluon_wgrad_resident import RESIDENT_CANDIDATES
    except ImportError:  # a triton without Gluon
        return []
    return list(RESIDENT_CANDIDATES)


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(_resident_candidates())))
@pytest.mark.parametrize(
    "K, M, N",
    [(None, 53248, 16384), (None, 16384, 53248), (1, 1000, 1176), (77, 384, 520), (None, 1000, 1176), (200, 2048, 1536)],
)
def test_resident_weight_gradient_gives_the_ring_kernels_bits(index, K, M, N):
    """``swiglu_lab.experiments.gluon_wgrad_resident`` (A held in shared memory): within the fp32 bound of
    ``test_gluon_weight_gradient_matches_fp32``, NaN-poisoned output fully written, and bitwise the
    ring kernel's output at the same tile and K-step (the same wgmma sequence per element), launch
    after launch; every launch finishes (a lost A-block phase would hang)."""
    _gluon_or_skip()
    from swiglu_lab.experiments import gluon_wgrad_probe  # noqa: F401 (runs a deferred ring)

    cfg = _resident_candidates()[index]
    K = cfg.resident_k if K is None else K
    if K > cfg.resident_k:
        pytest.skip(f"K = {K} is past this candidate's resident_k {cfg.resident_k}")
    gen = torch.Generator(device="cuda").manual_seed(index * 1000 + K + M)
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    ring = replace(cfg, resident_k=0, STAGES=2, NC=1)
    want_bits = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    backward.launch_grad_weight_gluon_or_tl(a, b, want_bits, None, ring, devices.tile_programs(a.device, M, N, ring))
    want = a.float().T @ b.float()
    bound = want.abs() * 2.0**-7 + K * 2.0**-23 * (a.float().abs().T @ b.float().abs())
    for _ in range(2):
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        backward.launch_grad_weight_gluon_or_tl(a, b, out, None, cfg)
        _finishes_within(60)
        assert torch.isfinite(out).all()
        err = (out.float() - want).abs()
        assert (err <= bound).all(), f"max error {(err / bound).max().item():.2f} x the bound"
        assert torch.equal(out, want_bits), cfg
        # The other epilogue placement (GluonConfig.defer), the same bits.
        other = torch.full_like(out, float("nan"))
        backward.launch_grad_weight_gluon_or_tl(a, b, other, None, replace(cfg, defer=not cfg.defer))
        _finishes_within(60)
        assert torch.equal(other, want_bits), replace(cfg, defer=not cfg.defer)


@pytest.mark.gpu
@pytest.mark.parametrize("K", [200, 256, 130])
def test_pingpong_with_one_output_buffer_is_right_launch_after_launch(K):
    """The table's ping-pong kernels with one output buffer (NC = 1: the 128 x 192 tile at
    T = 129-256 as it is, the others with NC set to 1) at short K, where a tile's stores are slow
    against its mainloop: 20 launches each bitwise the cooperative kernel's. A warpgroup whose
    epilogue ran ahead of the other's wrote the buffer while a store still read it (launches
    differed on the H200 before the epilogues took turns)."""
    _gluon_or_skip()
    M, N = 53248, 16384
    gen = torch.Generator(device="cuda").manual_seed(K)
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    single = [replace(g, NC=1) for g in backward.GLUON_CONFIGS.values() if g is not None and g.pingpong]
    assert single, "the table has no ping-pong entry: test the candidates instead"
    tl_cfg = backward.config_for("grad_weights", K)
    want = torch.empty((M, N), device="cuda", dtype=torch.bfloat16)
    got = torch.empty_like(want)
    for cfg in sorted(set(single), key=str):
        want.fill_(float("nan"))
        backward.launch_grad_weight_gluon_or_tl(a, b, want, tl_cfg, replace(cfg, pingpong=False, BN2=0, mma_regs=0, wg_store=0))
        bad = 0
        for _ in range(20):
            got.fill_(float("nan"))
            backward.launch_grad_weight_gluon_or_tl(a, b, got, tl_cfg, cfg)
            _finishes_within(60)
            bad += not torch.equal(got, want)
        assert bad == 0, f"{cfg}: {bad} of 20 launches differ from the cooperative kernel's bits"


@pytest.mark.gpu
@pytest.mark.parametrize("K", [1024, 2048])
def test_weight_gradients_keep_their_bits_while_another_process_time_slices_the_gpu(K):
    """The table's weight gradient at Hermes' size, 10 launches beside a process running matmuls,
    each bitwise its launch on the idle GPU with nothing left of the NaN poison. The ping-pong
    tile whose MMA warpgroups store their own chunks (``wg_store``) failed this in every launch on
    an H100 (a preempted tile's first chunk, 16 of its 64 columns wrong or unwritten:
    lab/probes/time_slicing.py); the storer warp's epilogue and the cooperative tile pass."""
    _gluon_or_skip()
    g = backward.GLUON_CONFIGS[K]
    M, N = 53248, 16384
    gen = torch.Generator(device="cuda").manual_seed(K + 3)
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    tl_cfg = backward.config_for("grad_weights", K)
    want = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    backward.launch_grad_weight_gluon_or_tl(a, b, want, tl_cfg, g)
    assert torch.isfinite(want).all()
    got = torch.empty_like(want)
    bad = []
    with matmuls_in_another_process():
        for _ in range(10):
            got.fill_(float("nan"))
            backward.launch_grad_weight_gluon_or_tl(a, b, got, tl_cfg, g)
            bad.append(int((got != want).sum()))
    assert not any(bad), f"{g}: elements differing from the idle GPU's launch, per launch: {bad}"


# --------------------------------------------------------------------------- Gluon dSwiGLU kernel
# swiglu.kernels.gluon_dswiglu: compiled here; on the GPU bitwise the tl kernel's (below) and
# dispatched per token bucket from backward_configs.json (lab/probes/probe_gluon_dswiglu.py times it).


def test_dswiglu_table_entries():
    """Gluon dSwiGLU from T = 129 up (the tl kernel won at T <= 128), each entry one of the compiled
    candidates, within the H200's shared memory, and measured faster than the tl kernel."""

    table = json.loads(backward.TUNED_CONFIGS_PATH.read_text())["gluon_dswiglu"]
    chosen = {b: g for b, g in backward.GLUON_DSWIGLU.items() if g is not None}
    assert set(chosen) == set(configs.TOKEN_BUCKETS) - {128}
    for bucket, g in chosen.items():
        entry = table[configs.bucket_key(bucket)]
        assert g == DSWIGLU_CANDIDATES[entry["candidate"]]
        assert g.smem_bytes() <= 232448
        assert entry["ms"] < entry["tl_ms"], entry


def test_dswiglu_shape_entries():
    """Each per-shape entry is a compiled candidate, fits the H200's shared memory, measured faster
    than the tl kernel and than the bucket's own entry at that shape, and differs from it."""

    table = json.loads(backward.TUNED_CONFIGS_PATH.read_text())["gluon_dswiglu_by_shape"]
    assert set(backward.GLUON_DSWIGLU_BY_SHAPE) == {configs.parse_shape(k) for k in table}
    for key, buckets in table.items():
        for bucket_key, entry in buckets.items():
            g = backward.GLUON_DSWIGLU_BY_SHAPE[configs.parse_shape(key)][configs.parse_bucket(bucket_key)]
            assert g == DSWIGLU_CANDIDATES[entry["candidate"]] and g.smem_bytes() <= 232448
            assert entry["ms"] < min(entry["tl_ms"], entry["bucket_choice_ms"]), entry
            assert g != backward.GLUON_DSWIGLU[configs.parse_bucket(bucket_key)]
    with pytest.raises(ValueError, match="HIDDENxINTERMEDIATE"):
        configs.parse_shape("4096-14336")


@pytest.fixture
def dswiglu_recorded(monkeypatch):
    """Gluon 'available' for dSwiGLU only, its launch replaced by the tl kernel (interpreted) that
    records the config it was given: the CPU check of the backward's dispatch."""
    from swiglu.kernels import gluon_dswiglu

    calls = []

    def fake(go, dw, gate, up, act, d_gate, d_up, h, cfg, nprog):
        calls.append(cfg)
        backward.launch_dswiglu(go, dw, gate, up, act, d_gate, d_up, h, backward.config_for("dswiglu", go.shape[0]))

    monkeypatch.setattr(backward, "gluon_unavailable_reason", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _FakeProps())
    monkeypatch.setattr(backward, "GLUON_CONFIGS", {b: None for b in configs.TOKEN_BUCKETS})
    monkeypatch.setattr(gluon_dswiglu, "launch_dswiglu_gluon_trusted", fake)
    backward.clear_plans()
    yield calls
    backward.clear_plans()


@pytest.mark.parametrize("recompute", [False, True])
def test_backward_takes_gluon_dswiglu_for_table_buckets(dswiglu_recorded, recompute):
    inp = make_inputs(1, 130, 16, 48, seed=11)
    args = list(inp.as_tuple())
    if recompute:
        args[4] = None
    want = backward.triton_swiglu_backward(*args, configs={"dswiglu": backward.config_for("dswiglu", 130)})
    assert dswiglu_recorded == []
    got = backward.triton_swiglu_backward(*args)
    assert dswiglu_recorded == [backward.GLUON_DSWIGLU[256]]
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_plans_take_the_shapes_own_dswiglu_entry(dswiglu_recorded):
    """At a shape with its own entry for a bucket the plan takes it; other buckets at that shape and
    other shapes at that bucket keep the bucket's entry."""
    llama = next(iter(backward.GLUON_DSWIGLU_BY_SHAPE))
    own = backward.GLUON_DSWIGLU_BY_SHAPE[llama]
    cpu = torch.device("cpu")
    for bucket, g in own.items():
        tokens = 1500 if bucket == 2048 else (bucket if bucket < configs.OPEN_BUCKET else 8192)
        assert backward.backward_plan(tokens, *llama, cpu).gluon_dswiglu == g
        assert backward.backward_plan(tokens, 16384, 53248, cpu).gluon_dswiglu == backward.GLUON_DSWIGLU[bucket]
    for bucket in set(configs.TOKEN_BUCKETS) - set(own) - {128}:
        assert backward.backward_plan(bucket, *llama, cpu).gluon_dswiglu == backward.GLUON_DSWIGLU[bucket]


def test_backward_launches_the_shapes_own_dswiglu_config(dswiglu_recorded, monkeypatch):
    """The launch gets the plan's per-shape config (here a planted entry for H = 16, I = 48)."""

    other = next(c for c in DSWIGLU_CANDIDATES if c != backward.GLUON_DSWIGLU[256])
    monkeypatch.setattr(backward, "GLUON_DSWIGLU_BY_SHAPE", {(16, 48): {256: other}})
    backward.clear_plans()
    inp = make_inputs(1, 130, 16, 48, seed=14)
    backward.triton_swiglu_backward(*inp.as_tuple())
    backward.triton_swiglu_backward(*make_inputs(1, 130, 16, 56, seed=15).as_tuple())
    assert dswiglu_recorded == [other, backward.GLUON_DSWIGLU[256]]


def test_backward_keeps_tl_dswiglu_where_gluon_cannot_run(dswiglu_recorded):
    inp = make_inputs(1, 100, 16, 48, seed=12)  # bucket 128: no Gluon entry
    backward.triton_swiglu_backward(*inp.as_tuple())
    assert dswiglu_recorded == []
    # Row strides the Gluon kernel cannot address (one for gate/up/act, one for d_gate/d_up/h): gate
    # a view of a wider buffer (2I) beside a contiguous up; and, written over
    # (overwrite_activations), both such views, so d_gate's row stride (2I) is not h's (I).
    inp = make_inputs(1, 130, 16, 48, seed=13)
    args = list(inp.as_tuple())
    want = backward.triton_swiglu_backward(*args)
    assert len(dswiglu_recorded) == 1

    def wide(t):  # the same values, each row inside a row twice as long
        return torch.cat([t, torch.randn_like(t)], dim=-1)[..., : t.shape[-1]]

    for gate, up, overwrite in ((wide(args[2]), args[3], False), (wide(args[2]), wide(args[3]), True)):
        got = backward.triton_swiglu_backward(*args[:2], gate, up, *args[4:], overwrite_activations=overwrite)
        assert len(dswiglu_recorded) == 1, (gate.stride(), up.stride())
        for g, w in zip(got, want):
            assert torch.equal(g, w)


#: DSWIGLU_CANDIDATES indices that compile without spills (triton 3.6.0 and 3.7.1, ptxas -v, with and without RECOMPUTE_ACT);
#: config 1 (32x64 epilogue pieces) spills 60 B (24 B recomputing act), so nothing is asserted on it.
DSWIGLU_SPILL_FREE = {0, 2, 3, 4}


def check_dswiglu_compiles(report: dict) -> None:
    """What every dSwiGLU candidate's sm_90 compile must show (the worker's report)."""
    from swiglu.kernels import gluon_dswiglu

    assert triton_minor(report["triton"]) in GLUON_TRITONS
    results = report["results"]
    n = len(DSWIGLU_CANDIDATES)
    assert {(r["index"], r["recompute"]) for r in results if not r["T_is_one"] and r["pdl"] == 0} == {
        (i, rec) for i in range(n) for rec in (False, True)
    }
    assert any(r["T_is_one"] for r in results)
    assert {r["pdl"] for r in results} == {0, 1, 2}
    for r in results:
        assert r["error"] is None, r["error"]
        cfg = gluon_dswiglu.DswigluGluonConfig(**r["config"])
        assert cfg == DSWIGLU_CANDIDATES[r["index"]]
        assert r["shared"] <= cfg.smem_bytes() <= 232448, (cfg, r["shared"])
        # wgmma, TMA loads of go/dw, no TMA stores (the epilogue stores with plain 16-byte stores),
        # register reallocation between the partitions.
        assert r["wgmma"] > 0 and r["tma_load"] > 0 and r["tma_store"] == 0 and r["setmaxnreg"] > 0, r
        assert r["ld_global_v4"] > 0 and r["st_global_v4"] > 0, r
        assert not pdl_problems(r, r["pdl"]), pdl_problems(r, r["pdl"])
        assert r["regs"] is not None and r["regs"] <= cfg.maxnreg, r
        if r["index"] in DSWIGLU_SPILL_FREE:
            assert r["spills"] == 0, r


@pytest.mark.parametrize("which", WHICH_TRITONS)
def test_dswiglu_candidates_compile_for_sm90(tmp_path_factory, which):
    """Every candidate of the Gluon dSwiGLU kernel compiles for sm_90 with each triton the kernels
    are written for (both RECOMPUTE_ACT variants, and T = 1 specialized as a constexpr)."""
    check_dswiglu_compiles(compile_report(tmp_path_factory, which, "dswiglu"))


def test_dswiglu_compile_check_can_fail():
    """The compile check rejects a spill, a missing wgmma, too much shared memory, a compile error
    and a missing config (entries planted in a report that passes)."""

    def entry(i, rec, t1=False, **kw):
        cfg = DSWIGLU_CANDIDATES[i]
        return {
            "index": i,
            "config": cfg.__dict__,
            "recompute": rec,
            "T_is_one": t1,
            "error": None,
            "shared": cfg.smem_bytes() - 724,
            "regs": cfg.maxnreg,
            "spills": 60 if i not in DSWIGLU_SPILL_FREE else 0,
            "wgmma": 4,
            "tma_load": 5,
            "tma_store": 0,
            "setmaxnreg": 10,
            "ld_global_v4": 8,
            "st_global_v4": 6,
            "pdl": 0,
            "gdc_wait": 0,
            "gdc_trigger": 0,
            "wait_before_access": False,
            "trigger_before_access": False,
            **kw,
        }

    pdl_on = dict(gdc_wait=1, gdc_trigger=1, wait_before_access=True)
    good = [entry(i, rec) for i in range(len(DSWIGLU_CANDIDATES)) for rec in (False, True)] + [entry(0, False, True)]
    good += [entry(0, False, pdl=1, trigger_before_access=True, **pdl_on), entry(0, False, pdl=2, **pdl_on)]
    check_dswiglu_compiles({"triton": GLUON_TRITONS[0] + ".0", "results": good})
    for bad in (
        {"spills": 8},
        {"wgmma": 0},
        {"tma_store": 1},
        {"shared": 240000},
        {"error": "CompilationError"},
        {"regs": 256},
        {"gdc_wait": 1},
    ):
        results = [dict(r) for r in good]
        results[0].update(bad)
        with pytest.raises(AssertionError):
            check_dswiglu_compiles({"triton": GLUON_TRITONS[0] + ".0", "results": results})
    late = [dict(r) for r in good]
    late[-2]["wait_before_access"] = False  # the mode-1 compile waits after a global access
    with pytest.raises(AssertionError):
        check_dswiglu_compiles({"triton": GLUON_TRITONS[0] + ".0", "results": late})
    with pytest.raises(AssertionError):
        check_dswiglu_compiles({"triton": GLUON_TRITONS[0] + ".0", "results": good[1:]})
    with pytest.raises(AssertionError):
        check_dswiglu_compiles({"triton": "3.8.0", "results": good})


def test_dswiglu_configs_fit_and_check():
    """The candidates fit the H200's shared memory and register file; a config that cannot is refused."""
    from swiglu.kernels import gluon_dswiglu

    for cfg in DSWIGLU_CANDIDATES:
        assert cfg.smem_bytes() <= 232448 and cfg.total_warps() * 32 * cfg.maxnreg <= 65536
    with pytest.raises(ValueError, match="registers"):
        gluon_dswiglu.DswigluGluonConfig(epi_warps=4)  # 16 warps x 32 x 168 > 65536
    with pytest.raises(ValueError, match="pieces"):
        gluon_dswiglu.DswigluGluonConfig(EPI_N=128)


def test_dswiglu_launcher_default_is_the_first_candidate():
    """``launch_dswiglu_gluon``'s default cfg, ``DswigluGluonConfig()``, is candidate 0 (the lab's
    list, index 0 of the probe's --configs), as when the launcher took it from the list."""
    import inspect

    from swiglu.kernels import gluon_dswiglu

    default = inspect.signature(gluon_dswiglu.launch_dswiglu_gluon).parameters["cfg"].default
    assert default == gluon_dswiglu.DswigluGluonConfig() == DSWIGLU_CANDIDATES[0]


def test_dswiglu_launcher_checks_its_tensors():
    from swiglu.kernels import gluon_dswiglu

    T, H, I = 5, 16, 48
    go, dw = torch.zeros(T, H, dtype=torch.bfloat16), torch.zeros(H, I, dtype=torch.bfloat16)
    ins = [torch.zeros(T, I, dtype=torch.bfloat16) for _ in range(3)]
    outs = [torch.zeros(T, I, dtype=torch.bfloat16) for _ in range(3)]
    with pytest.raises(ValueError, match="up"):
        gluon_dswiglu.launch_dswiglu_gluon(go, dw, ins[0], ins[1][:, :40], ins[2], *outs)
    wide = torch.zeros(T, 2 * I, dtype=torch.bfloat16)[:, :I]  # a valid tensor, but another row stride than gate's
    with pytest.raises(ValueError, match="row stride"):
        gluon_dswiglu.launch_dswiglu_gluon(go, dw, ins[0], ins[1], ins[2], outs[0], wide, outs[2])


def test_dswiglu_trusted_launch_passes_what_the_checked_one_does(monkeypatch):
    """The backward's launcher (no checks, cached launch) hands the kernel the same arguments as
    the checked one: the same tensors, sizes, row strides and constexprs, descriptors of the same
    tensors and blocks; act None passes gate in its place."""
    from swiglu.kernels import gluon_dswiglu

    T, H, I = 5, 16, 48
    go, dw = torch.randn(T, H).bfloat16(), torch.randn(H, I).bfloat16()
    gate, up, act = (torch.randn(T, 2 * I).bfloat16()[:, :I] for _ in range(3))  # row stride 2I in
    outs = [torch.empty(T, I, dtype=torch.bfloat16) for _ in range(3)]
    seen = []
    monkeypatch.setattr(gluon_dswiglu, "launch", lambda kernel, grid, key, *args, **kw: seen.append((grid, args, kw)))
    for a in (act, None):
        cfg = DSWIGLU_CANDIDATES[3]
        grid, want, want_kw = gluon_dswiglu._prepare(go, dw, gate, up, a, *outs, cfg, 7)
        gluon_dswiglu.launch_dswiglu_gluon_trusted(go, dw, gate, up, a, *outs, cfg, 7)
        got_grid, got, got_kw = seen.pop()
        assert got_grid == grid and got_kw == want_kw and len(got) == len(want)
        for g, w in zip(tma.as_descriptors(got[:2]), want[:2]):  # descriptors, as Triton's path builds them
            assert g.base is w.base and list(g.block_shape) == list(w.block_shape) and g.layout == w.layout
            assert type(g) is type(w)
        for g, w in zip(got[2:], want[2:]):
            assert g is w if isinstance(w, torch.Tensor) else g == w
        assert got[4] is (gate if a is None else act) and got[10:12] == (2 * I, I)


def _dswiglu_inputs(T, H, I, seed):
    """go, dw, gate, up, act as the backward sees them (act = bf16(silu(gate)), the forward's)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    go = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)
    dw = (torch.randn(H, I, device="cuda", generator=gen) * H**-0.5).to(torch.bfloat16)
    gate = (torch.randn(T, I, device="cuda", generator=gen) * 2.0).to(torch.bfloat16)
    up = torch.randn(T, I, device="cuda", generator=gen).to(torch.bfloat16)
    act = (gate.float() * torch.sigmoid(gate.float())).to(torch.bfloat16)
    return go, dw, gate, up, act


_DSWIGLU_SMOKE: dict[int, str | None] = {}
_SMOKE_CODE = """
import sys, torch
from swiglu.kernels import gluon_dswiglu
from swiglu_lab.experiments.candidates import DSWIGLU_CANDIDATES
T, H, I = 300, 1000, 1176
x = [torch.randn(*s, device="cuda").to(torch.bfloat16) for s in ((T, H), (H, I), (T, I), (T, I), (T, I))]
for act in (x[4], None):
    gluon_dswiglu.launch_dswiglu_gluon(*x[:4], act, *[torch.empty(T, I, device="cuda", dtype=torch.bfloat16) for _ in range(3)],
                                       DSWIGLU_CANDIDATES[int(sys.argv[1])])
torch.cuda.synchronize()
print("ok")
"""


def _dswiglu_runs_or_fail(index: int) -> None:
    """Run config ``index`` once in a subprocess with a time limit before the in-process test: a
    never-run warp-specialized kernel may deadlock on an mbarrier, which would hang pytest."""
    if index not in _DSWIGLU_SMOKE:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "lab"), os.environ.get("PYTHONPATH", "")])
        )
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _SMOKE_CODE, str(index)], env=env, capture_output=True, text=True, timeout=180
            )
            ok = proc.returncode == 0 and proc.stdout.strip().endswith("ok")
            _DSWIGLU_SMOKE[index] = None if ok else f"exit {proc.returncode}: {proc.stderr[-2000:]}"
        except subprocess.TimeoutExpired:
            _DSWIGLU_SMOKE[index] = "no result within 180 s (a deadlock?)"
    if _DSWIGLU_SMOKE[index] is not None:
        pytest.fail(f"config {index}: the smoke run (T=300, H=1000, I=1176) failed: {_DSWIGLU_SMOKE[index]}")


@pytest.mark.gpu
@pytest.mark.parametrize("recompute", [False, True], ids=["act", "recompute"])
@pytest.mark.parametrize("T, H, I", [(1, 520, 1176), (77, 384, 520), (300, 1000, 1176), (128, 16384, 53248), (512, 16384, 53248)])
@pytest.mark.parametrize("index", range(len(DSWIGLU_CANDIDATES)))  # every candidate, however many
def test_gluon_dswiglu_bitwise_tl(index, T, H, I, recompute):
    """The Gluon dSwiGLU kernel (candidate ``index``) against the tl kernel (backward.launch_dswiglu):
    d_gate, d_up and h bitwise equal, every element written (outputs NaN-poisoned): both round at
    the same points with the same PTX ops and accumulate over K in the same order (docs/kernels.md)."""
    _gluon_or_skip()
    from swiglu.kernels import gluon_dswiglu

    _dswiglu_runs_or_fail(index)
    cfg = DSWIGLU_CANDIDATES[index]
    go, dw, gate, up, act = _dswiglu_inputs(T, H, I, seed=T * 31 + I)
    a = None if recompute else act
    want = [torch.full((T, I), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    got = [torch.full_like(w, float("nan")) for w in want]
    backward.launch_dswiglu(go, dw, gate, up, a, *want, backward.config_for("dswiglu", T))
    gluon_dswiglu.launch_dswiglu_gluon(go, dw, gate, up, a, *got, cfg)
    torch.cuda.synchronize()
    assert not any(torch.isnan(w).any() for w in want), "the tl kernel left NaN (unwritten) outputs"
    report = []
    for name, g, w in zip(("d_gate", "d_up", "h"), got, want):
        same = g.view(torch.int16) == w.view(torch.int16)
        if not same.all():
            diff = torch.nan_to_num((g.float() - w.float()).abs(), nan=float("inf"))
            report.append(
                f"{name}: {same.float().mean().item():.6f} bitwise equal, {torch.isnan(g).sum().item()} NaN, "
                f"max abs diff {diff.max().item():.3g}"
            )
    assert not report, f"config {index} ({cfg.name()}), T={T} H={H} I={I} recompute={recompute}: " + "; ".join(report)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["act", "recompute", "overwrite"])
@pytest.mark.parametrize(
    "T, H, I",
    [
        (129, 1000, 1176),
        (300, 1000, 1176),
        (700, 384, 2056),
        (1500, 1000, 1176),
        (2984, 520, 1176),
        (5000, 384, 520),
        (300, 16384, 53248),
        (1500, 4096, 14336),
        (4500, 4096, 14336),
    ],
)  # the shape's own entries
def test_backward_with_gluon_dswiglu_bitwise_tl(T, H, I, mode):
    """The whole backward as dispatched (Gluon dSwiGLU from the table) against the same backward
    with the tl dSwiGLU kernel: all four gradients bitwise equal, NaN-poisoned outputs, in each
    table bucket (odd T), with activated_gate given or recomputed, and writing over gate/up."""
    _gluon_or_skip()
    assert backward.gluon_dswiglu_config_for(T, torch.device("cuda")) is not None
    inp = make_inputs(1, T, H, I, device="cuda", seed=T + I)
    args = list(inp.as_tuple())
    if mode == "recompute":
        args[4] = None
    tl = {"dswiglu": backward.config_for("dswiglu", T)}
    shapes = [(T, H), (I, H), (I, H), (H, I)]
    results = []
    for plan_configs in (None, tl):
        a = list(args)
        if mode == "overwrite":
            a[2], a[3] = a[2].clone(), a[3].clone()
        out = tuple(torch.full(s, float("nan"), device="cuda", dtype=torch.bfloat16) for s in shapes)
        results.append(
            backward.triton_swiglu_backward(*a, configs=plan_configs, out=out, overwrite_activations=mode == "overwrite")
        )
    torch.cuda.synchronize()
    for name, g, w in zip(("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight"), *results):
        assert not torch.isnan(w).any(), f"{name}: the tl path left NaN"
        assert torch.equal(g.view(torch.int16), w.view(torch.int16)), f"{name} differs, T={T} H={H} I={I} {mode}"
