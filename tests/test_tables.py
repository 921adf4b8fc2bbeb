"""The tables' writer (swiglu_lab.bench.tables): a tuning run's fastest correct config per kernel
and bucket goes in with its time, everything else in the table stays, and the library reads back
what was written."""

from __future__ import annotations

import json
from dataclasses import asdict

from swiglu.kernels import configs
from swiglu.kernels.configs import KernelConfig
from swiglu_lab.bench.tables import backward_table, forward_table


def _row(kernel, tokens, ms, err=1e-3, cfg=KernelConfig(BM=64)):
    return dict(kernel=kernel, tokens=tokens, config=str(cfg), config_dict=asdict(cfg), ms=ms, tflops=1.0, cublas_ms=2.0,
                err=err)


def test_backward_table_takes_the_fastest_correct_and_keeps_the_rest():
    old = json.loads(configs.TUNED_CONFIGS_PATH.read_text())
    fast, slow, wrong = KernelConfig(BM=64), KernelConfig(BM=128, GROUP_M=4), KernelConfig(BN=128)
    rows = [_row("grad_x", 300, 0.9, cfg=slow), _row("grad_x", 300, 0.5, cfg=fast), _row("grad_x", 310, 0.1, err=0.5, cfg=wrong),
            _row("dswiglu", 9000, 3.0, cfg=fast), dict(_row("grad_x", 300, 0.01), config="cublas")]
    new = backward_table(rows, old, {"utc": "now", "gpu": "test"})
    assert new["configs"]["grad_x"]["512"]["config"] == asdict(fast) and new["configs"]["grad_x"]["512"]["ms"] == 0.5
    assert new["configs"]["dswiglu"]["open"]["config"] == asdict(fast)
    for section in ("gluon_grad_weights", "gluon_dswiglu"):
        assert new[section] == old[section]
    untouched = {k: e for k, e in new["configs"]["grad_x"].items() if k != "512"}
    assert {k: e["config"] for k, e in untouched.items()} == {k: e["config"] for k, e in old["configs"]["grad_x"].items()
                                                               if k != "512"}
    assert new["meta"]["gpu"] == "test" and old["meta"]["utc"] != "now"
    assert {configs.parse_bucket(k) for k in new["configs"]["grad_x"]} <= set(configs.TOKEN_BUCKETS)


def test_forward_table_keys_are_the_ones_the_library_parses():
    doc = forward_table({128: ("fused", KernelConfig(), 1.0, 3), configs.OPEN_BUCKET: ("cublas", None, 2.0, 9000)}, {})
    assert list(doc["configs"]) == ["128", "open"]
    assert [configs.parse_bucket(k) for k in doc["configs"]] == [128, configs.OPEN_BUCKET]
