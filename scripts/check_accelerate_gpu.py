"""With accelerate itself (the GPU machine has it; the CPU tests build its hook by hand,
tests/library/test_offload_and_copies.py): offloaded and hooked patched MLPs, copies of them, and a
float16 CUDA autocast, against the unpatched module. Prints one line per check; exits 1 on any
failure.

    PYTHONPATH=src python3 scripts/check_accelerate_gpu.py
"""

from __future__ import annotations

import copy
import sys

import torch
from accelerate import cpu_offload
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP

import swiglu
from swiglu.integrations import transformers as swiglu_hf

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")


def mlp(dtype, device, H=64, I=128):
    torch.manual_seed(0)
    return LlamaMLP(LlamaConfig(hidden_size=H, intermediate_size=I, num_attention_heads=2, num_key_value_heads=2)).to(
        device=device, dtype=dtype
    )


calls = []
real = swiglu_hf._swiglu_mlp
swiglu_hf._swiglu_mlp = lambda *a, **k: calls.append(1) or real(*a, **k)
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(4, 64, device="cuda", dtype=dtype)
    want = mlp(dtype, "cuda")(x)
    m = mlp(dtype, "cpu")
    swiglu_hf.apply(m)
    cpu_offload(m, execution_device=torch.device("cuda"))
    try:
        got = m(x)
        check(f"cpu_offload, execution on cuda, {dtype}", torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2))
    except Exception as e:  # noqa: BLE001
        check(f"cpu_offload, execution on cuda, {dtype}", False, f"{type(e).__name__}: {e}")
    m = mlp(dtype, "cuda")
    add_hook_to_module(m, AlignDevicesHook(io_same_device=True))
    n = len(calls)
    names = swiglu_hf.apply(m)
    got = m(x)
    check(
        f"AlignDevicesHook(io_same_device) then apply, {dtype}",
        names == [""] and len(calls) == n + 1 and torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2),
        f"(fused op calls: {len(calls) - n})",
    )
    c = copy.deepcopy(m)
    check(f"deepcopy of the hooked patched module, {dtype}", torch.allclose(c(x).float(), want.float(), rtol=2e-2, atol=2e-2))
ours = swiglu.SwiGLUMLP(64, 128, device="cuda")
plain = swiglu.module.PlainSwiGLUMLP(64, 128, device="cuda")
plain.load_state_dict(ours.state_dict())
x = torch.randn(4, 16, 64, device="cuda")
with torch.autocast("cuda", dtype=torch.float16):
    a, b = ours(x), plain(x)
ref = plain.double()(x.double())
ratio = ((a.double() - ref).norm() / (b.double() - ref).norm()).item()
check(
    "float16 CUDA autocast: dtype and error against the nn.Linear module's",
    a.dtype == torch.float16 and ratio < 1.5,
    f"(dtype {a.dtype}, error ratio {ratio:.2f})",
)
sys.exit(0 if all(results) else 1)
