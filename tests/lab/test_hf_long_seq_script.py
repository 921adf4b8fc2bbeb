"""scripts/hf_long_seq_gpu.py on a tiny model on the CPU, with out-of-memory errors faked above a
length: the search finds that length's granularity step, the comparison runs, the files hold
what they promise."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


def test_the_search_finds_the_fake_limit_and_writes_its_rows(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "hf_long_seq_gpu.py"),
        "--device",
        "cpu",
        "--layers",
        "1",
        "--hidden-size",
        "32",
        "--intermediate-size",
        "64",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--vocab-size",
        "64",
        "--start-seq",
        "256",
        "--max-seq",
        "4096",
        "--granularity",
        "128",
        "--fake-oom-above",
        "1000",
        "--variants",
        "unpatched,swiglu",
        "--steps",
        "1",
        "--out",
        str(tmp_path),
    ]
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'lab'}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["longest"] == {"unpatched": 896, "swiglu": 896}  # 1000 // 128 * 128
    rows = list(csv.DictReader(open(tmp_path / "long_seq.csv")))
    assert set(rows[0]) == {
        "variant",
        "seq_len",
        "layers",
        "activation_checkpointing",
        "step_ms",
        "tokens_per_s",
        "peak_gib",
        "oom",
    }
    searched = [(r["variant"], int(r["seq_len"]), r["oom"]) for r in rows if r["activation_checkpointing"] == "False"]
    assert ("unpatched", 896, "False") in searched and ("unpatched", 1024, "True") in searched
    compared = [r for r in rows if r["seq_len"] == "1024"]
    assert any(r["activation_checkpointing"] == "True" for r in compared)
