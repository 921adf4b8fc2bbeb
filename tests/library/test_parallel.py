"""Tensor parallelism (``swiglu.parallelize``) on CPU: 2 and 4 gloo processes spawned from pytest.

Every scenario lives in tests/tp_worker.py and compares the parallelized module (reference
backward on each rank's shard, float64) with the unsharded MLP; one spawn per world size runs them
all (process start-up dominates on the 2-core CI machine), each scenario reported as its own test
(only the scenarios a world size runs are collected). A rank that raises or exits non-zero fails
the spawn, whether or not it wrote its results first.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

import tp_worker

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)

TIMEOUT_S = 150  # the whole spawn; a hung collective fails the test instead of hanging CI
WORLD_SCENARIOS = {
    2: list(tp_worker.SCENARIOS),
    4: ["replicated", "sequence_parallel", "frozen", "uneven"],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world_size: int, names: list[str], out_dir) -> list[dict]:
    """Run ``tp_worker.run`` on ``world_size`` processes; returns each rank's results. Fails when a
    rank raises or exits non-zero (even after writing its results: a crash in teardown is a
    crash), and kills the processes and fails when they outlive ``TIMEOUT_S``."""
    ctx = mp.start_processes(
        tp_worker.run, args=(world_size, _free_port(), str(out_dir), names), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while True:
            try:
                if ctx.join(timeout=1):
                    break
            except ProcessException as e:
                pytest.fail(f"TP={world_size}: rank {e.error_index} failed (pid {e.error_pid}): {e}")
            if time.monotonic() > deadline:
                pytest.fail(f"{world_size} ranks did not finish within {TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    codes = [p.exitcode for p in ctx.processes]
    assert codes == [0] * world_size, f"TP={world_size}: rank exit codes {codes}"
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """``ranks(world)``: the results of one spawn per world size (run on first use)."""
    done = {}

    def get(world):
        if world not in done:
            done[world] = spawn(world, WORLD_SCENARIOS[world], tmp_path_factory.mktemp(f"tp{world}"))
        return done[world]

    return get


@pytest.mark.parametrize(
    "world,scenario",
    [(w, s) for w, names in WORLD_SCENARIOS.items() for s in names],
    ids=lambda v: f"tp{v}" if isinstance(v, int) else v,
)
def test_scenario(ranks, world, scenario):
    """Only the scenarios each world size runs are collected (TP = 4 runs four; the others at TP = 2
    only, for CPU time): no test that always skips."""
    results = ranks(world)
    for rank, result in enumerate(results):
        assert scenario in result, f"rank {rank} did not run {scenario}"
        assert result[scenario]["ok"], f"TP={world} rank {rank}:\n{result[scenario]['error']}"


def test_plan_layouts():
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInputOutput, RowwiseParallel

    import swiglu

    plan = swiglu.tensor_parallel_plan("layers.*.mlp", sequence_parallel=True)
    assert set(plan) == {"layers.*.mlp", "layers.*.mlp.gate_proj", "layers.*.mlp.up_proj", "layers.*.mlp.down_proj"}
    assert isinstance(plan["layers.*.mlp.gate_proj"], ColwiseParallel)
    assert isinstance(plan["layers.*.mlp.down_proj"], RowwiseParallel)
    io = plan["layers.*.mlp"]
    assert isinstance(io, PrepareModuleInputOutput)
    assert io.prepare_module_input.input_layouts == (Shard(1),)
    assert io.prepare_module_input.desired_input_layouts == (Replicate(),)
    assert io.prepare_module_output.output_layouts == (Partial(),)
    assert io.prepare_module_output.desired_output_layouts == (Shard(1),)
    plain = swiglu.tensor_parallel_plan(fused=False)
    assert set(plain) == {"gate_proj", "up_proj", "down_proj"}
    with pytest.raises(ValueError, match="sequence_dim"):
        swiglu.tensor_parallel_plan(sequence_dim=-1)


def test_check_shardable_names_the_sizes():
    from swiglu.parallel import check_shardable

    check_shardable(16384, 53248, 8, need_triton=True)  # Hermes at TP=8: local I = 6656
    with pytest.raises(ValueError, match=r"intermediate_size=53249 .* size 2 \(hidden_size=16384"):
        check_shardable(16384, 53249, 2)
    with pytest.raises(ValueError, match="53248 / 4096 = 13 is not a multiple of 8"):
        check_shardable(16384, 53248, 4096, need_triton=True)


def test_parallelize_rejects_a_module_without_the_linears():
    import swiglu

    with pytest.raises(TypeError, match="gate_proj"):
        swiglu.parallelize(torch.nn.Linear(4, 4), mesh=None)


def test_bench_tp_cli_on_cpu(tmp_path):
    """`torchrun -m swiglu_lab.bench --tp 2` end to end on gloo (tiny shape, Triton interpreter): the
    correctness, training and overlap parts write their records and pass, every overlap variant
    (the sequence-parallel row chunks included, 3 of them uneven) bitwise equal to its serial path."""
    import os
    import subprocess
    import sys

    import pandas as pd

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_free_port()),
        "-m",
        "swiglu_lab.bench",
        "--tp",
        "2",
        "--device",
        "cpu",
        "--parts",
        "check,train,overlap,timeline",
        "--cases",
        "s128_b1",
        "--reserve-sms",
        "8",
        "--sp-chunks",
        "2,3",
        "--out",
        str(tmp_path),
    ]
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checks = pd.read_csv(next(tmp_path.glob("tp_*_check.csv")))
    assert list(checks["output"]) == ["grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight"]
    assert checks["passed"].all() and checks["bitwise_repeatable"].all()
    assert (checks["rel_err_vs_reference"] < 0.02).all()
    record = json.loads(next(p for p in tmp_path.glob("tp_*.json")).read_text())
    assert record["tp"] == 2 and record["backend"] == "gloo" and record["train"]["passed"]
    assert record["nccl_env"]["NCCL_NVLS_ENABLE"] == "0"
    assert "correctness: 4/4 gathered outputs pass" in done.stdout
    rows = pd.read_csv(next(p for p in tmp_path.glob("tp_*.csv") if not p.name.endswith(("_check.csv", "_timeline.csv"))))
    assert list(rows["impl"]) == ["tp_serial", "tp_early", "tp_early_reserve8", "tp_sp_serial", "tp_sp_chunks2", "tp_sp_chunks3"]
    assert (rows["median_ms"] > 0).all()
    allreduce, sp = rows[~rows["impl"].str.startswith("tp_sp")], rows[rows["impl"].str.startswith("tp_sp")]
    assert allreduce["note"].str.contains("bitwise equal to tp_serial: True").all(), allreduce["note"].tolist()
    assert sp["note"].str.contains("bitwise equal to tp_sp_serial: True").all(), sp["note"].tolist()
    events = pd.read_csv(next(tmp_path.glob("tp_*_timeline.csv")))
    assert set(events["variant"]) == {"tp_serial", "tp_early", "tp_sp_serial", "tp_sp_chunks2", "tp_sp_chunks3"}
    assert set(events["rank"]) == {0, 1} and set(events["kind"]) == {"compute", "comm"}
    assert (events["end_us"] >= events["start_us"]).all() and (events.groupby("variant")["start_us"].min() == 0).all()
    assert "exposed_comm" in done.stdout
