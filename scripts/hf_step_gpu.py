"""Step time and peak memory of a Llama-shaped Hugging Face model: unpatched, patched with
``swiglu.integrations.transformers.apply``, patched with Liger's ``apply_liger_kernel_to_llama``
(its SwiGLU MLP only, so the three differ in the MLP alone) and the swiglu-patched model under
``torch.compile(mode="reduce-overhead")``, in the same run on one GPU.

    python scripts/hf_step_gpu.py                       # Llama-3-8B layer shape, 4 layers, bf16
    python scripts/hf_step_gpu.py --layers 2 --seq 4096 --out build/hf_step
    python scripts/hf_step_gpu.py --variants unpatched,swiglu,unpatched+compile,swiglu+compile

Variants (``--variants``, comma-separated; default: all but ``unpatched+compile``):
``unpatched``; ``swiglu`` (``apply``); ``swiglu_pdl`` (the same with programmatic dependent launch, mode 2,
``swiglu.kernels.launch.set_pdl(2)`` around each of its steps: what PDL gives the step); ``liger`` (only when ``liger_kernel`` imports, else
recorded as skipped with the reason); ``swiglu+compile`` (the patched model under
``torch.compile(model, mode="reduce-overhead")``: Inductor plus CUDA graphs);
``unpatched+compile`` (the same compile of the unpatched model, on request only: a second
compile costs about as long as the rest of the run). A failure of ``liger`` or of a compiled
variant prints the traceback and is recorded as a failed row; the run goes on.

Model: ``LlamaConfig(hidden_size=4096, intermediate_size=14336, 32 heads, 8 KV heads,
vocab 32000)`` with ``--layers`` decoder layers, random weights, bf16 parameters, SDPA attention.
Step = forward with labels (the LM loss) + backward, gradients set to None before each step (as
``zero_grad(set_to_none=True)``), no optimizer; timed with CUDA events, median of ``--iters``
after ``--warmup`` (at least 3 for compiled variants: CUDA graph trees run eagerly once, record
once, then replay; ``torch.compiler.cudagraph_mark_step_begin()`` before each of their steps).
The eager variants' models are all built and warmed first, then their timed steps run in
``--rounds`` blocks taken in turn, the order rotated each round, so the machine's drift (its slow
CPU's above all) hits every variant alike: run one after the other, the same code measured
0.906x to 1.008x the unpatched model's step on the H200 machine;
``host_ms_median``: the host's time per step (entering the step to ``backward()``'s return, no
synchronize: every launch enqueued); a host time near the step time means the step waits on the
host (the GPU machine's CPU is slow), where host cost per layer counts in full.
peak = ``torch.cuda.max_memory_allocated`` over a timed block, minus the memory held when it
began (every live model's weights; this variant's gradients dropped first), the largest over its
blocks; for compiled variants over all steps, the CUDA graph recording
included: replays allocate from the graph's private pool, and their peak alone read ~0 (H200,
torch 2.11).
``first_step_s``: wall time of the first step (compilation included). Each variant is a fresh
model built from the same seed, so the first step's losses agree (checked: relative difference
to the reference row, ``unpatched`` when measured, printed); with no optimizer every step sees
the same weights, so ``last_loss`` (the last timed step's) and the norm of all parameter
gradients after it check the replayed steps and the backward the same way. Compiled variants run
after the others, and ``torch._dynamo.reset()`` follows each. Writes ``hf_step.csv`` and
``hf_step.json`` (GPU, driver, power limit and SM clock through pynvml when importable, before
and after the runs; versions, git commit, arguments, this protocol) to ``--out`` (default
``$OUT`` when set, else build/hf_step) and prints a Markdown table last. About a minute on an
H200 for the eager variants, plus the compile.

``--profile N`` (eager variants): after the timed steps, N more steps under ``torch.profiler``
(no synchronize between them); per variant ``kernels_<variant>.csv`` (each kernel name: launches
and ms per step, its role), ``runtime_<variant>.csv`` (the host's CUDA runtime and driver calls:
count and ms per step, from N more steps profiled on the host alone) and the row's ``gpu_busy_ms`` (the union of all
kernels' intervals per step) and ``gpu_idle_ms`` (profiled span per step minus busy): where the
step's time goes, and whether the GPU waits on the host.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

from swiglu_lab.bench.environment import dist_version, git_info, nvml_info  # noqa: E402
from swiglu_lab.bench.stats import time_stats  # noqa: E402
from swiglu_lab.bench.timing import synchronize, time_iterations  # noqa: E402

#: Every variant, in the order they run (compiled ones last: their CUDA graph pools and compiled
#: code are released by torch._dynamo.reset(), which should not run between eager rows).
VARIANTS = ("unpatched", "swiglu", "swiglu_pdl", "swiglu_reuse", "liger", "swiglu+compile", "unpatched+compile")
DEFAULT_VARIANTS = ("unpatched", "swiglu", "liger", "swiglu+compile")
#: Variants whose failure is recorded instead of ending the run (peers and compiled variants).
GUARDED = ("liger", "swiglu+compile", "unpatched+compile")
CSV_FIELDS = [
    "variant",
    "status",
    "error",
    "mlp_forward",
    "ms_median",
    "ms_min",
    "ms_p20",
    "ms_p80",
    "host_ms_median",
    "gpu_busy_ms",
    "gpu_idle_ms",
    "peak_gib",
    "first_step_s",
    "first_loss",
    "last_loss",
    "grad_norm",
    "speedup",
    "peak_saved_gib",
    "loss_rel_diff",
    "last_loss_rel_diff",
    "grad_norm_rel_diff",
    "reference",
    "layers",
    "hidden_size",
    "intermediate_size",
    "tokens",
    "device",
    "torch",
    "transformers",
    "swiglu",
]


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=max(args.seq, 2048),
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.train()
    mlp = type(model.model.layers[0].mlp)
    if mlp.__module__ != "transformers.models.llama.modeling_llama":  # a class-level patch leaked in
        raise RuntimeError(f"a fresh model was built with MLP class {mlp.__module__}.{mlp.__qualname__}")
    return model


def patch(model, variant: str):
    base = variant.split("+")[0]
    if base in ("swiglu", "swiglu_pdl", "swiglu_reuse"):
        from swiglu.integrations import transformers as swiglu_hf

        names = swiglu_hf.apply(model, reuse_saved_buffers=base == "swiglu_reuse")
        assert len(names) == model.config.num_hidden_layers, names
    elif base == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        from transformers.models.llama import modeling_llama

        # Liger patches this model's MLP instances and also sets modeling_llama.LlamaMLP to its class,
        # which would make every later model (the compiled variants') a Liger model: undone at once.
        saved = dict(vars(modeling_llama))
        try:
            apply_liger_kernel_to_llama(
                rope=False, cross_entropy=False, fused_linear_cross_entropy=False, rms_norm=False, swiglu=True, model=model
            )
        finally:
            for name in set(vars(modeling_llama)) - set(saved):
                delattr(modeling_llama, name)
            for name, value in saved.items():
                if getattr(modeling_llama, name, None) is not value:
                    setattr(modeling_llama, name, value)
    return model


class Variant:
    """One variant's model, its step and what its timed steps recorded."""

    def __init__(self, variant: str, args):
        self.name, self.args = variant, args
        self.compiled = variant.endswith("+compile")
        self.model = patch(build(args), variant)
        self.run = torch.compile(self.model, mode="reduce-overhead") if self.compiled else self.model
        self.ids = torch.randint(
            0,
            self.model.config.vocab_size,
            (args.batch, args.seq),
            device="cuda",
            generator=torch.Generator("cuda").manual_seed(1),
        )
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.losses, self.times, self.host, self.peak = [], [], [], 0

    def step(self):
        if self.name.startswith("swiglu_pdl"):
            from swiglu.kernels import launch

            saved = launch.PDL
            launch.set_pdl(2)
            try:
                self._step()
            finally:
                launch.set_pdl(saved)
        else:
            self._step()

    def _step(self):
        self.model.zero_grad(set_to_none=True)
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        loss = self.run(self.ids, labels=self.ids).loss
        loss.backward()
        self.losses.append(loss.detach().clone())  # a CUDA graph replay reuses its output memory

    def warm(self) -> None:
        """The first step (timed in wall-clock, compilation included) and the warm-up steps."""
        synchronize(self.device)
        if self.compiled:
            # Compiled variants: the peak over every step (replays allocate from the graph's pool).
            self.model.zero_grad(set_to_none=True)
            self.base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        wall = time.perf_counter()
        self.step()
        torch.cuda.synchronize()
        self.first_step_s = time.perf_counter() - wall
        for _ in range(max(self.args.warmup, 3) - 1 if self.compiled else self.args.warmup - 1):
            self.step()
        synchronize(self.device)

    def time_block(self, iters: int) -> None:
        """``iters`` timed steps (the lab's step protocol: CUDA events, the device idle before each
        step); the block's peak memory above what was held when it began (this variant's own
        gradients dropped first, so the peak counts them as the sequential protocol did)."""
        if not self.compiled:
            self.model.zero_grad(set_to_none=True)
            synchronize(self.device)
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        self.times += time_iterations(
            self.step, tuple, iters, self.device, flush=lambda: synchronize(self.device), host_ms=self.host
        )
        if not self.compiled:
            self.peak = max(self.peak, torch.cuda.max_memory_allocated() - base)
        else:
            self.peak = torch.cuda.max_memory_allocated() - self.base

    def result(self) -> dict:
        losses = [v.item() for v in self.losses]
        grads = [p.grad.float().norm() for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.linalg.vector_norm(torch.stack(grads)).item() if grads else float("nan")
        stats = time_stats(self.times)
        profiled = (
            profile_steps(self.step, self.args.profile, self.device, Path(self.args.out) / f"kernels_{self.name}.csv")
            if self.args.profile and not self.compiled
            else {}
        )
        forward = self.model.model.layers[0].mlp.forward  # Liger binds its forward on the instance
        func = getattr(forward, "__func__", forward)
        return dict(
            variant=self.name,
            status="ok",
            error="",
            mlp_forward=f"{func.__module__}.{func.__qualname__}",
            ms_median=stats["median_ms"],
            ms_min=stats["min_ms"],
            ms_p20=stats["p20_ms"],
            ms_p80=stats["p80_ms"],
            host_ms_median=statistics.median(self.host),
            peak_gib=self.peak / 2**30,
            first_step_s=self.first_step_s,
            first_loss=losses[0],
            last_loss=losses[-1],
            grad_norm=grad_norm,
            **profiled,
        )


def blocks(iters: int, rounds: int) -> list[int]:
    """``iters`` steps split into ``rounds`` blocks as evenly as possible (none empty)."""
    rounds = max(1, min(rounds, iters))
    return [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]


def measure(variant: str, args) -> dict:
    """One variant alone: warm-up, then every timed step (the compiled variants' protocol)."""
    v = Variant(variant, args)
    v.warm()
    v.time_block(args.iters)
    return v.result()


def measure_interleaved(variants: list[str], args, rows: list[dict]) -> None:
    """The eager variants side by side: every model built and warmed, then the timed steps in
    ``args.rounds`` blocks per variant, taken in turn with the order rotated each round, so slow
    drift of the machine (its CPU above all) hits every variant alike. Appends one row per variant."""
    live = {}
    for name in variants:
        print(f"--- {name}: build, warm up", file=sys.stderr, flush=True)
        try:
            live[name] = Variant(name, args)
            live[name].warm()
        except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
            if name not in GUARDED:
                raise
            live.pop(name, None)
            rows.append(failed_row(name, exc))
    for r, n in enumerate(blocks(args.iters, args.rounds)):
        names = list(live)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            live[name].time_block(n)
    for name in variants:
        if name in live:
            rows.append(live.pop(name).result())
            release(False)


def failed_row(variant: str, exc: Exception) -> dict:
    print(f"{variant} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    message = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return dict(variant=variant, status="failed", error=(message[0] if message else "")[:300])


def profile_steps(step, steps: int, device, path: Path) -> dict:
    """``steps`` steps under torch.profiler; writes the per-kernel table to ``path`` and returns the
    GPU busy and idle time per step (ms)."""
    import pandas as pd

    from swiglu_lab.bench import breakdown, timeline

    def profiled(activities):
        synchronize(device)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            synchronize(device)
        return prof

    kernels = breakdown.device_kernels(profiled([torch.profiler.ProfilerActivity.CUDA]))
    # The host's CUDA runtime calls (a cudaFree, cudaMalloc or *Synchronize makes the host wait
    # for the GPU, whose queue then drains: idle time a kernel table does not show).
    path.parent.mkdir(parents=True, exist_ok=True)
    # Apart from the kernels' profile: host profiling slows the host.
    prof = profiled([torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
    runtime = pd.DataFrame(
        [
            (e.name, (e.time_range.end - e.time_range.start) / 1e3)
            for e in prof.events()
            if e.device_type.name == "CPU" and e.name.startswith("cu")
        ],
        columns=["call", "ms"],
    )
    if len(runtime):
        runtime = (runtime.groupby("call").agg(calls=("ms", "size"), ms=("ms", "sum")) / steps).reset_index()
        runtime.sort_values("ms", ascending=False).to_csv(
            path.with_name(path.name.replace("kernels_", "runtime_")), index=False, float_format="%.4f"
        )
    busy = timeline.length(timeline.union([(a, b) for _, a, b in kernels])) / 1e3 / steps
    span = (max(b for _, _, b in kernels) - min(a for _, a, _ in kernels)) / 1e3 / steps
    table = pd.DataFrame(kernels, columns=["kernel", "start_us", "end_us"])
    table["ms"] = (table.end_us - table.start_us) / 1e3
    table = (table.groupby("kernel").agg(launches=("ms", "size"), ms=("ms", "sum")) / steps).reset_index()
    table["role"] = table.kernel.map(breakdown.kernel_role)
    table.sort_values("ms", ascending=False).to_csv(path, index=False, float_format="%.4f")
    return dict(gpu_busy_ms=busy, gpu_idle_ms=span - busy)


def release(compiled: bool) -> None:
    gc.collect()
    if compiled:
        import torch._dynamo as dynamo  # (a plain `import torch._dynamo` would make torch local here)

        dynamo.reset()  # compiled code and CUDA graph trees (their memory pools)
        gc.collect()
    torch.cuda.empty_cache()


def parse_variants(text: str, parser: argparse.ArgumentParser) -> list[str]:
    if text in ("", "default"):
        return list(DEFAULT_VARIANTS)
    if text == "all":
        return list(VARIANTS)
    asked = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in asked if v not in VARIANTS]
    if unknown or not asked:
        parser.error(f"--variants: unknown {unknown or text!r}; choose from {', '.join(VARIANTS)} (or all, default)")
    return [v for v in VARIANTS if v in asked]  # run order: eager first, compiled last


def add_model_arguments(parser: argparse.ArgumentParser, seq: int = 2048) -> None:
    """The model and batch options ``build`` and ``Variant`` read: --layers, --hidden-size,
    --intermediate-size, --batch, --seq (default ``seq``)."""
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--intermediate-size", type=int, default=14336)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=seq)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="variants: " + ", ".join(VARIANTS) + "; default: " + ",".join(DEFAULT_VARIANTS),
    )
    add_model_arguments(parser)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5, help="blocks the eager variants' timed steps are split into")
    parser.add_argument(
        "--variants", default="default", help="comma-separated subset of the variants below, 'all', or 'default' (the default)"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="profile N more steps per eager variant (kernels_<variant>.csv; 0: none)",
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "build/hf_step"))
    args = parser.parse_args(argv)
    variants = parse_variants(args.variants, parser)
    if args.iters < 1 or args.rounds < 1 or args.warmup < 0 or args.profile < 0:
        parser.error("--iters and --rounds must be >= 1, --warmup and --profile >= 0")
    if not torch.cuda.is_available():
        sys.exit("hf_step_gpu.py needs a CUDA GPU")
    import transformers

    import swiglu

    started = datetime.now(timezone.utc)
    nvml_before = nvml_info(torch.device("cuda"))
    rows = []
    runnable = []
    for variant in variants:
        if variant.startswith("liger"):
            try:
                import liger_kernel  # noqa: F401
            except ImportError as exc:
                reason = f"liger_kernel not importable ({exc})"
                print(f"{reason}: Liger row skipped", file=sys.stderr)
                rows.append(dict(variant=variant, status="skipped", error=reason))
                continue
        runnable.append(variant)
    measure_interleaved([v for v in runnable if not v.endswith("+compile")], args, rows)
    for variant in (v for v in runnable if v.endswith("+compile")):
        print(f"--- {variant}", file=sys.stderr, flush=True)
        try:
            rows.append(measure(variant, args))
        except Exception as exc:  # noqa: BLE001 - a compiled variant that fails is reported, not fatal
            rows.append(failed_row(variant, exc))
        release(True)
    rows.sort(key=lambda row: VARIANTS.index(row["variant"]))
    nvml_after = nvml_info(torch.device("cuda"))

    ok = [r for r in rows if r["status"] == "ok"]
    ref = next((r for r in ok if r["variant"] == "unpatched"), ok[0] if ok else None)
    tokens = args.batch * args.seq
    common = dict(
        layers=args.layers,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        tokens=tokens,
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        swiglu=swiglu.__version__,
    )
    for row in rows:
        row.update(common)
        if row["status"] != "ok":
            continue
        row.update(
            reference=ref["variant"],
            speedup=ref["ms_median"] / row["ms_median"],
            peak_saved_gib=ref["peak_gib"] - row["peak_gib"],
            loss_rel_diff=abs(row["first_loss"] - ref["first_loss"]) / abs(ref["first_loss"]),
            last_loss_rel_diff=abs(row["last_loss"] - ref["first_loss"]) / abs(ref["first_loss"]),
            grad_norm_rel_diff=abs(row["grad_norm"] - ref["grad_norm"]) / abs(ref["grad_norm"]),
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "hf_step.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, restval="")
        writer.writeheader()
        writer.writerows(rows)
    meta = dict(
        script="scripts/hf_step_gpu.py",
        date_utc=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        gpu=torch.cuda.get_device_name(),
        nvml_before=nvml_before,
        nvml_after=nvml_after,
        cuda=torch.version.cuda,
        torch=torch.__version__,
        triton=dist_version("triton"),
        transformers=transformers.__version__,
        liger_kernel=dist_version("liger-kernel", "liger_kernel"),
        swiglu=swiglu.__version__,
        python=platform.python_version(),
        git_commit=git_info()["commit"],
        args=vars(args),
        variants_requested=variants,
        reference=ref["variant"] if ref else None,
        status={r["variant"]: r["status"] + (f": {r['error']}" if r.get("error") else "") for r in rows},
        protocol=__doc__,
    )
    (out / "hf_step.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")

    suspect = [r["variant"] for r in ok if max(r["loss_rel_diff"], r["last_loss_rel_diff"], r["grad_norm_rel_diff"]) > 1e-2]
    if suspect:
        print(f"\nWARNING: loss or gradient norm more than 1% off {ref['variant']}'s: {', '.join(suspect)}")
    print(f"\nCSV: {out / 'hf_step.csv'}, metadata: {out / 'hf_step.json'}")
    print(
        f"\nLlama-shaped, {args.layers} layers, H={args.hidden_size}, I={args.intermediate_size}, "
        f"{args.batch}x{args.seq} tokens, bf16, {common['device']}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, commit {meta['git_commit']}; rel. diffs against "
        f"{ref['variant'] if ref else '-'}\n"
    )
    print(
        "| MLP | step ms (median) | speedup | host ms (median) | GPU busy / idle ms | peak GiB above weights "
        "| saved GiB | first loss rel. diff | grad norm rel. diff |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        if row["status"] != "ok":
            error = row["error"][:80].replace("|", "\\|")
            print(f"| {row['variant']} | {row['status']}: {error} | | | | | | | |")
            continue
        gpu = f"{row['gpu_busy_ms']:.1f} / {row['gpu_idle_ms']:.2f}" if "gpu_busy_ms" in row else "-"
        print(
            f"| {row['variant']} | {row['ms_median']:.1f} | {row['speedup']:.3f} | {row['host_ms_median']:.1f} | "
            f"{gpu} | {row['peak_gib']:.2f} | "
            f"{row['peak_saved_gib']:.2f} | {row['loss_rel_diff']:.1e} | {row['grad_norm_rel_diff']:.1e} |"
        )
    if not ok:
        sys.exit("every variant failed")


if __name__ == "__main__":
    main()
