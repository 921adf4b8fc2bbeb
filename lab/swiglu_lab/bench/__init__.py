"""Benchmark harness: every implementation of the SwiGLU MLP backward side by side under the
public benchmark's protocol (SOL-ExecBench L2/005, ``docs/problem.md``).

CLI: ``python -m swiglu_lab.bench --help`` (``make bench BENCH_ARGS=...``). Python API:

    from swiglu_lab.bench import BenchConfig, run_benchmark, write_run
    result = run_benchmark(BenchConfig(cases, 16384, 53248, ["eager", "triton"], torch.device("cuda")))
    result.rows      # tidy frame, one row per case x impl (schema.COLUMNS)
    result.metadata  # GPU, clocks, versions, git, protocol, measured ceilings

Modules: ``stats`` (pure arithmetic: statistics, SOL columns, summaries), ``schema`` (CSV
columns and dtypes), ``impls`` (the implementations), ``timing`` (L2 flush, event timers,
ceilings), ``environment`` (metadata, run id), ``storage`` (append-only files), ``runner``,
``cli``, ``power`` (GPU power and energy), ``quack_peer``, ``tp`` and ``tp_model`` (tensor parallel and
its time model). Never imports ``swiglu_lab.research``.
"""

from .impls import IMPLS, BenchImpl
from .runner import PROTOCOLS, BenchConfig, BenchResult, run_benchmark
from .schema import COLUMNS, read_rows
from .stats import Ceilings, sol_columns, summary_table, time_stats
from .storage import write_run

__all__ = [
    "BenchConfig",
    "BenchImpl",
    "BenchResult",
    "COLUMNS",
    "Ceilings",
    "IMPLS",
    "PROTOCOLS",
    "read_rows",
    "run_benchmark",
    "sol_columns",
    "summary_table",
    "time_stats",
    "write_run",
]
