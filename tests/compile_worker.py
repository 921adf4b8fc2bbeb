"""Compile kernel specs for sm_90 with whatever Triton this interpreter imports (subprocess side of
tests/kernels/test_triton_compile.py).

Imports only Triton and ``src/swiglu/kernels/tl_kernels.py`` (loaded by path, no torch), so the same specs can
be compiled by a second Triton release put first on PYTHONPATH: the GPU machine's (3.6.0), next to
the CPU wheel's. Reads specs (JSON list) on stdin, writes ``{"triton": version, "results": [...]}``
to the path given as the only argument.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = ("cuda", 90, 32)  # GPUTarget(backend, arch, warp_size): sm_90
KERNELS_PY = Path(__file__).resolve().parents[1] / "src" / "swiglu" / "kernels" / "tl_kernels.py"


def _load_kernels():
    spec = importlib.util.spec_from_file_location("swiglu_kernels_for_compile", KERNELS_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: A PTX instruction that touches global memory (loads, stores, TMA copies, reductions, atomics).
GLOBAL_ACCESS = re.compile(r"\b(?:ld\.global|st\.global|cp\.async\.bulk\.tensor|cp\.reduce\.async\.bulk|red\.|atom\.)")


def pdl_report(ptx: str) -> dict:
    """The PDL instructions in ``ptx``: how many of each, and whether the first wait and the
    first trigger come before the first global memory access (in the text's order)."""
    first = GLOBAL_ACCESS.search(ptx)
    first = first.start() if first else len(ptx)
    wait, trigger = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    return {
        "gdc_wait": ptx.count("griddepcontrol.wait"),
        "gdc_trigger": ptx.count("griddepcontrol.launch_dependents"),
        "wait_before_access": 0 <= wait < first,
        "trigger_before_access": 0 <= trigger < first,
    }


def pdl_problems(result: dict, pdl: int) -> list[str]:
    """A compile's PDL instructions against what its mode needs (``pdl_report``):
    none in mode 0 (the default launch); one wait, before any global memory access, and one
    trigger, before that access in mode 1 and after it in mode 2 (``tl_kernels._pdl_start``)."""
    if pdl == 0:
        return [] if result["gdc_wait"] == result["gdc_trigger"] == 0 else ["PDL instructions in a plain launch"]
    if not (result["gdc_wait"] == 1 == result["gdc_trigger"] and result["wait_before_access"]):
        return [
            f"PDL mode {pdl}: want one griddepcontrol.wait before any global memory access and one "
            f"launch_dependents, got {result['gdc_wait']} / {result['gdc_trigger']}, wait first: "
            f"{result['wait_before_access']}"
        ]
    if result["trigger_before_access"] != (pdl == 1):
        return [f"PDL mode {pdl}: launch_dependents {'after' if pdl == 1 else 'before'} the first global access"]
    return []


def wait_for_worker(proc, logs, timeout: float = 900) -> tuple[str, str]:
    """(stdout, stderr) of a compile worker started with both written to the files ``logs`` (the
    test side's helper, for this worker and tests/gluon_compile_worker.py): waits, kills it past
    ``timeout`` seconds and re-raises, closes the files."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    out, err = (f.seek(0) or f.read() for f in logs)
    for f in logs:
        f.close()
    return out, err


def compile_one(kernels, spec: dict) -> dict:
    fn = getattr(kernels, spec["kernel"])
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in spec["divisible_by_16"]}
    start = time.perf_counter()
    try:
        compiled = triton.compile(
            ASTSource(fn=fn, signature=spec["signature"], constexprs=spec["constexprs"], attrs=attrs),
            target=GPUTarget(*TARGET),
            options=spec["options"],
        )
    except Exception as err:  # reported per spec; the test fails on it with the message
        return {"error": f"{type(err).__name__}: {err}"[-4000:], "seconds": time.perf_counter() - start}
    ptx = compiled.asm["ptx"]
    return {
        "error": None,
        "seconds": time.perf_counter() - start,
        "shared": compiled.metadata.shared,
        "num_warps": compiled.metadata.num_warps,
        "cubin_bytes": len(compiled.asm["cubin"]),
        "wgmma_mma_async": ptx.count("wgmma.mma_async"),
        "target": ".target sm_90" in ptx,
        **pdl_report(ptx),
    }


def main(results_path: str) -> None:
    kernels = _load_kernels()
    assert isinstance(kernels.grad_x_kernel, triton.JITFunction), "TRITON_INTERPRET leaked into the worker"
    specs = json.load(sys.stdin)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # triton.compile releases the GIL
        results = list(pool.map(lambda s: compile_one(kernels, s), specs))
    with open(results_path, "w") as f:
        json.dump({"triton": triton.__version__, "results": results}, f)


if __name__ == "__main__":
    main(sys.argv[1])
