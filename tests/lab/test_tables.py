"""The tables' writer (swiglu_lab.bench.tables): a tuning run's fastest correct config per kernel
and bucket goes in with its time, everything else in the table stays, and the library reads back
what was written."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from swiglu.kernels import configs
from swiglu.kernels.configs import KernelConfig
from swiglu_lab.bench.tables import backward_table, forward_table, parse_tile


def _row(kernel, tokens, ms, err=1e-3, cfg=KernelConfig(BM=64)):
    return dict(kernel=kernel, tokens=tokens, config=str(cfg), config_dict=asdict(cfg), ms=ms, tflops=1.0, cublas_ms=2.0, err=err)


def test_backward_table_takes_the_fastest_correct_and_keeps_the_rest():
    old = json.loads(configs.TUNED_CONFIGS_PATH.read_text())
    fast, slow, wrong = KernelConfig(BM=64), KernelConfig(BM=128, GROUP_M=4), KernelConfig(BN=128)
    rows = [
        _row("grad_x", 300, 0.9, cfg=slow),
        _row("grad_x", 300, 0.5, cfg=fast),
        _row("grad_x", 310, 0.1, err=0.5, cfg=wrong),
        _row("dswiglu", 9000, 3.0, cfg=fast),
        dict(_row("grad_x", 300, 0.01), config="cublas"),
    ]
    new = backward_table(rows, old, {"utc": "now", "gpu": "test"})
    assert new["configs"]["grad_x"]["512"]["config"] == asdict(fast) and new["configs"]["grad_x"]["512"]["ms"] == 0.5
    assert new["configs"]["dswiglu"]["open"]["config"] == asdict(fast)
    for section in ("gluon_grad_weights", "gluon_dswiglu"):
        assert new[section] == old[section]
    untouched = {k: e for k, e in new["configs"]["grad_x"].items() if k != "512"}
    assert {k: e["config"] for k, e in untouched.items()} == {
        k: e["config"] for k, e in old["configs"]["grad_x"].items() if k != "512"
    }
    assert new["meta"]["gpu"] == "test" and old["meta"]["utc"] != "now"
    assert {configs.parse_bucket(k) for k in new["configs"]["grad_x"]} <= set(configs.TOKEN_BUCKETS)


def test_forward_table_keys_are_the_ones_the_library_parses():
    doc = forward_table({128: ("fused", KernelConfig(), 1.0, 3), configs.OPEN_BUCKET: ("cublas", None, 2.0, 9000)}, {})
    assert list(doc["configs"]) == ["128", "open"]
    assert [configs.parse_bucket(k) for k in doc["configs"]] == [128, configs.OPEN_BUCKET]


def _probe_rows(T, times: dict, close=True, bitwise=True):
    rows = []
    for variant, (ms_a, ms_b) in times.items():
        for shape, ms in (("53248x16384", ms_a), ("16384x53248", ms_b)):
            rows.append(
                dict(
                    T=T,
                    shape=shape,
                    variant=variant,
                    ms=ms,
                    close_to_cublas=close,
                    bitwise_defer_off=(bitwise if variant.endswith(" defer") else None),
                )
            )
    return rows


def test_gluon_wgrad_table_takes_a_clear_winner_only():
    from swiglu_lab.bench.tables import gluon_wgrad_table

    old = {
        "meta": {},
        "configs": {},
        "gluon_grad_weights": {
            "256": {"config": {"BM": 128, "BN": 128, "BK": 64, "STAGES": 4, "NC": 3, "GROUP_M": 32}, "ms_x": [0.8, 0.8]}
        },
    }
    base = {"GROUP_M": 32, "num_warps": 8, "maxnreg": 168, "load_regs": 40, "store_regs": 40}
    rows = (
        _probe_rows(
            256,
            {
                "cublas": (0.9, 0.9),
                "tl 128x256x64": (0.95, 0.95),
                "gluon table 128x128x64 S4 NC3": (0.80, 0.80),
                "gluon table 128x128x64 S4 NC3 defer": (0.70, 0.72),
            },
        )
        + _probe_rows(
            2048,
            {"tl 128x256x64": (5.4, 5.4), "gluon 128x256x64 S3 NC1": (5.2, 5.2), "gluon 128x256x64 S3 NC1 defer": (5.37, 5.35)},
        )  # 3.7% better than tl
        + _probe_rows(4096, {"tl 128x256x64": (10.5, 10.5), "gluon 128x256x64 S3 NC1 defer": (10.4, 10.45)})  # < 2%
        + _probe_rows(512, {"tl 128x256x64": (1.6, 1.6), "gluon 128x256x32 S4 NC2 defer": (1.0, 1.0)}, close=False)
    )
    new = gluon_wgrad_table(rows, old, base, "probe.csv")
    section = new["gluon_grad_weights"]
    assert section["256"]["config"] == {
        **base,
        "BM": 128,
        "BN": 128,
        "BK": 64,
        "STAGES": 4,
        "NC": 3,
        "defer": True,
        "pingpong": False,
        "BN2": 0,
        "mma_regs": 0,
    }
    assert section["256"]["ms_16384x53248_53248x16384"] == [0.72, 0.70]
    assert section["2048"]["config"]["defer"] is False and section["2048"]["config"]["BN"] == 256
    assert "4096" not in section and "512" not in section  # within the margin; not close to cuBLAS
    assert new["configs"] == old["configs"] and old["gluon_grad_weights"]["256"]["ms_x"] == [0.8, 0.8]
    # A deferred variant that does not match its twin bit for bit is never taken.
    rows = _probe_rows(
        256, {"gluon table 128x128x64 S4 NC3": (0.8, 0.8), "gluon table 128x128x64 S4 NC3 defer": (0.5, 0.5)}, bitwise=False
    )
    assert gluon_wgrad_table(rows, old, base, "p")["gluon_grad_weights"] == old["gluon_grad_weights"]
    # The table's own ping-pong entry, deferred, keeps its kernel: "ping-pong " in the label.
    rows = _probe_rows(
        256, {"gluon table ping-pong 128x128x64 S4 NC3": (0.8, 0.8), "gluon table ping-pong 128x128x64 S4 NC3 defer": (0.7, 0.7)}
    )
    assert gluon_wgrad_table(rows, old, base, "p")["gluon_grad_weights"]["256"]["config"]["pingpong"] is True


@pytest.mark.parametrize("pingpong_ms, twin_ms, pingpong", [(1.2, 1.4, True), (1.5, 1.2, False)])
def test_gluon_wgrad_table_takes_the_faster_of_a_pingpong_kernel_and_its_cooperative_twin(pingpong_ms, twin_ms, pingpong):
    """A " pingpong" row is the ping-pong kernel, a " twin" row its cooperative twin (same tiles)."""
    from swiglu_lab.bench.tables import gluon_wgrad_table

    old = {"meta": {}, "configs": {}, "gluon_grad_weights": {}}
    rows = _probe_rows(
        512,
        {
            "tl 128x256x64": (1.6, 1.6),
            "gluon 128x128x64 S4 NC2 pingpong": (pingpong_ms, pingpong_ms),
            "gluon 128x128x64 S4 NC2 twin": (twin_ms, twin_ms),
        },
    )
    for r in rows:
        if r["variant"].endswith(" pingpong"):
            r["bitwise_defer_off"] = True
    config = gluon_wgrad_table(rows, old, {"GROUP_M": 32}, "p")["gluon_grad_weights"]["512"]["config"]
    assert config["pingpong"] is pingpong and config["NC"] == 2 and config["BN"] == 128


def test_gluon_wgrad_table_keeps_a_wide_candidates_chunk_and_registers():
    """A 128 x (128 + 64) ping-pong candidate at 232 registers, bitwise the table's kernel and
    faster, enters with BN2 and mma_regs: the label carries them, and the config must too (else
    the table would get a plain 128 x 128 tile)."""
    from swiglu.kernels.configs import GluonConfig
    from swiglu_lab.bench.tables import gluon_wgrad_table

    old = {"meta": {}, "configs": {}, "gluon_grad_weights": {"256": {"config": {"BM": 128, "BN": 128}}}}
    rows = _probe_rows(
        256, {"gluon table 128x128x64 S4 NC2": (0.80, 0.80), "gluon ping-pong 128x128+64x64 S4 NC1 r232": (0.70, 0.70)}
    )
    config = gluon_wgrad_table(rows, old, {"GROUP_M": 32}, "p")["gluon_grad_weights"]["256"]["config"]
    assert GluonConfig(**config) == GluonConfig(
        BM=128, BN=128, BN2=64, BK=64, STAGES=4, NC=1, GROUP_M=32, pingpong=True, mma_regs=232
    )


def test_parse_tile_reads_the_probes_tile_names():
    from swiglu.kernels.configs import GluonConfig

    base = GluonConfig(BM=64, BN=64, BK=32, STAGES=2, NC=1)
    assert parse_tile("128x256x64 S3 NC2", base) == GluonConfig(BM=128, BN=256, BK=64, STAGES=3, NC=2)
    wide = parse_tile("128x128+64x64 S4 NC3", base)
    assert (wide.BM, wide.BN, wide.BN2, wide.BK, wide.STAGES, wide.NC) == (128, 128, 64, 64, 4, 3)
