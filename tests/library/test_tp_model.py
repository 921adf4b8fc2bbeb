"""swiglu_lab.bench.tp_model: the TP summary and scaling model on synthetic rows with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from swiglu_lab.bench import tp_model

H, I = 16384, 53248


def _rows(bus_gbps=300.0, latency_ms=0.02):
    """TP=2 rows: compute scales as 1/N, the all-reduce follows the bandwidth model exactly."""
    rows = []
    for case, tokens, single in (("a", 1024, 16.0), ("b", 4096, 64.0)):
        comm = latency_ms + float(tp_model.bus_bytes(tokens, H, 2)) / (bus_gbps * 1e9) * 1e3

        def add(impl, ms, local=I // 2):
            rows.append(
                dict(
                    case=case,
                    tokens=tokens,
                    hidden_size=H,
                    intermediate_size=I,
                    tp=2,
                    local_intermediate_size=local,
                    impl=impl,
                    median_ms=ms,
                )
            )

        add("ours_local_compute", single, I)
        for n in (2, 4, 8):
            add("ours_local_compute", single / n * 1.05, I // n)
        add("tp_allreduce", comm)
        add("tp_ours", single / 2 * 1.05 + comm * 0.25)  # 75% of the collective hidden
        add("tp_ours_module", single / 2 * 1.1 + comm)
        add("tp_plain_module", single / 2 * 1.2 + 2 * comm)
    return pd.DataFrame(rows)


def test_bus_bytes_is_the_ring_traffic():
    assert tp_model.bus_bytes(4096, H, 2) == 4096 * H * 2  # 2 (N-1)/N = 1 at N = 2
    assert tp_model.bus_bytes(4096, H, 8) == pytest.approx(4096 * H * 2 * 1.75)


def test_fit_recovers_latency_and_bandwidth():
    latency, bw = tp_model.fit_allreduce(_rows(bus_gbps=250.0, latency_ms=0.03))
    assert latency == pytest.approx(0.03, rel=1e-6) and bw == pytest.approx(250.0, rel=1e-6)
    with pytest.raises(ValueError, match="2 token counts"):
        tp_model.fit_allreduce(_rows().query("case == 'a'"))


def test_case_table_overlap_and_efficiency():
    t = tp_model.case_table(_rows()).set_index("case")
    assert list(t["overlap"]) == pytest.approx([0.75, 0.75])
    assert t.loc["b", "efficiency"] == pytest.approx(64.0 / (2 * t.loc["b", "tp_ours_ms"]))
    assert (t["efficiency_module_plain"] < t["efficiency_module_ours"]).all()
    assert t.loc["b", "single_ms"] == 64.0 and t.loc["b", "compute_ms"] == pytest.approx(33.6)


def test_model_table_uses_the_local_compute_and_the_fitted_collective():
    m = tp_model.model_table(_rows(bus_gbps=300.0, latency_ms=0.02), tps=(2, 4, 8, 16))
    assert sorted(set(m["tp"])) == [2, 4, 8]  # no I/16 timing: left out
    row = m[(m["case"] == "b") & (m["tp"] == 8)].iloc[0]
    comm = 0.02 + 4096 * H * 2 * 1.75 / 300e9 * 1e3
    assert row["comm_ms"] == pytest.approx(comm, rel=1e-6)
    assert row["compute_ms"] == pytest.approx(64.0 / 8 * 1.05)
    assert row["efficiency_serial"] == pytest.approx(64.0 / (8 * (row["compute_ms"] + comm)))
    assert row["hidden"] == (comm <= row["compute_ms"] / 2)
    assert (m.groupby("case")["comm_fraction"].apply(lambda s: s.is_monotonic_increasing)).all()
    assert not math.isnan(row["efficiency_hidden"])
