"""Compile the Gluon weight-gradient kernel's table configs for sm_90 (subprocess side of
tests/test_gluon.py; no GPU needed).

Run with triton ``common.GLUON_TRITON``.x first on PYTHONPATH (make test installs the GPU machine's
3.6.0 under .venv/triton-3.6.0) and src/ after it. Writes ``{"triton": version, "results": [...]}``
(one entry per distinct config: shared memory, registers, spills, key PTX instructions) to the path
given as the only argument.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from swiglu.kernels import gluon_wgrad
from swiglu.kernels.backward import GLUON_CONFIGS


def compile_one(cfg) -> dict:
    def desc(block):
        return f"tensordesc<bf16{list(block)},{gluon_wgrad._layout(list(block))!r}>"

    sig = {"a_desc": desc([cfg.BK, cfg.BM]), "b_desc": desc([cfg.BK, cfg.BN]), "c_desc": desc([cfg.BM, cfg.BN])}
    constexprs = {"GROUP_M": cfg.GROUP_M, "STAGES": cfg.STAGES, "NC": cfg.NC, "LOAD_REGS": cfg.load_regs,
                  "STORE_REGS": cfg.store_regs}
    sig.update({k: "constexpr" for k in constexprs})
    try:
        k = triton.compile(GluonASTSource(gluon_wgrad.wgrad_kernel, sig, constexprs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": cfg.num_warps, "maxnreg": cfg.maxnreg})
    except Exception as err:  # reported per config; the test fails on it with the message
        return {"config": cfg.__dict__, "error": f"{type(err).__name__}: {err}"[-4000:]}
    ptx = k.asm["ptx"]
    regs = spills = None
    try:  # ptxas -v for registers and spills (the metadata has them only after loading on a GPU)
        from triton.backends.nvidia.compiler import get_ptxas

        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        info = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                              capture_output=True, text=True).stderr
        regs = int(re.search(r"Used (\d+) registers", info).group(1))
        spills = int(re.search(r"(\d+) bytes spill stores", info).group(1))
    except Exception:
        pass
    return {"config": cfg.__dict__, "error": None, "shared": k.metadata.shared, "regs": regs, "spills": spills,
            "wgmma": ptx.count("wgmma.mma_async"), "tma_store": ptx.count("cp.async.bulk.tensor.2d.global.shared"),
            "tma_load": ptx.count("cp.async.bulk.tensor.2d.shared"), "setmaxnreg": ptx.count("setmaxnreg")}


def main(path: str) -> None:
    configs = list(dict.fromkeys(c for c in GLUON_CONFIGS.values() if c is not None))
    with open(path, "w") as f:
        json.dump({"triton": triton.__version__, "results": [compile_one(c) for c in configs]}, f)


if __name__ == "__main__":
    main(sys.argv[1])
