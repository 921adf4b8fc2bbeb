"""Does the patched Llama MLP cost more host time than the stock one where ``impl="auto"`` runs
torch's ops (tokens x H x I below ``swiglu.ops.AUTO_TORCH_OPS_BELOW``)?

Answer (data/host_overhead/route_cpu_20261204.log, this repository's CPU machine): no. At a tiny
shape (4 tokens, 64 x 128, bf16, CPU, the dispatch decision forced to Triton so that the route
is taken as on the H200) a forward+backward took 330.9 us stock and 332.3 us patched, a no_grad
forward 82.6 and 77.9 (best of 5 rounds of 2000 calls).
Run: PYTHONPATH=src python3 lab/probes/probe_route_host.py
"""

import copy
import time

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP

import swiglu.integrations.transformers as st
import swiglu.ops as ops

torch.manual_seed(0)
stock = LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=128)).bfloat16()


class Wrap(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp


patched = Wrap(copy.deepcopy(stock))
st.apply(patched)
ops.resolve_impl = lambda impl, x, g: "triton"  # what "auto" decides on the H200
x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)


def step(m):
    m(x).sum().backward()


def forward(m):
    with torch.no_grad():
        m(x)


best = {}
for _ in range(5):
    for name, m in (("stock", stock), ("patched", patched.mlp)):
        for kind, fn in (("forward+backward", step), ("forward no_grad", forward)):
            for _ in range(100):
                fn(m)
            t = time.perf_counter()
            for _ in range(2000):
                fn(m)
            us = (time.perf_counter() - t) / 2000 * 1e6
            best[(name, kind)] = min(best.get((name, kind), us), us)
print(type(patched.mlp).__name__, torch.__version__)
for (name, kind), us in best.items():
    print(f"{name:8s} {kind:17s} {us:7.1f} us")
