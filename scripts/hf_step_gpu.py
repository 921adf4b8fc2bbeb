"""Step time and peak memory of a Llama-shaped Hugging Face model: unpatched, patched with
``swiglu.integrations.transformers.apply`` and patched with Liger's ``apply_liger_kernel_to_llama``
(its SwiGLU MLP only, so the three differ in the MLP alone), in the same run on one GPU.

    python scripts/hf_step_gpu.py                       # Llama-3-8B layer shape, 4 layers, bf16
    python scripts/hf_step_gpu.py --layers 2 --seq 4096 --out build/hf_step

Model: ``LlamaConfig(hidden_size=4096, intermediate_size=14336, 32 heads, 8 KV heads,
vocab 32000)`` with ``--layers`` decoder layers, random weights, bf16 parameters, SDPA attention.
Step = forward with labels (the LM loss) + backward, gradients set to None before each step (as
``zero_grad(set_to_none=True)``), no optimizer; timed with CUDA events, median of ``--iters``
after ``--warmup``; peak = ``torch.cuda.max_memory_allocated`` over the timed steps, minus the
memory held before the first step (parameters). Each variant is a fresh model built from the same
seed, so the first step's losses agree (checked: relative difference printed). Writes
``hf_step.csv`` to ``--out`` (default ``$OUT`` when set, else build/hf_step) and prints a
Markdown table. Runs in about a minute on an H200.
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import statistics
import sys
from pathlib import Path

import torch


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                         num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
                         vocab_size=32000, max_position_embeddings=max(args.seq, 2048),
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.train()
    return model


def patch(model, variant: str):
    if variant == "swiglu":
        from swiglu.integrations import transformers as swiglu_hf

        names = swiglu_hf.apply(model)
        assert len(names) == model.config.num_hidden_layers, names
    elif variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(rope=False, cross_entropy=False, fused_linear_cross_entropy=False,
                                    rms_norm=False, swiglu=True, model=model)
    return model


def measure(variant: str, args) -> dict:
    model = patch(build(args), variant)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    times, losses = [], []
    for i in range(args.warmup + args.iters):
        model.zero_grad(set_to_none=True)
        if i == args.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = model(ids, labels=ids).loss
        loss.backward()
        end.record()
        end.synchronize()
        losses.append(loss.item())
        if i >= args.warmup:
            times.append(start.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated() - base
    forward = model.model.layers[0].mlp.forward  # Liger binds its forward on the instance
    del model, loss
    gc.collect()
    torch.cuda.empty_cache()
    return dict(variant=variant, mlp_forward=f"{forward.__func__.__module__}.{forward.__func__.__qualname__}", ms_median=statistics.median(times),
                ms_min=min(times), peak_gib=peak / 2**30, first_loss=losses[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--intermediate-size", type=int, default=14336)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", default=os.environ.get("OUT", "build/hf_step"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("hf_step_gpu.py needs a CUDA GPU")
    import transformers

    import swiglu

    variants = ["unpatched", "swiglu"]
    try:
        import liger_kernel  # noqa: F401

        variants.append("liger")
    except ImportError as exc:
        print(f"liger_kernel not importable ({exc}): Liger row skipped", file=sys.stderr)
    rows = []
    for variant in variants:
        try:
            rows.append(measure(variant, args))
        except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
            if variant == "liger":
                print(f"liger failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            raise
    ref = rows[0]
    tokens = args.batch * args.seq
    for row in rows:
        row.update(speedup=ref["ms_median"] / row["ms_median"], peak_saved_gib=ref["peak_gib"] - row["peak_gib"],
                   loss_rel_diff=abs(row["first_loss"] - ref["first_loss"]) / abs(ref["first_loss"]),
                   layers=args.layers, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                   tokens=tokens, device=torch.cuda.get_device_name(), torch=torch.__version__,
                   transformers=transformers.__version__, swiglu=swiglu.__version__)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "hf_step.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"\nLlama-shaped, {args.layers} layers, H={args.hidden_size}, I={args.intermediate_size}, "
          f"{args.batch}x{args.seq} tokens, bf16, {rows[0]['device']}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}\n")
    print("| MLP | step ms (median) | speedup | peak GiB above weights | saved GiB | first loss rel. diff |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['variant']} | {row['ms_median']:.1f} | {row['speedup']:.3f} | {row['peak_gib']:.2f} | "
              f"{row['peak_saved_gib']:.2f} | {row['loss_rel_diff']:.1e} |")
    print(f"\nCSV: {out / 'hf_step.csv'}")


if __name__ == "__main__":
    main()
