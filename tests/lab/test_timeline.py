"""The TP timeline's arithmetic (swiglu_lab.bench.timeline) on hand-made events."""

from __future__ import annotations

import pandas as pd
import pytest

from swiglu_lab.bench import timeline


def _events(rows):
    return pd.DataFrame(
        [
            dict(case="c", tokens=8, variant=v, rank=r, name=n, kind=timeline.kind_of(n), start_us=s, end_us=e)
            for v, r, n, s, e in rows
        ]
    )


def test_kinds():
    assert timeline.kind_of("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "comm"
    assert timeline.kind_of("gloo:all_reduce") == "comm" and timeline.kind_of("c10d::reduce_scatter_tensor_") == "comm"
    assert timeline.kind_of("dswiglu_gemm_kernel") == "compute" and timeline.kind_of("grad_x_kernel") == "compute"


def test_exposed_communication_and_idle():
    ev = _events(
        [
            ("serial", 0, "dswiglu_gemm_kernel", 100, 200),
            ("serial", 0, "grad_x_kernel", 200, 300),
            ("serial", 0, "ncclDevKernel_AllReduce", 300, 380),  # after all compute: 80 exposed
            ("early", 0, "grad_x_kernel", 1000, 1100),
            ("early", 0, "ncclDevKernel_AllReduce", 1100, 1160),
            ("early", 0, "grad_weight_kernel", 1100, 1150),  # 50 of the 60 covered: 10 exposed
            ("early", 1, "grad_x_kernel", 1010, 1100),
            ("early", 1, "ncclDevKernel_AllReduce", 1120, 1170),  # idle 20
        ]
    )
    s = timeline.summary(ev).set_index(["variant", "rank"])
    assert s.loc[("serial", 0), "exposed_comm_us"] == 80 and s.loc[("serial", 0), "idle_us"] == 0
    assert s.loc[("early", 0), "exposed_comm_us"] == pytest.approx(10)
    assert s.loc[("early", 1), "idle_us"] == pytest.approx(20) and s.loc[("early", 1), "span_us"] == 160
    aligned = timeline.align(ev)
    assert aligned.groupby("variant")["start_us"].min().tolist() == [0.0, 0.0]
    assert aligned.loc[(aligned["variant"] == "early") & (aligned["rank"] == 1), "start_us"].min() == 10
