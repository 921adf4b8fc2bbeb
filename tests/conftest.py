"""Test set-up: run Triton kernels through the CPU interpreter when no GPU is present.

TRITON_INTERPRET is read when ``@triton.jit`` decorates a kernel, so it must be set before any
kernel module is imported (see docs/triton-on-cpu.md).
"""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# torch.compile's caches in a directory of this run's own: a graph cached by an earlier checkout
# calls the custom ops with their old schemas (a stale hit, not a failure of this code).
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="swiglu-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

# A pytest-xdist worker gets its share of the cores: with a pool per worker as wide as the machine,
# numpy's OpenBLAS (the interpreter's tl.dot) and torch's OpenMP threads spin waiting for cores the
# other worker holds (10% of a 2-core run), and torch.compile starts a pool of compile processes per
# worker. Read when numpy, torch and inductor load: set before them.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS:
    _THREADS = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _THREADS)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", _THREADS)

import pytest  # noqa: E402
import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    import fast_interpreter  # noqa: E402  (tests/ is on sys.path)

    fast_interpreter.install()

#: Device the small-shape tests run on: the GPU when there is one, else the CPU interpreter.
DEVICE = "cuda" if HAS_CUDA else "cpu"


#: What takes more than a few seconds on two cores (``pytest --durations``): whole files, and
#: tests by name. ``make test-fast`` (``pytest -m "not slow"``) leaves them out; ``make test`` runs all.
SLOW_FILES = {
    "test_triton_compile.py",  # sm_90 compiles of every tl kernel
    "test_notebooks.py",  # executes the notebooks
    "test_reproducible.py",  # redraws the committed figures
    "test_fsdp.py",
    "test_parallel.py",
    "test_tp_model.py",  # gloo process groups
    "test_make.py",
    "test_wheel.py",  # virtual environments and wheels
    "test_probe_backward_power.py",
    "test_probe_in_step.py",
    "test_multicast_probe.py",
    "test_lean_ownership.py",
    "test_hf_experts_survey.py",  # builds and runs ~55 tiny transformers models
    "test_direct_launch.py",
    "test_plan_cache.py",
    "test_hf_long_seq_script.py",
    "test_moe_bench_script.py",
    "test_moe_notebook.py",  # the MoE bench script on the CPU (interpreter)
    "test_moe_persistent.py",  # a lab experiment's kernels under the interpreter and sm_90 compiles
}
SLOW_TESTS = (
    "test_tables_and_figure_from_the_tiny_run",
    "test_latest_run_loads_the_newest_and_none_without_one",  # the tiny MoE bench run first
    "test_table_configs_compile_for_sm90",
    "test_grad_x_candidates_compile_for_sm90",
    "test_dswiglu_candidates_compile_for_sm90",
    "test_moe_gluon_kernels_compile_for_sm90",
    "test_each_tuned_config_on_its_own",
    "test_compiled_autograd_with_torchs_inductor_helper",
    "test_gradcheck_and_gradgradcheck",
    "test_30_steps_of_training_track_the_unpatched_model",
    "test_run_with_fake_nvml_fills_power_columns",
    "test_failures_print_at_once_only_when_asked",
    "test_backward_gradients_are_differentiable_by_the_reference_formula",
    "test_opcheck_every_util_with_inputs_requiring_grad",
    "test_runner_records_a_breakdown_per_case_and_impl_and_the_writer_keeps_it_apart",
    "test_split_tiles_against_float64",
    "test_config_options",
    "test_odd_shapes_against_float64",
)


#: Files whose Triton path runs on CPU tensors through the interpreter (tiny shapes), marked
#: ``interpreter`` as single tests may be: where a GPU is present TRITON_INTERPRET is off and they are
#: skipped; tests/kernels/test_moe_gpu.py checks the kernels at full size there.
INTERPRETER_FILES = {
    "test_moe_bias.py",
    "test_moe_hf.py",
    "test_moe_breaks.py",
    "test_moe_wrapped_tools.py",
    "test_moe_module.py",
}
#: Single tests of that kind (by name, or name[params]): Triton on CPU tensors, faked device
#: properties, tiny runs whose rows or routes are the interpreter's, gloo process groups.
INTERPRETER_TESTS = (
    "test_module_errors_name_impl",
    "test_double_backward_uses_the_reference_formula[auto]",  # on a GPU "auto" takes torch's ops here
    "test_scenario[tp2-lean_triton]",
    "test_bench_tp_cli_on_cpu",
    "test_scenario[fsdp_lean_triton]",
    "test_scenario[fsdp_moe_inplace_triton]",
    "test_backward_takes_gluon_for_table_buckets",
    "test_backward_keeps_tl_for_other_buckets_and_overrides",
    "test_backward_takes_the_gluon_grad_x_where_the_table_has_one",
    "test_lab_launchers_run_only_once_the_lab_sets_them",
    "test_backward_takes_gluon_dswiglu_for_table_buckets",
    "test_backward_launches_the_shapes_own_dswiglu_config",
    "test_backward_keeps_tl_dswiglu_where_gluon_cannot_run",
    "test_bad_inputs_raise_at_forward[triton_fp32]",
    "test_auto_backward_is_reference_on_cpu",
    "test_output_is_not_a_view_and_takes_in_place_ops[(7,)-triton-False]",
    "test_output_is_not_a_view_and_takes_in_place_ops[(7,)-triton-True]",
    "test_output_is_not_a_view_and_takes_in_place_ops[(2, 5)-triton-False]",
    "test_output_is_not_a_view_and_takes_in_place_ops[(2, 5)-triton-True]",
    "test_moe_forward_and_backward_launch_inside_the_device_guard",
    "test_dense_lean_forward_and_backward_launch_inside_the_device_guard",
    "test_tile_table_lists_every_experts_m_tiles",
    "test_wgrad_gathers_rows_only_up_to_its_rows_per_expert",
    "test_a_limited_call_hands_its_limit_to_the_gluon_kernels",
    "test_lab_install_routes_only_what_the_kernel_takes_and_undoes",
    "test_shared_grad_out_copy_gives_the_same_bits",
    "test_library_launchers_with_gluon_tiles_fall_back_bitwise",
    "test_gluon_decision_is_made_once_per_device_until_clear_plans",
    "test_lean_op_refuses_gate_output_that_shares_memory_with_a_read_input",
    "test_overwriting_backward_refuses_activated_gate_that_overlaps_what_it_writes",
    "test_second_lean_backward_message_names_both_remedies",
    "test_the_tiny_cpu_run_writes_every_row_and_column",
    "test_tables_and_figure_from_the_tiny_run",
    "test_the_notebook_draws_the_newest_recorded_run",
    "test_measure_write_read_plot",  # on a GPU the tiny steps take torch's ops
)

#: What compiles or launches with the GPU machine's Triton where ``SWIGLU_EXTRA_TRITON_DIR`` names it
#: (``make test-gpu-triton`` sets it and runs these; ``make test`` runs them with this venv's Triton).
GPU_TRITON_FILES = {"test_triton_compile.py", "test_moe_compile.py"}
GPU_TRITON_TESTS = (
    "test_table_configs_compile_for_sm90",
    "test_grad_x_candidates_compile_for_sm90",
    "test_dswiglu_candidates_compile_for_sm90",
    "test_moe_gluon_kernels_compile_for_sm90",
    "test_persistent_kernels_compile_for_sm90_with_the_gpu_machines_triton",
    "test_direct_runner_hands_the_c_launcher_what_triton_36_does",
)


@pytest.fixture
def call_spy(monkeypatch):
    """``call_spy(owner, name)``: wrap ``owner.name`` so each call's keyword arguments are recorded
    in the returned list (proves a route ran, e.g. the op rather than a fallback)."""

    def install(owner, name):
        calls = []
        real = getattr(owner, name)

        def spy(*args, **kwargs):
            calls.append(kwargs)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
        return calls

    return install


def _listed(item, files, tests) -> bool:
    """Whether ``item``'s file is in ``files`` or its name, with or without its parameters, in ``tests``."""
    return item.path.name in files or item.name in tests or item.name.split("[")[0] in tests


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    cpu_only = pytest.mark.skip(reason="the Triton path on CPU tensors needs TRITON_INTERPRET=1 (no GPU)")
    for item in items:
        if _listed(item, SLOW_FILES, SLOW_TESTS):
            item.add_marker(slow)
        if _listed(item, GPU_TRITON_FILES, GPU_TRITON_TESTS):
            item.add_marker(pytest.mark.gpu_triton)
        if _listed(item, INTERPRETER_FILES, INTERPRETER_TESTS):
            item.add_marker(pytest.mark.interpreter)
        if not interpreting and "interpreter" in item.keywords:
            item.add_marker(cpu_only)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """With ``SWIGLU_FAILURES_AT_ONCE=1`` (``make test-gpu`` sets it) a failure's traceback is
    printed when it happens, not only in the summary, so a run cut short by a time limit (a
    lent GPU's) still shows why its first failures failed."""
    if report.failed and os.environ.get("SWIGLU_FAILURES_AT_ONCE") == "1":
        import sys

        print(f"\nFAILED {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n", file=sys.__stderr__, flush=True)


@pytest.fixture
def device() -> str:
    return DEVICE


#: A lock file every pytest process of this user shares: GPU tests take it (``_gpu_tests_one_at_a_time``).
GPU_LOCK = Path(tempfile.gettempdir()) / f"swiglu-gpu-tests-{os.getuid()}.lock"


@pytest.fixture(autouse=True)
def _gpu_tests_one_at_a_time(request):
    """Where a GPU is present, a test marked ``gpu`` (full-size: tens of GiB) runs while no other
    worker's does, and every test hands its cached blocks back to the driver after it: the whole
    suite in 8 pytest-xdist workers on one 80 GB H100 ran out of memory in 70 tests before."""
    if not HAS_CUDA:
        yield
        return
    import fcntl
    import gc

    lock = open(GPU_LOCK, "a") if request.node.get_closest_marker("gpu") is not None else None
    if lock is not None:
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        yield
    finally:
        # A failed test's frames (tens of GiB of tensors at full size) stay reachable from
        # sys.last_traceback, where pytest leaves them, and sit in reference cycles: dropped
        # before the gc, or the tests after one failure run out of memory too.
        sys.last_type = sys.last_value = sys.last_traceback = None
        if hasattr(sys, "last_exc"):
            sys.last_exc = None
        gc.collect()
        torch.cuda.empty_cache()
        if lock is not None:
            lock.close()  # releases the lock


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Each test starts from no cached backend decision or launch plan (tests fake device
    properties and switch kernel tables, which the caches would otherwise remember)."""
    import swiglu.ops

    swiglu.ops.clear_plans()
    yield
