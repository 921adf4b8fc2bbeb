"""The lab's Gluon MoE weight gradient (``swiglu_lab.experiments.moe_gluon_wgrad``) compiles for sm_90
with each Triton the Gluon kernels are written for: warp-specialized (register reallocation), its
wgmma, TMA loads and stores, device-side descriptors (global scratch and the tensormap fence), no
spills, shared memory within the H200's block. A Gluon kernel does not run under the interpreter:
its values are checked on the GPU (``lab/probes/moe_gluon_wgrad.py``, bitwise the library's kernel)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SM90_SHARED = 232448
TRITONS = ["installed"] + (["extra"] if os.environ.get("SWIGLU_EXTRA_TRITON_DIR") else [])


@pytest.mark.parametrize("which", TRITONS)
def test_moe_gluon_wgrad_compiles_for_sm90(tmp_path, which):
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
    worker = [sys.executable, str(ROOT / "tests" / "gluon_compile_worker.py"), str(out), "moe_wgrad"]
    run = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert triton_minor(report["triton"]) in GLUON_TRITONS
    assert len(report["results"]) == 2
    for r in report["results"]:
        assert r["error"] is None, r["error"]
        assert r["wgmma"] > 0 and r["tma_load"] > 0 and r["tma_store"] > 0 and r["setmaxnreg"] > 0, r
        # The loader's descriptors: two slots of two (a, b), each 128 bytes, each with its fence.
        assert r["global_scratch"] >= 4 * 128 and r["tensormap_fence"] >= 4, r
        assert r["spills"] in (0, None), r
        assert r["shared"] <= SM90_SHARED, r


def test_install_routes_only_what_the_kernel_takes_and_undoes():
    """``install`` (the bench's ``--lab-moe-gluon wgrad``) replaces the library's weight-gradient
    launcher; operands the Gluon kernel does not take (here: CPU tensors) go to the library's
    kernel, bitwise as without it; the returned function restores the library's launcher."""
    import torch

    from swiglu import swiglu_moe
    from swiglu.kernels import moe
    from swiglu_lab.experiments import moe_gluon_wgrad

    T, H, I, E, k = 24, 32, 48, 4, 2
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
    library = moe.launch_wgrad
    undo = moe_gluon_wgrad.install()
    try:
        assert moe.launch_wgrad is not library
        assert not moe_gluon_wgrad.supports(gu.detach(), x.detach(), x.detach())
        got = grads()
    finally:
        undo()
    assert moe.launch_wgrad is library
    for a, b in zip(got, want):
        assert torch.equal(a, b)
