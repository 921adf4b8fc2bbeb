"""The lab's Gluon MoE up projection and dSwiGLU GEMM (``swiglu_lab.experiments.moe_gluon_up``,
``moe_gluon_dswiglu``): the tile table
(a tl kernel: run here under the interpreter) against the grouped GEMM's tiles computed in Python,
and the Gluon kernels compiled for sm_90 with each Triton the Gluon kernels are written for
(warp-specialized, its wgmma and TMA loads, no spills, shared memory within the H200's block). A
Gluon kernel does not run under the interpreter: its values are checked on the GPU
(``lab/probes/moe_gluon_up.py``, ``moe_gluon_dswiglu.py``, against the library's kernels)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SM90_SHARED = 232448
TRITONS = ["installed"] + (["extra"] if os.environ.get("SWIGLU_EXTRA_TRITON_DIR") else [])


def _tiles(expert_start, BM):
    """(expert, first row, end row) of each M tile: each expert's cdiv(count, BM) tiles in order."""
    out = []
    for e in range(len(expert_start) - 1):
        lo, hi = expert_start[e], expert_start[e + 1]
        out += [(e, r, hi) for r in range(lo, hi, BM)]
    return out


@pytest.mark.parametrize(
    "counts",
    [[5, 0, 17, 3], [0, 0, 0, 40], [1] * 9, [0, 33, 0, 0, 31, 0, 32, 1], [64, 64]],
    ids=["mixed", "one_expert", "ones", "gaps", "exact"],
)
def test_tile_table_lists_every_experts_m_tiles(counts):
    from swiglu.kernels import moe
    from swiglu_lab.experiments import moe_gluon_up

    E, k, BM = len(counts), 1, 16
    idx = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)])
    idx = idx[torch.randperm(len(idx), generator=torch.Generator().manual_seed(0))].reshape(-1, k)
    r = moe.Routing(idx, E)
    start = r.expert_start.tolist()
    assert start == [0] + torch.tensor(counts).cumsum(0).tolist()
    table = moe_gluon_up.tile_table(r, BM)
    max_m = -(-len(idx) // BM) + E
    assert table.shape == (3, max_m)
    want = _tiles(start, BM)
    got = [tuple(c) for c in table.T.tolist()]
    assert got[: len(want)] == want
    assert all(e >= E for e, _, _ in got[len(want) :])  # idle tiles


def _compile(tmp_path, which, kind):
    """tests/gluon_compile_worker.py's report of ``kind`` with the installed or the extra triton."""
    from swiglu.kernels.devices import GLUON_TRITONS, triton_minor

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    paths = [str(ROOT / "src"), str(ROOT / "lab")]
    if which == "extra":
        paths.insert(0, os.environ["SWIGLU_EXTRA_TRITON_DIR"])
    else:
        import triton

        if triton_minor(triton.__version__) not in GLUON_TRITONS:
            pytest.skip(f"this environment's triton {triton.__version__} is not one the Gluon kernels are written for")
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / "report.json"
    worker = [sys.executable, str(ROOT / "tests" / "gluon_compile_worker.py"), str(out), kind]
    run = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert triton_minor(report["triton"]) in GLUON_TRITONS
    return report


@pytest.mark.parametrize("which", TRITONS)
def test_moe_gluon_up_compiles_for_sm90(tmp_path, which):
    report = _compile(tmp_path, which, "moe_up")
    assert len(report["results"]) == 2
    for r in report["results"]:
        assert r["error"] is None, r["error"]
        # Two m64n128k16 wgmma chains (gate, up) of BK / 16 steps; three TMA loads (x, gate rows, up rows).
        assert r["wgmma"] == 8 and r["tma_load"] == 3 and r["setmaxnreg"] > 0, r
        assert r["st_global"] > 0 and r["tma_store"] == 0, r  # masked pointer stores: rows past an expert's end stay unwritten
        assert r["spills"] in (0, None), r
        assert r["shared"] <= SM90_SHARED, r


def test_install_routes_only_what_the_kernel_takes_and_undoes():
    """``install`` (the bench's ``--lab-moe-gluon up``) replaces the library's up-projection
    launcher; operands the Gluon kernel does not take (here: CPU tensors) go to the library's
    kernel, bitwise as without it; the returned function restores the library's launcher."""
    from swiglu import swiglu_moe
    from swiglu.kernels import moe
    from swiglu_lab.experiments import moe_gluon_up

    T, H, I, E, k = 24, 32, 128, 4, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g).bfloat16()
    idx = torch.randint(0, E, (T, k), generator=g)
    w = torch.rand(T, k, generator=g)
    gu = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).bfloat16()
    dp = (torch.randn(E, H, I, generator=g) / I**0.5).bfloat16()
    want = swiglu_moe(x, idx, w, gu, dp, impl="triton")
    library = moe.launch_up
    undo = moe_gluon_up.install()
    try:
        assert moe.launch_up is not library
        assert not moe_gluon_up.supports(x, gu)
        got = swiglu_moe(x, idx, w, gu, dp, impl="triton")
    finally:
        undo()
    assert moe.launch_up is library
    assert torch.equal(got, want)


@pytest.mark.parametrize("which", TRITONS)
def test_moe_gluon_dswiglu_compiles_for_sm90(tmp_path, which):
    """The lab's Gluon MoE dSwiGLU GEMM (``swiglu_lab.experiments.moe_gluon_dswiglu``), with fp32
    and bf16 routing weights: one m64n128k16 wgmma chain, two TMA loads, no spills."""
    report = _compile(tmp_path, which, "moe_dswiglu")
    assert len(report["results"]) == 2
    for r in report["results"]:
        assert r["error"] is None, r["error"]
        assert r["wgmma"] == 4 and r["tma_load"] == 3 and r["setmaxnreg"] > 0, r
        assert r["st_global"] > 0 and r["tma_store"] == 0, r
        assert r["spills"] in (0, None), r
        assert r["shared"] <= SM90_SHARED, r


def test_dswiglu_install_routes_only_what_the_kernel_takes_and_undoes():
    """``moe_gluon_dswiglu.install`` (the bench's ``--lab-moe-gluon dswiglu``): CPU operands go to
    the library's kernel, gradients bitwise as without it; undo restores the library's launcher."""
    from swiglu import swiglu_moe
    from swiglu.kernels import moe
    from swiglu_lab.experiments import moe_gluon_dswiglu

    T, H, I, E, k = 24, 64, 128, 4, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g).bfloat16().requires_grad_()
    idx = torch.randint(0, E, (T, k), generator=g)
    w = torch.rand(T, k, generator=g).requires_grad_()
    gu = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).bfloat16().requires_grad_()
    dp = (torch.randn(E, H, I, generator=g) / I**0.5).bfloat16().requires_grad_()
    go = torch.randn(T, H, generator=g).bfloat16()

    def grads():
        return torch.autograd.grad(swiglu_moe(x, idx, w, gu, dp, impl="triton"), (x, w, gu, dp), go)

    want = grads()
    library = moe.launch_dswiglu
    undo = moe_gluon_dswiglu.install()
    try:
        assert moe.launch_dswiglu is not library
        got = grads()
    finally:
        undo()
    assert moe.launch_dswiglu is library
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("which", TRITONS)
def test_moe_gluon_pairs_compiles_for_sm90(tmp_path, which):
    """The lab's Gluon down-projection-shaped GEMM (``swiglu_lab.experiments.moe_gluon_pairs``) as
    the forward's down projection and as grad_x's pieces, at BN 128 and 256: one m64nBNk16 wgmma
    chain, no spills."""
    report = _compile(tmp_path, which, "moe_pairs")
    assert len(report["results"]) == 4
    for r in report["results"]:
        assert r["error"] is None, r["error"]
        assert r["wgmma"] == 4 and r["tma_load"] >= 2 and r["setmaxnreg"] > 0, r
        assert r["st_global"] > 0 and r["tma_store"] == 0, r  # scattered rows: pointer stores
        assert r["spills"] in (0, None), r
        assert r["shared"] <= SM90_SHARED, r


def test_pairs_install_routes_only_what_the_kernel_takes_and_undoes():
    """``moe_gluon_pairs.install`` (the bench's ``--lab-moe-gluon pairs``): CPU operands go to the
    library's kernel, outputs and gradients bitwise as without it; undo restores the launcher."""
    from swiglu import swiglu_moe
    from swiglu.kernels import moe
    from swiglu_lab.experiments import moe_gluon_pairs

    T, H, I, E, k = 24, 128, 64, 4, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g).bfloat16().requires_grad_()
    idx = torch.randint(0, E, (T, k), generator=g)
    w = torch.rand(T, k, generator=g).requires_grad_()
    gu = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).bfloat16().requires_grad_()
    dp = (torch.randn(E, H, I, generator=g) / I**0.5).bfloat16().requires_grad_()
    go = torch.randn(T, H, generator=g).bfloat16()

    def run():
        out = swiglu_moe(x, idx, w, gu, dp, impl="triton")
        return (out, *torch.autograd.grad(out, (x, w, gu, dp), go))

    want = run()
    library = moe.launch_pairs
    undo = moe_gluon_pairs.install()
    try:
        assert moe.launch_pairs is not library
        got = run()
    finally:
        undo()
    assert moe.launch_pairs is library
    for a, b in zip(got, want):
        assert torch.equal(a, b)
