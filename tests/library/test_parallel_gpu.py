"""Tensor parallelism on NCCL (2 GPUs): uneven sequence-parallel shards."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.multiprocessing as mp

import tp_worker
from test_parallel import TIMEOUT_S, _free_port

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_uneven_sequence_shards_on_nccl(tmp_path):
    ctx = mp.start_processes(
        tp_worker.run_nccl_uneven, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"2 NCCL ranks did not finish within {TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())["uneven_nccl"]
        assert result["ok"], f"rank {rank}:\n{result.get('error')}"
