"""GPU smoke check of the cached launch path (swiglu.kernels.launch.launch): the first call per
key goes through Triton's JIT, later ones through the compiled kernel's runner; both must give
bit-identical gradients, close to the float64 oracle. Exits 1 otherwise.

    PYTHONPATH=src python3 scripts/smoke_launch_gpu.py
"""

import sys

import torch

import swiglu

ok = True
for T, H, I in ((128, 1024, 2816), (7, 256, 512), (300, 512, 1024)):
    args = swiglu.make_inputs(1, T, H, I, seed=T, device="cuda").as_tuple()
    first = swiglu.swiglu_mlp_backward(*args, impl="triton")
    second = swiglu.swiglu_mlp_backward(*args, impl="triton")
    oracle = swiglu.float64_backward(*args)
    same = all(torch.equal(a, b) for a, b in zip(first, second))
    err = max(swiglu.relative_error(g, o) for g, o in zip(second, oracle))
    print(f"T={T} H={H} I={I}: JIT and cached launch bitwise equal: {same}; max relative error {err:.2e}")
    ok &= same and err < 2e-2
sys.exit(0 if ok else 1)
