"""The MoE kernels compile for sm_90 in every configuration the plan dispatches, with this Triton and
(``make test-gpu-triton``) the GPU machine's, and their main loops are software-pipelined: shared memory holds
at least two stages of operand tiles (and fits an sm_90 block). The CPU interpreter cannot show either."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "moe_compile_worker.py"
# (routed pairs, experts, hidden_size, intermediate_size): Qwen3-30B-A3B, Qwen3-235B-A22B, Mixtral at 8192
# tokens, and few pairs per expert (64-pair tiles).
SHAPES = [(65536, 128, 2048, 768), (65536, 128, 4096, 1536), (16384, 8, 4096, 14336), (2048, 128, 2048, 768)]
SM90_SHARED = 232448
TRITONS = ["installed"] + (["extra"] if os.environ.get("SWIGLU_EXTRA_TRITON_DIR") else [])


def _stage_bytes(r: dict) -> int:
    """One stage's operand tiles (bf16): A [BM, BK] and B [BK, BN] (two B tiles in the up projection)."""
    b_tiles = 2 if r["kernel"] == "moe_up_kernel" else 1
    return 2 * r["BK"] * (r["BM"] + b_tiles * r["BN"])


@pytest.mark.parametrize("which", TRITONS)
def test_moe_kernels_compile_for_sm90_and_pipeline(which):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    paths = [str(ROOT / "src")]
    if which == "extra":
        paths.insert(0, os.environ["SWIGLU_EXTRA_TRITON_DIR"])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, str(WORKER), json.dumps(SHAPES)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    errors = [r for r in report["results"] if r["error"]]
    assert not errors, errors
    for r in report["results"]:
        if r["role"] in ("combine", "routing", "gather"):
            continue
        assert r["wgmma"] > 0, r
        # At least two stages of operand tiles (one stage and a TMA barrier is what an unpipelined
        # loop takes), within sm_90's 232,448 bytes per block (compiling without a GPU checks neither).
        assert 2 * _stage_bytes(r) <= r["shared"] <= SM90_SHARED, f"main loop not pipelined or too big ({report['triton']}): {r}"
