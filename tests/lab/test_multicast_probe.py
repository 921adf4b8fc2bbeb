"""The 2-CTA multicast kernels of lab/probes/probe_multicast.py and probe_multicast_wgrad.py
(``swiglu_lab.experiments``) on the CPU: the 2-CTA cluster tile compiles for sm_90 under triton
>= 3.7 with the multicast TMA load and the cluster launch in its PTX, and the check names a
missing multicast (the same kernel with multicast off). Its GPU run: data/validation/.

The compiles run in a subprocess without TRITON_INTERPRET: in this process triton's own library
functions (``gl.cdiv`` among them) may run in the interpreter after an interpreted kernel has,
and a Gluon compile calling them then fails on raw IR values."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[2]
NEW_ENOUGH = tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 7)
pytestmark = pytest.mark.skipif(not NEW_ENOUGH, reason=f"needs triton >= 3.7, this is {triton.__version__}")


def _compiled(name: str, **kwargs):
    """``swiglu_lab.experiments.<name>``'s ``compile_check(**kwargs)``, run in a fresh
    interpreter-free process."""
    code = (
        "import importlib, json\n"
        f"m = importlib.import_module('swiglu_lab.experiments.{name}')\n"
        f"print(json.dumps(m.compile_check(**{kwargs!r})))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "lab"), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pipelined():
    return importlib.import_module("swiglu_lab.experiments.multicast_wgrad")


def test_the_cluster_tile_compiles_with_a_multicast_load():
    assert _compiled("multicast_tile") == []


def test_the_check_names_a_missing_multicast():
    assert _compiled("multicast_tile", multicast=False) == ["multicast::cluster"]


def test_the_pipelined_kernel_compiles_with_multicast_and_the_peer_arrive():
    ptx = _compiled("multicast_wgrad")
    assert "multicast::cluster" in ptx and "mbarrier.arrive.shared::cluster" in ptx


def _ptx(count, offsets):
    lines = ["mov.b32 %r1, global_smem;"]
    for i, off in enumerate(offsets):
        lines += [f"add.s32 %r{10 + i}, %r1, {off};", f"mbarrier.init.shared::cta.b64 [%r{10 + i}], {count};"]
    return "\n".join(lines)


def test_the_free_barriers_are_found_and_a_move_between_passes_is_an_error(pipelined):
    first = [1000 + 8 * i for i in range(pipelined.STAGES)]
    assert pipelined.free_offsets(_ptx(pipelined.TAG, first), pipelined.TAG) == first
    passes = iter([_ptx(pipelined.TAG, first), _ptx(2, first)])
    assert pipelined.planned(lambda consts: next(passes), True)["FREE_OFF"] == 1000
    moved = iter([_ptx(pipelined.TAG, first), _ptx(2, [off + 16 for off in first])])
    with pytest.raises(RuntimeError, match="moved"):
        pipelined.planned(lambda consts: next(moved), True)
    with pytest.raises(RuntimeError, match="consecutive"):
        pipelined.planned(lambda consts: _ptx(pipelined.TAG, first[:-1]), True)


def test_the_warp_specialized_kernel_syncs_the_cluster_in_every_partition():
    """Every warp of both CTAs reaches the cluster barrier: one per partition (MMA, loader, storer),
    none before warp_specialize (whose worker warps never reach it: the hang at first launch), and
    12 warps in all, so no idle padding warp."""
    ptx = _compiled("multicast_wgrad", ws=True)
    assert "multicast::cluster" in ptx and "mbarrier.arrive.shared::cluster" in ptx
    assert ptx.count("barrier.cluster.arrive") == ptx.count("barrier.cluster.wait") == 3
    assert ".reqntid 384" in ptx
    assert "brx.idx" not in ptx  # no dispatch to a fourth (idle) partition


def test_the_warp_specialized_plan_finds_the_done_barrier_after_the_stages(pipelined):
    n = pipelined.STAGES + 1
    first = [2000 + 8 * i for i in range(n)]
    passes = iter([_ptx(pipelined.TAG, first), _ptx(2, first)])
    consts = pipelined.planned(lambda consts: next(passes), True, ws=True)
    assert consts["FREE_OFF"] == 2000 and consts["NC"] == pipelined.NC and consts["PEER"]
    short = iter([_ptx(pipelined.TAG, first[:-1]), _ptx(2, first[:-1])])
    with pytest.raises(RuntimeError, match=f"expected {n}"):
        pipelined.planned(lambda consts: next(short), True, ws=True)


def test_the_probes_run_the_lab_kernels(monkeypatch):
    """The probes in lab/probes import their kernels from swiglu_lab.experiments (none of their own)."""
    monkeypatch.syspath_prepend(str(ROOT / "lab" / "probes"))  # as ``python lab/probes/<probe>.py`` has it
    tile, wgrad = importlib.import_module("probe_multicast"), importlib.import_module("probe_multicast_wgrad")
    assert tile.compile_check is importlib.import_module("swiglu_lab.experiments.multicast_tile").compile_check
    assert wgrad.mw is importlib.import_module("swiglu_lab.experiments.multicast_wgrad")
