"""Tensor-parallel checks and timings: ``torchrun --nproc-per-node N -m swiglu_lab.bench --tp N``.

One process per GPU, one NCCL process group (gloo with ``--device cpu``), a 1-D mesh of N ranks;
``make bench-tp TP=2``. Every rank holds the whole inputs (same seed) and takes its shard: gate/up
weights rows, down weight columns and the [T, I] activations' columns of local I = I/N.

Parts (``--parts``, in this order; each writes its rows as soon as it ends):

* ``check``: per case at full size, the sharded backward through DTensor (``swiglu::mlp_backward``
  on each rank's shard, grad_x all-reduced) gathered and checked with the benchmark's criterion
  against the single-GPU bf16 reference (``swiglu.reference_backward``), run twice (bitwise
  equal), and the weight-gradient shards compared bit for bit with the single-GPU Triton backward.
* ``train``: 3 SGD steps of ``swiglu.parallelize(SwiGLUMLP)`` against the unsharded
  ``PlainSwiGLUMLP`` (and the unsharded ``SwiGLUMLP`` as the yardstick of bf16 noise).
* ``timing``: per case (swiglu_lab.bench protocol: warm-ups, median of CUDA-event times, L2 flushed
  before every iteration, 2 alternating input sets; ranks aligned by a 1-element all-reduce before
  each iteration; an iteration's time is the slowest rank's): ``ours_local_compute`` (our backward
  on the shard, no communication), ``tp_ours`` (the DTensor op path: compute + grad_x all-reduce),
  ``tp_allreduce`` (the collective alone), ``tp_ours_module`` / ``tp_plain_module`` (backward of
  the parallelized ``SwiGLUMLP`` / ``PlainSwiGLUMLP``, forward untimed; real-forward activations).
* ``model``: ``ours_local_compute`` at local I = I (one GPU, the whole MLP), I/4 and I/8 on every
  rank's own GPU (the scaling model's inputs, ``swiglu_lab.bench.tp_model``).
* ``overlap``: ``tp_serial`` (backward, then all-reduce), ``tp_early`` (grad_x first, its
  all-reduce issued async on NCCL's stream while the weight-gradient kernels run) and
  ``tp_early_reserve<k>`` (the same with the weight-gradient kernels leaving k SMs to NCCL:
  ``swiglu.kernels.devices.RESERVED_SMS``); under sequence parallelism ``tp_sp_serial`` (grad_x,
  then one reduce-scatter) and ``tp_sp_chunks<k>`` (grad_x in k row chunks per rank block, each
  reduced to its rank while the next computes: ``sp_backward``); every variant checked bitwise
  against its serial path. NCCL channel limits: run again with ``--nccl-max-channels``.
* ``timeline``: one ``torch.profiler`` trace per case and variant of the overlap part on every
  rank, the kernels' start and end on the host's clock, aligned (``swiglu_lab.bench.timeline``):
  where the exposed communication goes, rank by rank (``tp_<run_id>_timeline.csv``).

Outputs (rank 0, ``--out``, default data/tp): ``tp_<run_id>.csv`` (timings, one row per case x
impl x local I), ``tp_<run_id>_check.csv`` (correctness per case x output), ``tp_<run_id>.json``
(metadata: GPU count, ``nvidia-smi topo -m``, NCCL version and env, torch/triton, commit from
SWIGLU_GIT_COMMIT, protocol, train results, summary). The last lines printed are a short table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

import swiglu
import swiglu.parallel  # noqa: F401 - registers the sharding strategies
from swiglu.accuracy import benchmark_criterion, relative_error
from swiglu.api import swiglu_mlp_backward
from swiglu.inputs import BENCHMARK_SEED, make_inputs
from swiglu.module import PlainSwiGLUMLP
from swiglu.ops import mlp_backward
from swiglu.parallel import check_shardable
from swiglu.reference import reference_backward
from swiglu.workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE, select_cases

from . import environment, tp_model
from .runner import OUTPUT_NAMES, PROTOCOLS
from .stats import time_stats
from .timing import L2Flusher

PARTS = ("check", "train", "timing", "model", "overlap", "timeline")
CPU_SHAPE = (64, 128)  # --device cpu: tiny, I/8 = 16 stays a multiple of 8
CPU_CASES = "s128_b1,s256_b2"
TIMING_COLUMNS = (
    "run_id",
    "case",
    "seq_len",
    "batch_size",
    "tokens",
    "hidden_size",
    "intermediate_size",
    "tp",
    "local_intermediate_size",
    "impl",
    "protocol",
    "warmup",
    "iters",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "mean_ms",
    "min_ms",
    "note",
)


def launch_mlp_grad_weights(d_gate, d_up, h, x, go, grad_gate_weight, grad_up_weight, grad_down_weight, c, g=None) -> None:
    """The MLP's three weight gradients, each by ``swiglu.kernels.backward.launch_grad_weight_gluon_or_tl``
    (the tuner and the tensor-parallel benchmark time them alone): grad_down_weight = go.T @ h,
    grad_gate_weight = d_gate.T @ x, grad_up_weight = d_up.T @ x (a None output is skipped; its
    input may then be None too); ``c`` a KernelConfig, the Gluon kernel when ``g`` (a GluonConfig) is given."""
    from swiglu.kernels.backward import launch_grad_weight_gluon_or_tl

    for a, b, out in ((go, h, grad_down_weight), (d_gate, x, grad_gate_weight), (d_up, x, grad_up_weight)):
        if out is not None:
            launch_grad_weight_gluon_or_tl(a, b, out, c, g)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``torchrun ... -m swiglu_lab.bench --tp N`` (``--help`` lists it)."""
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m swiglu_lab.bench --tp N", description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel size: must equal torchrun's world size")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {','.join(PARTS)} (default: all)")
    p.add_argument("--cases", default=None, help="case names / token counts (default: all 18; CPU: %s)" % CPU_CASES)
    p.add_argument("--out", default="data/tp", help="output folder (default data/tp)")
    p.add_argument("--quick", action="store_true", help=f"{PROTOCOLS['quick']} warm-ups/iterations (not the protocol)")
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: gloo, tiny shapes, Triton interpreter (checks the script, says nothing about speed)",
    )
    p.add_argument("--hidden-size", type=int, default=None)
    p.add_argument("--intermediate-size", type=int, default=None)
    p.add_argument("--reserve-sms", default="8,16,32", help="overlap part: SMs left to NCCL (comma-separated)")
    p.add_argument(
        "--sp-chunks",
        default="2,4",
        help="overlap part: row chunks of the sequence-parallel grad_x per rank block (comma-separated; "
        "empty: no sequence-parallel rows)",
    )
    p.add_argument(
        "--nccl-max-channels",
        type=int,
        default=None,
        help="sets NCCL_MAX_NCHANNELS (and NCCL_MIN_NCHANNELS to 1) before NCCL starts",
    )
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=BENCHMARK_SEED)
    return p


# ----------------------------------------------------------------------------------------- setup
def init(args) -> tuple:
    """Environment (before NCCL or Triton start), process group, device and 1-D mesh."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast on the lent machines
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if args.nccl_max_channels:
        os.environ["NCCL_MAX_NCHANNELS"] = str(args.nccl_max_channels)
        os.environ.setdefault("NCCL_MIN_NCHANNELS", "1")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # our kernels on the CPU (before swiglu.kernels.backward)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise SystemExit(
                f"{name} is not set: start with `torchrun --nproc-per-node {args.tp} -m swiglu_lab.bench --tp {args.tp}`"
            )
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timedelta(minutes=5), device_id=device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ["WORLD_SIZE"])))
        dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    if dist.get_world_size() != args.tp:
        raise SystemExit(f"--tp {args.tp} but the world size is {dist.get_world_size()}")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (args.tp,), mesh_dim_names=("tp",))["tp"]
    return device, mesh


def log(*parts) -> None:
    """Print on rank 0 only (every rank runs the same script)."""
    if dist.get_rank() == 0:
        print(*parts, flush=True)


def metadata(args, device, H, I, cases, protocol) -> dict:
    """Run metadata (rank 0): GPUs, interconnect, NCCL, versions, git, protocol."""
    topo = None
    if device.type == "cuda":
        try:
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            topo = f"unavailable: {exc}"
    warmup, iters = PROTOCOLS[protocol]
    git = environment.git_info()
    return {
        "kind": "tensor-parallel",
        "utc": environment.utc_now().strftime(environment.UTC_FORMAT),
        "git_commit": git["commit"],
        "git": git,
        "tp": args.tp,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "gpu_count": torch.cuda.device_count() if device.type == "cuda" else 0,
        "gpu": environment.gpu_info(device),
        "nvidia_smi_topo": topo,
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_SYMM", "TORCH_NCCL"))},
        "software": environment.software_info(),
        "shape": {"hidden_size": H, "intermediate_size": I, "local_intermediate_size": I // args.tp},
        "cases": [c.name for c in cases],
        "parts": args.parts.split(","),
        "protocol": {
            "name": protocol,
            "warmup": warmup,
            "iters": iters,
            "statistic": "median of per-iteration max over ranks",
            "timer": "CUDA events on the current stream" if device.type == "cuda" else "host wall clock",
            "l2_flush": "2 x L2 zeroed before every iteration on every rank" if device.type == "cuda" else "none",
            "rank_alignment": "1-element all-reduce before each iteration (outside the timed span)",
            "input_sets": "2 alternating (benchmark-mode inputs; modules: real forward)",
        },
        "command": "torchrun -m swiglu_lab.bench " + " ".join(sys.argv[1:]),
    }


# ----------------------------------------------------------------------------------------- sharding
def same_everywhere(tensors, group=None):
    """Broadcast ``tensors`` from rank 0 in place (every rank drew them from the same seed, but a
    replicated input must be bitwise the same everywhere for the sums to be right); returns them."""
    for t in tensors:
        dist.broadcast(t, src=0, group=group)
    return tensors


def shard(inputs: tuple, rank: int, tp: int) -> tuple:
    """This rank's local backward inputs (contiguous): grad_output and x whole; the [.., I]
    activations' and the weights' slice of I."""
    go, x, gate, up, act, gw, uw, dw = inputs
    n = gw.shape[0] // tp
    s = slice(rank * n, (rank + 1) * n)
    return (
        go,
        x,
        gate[..., s].contiguous(),
        up[..., s].contiguous(),
        act[..., s].contiguous(),
        gw[s].contiguous(),
        uw[s].contiguous(),
        dw[:, s].contiguous(),
    )


def tp_backward(local: tuple, mesh, impl: str) -> tuple:
    """The sharded backward as a parallelized SwiGLUMLP runs it: ``swiglu::mlp_backward`` on
    DTensors (our backward on the local shard), grad_x (Partial) all-reduced to Replicate.
    Returns DTensors: grad_x replicated, weight gradients sharded like the weights."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    go, x, gate, up, act, gw, uw, dw = local
    last = x.dim() - 1
    layouts = [Replicate(), Replicate(), Shard(last), Shard(last), Shard(last), Shard(0), Shard(0), Shard(1)]
    dts = [DTensor.from_local(t, mesh, [p], run_check=False) for t, p in zip(local, layouts)]
    grad_x, ggw, guw, gdw = mlp_backward(*dts, True, True, True, True, impl)
    return grad_x.redistribute(mesh, [Replicate()]), ggw, guw, gdw


class _LocalBackward:
    """This rank's backward on its shard, in the pieces the overlap variants rearrange: built, it
    has run dSwiGLU (``d_gate``, ``d_up``, ``h``) and allocated ``grad_x`` [T, H] unwritten; the
    caller launches grad_x its own way, then ``weight_gradients()``. Configs from the table at T."""

    def __init__(self, local: tuple):
        from swiglu.kernels import backward as tb

        self.tb = tb
        go, x, gate, up, act, gw, uw, dw = (t.reshape(-1, t.shape[-1]) for t in local)
        T, H = go.shape
        I = gw.shape[0]
        self.go, self.x, self.gw, self.uw, self.I, self.H = go, x, gw, uw, I, H
        cfg_d, self.cfg_w, self.cfg_x = (tb.config_for(k, T) for k in ("dswiglu", "grad_weights", "grad_x"))
        self.d_gate, self.d_up, self.h = (torch.empty((T, I), device=go.device, dtype=torch.bfloat16) for _ in range(3))
        tb.launch_dswiglu(go, dw, gate, up, act, self.d_gate, self.d_up, self.h, cfg_d)
        self.grad_x = torch.empty((T, H), device=go.device, dtype=torch.bfloat16)

    def weight_gradients(self) -> tuple:
        """``(grad_gate_weight, grad_up_weight, grad_down_weight)`` of the shard, launched now."""
        dev, I, H = self.go.device, self.I, self.H
        ggw, guw = (torch.empty((I, H), device=dev, dtype=torch.bfloat16) for _ in range(2))
        gdw = torch.empty((H, I), device=dev, dtype=torch.bfloat16)
        launch_mlp_grad_weights(self.d_gate, self.d_up, self.h, self.x, self.go, ggw, guw, gdw, self.cfg_w)
        return ggw, guw, gdw


def overlapped_backward(local: tuple, group, reserve_sms: int | None) -> tuple:
    """Our backward with grad_x's all-reduce started as soon as grad_x exists (async on NCCL's
    stream) while the weight-gradient kernels run; ``reserve_sms`` k leaves k SMs idle in those
    kernels (None: ``serial``, the all-reduce after everything). Returns local tensors."""
    from swiglu.kernels import backward as tb, devices

    step = _LocalBackward(local)
    tb.launch_grad_x(step.d_gate, step.d_up, step.gw, step.uw, step.grad_x, step.cfg_x)
    grad_x = step.grad_x
    work = dist.all_reduce(grad_x, group=group, async_op=True) if reserve_sms is not None else None
    old = devices.RESERVED_SMS
    devices.RESERVED_SMS = reserve_sms or 0
    try:
        ggw, guw, gdw = step.weight_gradients()
    finally:
        devices.RESERVED_SMS = old
    if work is None:
        dist.all_reduce(grad_x, group=group)
    else:
        work.wait()  # the current stream waits for NCCL's before anything reads grad_x
    return grad_x.reshape(local[1].shape), ggw, guw, gdw


def sp_backward(local: tuple, group, chunks: int | None) -> tuple:
    """Our backward under sequence parallelism, grad_x reduce-scattered along the tokens (rank r
    keeps rows r*T/N .. (r+1)*T/N of the gathered sequence); ``local`` as ``shard`` gives it (x and
    grad_output gathered, the rest this rank's I shard). ``chunks`` None: grad_x whole, then one
    ``reduce_scatter_tensor`` (the serial reference). ``chunks`` k: each rank's block of grad_x in
    k row chunks, computed in order, each reduced (``dist.reduce``, async) to the rank that keeps
    it as soon as its GEMM is enqueued while the next chunk computes; the weight-gradient kernels
    after the last chunk overlap the last reductions. Every chunk runs the serial T's grad_x
    config, so each row has the same tiles and K order, and each element the same sum (at TP = 2:
    a + b either way): bitwise the serial path's. Returns local tensors: this rank's grad_x rows
    and its weight-gradient shards."""
    from swiglu.kernels import backward as tb

    n, rank = dist.get_world_size(group), dist.get_rank(group)
    T = local[1].numel() // local[1].shape[-1]
    if T % n:
        raise ValueError(f"sequence parallelism over {n} ranks needs tokens divisible by {n}, got {T}")
    rows = T // n
    step = _LocalBackward(local)
    d_gate, d_up, gw, uw, grad_x = step.d_gate, step.d_up, step.gw, step.uw, step.grad_x
    works = []
    if chunks is None:
        tb.launch_grad_x(d_gate, d_up, gw, uw, grad_x, step.cfg_x)
        mine = grad_x.new_empty((rows, grad_x.shape[1]))
        dist.reduce_scatter_tensor(mine, grad_x, group=group)
    else:
        cuts = [rows * j // chunks for j in range(chunks + 1)]
        for owner in range(n):
            for lo, hi in zip(cuts, cuts[1:]):
                part = slice(owner * rows + lo, owner * rows + hi)
                if hi > lo:
                    tb.launch_grad_x(d_gate[part], d_up[part], gw, uw, grad_x[part], step.cfg_x)
                    works.append(dist.reduce(grad_x[part], dst=dist.get_global_rank(group, owner), group=group, async_op=True))
        mine = grad_x[rank * rows : (rank + 1) * rows]
    ggw, guw, gdw = step.weight_gradients()
    for work in works:
        work.wait()  # the current stream waits for the reductions before anything reads grad_x
    return mine, ggw, guw, gdw


# ----------------------------------------------------------------------------------------- timing
def settle(obj) -> None:
    """Make the current stream wait for every collective whose result is in ``obj`` (tensors,
    DTensors, tuples): DTensor's functional collectives are waited for lazily, at the result's
    first use, so without this a timed span could end before its all-reduce does."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor

    if isinstance(obj, (tuple, list)):
        for o in obj:
            settle(o)
    elif isinstance(obj, DTensor):
        settle(obj._local_tensor)
    elif isinstance(obj, AsyncCollectiveTensor):
        obj.wait()


class Timer:
    """Per-iteration times of ``fn(*make_args())`` on every rank; an iteration's time is the
    slowest rank's (all ranks get the same list). Collectives in fn's result are waited for
    inside the timed span (``settle``)."""

    def __init__(self, device, mesh):
        self.device, self.group = device, mesh.get_group()
        self.flush = L2Flusher(device)
        self.token = torch.zeros(1, device=device)

    def _align(self):
        dist.all_reduce(self.token, group=self.group)

    def __call__(self, fn, make_args, warmup: int, iters: int) -> list[float]:
        cuda = self.device.type == "cuda"
        times = []
        events = []
        for i in range(warmup + iters):
            args = make_args()
            self.flush()
            self._align()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn(*args)
                settle(out)
                end.record()
                if i >= warmup:
                    events.append((start, end))
            else:
                t0 = time.perf_counter()
                out = fn(*args)
                settle(out)
                if i >= warmup:
                    times.append((time.perf_counter() - t0) * 1e3)
            del out, args
        if cuda:
            torch.cuda.synchronize(self.device)
            times = [s.elapsed_time(e) for s, e in events]
        mine = torch.tensor(times, dtype=torch.float64, device=self.token.device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=self.group)
        return mine.tolist()


def _row(case, H, I, tp, local_i, impl, protocol, times, note=""):
    warmup, iters = PROTOCOLS[protocol]
    stats = time_stats(times) if times else {k: math.nan for k in ("median_ms", "p20_ms", "p80_ms", "mean_ms", "min_ms")}
    return dict(
        case=case.name,
        seq_len=case.seq_len,
        batch_size=case.batch_size,
        tokens=case.tokens,
        hidden_size=H,
        intermediate_size=I,
        tp=tp,
        local_intermediate_size=local_i,
        impl=impl,
        protocol=protocol,
        warmup=warmup,
        iters=iters,
        **stats,
        note=note,
    )


def _timed(rows, timer, case, H, I, tp, local_i, impl, protocol, fn, make_args):
    warmup, iters = PROTOCOLS[protocol]
    note = ""
    try:
        times = timer(fn, make_args, warmup, iters)
    except Exception as exc:  # noqa: BLE001 - one failing variant must not end the run
        times, note = [], f"ERROR: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    rows.append(_row(case, H, I, tp, local_i, impl, protocol, times, note))
    r = rows[-1]
    log(f"  {case.name:>9} {impl:<22} I_local={local_i:<6} median {r['median_ms']:9.3f} ms {note}")


def _cleanup(device):
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------- parts
def part_check(cases, H, I, device, mesh, impl, seed) -> list[dict]:
    """Correctness per case (module docstring); rows for rank 0's check CSV."""
    from swiglu.kernels.backward import triton_swiglu_backward

    rank, tp, rows = mesh.get_local_rank(), mesh.size(), []
    for case in cases:
        inputs = same_everywhere(make_inputs(case.batch_size, case.seq_len, H, I, seed=seed, device=device).as_tuple())
        local = shard(inputs, rank, tp)
        first = tp_backward(local, mesh, impl)
        again = tp_backward(local, mesh, impl)
        bitwise = torch.tensor([int(all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(first, again)))], device=device)
        del again
        single = triton_swiglu_backward(*local)  # our backward on this shard alone
        same_w = torch.tensor([int(all(torch.equal(a.to_local(), b) for a, b in zip(first[1:], single[1:])))], device=device)
        del single
        dist.all_reduce(bitwise, op=dist.ReduceOp.MIN)
        dist.all_reduce(same_w, op=dist.ReduceOp.MIN)
        gathered = [g.full_tensor() for g in first]
        del first
        if rank == 0:
            ref = reference_backward(*inputs)
            for name, out, want in zip(OUTPUT_NAMES, gathered, ref):
                res = benchmark_criterion(out, want, case.atol, case.rtol)
                rows.append(
                    dict(
                        case=case.name,
                        tokens=case.tokens,
                        output=name,
                        passed=res.passed,
                        match_fraction=res.match_fraction,
                        nonfinite=res.nonfinite,
                        max_abs_error=res.max_abs_error,
                        rel_err_vs_reference=relative_error(out, want),
                        bitwise_repeatable=bool(bitwise.item()),
                        weight_shards_equal_one_gpu_triton=bool(same_w.item()) if name != "grad_x" else None,
                    )
                )
            log(
                f"  check {case.name:>9}: "
                + ", ".join(f"{r['output']} {'ok' if r['passed'] else 'FAIL'} ({r['match_fraction']:.4f})" for r in rows[-4:])
                + f"; bitwise repeatable {bool(bitwise.item())}; weight shards == one-GPU Triton {bool(same_w.item())}"
            )
            del ref
        del gathered, inputs, local
        _cleanup(device)
    return rows


def part_train(H, I, device, mesh, steps, seed) -> dict:
    """SGD steps of the parallelized SwiGLUMLP against the unsharded PlainSwiGLUMLP (rank 0 holds
    it) and the unsharded SwiGLUMLP (the bf16 noise yardstick). Same weights, inputs, lr."""

    rank = mesh.get_local_rank()
    dtype, tokens = torch.bfloat16, (4, 256) if device.type == "cuda" else (2, 8)
    torch.manual_seed(seed)
    plain = PlainSwiGLUMLP(H, I, device=device, dtype=dtype)
    with torch.no_grad():
        for p in plain.parameters():  # the benchmark's weight scale
            p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    start = {k: v.clone() for k, v in plain.state_dict().items()}
    tp = swiglu.SwiGLUMLP(H, I, device=device, dtype=dtype)
    tp.load_state_dict(start)
    swiglu.parallelize(tp, mesh)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    batches = [
        tuple(same_everywhere([torch.randn(*tokens, H, generator=gen, device=device, dtype=dtype) for _ in range(2)]))
        for _ in range(steps)
    ]

    def train(module):
        lr = 0.05  # relative update ~ lr * |grad| / |w|: several bf16 ulps per step
        opt = torch.optim.SGD(module.parameters(), lr=lr)
        losses = []
        for x, target in batches:
            loss = (module(x).float() - target.float()).pow(2).sum() / x[..., 0].numel()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses

    losses_tp = train(tp)
    tp_state = {k: v.full_tensor() for k, v in tp.state_dict().items()}
    del tp
    result = {}
    if rank == 0:
        single = swiglu.SwiGLUMLP(H, I, device=device, dtype=dtype)
        single.load_state_dict(start)
        losses_single, losses_plain = train(single), train(plain)
        result = {
            "steps": steps,
            "tokens": list(tokens),
            "losses_tp": losses_tp,
            "losses_plain": losses_plain,
            "losses_single_gpu_ours": losses_single,
            "params": {},
        }
        for name, w_plain in plain.state_dict().items():
            update = relative_error(w_plain, start[name])
            d_tp = relative_error(tp_state[name], w_plain) / update
            d_single = relative_error(single.state_dict()[name], w_plain) / update
            result["params"][name] = {
                "update_rel": update,
                "tp_vs_plain_over_update": d_tp,
                "single_vs_plain_over_update": d_single,
            }
        loss_dev = max(abs(a - b) / abs(b) for a, b in zip(losses_tp, losses_plain))
        worst = max(v["tp_vs_plain_over_update"] for v in result["params"].values())
        yard = max(v["single_vs_plain_over_update"] for v in result["params"].values())
        result.update(
            max_loss_rel_dev=loss_dev,
            worst_tp_vs_plain=worst,
            worst_single_vs_plain=yard,
            passed=bool(loss_dev < 1e-2 and worst <= max(2 * yard, 0.05)),
            rule="loss within 1% of the plain module each step, and every weight's distance to the "
            "plain module's (relative to its update) <= max(2 x the one-GPU SwiGLUMLP's, 0.05)",
        )
        log(
            f"  train: {steps} SGD steps, loss dev {loss_dev:.2e}, weights tp-vs-plain {worst:.3f} of the update "
            f"(one-GPU ours {yard:.3f}) -> {'ok' if result['passed'] else 'FAIL'}"
        )
        del single
    del plain, tp_state, start
    _cleanup(device)
    return result


def _sets(inputs: tuple) -> list[tuple]:
    return [inputs, tuple(t.clone() for t in inputs)]


def _cycle(sets):
    state = {"i": 0}

    def make():
        state["i"] += 1
        return sets[state["i"] % len(sets)]

    return make


def part_timing(cases, H, I, device, mesh, impl, protocol, seed, rows) -> None:
    """The ``timing`` part (module docstring): appends one row per case x impl to ``rows``
    (median ms, slowest rank per iteration)."""

    rank, tp = mesh.get_local_rank(), mesh.size()
    timer = Timer(device, mesh)
    torch.manual_seed(seed)
    plain = PlainSwiGLUMLP(H, I, device=device, dtype=torch.bfloat16)
    ours = swiglu.SwiGLUMLP(H, I, device=device, dtype=torch.bfloat16, impl=impl)
    ours.load_state_dict(plain.state_dict())
    swiglu.parallelize(plain, mesh)
    swiglu.parallelize(ours, mesh)
    for case in cases:
        inputs = same_everywhere(make_inputs(case.batch_size, case.seq_len, H, I, seed=seed, device=device).as_tuple())
        sets = _sets(shard(inputs, rank, tp))
        del inputs
        common = (case, H, I, tp, I // tp)
        _timed(rows, timer, *common, "ours_local_compute", protocol, lambda *a: swiglu_mlp_backward(*a, impl=impl), _cycle(sets))
        _timed(rows, timer, *common, "tp_ours", protocol, lambda *a: tp_backward(a, mesh, impl), _cycle(sets))
        bufs = [torch.randn(case.tokens, H, device=device, dtype=torch.bfloat16) for _ in range(2)]
        work = [torch.empty_like(b) for b in bufs]
        k = {"i": 0}

        def fresh():
            k["i"] += 1
            return (work[k["i"] % 2].copy_(bufs[k["i"] % 2]),)

        _timed(rows, timer, *common, "tp_allreduce", protocol, lambda b: dist.all_reduce(b, group=mesh.get_group()), fresh)
        sets = bufs = work = None  # freed (fresh and the lambdas above close over them)
        gen = torch.Generator(device=device).manual_seed(seed)  # same x and grad_output on every rank
        shape = (case.batch_size, case.seq_len, H)
        x = same_everywhere([torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16) for _ in range(2)])
        x = [t.requires_grad_() for t in x]
        go = same_everywhere([torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)])[0]
        for name, module in (("tp_ours_module", ours), ("tp_plain_module", plain)):
            j = {"i": 0}

            def forward():  # untimed: the forward that builds the graph
                j["i"] += 1
                for p in module.parameters():
                    p.grad = None
                xi = x[j["i"] % 2]
                xi.grad = None
                out = module(xi)
                settle(out)  # the forward's all-reduce ends before the timed backward starts
                return out, go, xi

            def backward(out, g, xi):
                out.backward(g)
                return xi.grad  # settled by the timer: its all-reduce counts

            _timed(rows, timer, *common, name, protocol, backward, forward)
        x = go = None  # freed (forward closes over them)
        _cleanup(device)
    del plain, ours
    _cleanup(device)


def part_model(cases, H, I, device, mesh, impl, protocol, seed, rows) -> None:
    """The ``model`` part: our one-GPU backward at local I = I, I/4 and I/8 per case (the scaling
    model's inputs, ``swiglu_lab.bench.tp_model``), appended to ``rows``."""

    tp = mesh.size()
    timer = Timer(device, mesh)
    sizes = [n for n in (1, 4, 8) if n != tp and I % n == 0]
    for case in cases:
        for n in sizes:
            sets = _sets(make_inputs(case.batch_size, case.seq_len, H, I // n, seed=seed, device=device).as_tuple())
            _timed(
                rows,
                timer,
                case,
                H,
                I,
                tp,
                I // n,
                "ours_local_compute",
                protocol,
                lambda *a: swiglu_mlp_backward(*a, impl=impl),
                _cycle(sets),
            )
            del sets
            _cleanup(device)


def part_overlap(cases, H, I, device, mesh, protocol, seed, reserves, rows, sp_chunks=()) -> None:
    """The ``overlap`` part: ``tp_serial``, ``tp_early`` and ``tp_early_reserve<k>`` for k in
    ``reserves`` per case, each checked bitwise against ``tp_serial``; then, under sequence
    parallelism, ``tp_sp_serial`` and ``tp_sp_chunks<k>`` for k in ``sp_chunks`` (``sp_backward``),
    each checked bitwise against ``tp_sp_serial``; appended to ``rows``."""
    rank, tp, group = mesh.get_local_rank(), mesh.size(), mesh.get_group()
    timer = Timer(device, mesh)
    variants = [("tp_serial", "tp_serial", lambda a: overlapped_backward(a, group, None))]
    variants += [("tp_early", "tp_serial", lambda a: overlapped_backward(a, group, 0))]
    variants += [(f"tp_early_reserve{k}", "tp_serial", lambda a, k=k: overlapped_backward(a, group, k)) for k in reserves]
    if sp_chunks:
        variants += [("tp_sp_serial", "tp_sp_serial", lambda a: sp_backward(a, group, None))]
        variants += [(f"tp_sp_chunks{k}", "tp_sp_serial", lambda a, k=k: sp_backward(a, group, k)) for k in sp_chunks]
    for case in cases:
        inputs = same_everywhere(make_inputs(case.batch_size, case.seq_len, H, I, seed=seed, device=device).as_tuple())
        sets = _sets(shard(inputs, rank, tp))
        del inputs
        baselines = {}
        for name, baseline, fn in variants:
            if name == baseline:
                baselines[name] = [t.clone() for t in fn(sets[0])]
            _timed(rows, timer, case, H, I, tp, I // tp, name, protocol, lambda *a, fn=fn: fn(a), _cycle(sets))
            got = fn(sets[0])
            same = torch.tensor([int(all(torch.equal(a, b) for a, b in zip(got, baselines[baseline])))], device=device)
            dist.all_reduce(same, op=dist.ReduceOp.MIN)
            note = f"bitwise equal to {baseline}: {bool(same.item())}"
            rows[-1]["note"] = (rows[-1]["note"] + "; " if rows[-1]["note"] else "") + note
            del got
        del sets, baselines
        _cleanup(device)


def part_timeline(cases, H, I, device, mesh, seed, reserve, sp_chunks) -> list[dict]:
    """The ``timeline`` part: per case, one profiled backward of ``tp_serial``, ``tp_early`` (with
    ``reserve`` SMs left to NCCL), ``tp_sp_serial`` and ``tp_sp_chunks<k>`` on every rank after two
    warm-ups, the ranks aligned by a barrier and a 1-element all-reduce first; the kernels each
    rank ran (``timeline.profiler_events``: the device's kernels on a GPU, top-level ops on a CPU)
    gathered on rank 0 as rows of ``timeline.TIMELINE_COLUMNS``, times aligned per backward."""
    from torch.profiler import ProfilerActivity, profile

    from . import timeline

    rank, tp, group = mesh.get_local_rank(), mesh.size(), mesh.get_group()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    variants = [
        ("tp_serial", lambda a: overlapped_backward(a, group, None)),
        ("tp_early", lambda a: overlapped_backward(a, group, reserve)),
    ]
    if sp_chunks:
        variants += [("tp_sp_serial", lambda a: sp_backward(a, group, None))]
        variants += [(f"tp_sp_chunks{k}", lambda a, k=k: sp_backward(a, group, k)) for k in sp_chunks]
    mine = []
    for case in cases:
        inputs = same_everywhere(make_inputs(case.batch_size, case.seq_len, H, I, seed=seed, device=device).as_tuple())
        local = shard(inputs, rank, tp)
        del inputs
        for name, fn in variants:
            for _ in range(2):
                fn(local)
            ping = torch.ones(1, device=device)
            dist.barrier()
            dist.all_reduce(ping, group=group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            with profile(activities=activities) as prof:
                fn(local)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            mine += [
                dict(
                    case=case.name,
                    tokens=case.tokens,
                    variant=name,
                    rank=rank,
                    name=e["name"],
                    kind=timeline.kind_of(e["name"]),
                    start_us=e["start_us"],
                    end_us=e["end_us"],
                )
                for e in timeline.profiler_events(prof, device.type)
            ]
        del local
        _cleanup(device)
    gathered = [None] * tp if rank == 0 else None
    dist.gather_object(mine, gathered, dst=dist.get_global_rank(group, 0), group=group)
    if rank != 0:
        return []
    events = pd.DataFrame([r for part in gathered for r in part], columns=list(timeline.TIMELINE_COLUMNS))
    return timeline.align(events).to_dict("records") if len(events) else []


# ----------------------------------------------------------------------------------------- main
def summary_text(rows: pd.DataFrame, checks: pd.DataFrame, train: dict) -> str:
    """The closing table printed by rank 0: correctness, training, per-case times and overlap."""
    lines = []
    if not checks.empty:
        failed = checks[~checks["passed"].astype(bool)]
        lines.append(
            f"correctness: {len(checks) - len(failed)}/{len(checks)} gathered outputs pass the criterion; "
            f"bitwise repeatable: {bool(checks['bitwise_repeatable'].all())}"
            + (f"; FAILED: {', '.join(failed['case'] + ':' + failed['output'])}" if len(failed) else "")
        )
    if train:
        lines.append(f"training: {'ok' if train.get('passed') else 'FAIL'} (loss dev {train['max_loss_rel_dev']:.2e})")
    if not rows.empty:
        table = tp_model.case_table(rows)
        cols = [
            "case",
            "tokens",
            "single_ms",
            "compute_ms",
            "allreduce_ms",
            "tp_ours_ms",
            "tp_ours_module_ms",
            "tp_plain_module_ms",
            "overlap",
            "efficiency",
        ]
        lines.append(table[[c for c in cols if c in table]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        over = rows[rows["impl"].str.startswith(("tp_serial", "tp_early", "tp_sp_"))]
        if not over.empty:
            lines.append("overlap attempts, median ms:")
            lines.append(
                over.pivot_table(index="case", columns="impl", values="median_ms", sort=False).to_string(
                    float_format=lambda v: f"{v:.3f}"
                )
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None, exit_now: bool = False) -> int:
    """Run the parts asked for on this rank; rank 0 writes ``tp_<run_id>.*`` to ``--out``.
    Returns the exit status (non-zero when a correctness check failed); ``exit_now`` (the
    command line): exits the process with it instead (``leave``)."""
    args = build_parser().parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"--parts: unknown {unknown}; expected some of {PARTS}")
    device, mesh = init(args)
    rank = dist.get_rank()
    cpu = device.type == "cpu"
    H = args.hidden_size or (CPU_SHAPE[0] if cpu else HIDDEN_SIZE)
    I = args.intermediate_size or (CPU_SHAPE[1] if cpu else INTERMEDIATE_SIZE)

    check_shardable(H, I, args.tp, need_triton=True)
    cases = select_cases(args.cases if args.cases is not None else (CPU_CASES if cpu else None))
    protocol = "cpu-smoke" if cpu else ("quick" if args.quick else "full")
    impl = "triton"  # our kernels (under the interpreter on CPU)
    meta = metadata(args, device, H, I, cases, protocol) if rank == 0 else None
    box = [meta]
    dist.broadcast_object_list(box, src=0)
    meta = box[0]
    run_id = environment.make_run_id(meta["utc"], meta["git_commit"])
    out = Path(args.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        log(
            f"tensor-parallel run {run_id}: TP={args.tp} on {meta['gpu']['name']}, H={H} I={I} (local {I // args.tp}), "
            f"{len(cases)} cases, parts {','.join(parts)}, protocol {protocol}; NCCL {meta['nccl_version']}"
        )
    reserves = [int(k) for k in args.reserve_sms.split(",") if k.strip()]
    sp_chunks = [int(k) for k in args.sp_chunks.split(",") if k.strip()]
    rows: list[dict] = []
    checks: list[dict] = []
    timelines: list[dict] = []
    train: dict = {}
    seconds = {}

    def save():
        if rank != 0:
            return
        frame = pd.DataFrame(rows, columns=[c for c in TIMING_COLUMNS if c != "run_id"]).assign(run_id=run_id)
        frame[list(TIMING_COLUMNS)].to_csv(out / f"tp_{run_id}.csv", index=False, float_format="%.6g")
        if checks:
            pd.DataFrame(checks).assign(run_id=run_id).to_csv(out / f"tp_{run_id}_check.csv", index=False, float_format="%.6g")
        if timelines:
            pd.DataFrame(timelines).assign(run_id=run_id).to_csv(
                out / f"tp_{run_id}_timeline.csv", index=False, float_format="%.6g"
            )
        record = dict(
            meta, run_id=run_id, seconds=seconds, train=train, finished_utc=environment.utc_now().strftime(environment.UTC_FORMAT)
        )
        (out / f"tp_{run_id}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")

    for part in parts:
        t0 = time.perf_counter()
        log(f"part {part}")
        if part == "check":
            checks += part_check(cases, H, I, device, mesh, impl, args.seed)
        elif part == "train":
            train = part_train(H, I, device, mesh, args.train_steps, args.seed)
        elif part == "timing":
            part_timing(cases, H, I, device, mesh, impl, protocol, args.seed, rows)
        elif part == "model":
            part_model(cases, H, I, device, mesh, impl, protocol, args.seed, rows)
        elif part == "overlap":
            part_overlap(cases, H, I, device, mesh, protocol, args.seed, reserves, rows, sp_chunks)
        elif part == "timeline":
            timelines += part_timeline(cases, H, I, device, mesh, args.seed, reserves[0] if reserves else 0, sp_chunks)
        seconds[part] = round(time.perf_counter() - t0, 1)
        save()
    if rank == 0:
        print(f"\nwrote {out}/tp_{run_id}.csv, .json" + (", _check.csv" if checks else "") + f"; seconds per part {seconds}")
        print(summary_text(pd.DataFrame(rows), pd.DataFrame(checks), train))
        if timelines:
            from . import timeline

            print("timeline (us per backward; exposed_comm: communication no compute covered):")
            print(
                timeline.summary(pd.DataFrame(timelines))
                .groupby(["case", "variant"], sort=False)[["span_us", "compute_us", "comm_us", "exposed_comm_us", "idle_us"]]
                .max()
                .to_string(float_format=lambda v: f"{v:.1f}")
            )
    dist.barrier()
    dist.destroy_process_group()
    # A failed check must fail the command (rank 0 holds the results; the other ranks exit 0).
    failed = any(not (c["passed"] and c["bitwise_repeatable"]) for c in checks) or (train and not train.get("passed"))
    if exit_now:
        leave(1 if failed else 0)
    return 1 if failed else 0


def leave(status: int) -> None:
    """Exit now with ``status``, output flushed, skipping the interpreter's teardown: there gloo's
    threads have aborted the process now and then under load ("terminate called without an
    active exception", SIGABRT after every record was written; tests/tp_worker.py does the same)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
