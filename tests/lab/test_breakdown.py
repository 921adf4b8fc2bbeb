"""The bench's per-kernel breakdown (swiglu_lab.bench.breakdown): the arithmetic on known
intervals, a real profile on the CPU, the runner and the writer, and the figure's values."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from swiglu.workloads import select_cases  # noqa: E402
from swiglu_lab.bench import breakdown  # noqa: E402
from swiglu_lab.bench.runner import BenchConfig, run_benchmark  # noqa: E402
from swiglu_lab.bench.storage import KERNELS_DIR, RunWriter  # noqa: E402
from swiglu_lab.research import analysis, plots  # noqa: E402


@pytest.mark.parametrize(
    "name, role",
    [
        ("dswiglu_gemm_kernel", "dSwiGLU GEMM"),
        ("dswiglu_gluon_kernel", "dSwiGLU GEMM"),
        ("kernel_cutlass_gemm_dgated_sm90", "dSwiGLU GEMM"),
        ("grad_x_kernel", "grad_x GEMM"),
        ("grad_weight_kernel", "weight-gradient GEMM"),
        ("wgrad_kernel", "weight-gradient GEMM"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "GEMM (library)"),
        ("aten::mm", "GEMM (library)"),
        ("triton_poi_fused_mul_silu_0", "elementwise / other"),
    ],
)
def test_kernel_roles(name, role):
    assert breakdown.kernel_role(name) == role


def test_summarize_known_intervals():
    # Two calls starting at 0 and 1000 us. Call 1: a [10, 110], b [100, 300] (overlapping: busy
    # 290), c [350, 400]; call 2: a [1020, 1120], b [1120, 1320], c [1330, 1390].
    calls = [[("a", 10, 110), ("b", 100, 300), ("c", 350, 400)], [("a", 1020, 1120), ("b", 1120, 1320), ("c", 1330, 1390)]]
    rows = breakdown.summarize(calls, [0.0, 1000.0])
    assert [r["kernel"] for r in rows] == ["a", "b", "c"] and [r["position"] for r in rows] == [0, 1, 2]
    assert [r["ms"] for r in rows] == pytest.approx([0.100, 0.200, 0.055])
    assert rows[0]["busy_ms"] == pytest.approx((340 + 360) / 2 / 1e3)  # 290 + 50 and 300 + 60
    assert rows[0]["lead_ms"] == pytest.approx((10 + 20) / 2 / 1e3)
    assert rows[0]["span_ms"] == pytest.approx((400 + 390) / 2 / 1e3)
    assert rows[0]["gaps_ms"] == pytest.approx((50 + 10) / 2 / 1e3)  # [300, 350] and [1320, 1330] uncovered
    assert all(r["seen"] == 2 and r["profiled_calls"] == 2 for r in rows)


def test_split_at_flushes_assigns_each_kernel_to_the_flush_before_it():
    flush = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<unsigned char>, x>"
    other_fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, x>"
    kernels = [
        ("early", 0, 5),
        (flush, 10, 40),
        ("a", 45, 100),
        (other_fill, 101, 102),
        ("b", 103, 200),
        (flush, 150, 180),
        ("a", 190, 260),
    ]  # the host ran ahead: the next flush is queued behind b
    calls, ends = breakdown.split_at_flushes(kernels)
    assert ends == [40, 180]
    assert [[k[0] for k in c] for c in calls] == [["a", other_fill, "b"], ["a"]]
    rows = breakdown.summarize(calls, ends)
    assert rows[0]["lead_ms"] == pytest.approx((5 + 10) / 2 / 1e3)
    assert breakdown.split_at_flushes([("a", 0, 1)]) == ([], [])


def test_summarize_takes_the_common_name_per_position_and_skips_empty_calls():
    calls = [[("a", 0, 10)], [("a", 100, 120)], [("z", 200, 260)], []]
    rows = breakdown.summarize(calls, [0.0, 100.0, 200.0, 300.0])
    assert len(rows) == 1 and rows[0]["kernel"] == "a" and rows[0]["seen"] == 2
    assert rows[0]["ms"] == pytest.approx(0.015) and rows[0]["profiled_calls"] == 3
    assert breakdown.summarize([[]], [0.0]) == []


def test_profile_calls_on_the_cpu_sees_each_op_of_each_call():
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def fn(x, y):
        return torch.relu(torch.mm(x, y))

    rows = breakdown.profile_calls(fn, lambda: (a, b), 3, torch.device("cpu"))
    assert [r["kernel"] for r in rows] == ["aten::mm", "aten::relu"]
    assert [r["role"] for r in rows] == ["GEMM (library)", "elementwise / other"]
    assert all(r["profiled_calls"] == 3 and r["seen"] == 3 and r["ms"] > 0 for r in rows)
    assert rows[0]["span_ms"] >= rows[0]["busy_ms"] > 0 and rows[0]["lead_ms"] >= 0 and rows[0]["gaps_ms"] >= 0


def test_runner_records_a_breakdown_per_case_and_impl_and_the_writer_keeps_it_apart(tmp_path):
    config = BenchConfig(
        cases=select_cases("s128_b1,s256_b1"),
        hidden_size=64,
        intermediate_size=96,
        impls=["eager", "cublas-gemms"],
        device=torch.device("cpu"),
        protocol="cpu-smoke",
        measure_ceilings=False,
        breakdown=2,
    )
    handed = []
    result = run_benchmark(config, progress=False, log=lambda s: None, on_kernels=handed.append)
    k = result.kernels
    assert list(k.columns) == list(breakdown.COLUMNS)
    assert set(zip(k["case"], k["impl"])) == {(c, i) for c in ("s128_b1", "s256_b1") for i in ("eager", "cublas-gemms")}
    assert [list(f["case"].unique()) for f in handed] == [["s128_b1"], ["s256_b1"]]
    assert (k["profiled_calls"] == 2).all() and k["ms"].gt(0).all()
    timed = result.rows.set_index(["case", "impl"])["median_ms"]
    assert [timed[(c, i)] for c, i in zip(k["case"], k["impl"])] == k["timed_ms"].tolist()
    assert "2 calls per impl and case" in result.metadata["protocol"]["kernel_breakdown"]
    assert not result.rows.columns.str.contains("kernel").any()

    writer = RunWriter(tmp_path, "20261201T000000Z-test")
    writer.append(result.rows)
    for f in handed:
        path = writer.append_kernels(f)
    writer.finish(result.metadata)
    assert path == tmp_path / KERNELS_DIR / "20261201T000000Z-test.csv"
    back = pd.read_csv(path)
    assert len(back) == len(k) and (back["run_id"] == "20261201T000000Z-test").all()
    assert list(analysis.list_runs(tmp_path)["run_id"]) == ["20261201T000000Z-test"]  # not taken for a run


def test_no_breakdown_by_default():
    config = BenchConfig(
        cases=select_cases("s128_b1"),
        hidden_size=64,
        intermediate_size=96,
        impls=["eager"],
        device=torch.device("cpu"),
        protocol="cpu-smoke",
        measure_ceilings=False,
    )
    result = run_benchmark(config, progress=False, log=lambda s: None)
    assert result.kernels is None and result.metadata["protocol"]["kernel_breakdown"] == "none"


def _synthetic_kernels() -> pd.DataFrame:
    rows = []
    for tokens, scale in ((128, 1.0), (2048, 10.0)):
        for impl, kernels, idle in (
            ("triton", [("dswiglu_gemm_kernel", 0.5), ("grad_weight_kernel", 0.6), ("grad_x_kernel", 0.8)], 0.15),
            ("quack", [("gemm_dgated", 0.5), ("gemm", 1.2)], 0.05),
        ):
            busy = sum(ms for _, ms in kernels) * scale
            for position, (name, ms) in enumerate(kernels):
                rows.append(
                    dict(
                        run_id="r",
                        case=f"c{tokens}",
                        tokens=tokens,
                        impl=impl,
                        position=position,
                        kernel=name,
                        role=breakdown.kernel_role(name),
                        ms=ms * scale,
                        seen=3,
                        busy_ms=busy,
                        lead_ms=0.3,
                        span_ms=0.3 + busy,
                        profiled_calls=3,
                        timed_ms=busy + idle,
                    )
                )
    return pd.DataFrame(rows, columns=list(breakdown.COLUMNS))


def test_breakdown_plot_stacks_each_kernel_on_the_idle_time_relative_to_quacks_median():
    kernels = _synthetic_kernels()
    fig = plots.kernel_breakdown_plot(kernels)
    p = fig.plotted
    tops = p.groupby(["series", "x"])["y"].max()
    timed = kernels.groupby(["impl", "tokens"])["timed_ms"].first()
    for tokens in (128, 2048):
        ours = p[(p["x"] == tokens) & p["series"].str.startswith("triton")]
        base = p[(p["x"] == tokens) & p["series"].str.startswith("quack")]
        assert base["y"].max() == pytest.approx(1.0)  # the base bar's top is its own timed median
        assert ours["y"].max() == pytest.approx(timed[("triton", tokens)] / timed[("quack", tokens)])
        assert ours["hi"].sum() == pytest.approx(timed[("triton", tokens)])  # idle + kernels = the timed median
        idle = ours[ours["series"] == f"triton: {plots.IDLE}"]
        assert idle["lo"].tolist() == [0.0] and idle["hi"].tolist() == pytest.approx([0.15])
    assert tops.loc[("triton: grad_x GEMM", 128)] > tops.loc[("triton: weight-gradient GEMM", 128)]
    table = breakdown.per_role(kernels).set_index(["tokens", "impl"])
    assert table.loc[(128, "triton"), "timed_minus_busy_ms"] == pytest.approx(0.15)
    assert table["idle_ms"].isna().all()  # no gaps_ms: a run from before the looped profile
    assert table.loc[(2048, "quack"), "GEMM (library)"] == pytest.approx(12.0)
    plots.plt.close(fig)


def test_breakdown_plot_without_data_says_so():
    fig = plots.kernel_breakdown_plot(pd.DataFrame(columns=list(breakdown.COLUMNS)))
    assert fig.plotted.empty
    plots.plt.close(fig)


def test_breakdown_plot_fits_longer_profiled_kernels_into_the_timed_median_and_covers_a_t_the_base_lacks():
    kernels = _synthetic_kernels()
    slow = (kernels["impl"] == "triton") & (kernels["tokens"] == 128)
    kernels.loc[slow, "ms"] *= 1.1  # profiled kernels 10% longer than the timed median leaves room for
    kernels.loc[slow, "busy_ms"] *= 1.1
    kernels = kernels[~((kernels["impl"] == "quack") & (kernels["tokens"] == 2048))]  # quack lacks T = 2048
    fig = plots.kernel_breakdown_plot(kernels)
    p = fig.plotted
    timed = kernels.groupby(["impl", "tokens"])["timed_ms"].first()
    ours = p[(p["x"] == 128) & p["series"].str.startswith("triton")]
    assert ours["y"].max() == pytest.approx(timed[("triton", 128)] / timed[("quack", 128)])
    assert ours.loc[ours["series"] == f"triton: {plots.IDLE}", "hi"].tolist() == [0.0]
    assert ours["hi"].sum() == pytest.approx(timed[("triton", 128)])
    at_2048 = p[(p["x"] == 2048)]
    assert at_2048["y"].max() == pytest.approx(1.0) and set(at_2048["series"].str.split(":").str[0]) == {"triton"}
    assert "(vs triton)" in fig.axes[0].get_xticklabels()[1].get_text()
    plots.plt.close(fig)


@pytest.mark.gpu
def test_profile_calls_on_the_gpu_splits_the_loop_at_the_flushes():
    """The looped profile on a GPU: one call per L2 flush, every kernel of the call seen, the
    idle terms non-negative; without the flush it refuses rather than guess the boundaries."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from swiglu_lab.bench.timing import L2Flusher

    dev = torch.device("cuda")
    a, b = torch.randn(512, 512, device=dev), torch.randn(512, 512, device=dev)

    def fn(x, y):
        return torch.relu(torch.mm(x, y))

    # Arguments made with a kernel of their own (as quack's preparation): not part of any call.
    rows = breakdown.profile_calls(fn, lambda: (a.reciprocal(), b), 4, dev, L2Flusher(dev))
    assert not any("reciprocal" in r["kernel"].lower() for r in rows), [r["kernel"] for r in rows]
    roles = [r["role"] for r in rows]  # in launch order: the GEMM (cuBLAS may take two kernels), then relu
    assert roles[0] == "GEMM (library)" and roles[-1] == "elementwise / other", roles
    assert set(roles) == {"GEMM (library)", "elementwise / other"}, roles
    assert all(r["profiled_calls"] == 4 and r["seen"] == 4 for r in rows)
    assert rows[0]["lead_ms"] >= 0 and rows[0]["gaps_ms"] >= 0 and rows[0]["busy_ms"] > 0
    with pytest.raises(ValueError, match="L2 flushes"):
        breakdown.profile_calls(fn, lambda: (a, b), 2, dev)
