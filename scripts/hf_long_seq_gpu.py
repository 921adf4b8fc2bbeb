"""The longest sequence a Llama-3-8B-shaped Hugging Face model trains on one GPU without activation
checkpointing, stock against patched (``swiglu.integrations.transformers.apply``, two saved [T, I]
activations per MLP instead of four) and Liger's SwiGLU; then, at a length where the stock model
needs checkpointing, tokens/s of the stock model with ``gradient_checkpointing_enable`` against
the patched one without it.

    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=src:lab \\
        python3 scripts/hf_long_seq_gpu.py --out $OUT

A step: batch 1, one sequence, forward with the LM loss, backward, AdamW step, gradients set to
None. Each variant's model is built once (random weights, bf16, 32 layers by default), its
optimizer states allocated by one short step, then the length is searched: doubling from
``--start-seq``, then bisection to ``--granularity``; a trial is two steps, an out-of-memory error
is caught and recorded. Writes ``long_seq.csv`` (variant, seq_len, layers, activation_checkpointing,
step_ms, tokens_per_s, peak_gib, oom) and ``meta.json`` under ``--out``, and prints a table last.
``--fake-oom-above`` (tests only) raises torch's out-of-memory error above that length.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from hf_step_gpu import patch  # noqa: E402  (this folder is on sys.path when run as a script)

FIELDS = ["variant", "seq_len", "layers", "activation_checkpointing", "step_ms", "tokens_per_s", "peak_gib", "oom"]


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_seq,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.train()
    return model


class Trainer:
    def __init__(self, variant: str, args):
        self.variant, self.args = variant, args
        self.model = patch(build(args), variant)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5)
        self.gen = torch.Generator(args.device).manual_seed(1)

    def step(self, seq: int) -> None:
        if self.args.fake_oom_above and seq > self.args.fake_oom_above:
            raise torch.cuda.OutOfMemoryError(f"fake: {seq} > {self.args.fake_oom_above}")
        ids = torch.randint(0, self.model.config.vocab_size, (1, seq), device=self.args.device, generator=self.gen)
        loss = self.model(ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def trial(self, seq: int, steps: int, checkpointing: bool = False) -> dict:
        """``steps`` steps at ``seq`` (timed after the first when ``steps`` > 1)."""
        if checkpointing:  # transformers' current name, or the one before it
            kwargs = {"use_reentrant": False}
            if hasattr(self.model, "activation_checkpointing_enable"):
                self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        row = dict(
            variant=self.variant,
            seq_len=seq,
            layers=self.args.layers,
            activation_checkpointing=checkpointing,
            step_ms=float("nan"),
            tokens_per_s=float("nan"),
            peak_gib=float("nan"),
            oom=False,
        )
        cuda = self.args.device.startswith("cuda")
        try:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            self.step(seq)
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(steps - 1):
                self.step(seq)
            if cuda:
                torch.cuda.synchronize()
            if steps > 1:
                row["step_ms"] = (time.perf_counter() - start) / (steps - 1) * 1e3
                row["tokens_per_s"] = seq / row["step_ms"] * 1e3
            if cuda:
                row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        except torch.cuda.OutOfMemoryError:
            row["oom"] = True
            self.opt.zero_grad(set_to_none=True)
        finally:
            if checkpointing:
                (getattr(self.model, "activation_checkpointing_disable", None) or self.model.gradient_checkpointing_disable)()
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        return row

    def state_bytes(self) -> dict:
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        states = sum(
            t.numel() * t.element_size() for s in self.opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)
        )
        return dict(weights_gib=weights / 2**30, gradients_gib=weights / 2**30, adamw_states_gib=states / 2**30)

    def close(self) -> None:
        del self.model, self.opt
        gc.collect()
        if self.args.device.startswith("cuda"):
            torch.cuda.empty_cache()


def longest(trainer: Trainer, args, rows: list[dict], deadline: float) -> int:
    """The longest multiple of ``--granularity`` that trains (0 if none): doubling, then bisection."""

    def fits(seq: int) -> bool:
        row = trainer.trial(seq, steps=2)
        rows.append(row)
        print(f"  {trainer.variant:10s} seq {seq:6d}: {'OOM' if row['oom'] else 'peak %.2f GiB' % row['peak_gib']}", flush=True)
        return not row["oom"]

    good, bad, seq = 0, None, args.start_seq
    while time.monotonic() < deadline:
        if not fits(seq):
            bad = seq
            break
        good = seq
        if seq >= args.max_seq:
            return good
        seq = min(seq * 2, args.max_seq)
    if bad is None:
        return good
    while bad - good > args.granularity and time.monotonic() < deadline:
        mid = (good + bad) // 2 // args.granularity * args.granularity
        if mid <= good:
            break
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="unpatched,swiglu,liger")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden-size", type=int, default=4096)
    p.add_argument("--intermediate-size", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=128256)
    p.add_argument("--start-seq", type=int, default=4096)
    p.add_argument("--max-seq", type=int, default=131072)
    p.add_argument("--granularity", type=int, default=1024)
    p.add_argument("--steps", type=int, default=4, help="timed steps of the comparison (after one warm step)")
    p.add_argument(
        "--compare-seq",
        default="",
        help="lengths to compare (default: the stock model's longest plus "
        "one granularity step, and the patched model's longest; 'none': no comparison)",
    )
    p.add_argument("--time-budget-s", type=float, default=420)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=os.environ.get("OUT") or "build/hf_long_seq")
    p.add_argument("--fake-oom-above", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.time_budget_s
    variants = [v for v in args.variants.split(",") if v]
    if "liger" in variants:
        try:
            import liger_kernel  # noqa: F401
        except ImportError as exc:
            print(f"liger skipped: {exc}", flush=True)
            variants.remove("liger")
    rows, best, memory = [], {}, {}
    for variant in variants:
        trainer = Trainer(variant, args)
        trainer.trial(1024, steps=1)  # allocates the AdamW states: every later trial sees them
        memory[variant] = trainer.state_bytes()
        best[variant] = longest(trainer, args, rows, deadline)
        print(f"{variant}: longest {best[variant]}", flush=True)
        trainer.close()
    base = best.get("unpatched", 0)
    # Default: just past the stock model's longest, and the patched model's longest.
    compare = (
        []
        if args.compare_seq == "none"
        else [int(s) for s in args.compare_seq.split(",") if s]
        or sorted({s for s in (base + args.granularity, best.get("swiglu", 0)) if base and s > base})
    )
    for seq in compare:
        for variant, checkpointing in (("unpatched", True), ("swiglu", False), ("liger", False), ("unpatched", False)):
            if variant not in variants or time.monotonic() > deadline:
                continue
            trainer = Trainer(variant, args)
            trainer.trial(1024, steps=1)
            row = trainer.trial(seq, steps=args.steps + 1, checkpointing=checkpointing)
            row["compare"] = True
            rows.append(row)
            print(
                f"  compare {variant:10s} ckpt={checkpointing!s:5s} seq {seq}: "
                f"{'OOM' if row['oom'] else '%.0f tokens/s, %.2f GiB' % (row['tokens_per_s'], row['peak_gib'])}",
                flush=True,
            )
            trainer.close()
    with open(out / "long_seq.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    meta = dict(
        utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        commit=os.environ.get("SWIGLU_GIT_COMMIT", ""),
        args=vars(args),
        longest=best,
        state_memory=memory,
        torch=torch.__version__,
        alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        device=torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
    )
    try:
        import transformers
        import triton

        meta.update(transformers=transformers.__version__, triton=triton.__version__)
    except ImportError:
        pass
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"\n{'variant':12s} {'longest seq':>11s}  weights+grads+AdamW GiB")
    for v in variants:
        m = memory[v]
        print(f"{v:12s} {best[v]:11d}  {m['weights_gib'] + m['gradients_gib'] + m['adamw_states_gib']:.1f}")
    for r in rows:
        if r.get("compare"):
            print(
                f"compare {r['variant']:10s} ckpt={r['activation_checkpointing']!s:5s} seq {r['seq_len']}: "
                f"{r['tokens_per_s']:.0f} tokens/s, peak {r['peak_gib']:.2f} GiB, oom {r['oom']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
