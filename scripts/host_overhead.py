"""Host overhead per call: wall time of one synchronized call at shapes where the device work is
negligible, for ``swiglu.SwiGLUMLP`` against the same block from three ``nn.Linear``. A benchmark,
not a test.

    python scripts/host_overhead.py                      # CPU: --shape overhead, 1 thread
    python scripts/host_overhead.py --device cuda        # GPU: --shape tiny
    python scripts/host_overhead.py --profile            # + cProfile of SwiGLUMLP fwd+bwd
    python scripts/host_overhead.py --device cuda --shape llama-3-8b --enqueue --iters 200
    python scripts/host_overhead.py --stub-launches --profile   # CPU: the GPU path's Python, launches stubbed

Rows: ``swiglu.SwiGLUMLP`` forward+backward; ``swiglu.module.PlainSwiGLUMLP`` (three
``nn.Linear``, PyTorch autograd) forward+backward; ``swiglu.swiglu_mlp_backward`` with
``impl="reference"``; with ``impl="triton"`` where ``swiglu.available_impls(device)`` lists it;
Liger's ``LigerSwiGLUMLP`` forward+backward where ``liger_kernel`` imports (on CUDA);
transformers' ``LlamaMLP`` forward+backward, stock and patched by ``swiglu.integrations.
transformers.apply``, where transformers imports.
Shapes: ``tiny`` H=256, I=512, T=16 (default on CUDA); ``overhead`` H=16, I=32, T=2 (default on
the CPU, where any real shape measures the arithmetic); ``llama-3-8b`` H=4096, I=14336, T=2048
(a real layer, with ``--enqueue``). bf16 unless ``--dtype``.

``--enqueue`` (CUDA): each call timed from its start to its return, the synchronize after the
clock stops: the host's time to enqueue the call's work on an idle GPU (the device runs behind),
which is the host cost per layer a training step pays where the host, not the GPU, is the bound.

Protocol: inputs and modules built once; the modules' and x's gradients set to None outside the
timed region before each call (as ``zero_grad(set_to_none=True)``); each call timed alone with
``time.perf_counter_ns`` around the call and ``torch.cuda.synchronize()`` (CUDA), so on a GPU the
number is the host cost plus one launch-to-completion latency. ``--warmup`` untimed calls per
implementation, then ``--iters`` timed calls split into ``--rounds`` blocks taken in turn over the
implementations (slow drift of the machine hits all alike); Python's garbage collector off during
the timed blocks (as ``timeit``). Reported: median, 20th and 80th percentile in microseconds, and
the median's ratio to the ``nn.Linear`` block's. On the CPU ``torch.set_num_threads(--threads)``
(default 1), restored afterwards. Writes ``host_overhead.csv`` and ``host_overhead.json``
(metadata) to ``--out`` (default ``$OUT`` when set, else build/host_overhead).

``--idle T1,T2,...`` (CUDA): the GPU time a backward leaves idle when every call starts on an
idle device, per token count, at Hermes' size (``--idle-hidden``/``--idle-intermediate``): the
median span between CUDA events around one eager ``swiglu_mlp_backward(impl="triton")`` call
(L2 flushed first) minus the median span of the same launches replayed from a CUDA graph (no host
work between them), each iteration synchronized. The benchmark's own loop does not synchronize
between iterations, so there the host runs ahead (``lab/probes/probe_idle_gaps.py`` measures that
case). Writes ``idle_gap.csv``.

``--stub-launches`` (CPU, TRITON_INTERPRET unset): the Python the Triton path runs on the GPU
machine, measured on this CPU with the kernel launches stubbed, beside the stock modules' host cost
at the same tiny shape (their CPU arithmetic is a few microseconds there: what is left is PyTorch's
dispatcher and autograd, which the stock model pays per op on any device). For the run
(``stubbed_launches``): ``impl="auto"`` and ``"triton"`` resolve to the Triton path for bfloat16 CPU
tensors; every kernel choice is the one the H200 makes at ``--stub-plan`` (default T=512, H=4096,
I=14336: Llama-3-8B's MLP at 512 tokens), its tables read as on that machine (Gluon kernels where
they have entries, grad_x's tile rule for 132 SMs), while the tensors have ``--shape``'s sizes (x as
[1, T, H], as in a Hugging Face model); a key's first launch gets a stand-in for the compiled kernel,
and every later one runs ``swiglu.kernels.launch``'s cached launch with triton 3.6's per-launch
work (the hook check, the stream query, the CUtensorMap memo) and a C launcher and descriptor fill
that do nothing. What stays out: the C launcher's own time (a few microseconds per launch on the
GPU machine) and CUDA's allocator against the CPU's. Adds forward-only rows of transformers'
LlamaMLP, stock and patched; ``--profile`` then profiles the patched and the stock LlamaMLP. Host
microseconds on this CPU: compare ratios and differences, not the GPU machine's times.

``--profile``: cProfile over ``--iters`` SwiGLUMLP forward+backward calls and as many of the
nn.Linear block's, top 15 functions by tottime and by cumulative time (printed, and written to
``cprofile.txt``). On CUDA the backward's Python runs in autograd's device thread: Python 3.12's cProfile
(on sys.monitoring) sees it (checked on the H200 machine), older Pythons' may show only the
forward and the wait in ``run_backward``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import csv
import gc
import io
import json
import math
import os
import platform
import pstats
import statistics
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

import swiglu  # noqa: E402
from swiglu_lab.bench.environment import dist_version, git_info, nvml_info  # noqa: E402
from swiglu.module import PlainSwiGLUMLP  # noqa: E402

SHAPES = {"tiny": dict(H=256, I=512, T=16), "overhead": dict(H=16, I=32, T=2), "llama-3-8b": dict(H=4096, I=14336, T=2048)}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
BASELINE = "nn_linear_fwd_bwd"
CSV_FIELDS = ["implementation", "description", "us_median", "us_p20", "us_p80", "us_min", "calls", "ratio_to_nn_linear"]


#: The H200's SMs and opt-in shared memory per block: what ``stubbed_launches`` plans for.
H200_SMS, H200_SHARED_MEMORY = 132, 232448
#: ``--stub-plan``'s default: Llama-3-8B's MLP at 512 tokens (the host-bound HF step).
STUB_PLAN = (512, 4096, 14336)


class _StubCompiled:
    """What ``kernel[grid](...)`` returns under ``stubbed_launches``: no kernel, the descriptor
    positions and blocks of the first launch (what triton 3.6's launcher records per kernel)."""

    packed_metadata = None

    def __init__(self, args):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
        from triton.tools.tensor_descriptor import TensorDescriptor

        self.descriptors = tuple(
            (i, 128, 2, 9, list(a.block_shape)) for i, a in enumerate(args) if isinstance(a, (TensorDescriptor, GluonDescriptor))
        )

    def __getitem__(self, grid):
        return lambda *args: None


def _stub_direct_runner(compiled, grid, *extra):
    """``launch.direct_runner`` with a C launcher and a CUtensorMap fill that do nothing: the
    library's own per-launch closure (``launch.direct_run``), so the Python per launch is the
    GPU path's."""
    from swiglu.kernels import launch

    def noop(*args):
        return None

    def fill(*args):
        return object()

    head = (*grid, None, None, False, False, None, None, None, None, None, None)
    return launch.direct_run(
        raw=noop,
        head=head,
        descriptors=compiled.descriptors,
        fill=fill,
        device=lambda: 0,
        stream=lambda device: 0,
        slow=compiled[grid],
        rest=extra[0] if extra else (),
    )


@contextlib.contextmanager
def stubbed_launches(plan_shape: tuple[int, int, int] = STUB_PLAN, sms: int = H200_SMS, shared_memory: int = H200_SHARED_MEMORY):
    """Inside: the Triton path runs on bfloat16 CPU tensors with its launches stubbed (the module
    docstring's ``--stub-launches``). Patches and restores: ``swiglu.ops.auto_reason`` and
    ``triton_reason`` (None for bfloat16), the backward's Gluon table reads (as on a device with
    ``shared_memory`` bytes per block) and the backward's plan cache (the plan at ``plan_shape`` with ``sms``
    SMs, carrying the call's sizes), the forward's configuration choice (``plan_shape``'s),
    ``JITFunction.run``, ``launch.direct_runner`` and ``ops.AUTO_TORCH_OPS_BELOW`` (0: the kernels
    at every size); the decision, plan and launch caches are
    emptied on entry and exit. Needs TRITON_INTERPRET unset (RuntimeError otherwise)."""
    from functools import lru_cache

    from triton.runtime.jit import JITFunction

    from swiglu import ops
    from swiglu.kernels import backward, devices, forward, launch

    if devices.INTERPRET:
        raise RuntimeError("--stub-launches measures the GPU path's Python: run it without TRITON_INTERPRET=1")
    pT, pH, pI = plan_shape
    real = dict(
        run=JITFunction.run,
        direct_runner=launch.direct_runner,
        gluon=backward._gluon_config_for_bucket,
        plan=backward._cached_plan,
        forward_config_for=forward.forward_config_for,
        auto_reason=ops.auto_reason,
        triton_reason=ops.triton_reason,
        torch_ops_below=ops.AUTO_TORCH_OPS_BELOW,
    )

    def gluon_config(bucket, device, kernel="grad_weights", shape=None):
        # backward._gluon_config_for_bucket where Gluon runs (triton 3.6, sm_90).
        if kernel == "grad_weights":
            g = backward.GLUON_CONFIGS[bucket]
        elif kernel == "grad_x":
            g = backward.GLUON_GRAD_X[bucket]
        else:
            g = backward.shape_choice(backward.GLUON_DSWIGLU, backward.GLUON_DSWIGLU_BY_SHAPE, bucket, shape)
        return g if g is not None and g.smem_bytes() <= shared_memory else None

    @lru_cache(maxsize=None)
    def plan(T, H, I, device, reserved_sms):
        p = backward._make_plan(pT, pH, pI, device, {})
        # The rules _make_plan applies on a CUDA device only (its SM count).
        grad_x = backward.grad_x_config_filling(pT, pH, p.grad_x, sms)
        gluon_grad_x = (
            p.gluon_grad_x if p.gluon_grad_x is not None and backward.grad_x_fills(pT, pH, p.gluon_grad_x, sms) else None
        )
        return replace(p, tokens=T, hidden_size=H, intermediate_size=I, grad_x=grad_x, gluon_grad_x=gluon_grad_x)

    def forward_config_for(tokens, hidden_size=None, intermediate_size=None):
        return real["forward_config_for"](pT, pH, pI)

    def auto_reason(device, dtype=torch.bfloat16, hidden_size=None, intermediate_size=None):
        return None if dtype == torch.bfloat16 else real["auto_reason"](device, dtype, hidden_size, intermediate_size)

    def stub_run(self, *args, grid, warmup, **kwargs):
        return _StubCompiled(args)

    def clear():
        ops._resolve.cache_clear()
        backward._cached_plan.cache_clear()
        launch.clear_launches()

    JITFunction.run = stub_run
    launch.direct_runner = _stub_direct_runner
    backward._gluon_config_for_bucket, backward._cached_plan = gluon_config, plan
    forward.forward_config_for = forward_config_for
    ops.auto_reason, ops.triton_reason = auto_reason, lambda device, hidden_size, intermediate_size: None
    ops.AUTO_TORCH_OPS_BELOW = 0  # the kernels' path at every size: what this measures
    clear()
    try:
        yield
    finally:
        clear()
        JITFunction.run = real["run"]
        launch.direct_runner = real["direct_runner"]
        backward._gluon_config_for_bucket, backward._cached_plan = real["gluon"], real["plan"]
        forward.forward_config_for = real["forward_config_for"]
        ops.auto_reason, ops.triton_reason = real["auto_reason"], real["triton_reason"]
        ops.AUTO_TORCH_OPS_BELOW = real["torch_ops_below"]
        clear()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_calls(device: torch.device, dtype: torch.dtype, H: int, I: int, T: int, stub: bool = False) -> dict:
    """name -> (description, call, reset): ``reset`` runs untimed before each ``call``. ``stub``
    (inside ``stubbed_launches``): x is [1, T, H], the Triton backward row is always there, and
    LlamaMLP's forward-only rows are added."""
    torch.manual_seed(0)
    fused = swiglu.SwiGLUMLP(H, I, device=device, dtype=dtype)
    plain = PlainSwiGLUMLP(H, I, device=device, dtype=dtype)
    plain.load_state_dict(fused.state_dict())
    lead = (1, T) if stub else (T,)
    x = torch.randn(*lead, H, device=device, dtype=dtype, requires_grad=True)
    grad_output = torch.randn(*lead, H, device=device, dtype=dtype)
    inputs = swiglu.make_inputs(1, T, H, I, seed=0, device=device, dtype=dtype).as_tuple()

    def step(module):
        def call():
            module(x).backward(grad_output)

        def reset():
            for p in module.parameters():
                p.grad = None
            x.grad = None

        return call, reset

    def noop():
        pass

    calls = {
        "swiglu_SwiGLUMLP_fwd_bwd": ("swiglu.SwiGLUMLP forward+backward", *step(fused)),
        BASELINE: ("PlainSwiGLUMLP (3x nn.Linear) forward+backward", *step(plain)),
        "backward_reference": (
            'swiglu_mlp_backward(impl="reference")',
            lambda: swiglu.swiglu_mlp_backward(*inputs, impl="reference"),
            noop,
        ),
    }
    if stub or "triton" in swiglu.available_impls(device):
        calls["backward_triton"] = (
            'swiglu_mlp_backward(impl="triton")',
            lambda: swiglu.swiglu_mlp_backward(*inputs, impl="triton"),
            noop,
        )
    try:  # transformers' LlamaMLP, stock and patched by swiglu.integrations.transformers.apply
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP

        from swiglu.integrations import transformers as swiglu_hf
    except ImportError:
        pass
    else:
        config = LlamaConfig(hidden_size=H, intermediate_size=I, num_attention_heads=1, num_key_value_heads=1)
        with torch.device(device):
            stock, patched = LlamaMLP(config).to(dtype), LlamaMLP(config).to(dtype)
        for m in (stock, patched):
            m.load_state_dict(plain.state_dict())
        swiglu_hf.apply(patched)
        calls["hf_LlamaMLP_fwd_bwd"] = ("transformers LlamaMLP forward+backward", *step(stock))
        calls["hf_LlamaMLP_swiglu_fwd_bwd"] = ("LlamaMLP patched by swiglu_hf.apply, forward+backward", *step(patched))
        if stub:  # the forward alone (its graph freed when the output is dropped)
            calls["hf_LlamaMLP_fwd"] = ("transformers LlamaMLP forward", lambda: stock(x), noop)
            calls["hf_LlamaMLP_swiglu_fwd"] = ("LlamaMLP patched by swiglu_hf.apply, forward", lambda: patched(x), noop)
    if device.type == "cuda":
        try:
            from types import SimpleNamespace

            from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
        except ImportError:
            pass
        else:
            with torch.device(device):
                liger = LigerSwiGLUMLP(SimpleNamespace(hidden_size=H, intermediate_size=I, hidden_act="silu")).to(dtype)
            liger.load_state_dict(plain.state_dict())
            calls["liger_fwd_bwd"] = ("liger_kernel LigerSwiGLUMLP forward+backward", *step(liger))
    return calls


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def measure(
    calls: dict, device: torch.device, warmup: int, iters: int, rounds: int, enqueue: bool = False
) -> dict[str, list[float]]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _, call, reset in calls.values():
        for _ in range(warmup):
            reset()
            call()
        sync()
    rounds = max(1, min(rounds, iters))
    blocks = [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]
    samples: dict[str, list[float]] = {name: [] for name in calls}
    try:
        from tqdm import tqdm

        bar = tqdm(total=rounds * len(calls), desc="host overhead", unit="block", disable=None, leave=False)
    except ImportError:
        bar = None
    clock = time.perf_counter_ns
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r, n in enumerate(blocks):
            names = list(calls)
            names = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
            for name in names:
                _, call, reset = calls[name]
                out = samples[name]
                for _ in range(n):
                    reset()
                    if enqueue:
                        sync()
                    start = clock()
                    call()
                    if not enqueue:
                        sync()
                    out.append((clock() - start) / 1000)
                if bar is not None:
                    bar.update()
    finally:
        if was_enabled:
            gc.enable()
        if bar is not None:
            bar.close()
    return samples


def summarize(calls: dict, samples: dict[str, list[float]]) -> list[dict]:
    rows = []
    for name, values in samples.items():
        values = sorted(values)
        rows.append(
            dict(
                implementation=name,
                description=calls[name][0],
                us_median=statistics.median(values),
                us_p20=_percentile(values, 0.2),
                us_p80=_percentile(values, 0.8),
                us_min=values[0],
                calls=len(values),
            )
        )
    base = next(r["us_median"] for r in rows if r["implementation"] == BASELINE)
    for row in rows:
        row["ratio_to_nn_linear"] = row["us_median"] / base
    return rows


IDLE_FIELDS = [
    "tokens",
    "hidden_size",
    "intermediate_size",
    "eager_ms_median",
    "graph_ms_median",
    "idle_ms",
    "eager_ms_p20",
    "eager_ms_p80",
    "graph_ms_p20",
    "graph_ms_p80",
    "iters",
]


def measure_idle(device: torch.device, tokens: list[int], H: int, I: int, iters: int) -> list[dict]:
    """Per T: eager and CUDA-graph-replayed spans of one Triton backward, L2 flushed before each."""
    from swiglu_lab.bench.timing import L2Flusher

    flush = L2Flusher(device)
    rows = []
    for T in tokens:
        args = swiglu.make_inputs(1, T, H, I, seed=0, device=device).as_tuple()

        def call():
            return swiglu.swiglu_mlp_backward(*args, impl="triton")

        for _ in range(3):
            call()
        torch.cuda.synchronize(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            call()  # warm the side stream's allocator pool before capture
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = call()
        spans = {"eager": [], "graph": []}
        for i in range(2 * iters):
            kind = "eager" if i % 2 == 0 else "graph"
            flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if kind == "eager":
                out = call()
            else:
                graph.replay()
            end.record()
            end.synchronize()
            spans[kind].append(start.elapsed_time(end))
            if kind == "eager":
                del out
        del static_out, graph
        args = None  # freed (call closes over it)
        e, g = sorted(spans["eager"]), sorted(spans["graph"])
        rows.append(
            dict(
                tokens=T,
                hidden_size=H,
                intermediate_size=I,
                eager_ms_median=statistics.median(e),
                graph_ms_median=statistics.median(g),
                idle_ms=statistics.median(e) - statistics.median(g),
                eager_ms_p20=_percentile(e, 0.2),
                eager_ms_p80=_percentile(e, 0.8),
                graph_ms_p20=_percentile(g, 0.2),
                graph_ms_p80=_percentile(g, 0.8),
                iters=iters,
            )
        )
        torch.cuda.empty_cache()
    return rows


def profile(
    calls: dict, iters: int, device: torch.device, top: int = 15, names: tuple[str, ...] = ("swiglu_SwiGLUMLP_fwd_bwd", BASELINE)
) -> str:
    """cProfile of each row of ``names`` (default: SwiGLUMLP's forward+backward and the nn.Linear
    block's), ``iters`` calls each, top ``top`` functions by tottime and by cumulative time."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    parts = []
    for name in names:
        description, call, reset = calls[name]
        profiler = cProfile.Profile()
        for _ in range(iters):
            reset()
            sync()  # outside the profile: the GPU queue empty before each call, as in measure
            profiler.enable()
            call()
            profiler.disable()
        for key in ("tottime", "cumulative"):
            stream = io.StringIO()
            pstats.Stats(profiler, stream=stream).sort_stats(key).print_stats(top)
            parts.append(f"===== {description}, {iters} calls, top {top} by {key}\n{stream.getvalue().strip()}")
    return "\n\n".join(parts)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cpu or cuda[:n] (default: cuda when available)")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="tiny: H=256 I=512 T=16; overhead: H=16 I=32 T=2 (default: tiny on CUDA, overhead on CPU)",
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on the CPU (default 1)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls per implementation")
    parser.add_argument("--iters", type=int, default=2000, help="timed calls per implementation")
    parser.add_argument("--rounds", type=int, default=5, help="blocks the timed calls are split into")
    parser.add_argument(
        "--enqueue", action="store_true", help="CUDA: time each call to its return, synchronized after (the host's enqueue time)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also cProfile SwiGLUMLP fwd+bwd and the nn.Linear block's (cprofile.txt)"
    )
    parser.add_argument(
        "--stub-launches",
        action="store_true",
        help="CPU: the Triton path's Python with its launches stubbed, kernels chosen as the H200 "
        "does at --stub-plan (module docstring)",
    )
    parser.add_argument(
        "--stub-plan",
        default=",".join(map(str, STUB_PLAN)),
        help="T,H,I whose kernel choices --stub-launches takes (default: Llama-3-8B at 512 tokens)",
    )
    parser.add_argument("--idle", default="", help="CUDA: token counts for the idle-gap measurement, e.g. 128,2048")
    parser.add_argument("--idle-hidden", type=int, default=16384)
    parser.add_argument("--idle-intermediate", type=int, default=53248)
    parser.add_argument("--idle-iters", type=int, default=20)
    parser.add_argument("--out", default=os.environ.get("OUT") or "build/host_overhead")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--iters and --rounds must be >= 1, --warmup >= 0")
    try:
        args.stub_plan = tuple(int(v) for v in args.stub_plan.split(","))
        if len(args.stub_plan) != 3 or min(args.stub_plan) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--stub-plan takes three positive ints T,H,I, got {args.stub_plan!r}")
    if args.stub_launches and (args.device or "cpu") != "cpu":
        parser.error("--stub-launches runs on the CPU (--device cpu)")
    return args


def main(argv=None) -> dict:
    """Run, write the CSV and JSON, print the table; returns ``{"rows", "csv", "json"}``."""
    args = parse_args(argv)
    device = torch.device(args.device or ("cpu" if args.stub_launches or not torch.cuda.is_available() else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA GPU here")
    shape_name = args.shape or ("tiny" if device.type == "cuda" else "overhead")
    shape = SHAPES[shape_name]
    dtype = DTYPES[args.dtype]
    threads_before = torch.get_num_threads()
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else None)
    if threads is not None:
        torch.set_num_threads(threads)
    stub = stubbed_launches(args.stub_plan) if args.stub_launches else contextlib.nullcontext()
    profiled = (
        ("hf_LlamaMLP_swiglu_fwd_bwd", "hf_LlamaMLP_fwd_bwd") if args.stub_launches else ("swiglu_SwiGLUMLP_fwd_bwd", BASELINE)
    )
    try:
        with stub:
            calls = build_calls(device, dtype, shape["H"], shape["I"], shape["T"], stub=args.stub_launches)
            started = datetime.now(timezone.utc)
            samples = measure(calls, device, args.warmup, args.iters, args.rounds, args.enqueue and device.type == "cuda")
            rows = summarize(calls, samples)
            profile_text = (
                profile(
                    calls,
                    args.iters,
                    device,
                    top=25 if args.stub_launches else 15,
                    names=tuple(n for n in profiled if n in calls),
                )
                if args.profile
                else None
            )
        idle_tokens = [int(t) for t in args.idle.split(",") if t.strip()]
        idle_rows = (
            measure_idle(device, idle_tokens, args.idle_hidden, args.idle_intermediate, args.idle_iters)
            if idle_tokens and device.type == "cuda"
            else []
        )
    finally:
        torch.set_num_threads(threads_before)

    meta = dict(
        script="scripts/host_overhead.py",
        date_utc=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        device=str(device),
        device_name=device_name(device),
        torch=torch.__version__,
        triton=dist_version("triton"),
        python=platform.python_version(),
        swiglu=swiglu.__version__,
        git_commit=git_info()["commit"],
        platform=platform.platform(),
        shape=dict(name=shape_name, **shape),
        dtype=args.dtype,
        enqueue=bool(args.enqueue and device.type == "cuda"),
        warmup=args.warmup,
        iters=args.iters,
        rounds=args.rounds,
        torch_threads=torch.get_num_threads() if threads is None else threads,
        triton_interpret=os.environ.get("TRITON_INTERPRET"),
        auto_backend_reason="stubbed: 'auto' took the Triton path (stub_launches)"
        if args.stub_launches
        else swiglu.backend_reason(device, dtype),
        stub_launches=dict(
            plan_shape=dict(zip("THI", args.stub_plan)),
            sms=H200_SMS,
            shared_memory_per_block=H200_SHARED_MEMORY,
            x_shape=[1, shape["T"], shape["H"]],
            note="host-only microseconds on this CPU, kernel launches stubbed: not GPU-machine times",
        )
        if args.stub_launches
        else None,
        implementations=list(calls),
        baseline=BASELINE,
        protocol=__doc__.split("Protocol: ", 1)[1].split("\n\n")[0].replace("\n", " "),
    )
    if device.type == "cuda":
        meta["nvml"] = nvml_info(device)
        meta["cuda"] = torch.version.cuda

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out / "host_overhead.csv", out / "host_overhead.json"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    json_path.write_text(json.dumps(meta, indent=2) + "\n")
    if idle_rows:
        with open(out / "idle_gap.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=IDLE_FIELDS)
            writer.writeheader()
            writer.writerows(idle_rows)

    if profile_text is not None:
        print(profile_text)
        (out / "cprofile.txt").write_text(profile_text + "\n")
    print(
        f"\nhost overhead per call, {meta['device_name']} ({device}), {shape_name} H={shape['H']} "
        f"I={shape['I']} T={shape['T']} {args.dtype}, threads {meta['torch_threads']}, "
        f"median of {args.iters} (warm-up {args.warmup})"
        f"{', enqueue time (no synchronize inside the clock)' if meta['enqueue'] else ''}; torch {torch.__version__}, commit {meta['git_commit']}"
        f"{'; launches stubbed, kernels as the H200 picks at T,H,I = ' + args.stub_plan.__str__() if args.stub_launches else ''}\n"
    )
    width = max(len(r["implementation"]) for r in rows)
    print(f"{'implementation':<{width}}  {'us median':>10}  {'p20-p80':>17}  {'x nn.Linear':>11}")
    for r in rows:
        print(
            f"{r['implementation']:<{width}}  {r['us_median']:>10.1f}  "
            f"{r['us_p20']:>8.1f}-{r['us_p80']:<8.1f}  {r['ratio_to_nn_linear']:>10.2f}x"
        )
    by_name = {r["implementation"]: r["us_median"] for r in rows}
    for patched, stock in (("hf_LlamaMLP_swiglu_fwd_bwd", "hf_LlamaMLP_fwd_bwd"), ("hf_LlamaMLP_swiglu_fwd", "hf_LlamaMLP_fwd")):
        if patched in by_name and stock in by_name:
            print(
                f"{patched} against {stock}: {by_name[patched] - by_name[stock]:+.1f} us "
                f"({by_name[patched] / by_name[stock]:.2f}x)"
            )
    if idle_rows:
        print("\nidle GPU time per backward (eager minus CUDA-graph replay, L2 flushed, medians, ms):")
        for r in idle_rows:
            print(
                f"  T={r['tokens']:>5}  eager {r['eager_ms_median']:.3f}  graph {r['graph_ms_median']:.3f}  "
                f"idle {r['idle_ms']:.3f}"
            )
    print(f"\nCSV: {csv_path}\nJSON: {json_path}")
    return dict(rows=rows, csv=csv_path, json=json_path)


if __name__ == "__main__":
    main()
