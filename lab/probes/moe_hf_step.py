"""Does a Qwen3-MoE-shaped Hugging Face model step faster with "swiglu" experts than with "grouped_mm"?

A few decoder layers of the Qwen3-30B-A3B shape (hidden 2048, 128 experts of 768, top-8, random
weights, bf16), one sequence, forward with the LM loss + backward + AdamW, both variants in one
process, alternating blocks; losses of the first step compared. Answer: data/moe_bench/README.md.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_hf_step.py [--layers 4] [--seq 4096] [--profile] (with --profile:
our kernels and AdamW per step, and the ratio the step could reach with the experts at their GEMM floor)
"""

import argparse
import copy
import statistics
import time

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import swiglu.integrations.transformers as st
from swiglu_lab.bench.timing import median_step_ms


def sync(dev):
    if dev != "cpu":
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (a CPU smoke run)")
    ap.add_argument("--profile", action="store_true", help="per variant: GPU kernel time per step and the top kernels")
    args = ap.parse_args()
    h, i, e, heads = (64, 32, 8, 4) if args.tiny else (2048, 768, 128, 32)
    cfg = Qwen3MoeConfig(
        hidden_size=h,
        moe_intermediate_size=i,
        intermediate_size=3 * h,
        num_experts=e,
        num_experts_per_tok=min(8, e // 2),
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=4,
        head_dim=h // heads * (1 if args.tiny else 2),
        vocab_size=32000 if not args.tiny else 128,
        max_position_embeddings=args.seq,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    )
    dev = args.device
    torch.manual_seed(0)
    base = Qwen3MoeForCausalLM(cfg).to(dev, torch.bfloat16)
    models = {}
    for name in ("grouped_mm", "swiglu"):
        m = Qwen3MoeForCausalLM(copy.deepcopy(cfg)).to(dev, torch.bfloat16)  # a config of its own: apply sets it
        m.load_state_dict(base.state_dict())
        if hasattr(m, "set_experts_implementation"):
            m.set_experts_implementation("grouped_mm")
        else:
            m.config._experts_implementation = "grouped_mm"
        if name == "swiglu":
            st.apply(m)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=dev != "cpu")
        models[name] = (m, opt)
    del base
    ids = torch.randint(0, cfg.vocab_size, (1, args.seq), device=dev)

    def step(m, opt):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    first = {n: step(*mo).item() for n, mo in models.items()}
    times = {n: [] for n in models}
    for block in range(args.steps):
        for n in list(models) if block % 2 == 0 else list(models)[::-1]:
            sync(dev)
            t = time.perf_counter()
            step(*models[n])
            sync(dev)
            times[n].append((time.perf_counter() - t) * 1e3)
    print(
        f"experts {[type(l.mlp.experts).__name__ for l in models['swiglu'][0].model.layers][:1]} "
        f"impl {[mo[0].config._experts_implementation for mo in models.values()]}"
    )
    ours = {}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for n, mo in models.items():
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(2):
                    step(*mo)
                sync(dev)
            agg = {}
            for ev in p.events():
                if ev.device_type.name == "CUDA":
                    agg[ev.name[:60]] = agg.get(ev.name[:60], 0) + ev.device_time_total / 2 / 1000
            print(
                f"profile {n}: GPU kernels {sum(agg.values()):.2f} ms per step; top: "
                + "; ".join(f"{v:.2f} {k}" for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:6]),
                flush=True,
            )
            ours[n] = sum(v for k, v in agg.items() if k.startswith("moe_"))  # every kernel of swiglu_moe
            adamw = sum(v for k, v in agg.items() if "multi_tensor_apply" in k)
            print(f"profile {n}: swiglu_moe's kernels {ours[n]:.2f} ms, fused AdamW {adamw:.2f} ms per step", flush=True)
        floor = experts_gemm_floor_ms(h, i, cfg.num_experts_per_tok * args.seq, dev) * args.layers
        print(f"experts' six GEMMs as dense torch.mm over all routed rows (their floor): {floor:.2f} ms per step")
    g = statistics.median(times["grouped_mm"])
    for n in models:
        med = statistics.median(times[n])
        print(
            f"moe_hf_step layers={args.layers} seq={args.seq} {n:10s} step {med:8.2f} ms  "
            f"speedup vs grouped_mm {g / med:5.3f}x  first loss {first[n]:.4f}"
        )
    if "swiglu" in ours:
        rest = statistics.median(times["swiglu"]) - ours["swiglu"]
        print(
            f"the step without swiglu_moe's kernels: {rest:.2f} ms; with the experts at their GEMM floor "
            f"{g / (rest + floor):.3f}x grouped_mm at most"
        )


def experts_gemm_floor_ms(H: int, I: int, S: int, dev: str) -> float:
    """The experts' six GEMMs (gate|up, down; dSwiGLU's, grad_x, both weight gradients) as plain
    torch.mm over all S routed rows at once: a layer's forward+backward with every non-GEMM cost gone
    and every expert's GEMM as efficient as one large one (CUDA events, median of 20)."""
    if dev == "cpu":
        return float("nan")
    a, w_gu, w_dp = (torch.randn(*s, device=dev, dtype=torch.bfloat16) for s in ((S, H), (H, 2 * I), (I, H)))
    gu, h, go = torch.randn(S, 2 * I, device=dev, dtype=torch.bfloat16), a[:, :I], a

    def layer():
        torch.mm(a, w_gu), torch.mm(h, w_dp)  # forward
        torch.mm(go, w_dp.T), torch.mm(gu, w_gu.T), torch.mm(a.T, gu), torch.mm(go.T, h)  # backward

    return median_step_ms(layer, warmup=3, iters=20, device=dev)


if __name__ == "__main__":
    main()
