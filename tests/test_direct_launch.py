"""``swiglu.kernels.common.direct_runner``: the C launcher gets the very arguments triton 3.6's own
runner would give it (checked against triton 3.6's descriptor wrapper with a fake C launcher, in a
subprocess with that triton on the path); on the GPU, the whole-backward tests run through it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swiglu.kernels import common

ROOT = Path(__file__).resolve().parents[1]
EXTRA_TRITON_DIR = os.environ.get("SWIGLU_EXTRA_TRITON_DIR")


def test_expand_descriptors_replaces_each_descriptor_by_its_map_shape_and_strides():
    t = torch.empty(40, 24, dtype=torch.bfloat16)
    d = common.tma_descriptor(t, [8, 16])
    seen = []
    out = common.expand_descriptors(("x", d, 5, d), ((1, 128, 2, 9, [8, 16]), (3, 64, 2, 9, [8, 16])),
                                    lambda *a: seen.append(a) or f"map{len(seen)}")
    assert out == ["x", "map2", 40, 24, 24, 1, 5, "map1", 40, 24, 24, 1]  # filled last position first
    assert seen[1] == (t.data_ptr(), 128, 2, 9, [8, 16], t.shape, t.stride(), 0)


def test_no_direct_runner_on_another_triton_or_when_switched_off(monkeypatch):
    import triton

    compiled = SimpleNamespace(run=None)
    if not triton.__version__.startswith(common.GLUON_TRITON + "."):
        assert common.direct_runner(compiled, (1, 1, 1)) is None
    monkeypatch.setattr(common, "DIRECT_LAUNCH", False)
    assert common.direct_runner(compiled, (1, 1, 1)) is None


def test_direct_runner_hands_the_c_launcher_what_triton_36_does(tmp_path):
    if not EXTRA_TRITON_DIR:
        pytest.skip("SWIGLU_EXTRA_TRITON_DIR unset (make test sets it to the GPU machine's triton)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([EXTRA_TRITON_DIR, str(ROOT / "src")])
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "direct_launch_worker.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["triton"].startswith(common.GLUON_TRITON + ".") and report["direct"]
    assert report["n_calls"] == 2
    assert report["direct_call"] == report["triton_call"]
    assert len(report["triton_call"]) == 13 + (1 + 4) + 1 + 1 + 1 + (1 + 4)  # base, a, n, BM, b, c
    assert len(report["fills"]) == 4  # two descriptors, each filled once per call
    assert report["hooked"] == ["slow"]  # a hook added (a profiler): Triton's runner takes the call
