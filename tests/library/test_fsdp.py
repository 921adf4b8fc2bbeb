"""FSDP2 (``fully_shard``) with ``swiglu.SwiGLUMLP`` on 2 gloo ranks (CPU): alone in float32, with
bf16 parameters and float32 gradient reduction, with the memory-lean Triton backward (interpreter),
on 1x2 and 2x1 (dp, tp) meshes with ``swiglu.tensor_parallel_plan`` inside (torchtitan's
arrangement), a tiny Hugging Face Llama patched by ``swiglu.integrations.transformers``, and a
router + ``swiglu.SwiGLUExperts`` block whose output takes an in-place add (reference and Triton). float32: first-step gradients and the updates of 3 SGD steps within 1e-5 of the
unsharded float64 computation (a 0.1% error planted in the backward fails them); bf16: at most twice
the error of the same FSDP run with nn.Linear autograd blocks plus 1e-3 (a 3% plant fails them).
gloo does all of it, bf16 all-gathers and float32 reduce-scatters included. Every scenario lives in
tests/fsdp_worker.py; one spawn runs them all, each reported as its own test. A rank that exits non-zero, or does not finish in time, fails the tests.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fsdp_worker

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)

WORLD = 2
TIMEOUT_S = 150


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(out_dir, device_type: str) -> list[dict]:
    """Run every scenario of tests/fsdp_worker.py on WORLD ranks; returns each rank's results."""
    names = list(fsdp_worker.SCENARIOS)
    ctx = mp.start_processes(
        fsdp_worker.run,
        args=(WORLD, _free_port(), str(out_dir), names, device_type),
        nprocs=WORLD,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1):  # raises ProcessExitedException when a rank exits non-zero
            if time.monotonic() > deadline:
                pytest.fail(f"{WORLD} ranks did not finish within {TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _assert_ran(results, scenario):
    for rank, result in enumerate(results):
        assert scenario in result, f"rank {rank} did not run {scenario}"
        assert result[scenario]["ok"], f"rank {rank}:\n{result[scenario]['error']}"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return spawn(tmp_path_factory.mktemp("fsdp"), "cpu")


@pytest.mark.parametrize("scenario", list(fsdp_worker.SCENARIOS))
def test_scenario(results, scenario):
    _assert_ran(results, scenario)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
    reason="needs 2 CUDA GPUs and NCCL",
)
def test_all_scenarios_on_two_gpus_with_nccl(tmp_path):
    """The same scenarios with NCCL on 2 GPUs (the Triton kernels compiled, not interpreted)."""
    results = spawn(tmp_path, "cuda")
    for scenario in fsdp_worker.SCENARIOS:
        _assert_ran(results, scenario)
