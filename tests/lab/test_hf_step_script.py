"""scripts/hf_step_gpu.py's protocol on the CPU (no model, no GPU): the eager variants' timed steps
interleave in rotated blocks; compiled variants run alone, after them."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("hf_step_gpu", ROOT / "scripts" / "hf_step_gpu.py")
hf_step = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hf_step)


def test_blocks_split_every_step_and_none_is_empty():
    for iters in (1, 2, 7, 30, 31):
        for rounds in (1, 3, 5, 40):
            b = hf_step.blocks(iters, rounds)
            assert sum(b) == iters and min(b) >= 1 and max(b) - min(b) <= 1, (iters, rounds, b)


def test_eager_variants_are_timed_in_rotated_blocks(monkeypatch):
    log = []

    class Fake:
        def __init__(self, name, args):
            self.name = name
            log.append(("build", name))

        def warm(self):
            log.append(("warm", self.name))

        def time_block(self, n):
            log.append(("time", self.name, n))

        def result(self):
            return dict(variant=self.name, status="ok")

    monkeypatch.setattr(hf_step, "Variant", Fake)
    monkeypatch.setattr(hf_step, "release", lambda compiled: None)
    args = type("A", (), dict(iters=7, rounds=3))()
    rows = []
    hf_step.measure_interleaved(["unpatched", "swiglu", "liger"], args, rows)
    assert [r["variant"] for r in rows] == ["unpatched", "swiglu", "liger"]
    timed = [e[1:] for e in log if e[0] == "time"]
    assert timed == [
        ("unpatched", 3),
        ("swiglu", 3),
        ("liger", 3),
        ("swiglu", 2),
        ("liger", 2),
        ("unpatched", 2),
        ("liger", 2),
        ("unpatched", 2),
        ("swiglu", 2),
    ]
    assert log.index(("warm", "liger")) < log.index(("time", "unpatched", 3))  # all warmed before any timing


def test_a_failing_peer_is_recorded_and_the_others_still_run(monkeypatch):
    class Fake:
        def __init__(self, name, args):
            if name == "liger":
                raise RuntimeError("no liger here")
            self.name, self.n = name, 0

        def warm(self):
            pass

        def time_block(self, n):
            self.n += n

        def result(self):
            return dict(variant=self.name, status="ok", n=self.n)

    monkeypatch.setattr(hf_step, "Variant", Fake)
    monkeypatch.setattr(hf_step, "release", lambda compiled: None)
    rows = []
    hf_step.measure_interleaved(["unpatched", "liger", "swiglu"], type("A", (), dict(iters=5, rounds=2))(), rows)
    by = {r["variant"]: r for r in rows}
    assert by["liger"]["status"] == "failed" and "no liger here" in by["liger"]["error"]
    assert by["unpatched"]["n"] == by["swiglu"]["n"] == 5
