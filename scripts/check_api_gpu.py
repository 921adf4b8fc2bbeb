"""GPU checks of the shared-memory check, zero tokens, double backward and subnormals, in one process;
prints a table last.

Run on the GPU machine (about a minute, mostly Triton compiles):

    PYTHONPATH=src python3 scripts/check_api_gpu.py [compiled_autograd flop_count ...]

Writes ``check_api_gpu.json`` under ``$OUT`` when that is set. Checks:

* shared memory: the device's opt-in limit as ``swiglu.kernels.shared_memory`` reads it; for
  every configuration of the tuned table (and a few around it), the shared memory of the kernel
  Triton actually compiled and loaded against the estimate (estimate >= real); the oversized
  example config rejected with a ValueError, and what Triton itself says when the check is bypassed;
* zero tokens: ``SwiGLUMLP`` with x [0, H] and [3, 0, H], impl auto (Triton) and
  triton: no kernel launch, empty grad_x, zero weight gradients;
* double backward: a gradient penalty through ``SwiGLUMLP`` (auto) equals the
  reference implementation's, bit for bit;
* subnormals: the compiled kernels with every down_weight element subnormal
  (x 2**-125, grad_output x 2**125), float64 error against the reference's;
* compiled autograd: ``SwiGLUMLP`` (auto, lean and saved modes) at a Llama-3-8B layer's size, the
  backward traced by torch's ``maybe_enable_compiled_autograd`` (inductor) and by an aot_eager
  compiled autograd with graph breaks allowed: gradients bitwise the eager ones;
* FLOP counts: ``FlopCounterMode`` over forward and backward of the module, of the custom op and
  of ``swiglu_mlp_backward``: 18 / 18 / 12 T H I;
* ``swiglu_mlp_backward`` compiled with weights that require grad: bitwise eager, differentiable.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import replace

import torch

import swiglu
from swiglu import float64_backward, make_inputs, reference_backward, relative_error
from swiglu.kernels import tl_kernels as kernels
from swiglu.kernels import shared_memory
from swiglu.kernels import backward as triton_backward
from swiglu.ops import resolve_impl
from swiglu.kernels.backward import CONFIGS, KernelConfig, triton_swiglu_backward

OVERSIZED_EXAMPLE = KernelConfig(
    BM=128, BN=256, BK=64, EPI_SPLIT=1, num_stages=3, num_warps=8, warp_specialize=True, flatten=True
)
KERNEL_KEYS = {v: k for k, v in shared_memory.KERNELS.items()}
rows: list[dict] = []


def record(check: str, ok: bool, detail: str) -> None:
    rows.append({"check": check, "ok": bool(ok), "detail": detail})
    print(f"[{'ok' if ok else 'FAIL'}] {check}: {detail}", flush=True)


class _Capture:
    """Wraps a kernel: records the CompiledKernel of each launch (JITFunction.run returns it)."""

    def __init__(self, name, fn, seen):
        self.name, self.fn, self.seen = name, fn, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            compiled = self.fn[grid](*args, **kwargs)
            self.seen.append((self.name, kwargs, compiled))
            return compiled

        return launch

    def __getattr__(self, name):  # the launcher reads the kernel's signature (arg_names)
        return getattr(self.fn, name)


def shared_memory_checks(dev) -> None:
    limit = shared_memory.shared_memory_limit(dev)
    props = torch.cuda.get_device_properties(dev)
    record("limit", limit == props.shared_memory_per_block_optin, f"{limit} bytes per block ({torch.cuda.get_device_name(dev)})")
    configs = {(k, c) for k, table in CONFIGS.items() for c in table.values()}
    for kernel in CONFIGS:
        base = CONFIGS[kernel][4096]
        configs |= {(kernel, replace(base, EPI_SPLIT=e, flatten=f)) for e in (1, 2, 4) for f in (False, True)}
    inp = make_inputs(1, 300, 512, 768, seed=0, device=dev)
    seen: list = []
    originals = {n: getattr(kernels, n) for n in shared_memory.KERNELS.values()}
    try:
        for n, fn in originals.items():
            setattr(kernels, n, _Capture(n, fn, seen))
        for kernel, cfg in sorted(configs, key=str):
            if shared_memory.estimate_shared_memory(kernel, cfg) > limit:
                continue  # rejected before launch (that path is checked below)
            seen.clear()
            triton_swiglu_backward(*inp.as_tuple(), configs={kernel: cfg})
            for name, _, compiled in seen:
                if KERNEL_KEYS[name] != kernel:
                    continue
                est = shared_memory.estimate_shared_memory(kernel, cfg)
                real = getattr(getattr(compiled, "metadata", None), "shared", None)
                if real is None:
                    record(f"smem {kernel} {cfg}", False, "the launch returned no compiled kernel to read")
                    continue
                record(
                    f"smem {kernel} {cfg.BM}x{cfg.BN}x{cfg.BK} s{cfg.num_stages}w{cfg.num_warps} E{cfg.EPI_SPLIT}"
                    f"{' ws' if cfg.warp_specialize else ''}{' flat' if cfg.flatten else ''}",
                    real <= est <= limit,
                    f"Triton {real}, estimate {est}",
                )
    finally:
        for n, fn in originals.items():
            setattr(kernels, n, fn)
    try:
        triton_swiglu_backward(*inp.as_tuple(), configs={"dswiglu": OVERSIZED_EXAMPLE})
        record("oversized example rejected", False, "no error")
    except ValueError as e:
        record("oversized example rejected", "dswiglu_gemm_kernel" in str(e), str(e)[:160])
    real_check = triton_backward.check_shared_memory
    triton_backward.check_shared_memory = lambda kernel, cfg, device: None
    try:
        triton_swiglu_backward(*inp.as_tuple(), configs={"dswiglu": OVERSIZED_EXAMPLE})
        torch.cuda.synchronize()
        record("oversized example without the check", False, "Triton launched it")
    except Exception as e:  # what the check now pre-empts: Triton's OutOfResources
        record("oversized example without the check", "shared memory" in str(e), f"{type(e).__name__}: {str(e)[:120]}")
    finally:
        triton_backward.check_shared_memory = real_check


def zero_token_checks(dev) -> None:
    launches: list = []
    originals = {n: getattr(kernels, n) for n in shared_memory.KERNELS.values()}
    try:
        for n, fn in originals.items():
            setattr(kernels, n, _Capture(n, fn, launches))
        for impl in ("auto", "triton"):
            for lead in ((0,), (3, 0)):
                mlp = swiglu.SwiGLUMLP(256, 512, impl=impl, device=dev, dtype=torch.bfloat16)
                x = torch.randn(*lead, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
                mlp(x).backward(torch.ones(*lead, 256, device=dev, dtype=torch.bfloat16))
                grads = [p.grad for p in mlp.parameters()]
                ok = x.grad.shape == x.shape and all(g is not None and not g.count_nonzero() for g in grads) and not launches
                record(f"zero tokens {impl} {list(lead)}", ok, f"grad_x {list(x.grad.shape)}, launches {len(launches)}")
    finally:
        for n, fn in originals.items():
            setattr(kernels, n, fn)


def double_backward_check(dev) -> None:
    torch.manual_seed(0)
    ours = swiglu.SwiGLUMLP(256, 512, device=dev, dtype=torch.bfloat16)
    ref = swiglu.SwiGLUMLP(256, 512, impl="reference", device=dev, dtype=torch.bfloat16)
    ref.load_state_dict(ours.state_dict())
    x0 = torch.randn(64, 256, device=dev, dtype=torch.bfloat16)
    got = []
    for m in (ours, ref):
        x = x0.clone().requires_grad_(True)
        (gx,) = torch.autograd.grad(m(x), x, torch.ones_like(x), create_graph=True)
        gx.square().sum().backward()
        got.append([x.grad] + [p.grad for p in m.parameters()])
    ok = all(torch.equal(a, b) and torch.isfinite(a).all() for a, b in zip(*got))
    record("double backward (auto) == reference", ok, f"auto resolves to {resolve_impl('auto', x0, ours.gate_proj.weight)}")


def subnormal_check(dev) -> None:
    inp = make_inputs(1, 256, 1024, 2048, seed=0, device=dev)
    inp.down_weight = (inp.down_weight.double() * 2.0**-125).to(torch.bfloat16)
    inp.grad_output = (inp.grad_output.double() * 2.0**125).to(torch.bfloat16)
    sub = (inp.down_weight.abs() < 2.0**-126).float().mean().item()
    got = triton_swiglu_backward(*inp.as_tuple(), need_grad_down_weight=False)
    ref = reference_backward(*inp.as_tuple(), need_grad_down_weight=False)
    oracle = float64_backward(*inp.as_tuple())
    for name, g, r, o in zip(("grad_x", "grad_gate_weight", "grad_up_weight"), got, ref, oracle):
        e, er = relative_error(g, o), relative_error(r, o)
        record(f"subnormal down_weight {name}", e <= 2 * er + 1e-6, f"rel err {e:.2e}, reference {er:.2e} ({sub:.0%} subnormal)")


def compiled_autograd_check(dev) -> None:
    from torch._dynamo.utils import maybe_enable_compiled_autograd

    hidden, inter, tokens = 4096, 14336, 1024
    for lean in (True, False):
        torch.manual_seed(1)
        m = swiglu.SwiGLUMLP(hidden, inter, device=dev, dtype=torch.bfloat16, save_activated_gate=not lean)
        x0 = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
        go = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
        grads = []
        for mode in ("eager", "inductor", "aot_eager"):
            torch._dynamo.reset()
            m.zero_grad(set_to_none=True)
            x = x0.clone().requires_grad_(True)
            y = m(x)
            if mode == "inductor":
                ctx = maybe_enable_compiled_autograd(True, fullgraph=True, dynamic=False)
            elif mode == "aot_eager":
                ctx = torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=False))
            else:
                ctx = contextlib.nullcontext()
            with ctx:
                y.backward(go)
            grads.append([x.grad] + [p.grad.clone() for p in m.parameters()])
        torch._dynamo.reset()
        for mode, g in zip(("inductor", "aot_eager"), grads[1:]):
            ok = all(torch.equal(a, b) for a, b in zip(g, grads[0]))
            record(
                f"compiled autograd ({mode}, {'lean' if lean else 'saved'}) == eager",
                ok,
                f"T={tokens} H={hidden} I={inter}, impl {resolve_impl('auto', x0, m.gate_proj.weight)}",
            )


def flop_count_check(dev) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    hidden, inter, tokens = 4096, 14336, 512
    m = swiglu.SwiGLUMLP(hidden, inter, device=dev, dtype=torch.bfloat16)
    x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)
    t = make_inputs(1, tokens, hidden, inter, seed=0, device=dev, mode="forward").as_tuple()
    unit = tokens * hidden * inter
    for name, fn, want in (
        ("module fwd+bwd", lambda: m(x).sum().backward(), 18 * unit),
        ("custom op fwd+bwd", lambda: torch.ops.swiglu.mlp_forward(x, *w, "auto", False)[0].sum().backward(), 18 * unit),
        ("swiglu_mlp_backward", lambda: swiglu.swiglu_mlp_backward(*t), 12 * unit),
    ):
        with FlopCounterMode(display=False) as counter:
            fn()
        got = counter.get_total_flops()
        record(f"FlopCounterMode {name}", got == want, f"{got:,} FLOPs, expected {want:,}")


def compiled_backward_check(dev) -> None:
    t = list(make_inputs(1, 256, 1024, 2048, seed=0, device=dev, mode="forward").as_tuple())
    for i in (5, 6, 7):
        t[i] = torch.nn.Parameter(t[i])
    torch._dynamo.reset()
    got = torch.compile(swiglu.swiglu_mlp_backward, backend="inductor")(*t)
    want = swiglu.swiglu_mlp_backward(*t)
    torch._dynamo.reset()
    ok = all(torch.equal(a, b) for a, b in zip(got, want)) and all(g.requires_grad for g in got)
    record("swiglu_mlp_backward compiled, weights require grad", ok, "bitwise eager, differentiable")


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    checks = (
        shared_memory_checks,
        zero_token_checks,
        double_backward_check,
        subnormal_check,
        compiled_autograd_check,
        flop_count_check,
        compiled_backward_check,
    )
    wanted = sys.argv[1:]  # check names without "_check(s)", e.g. flop_count; none: all
    for check in checks:
        if not wanted or check.__name__.removesuffix("s").removesuffix("_check") in wanted:
            check(dev)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "check_api_gpu.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"\n{'check':58s} {'ok':4s} detail")
    for r in rows:
        print(f"{r['check'][:58]:58s} {'ok' if r['ok'] else 'FAIL':4s} {r['detail'][:90]}")
    failed = sum(not r["ok"] for r in rows)
    print(f"{len(rows) - failed} ok, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
