"""Does a restructuring leave the dispatched dense kernels' bits unchanged: the same inputs through
two source trees of the library (two commits), every output compared on the GPU?

Answer: yes, 126 of 126 outputs with the same bits between 9fef3e0 (before the restructuring)
and 5f128e4 (data/validation/h200_restructure_bits_5f128e4_20261204/). Each tree runs in its own process (``PYTHONPATH=<tree>``): the
backward (``swiglu_mlp_backward``, impl="triton") and the forward+backward (``swiglu_mlp`` under
autograd) at Hermes-4-405B's size over T = 1 ... 8192 (every bucket of the dispatch table) and at
Llama-3-8B's, on inputs drawn from fixed seeds on the GPU; each output's fingerprint (two int64
sums of its bits, one position-weighted; NaN count) is compared between the trees.
Run: git archive <commit> src | tar -x -C build/before && PYTHONPATH=src:lab python3
lab/probes/bits_across_commits.py build/before/src src
"""

import json
import os
import subprocess
import sys
import tempfile

DEV = os.environ.get("BITS_DEVICE", "cuda")  # cpu (with TRITON_INTERPRET=1 and BITS_SMALL=1): a smoke run
CASES = [("hermes", 16384, 53248, t) for t in (1, 77, 128, 200, 256, 512, 1024, 2048, 4096, 8192)] + [
    ("llama3-8b", 4096, 14336, t) for t in (128, 512, 2048, 8192)
]
if os.environ.get("BITS_SMALL"):
    CASES = [("small", 64, 96, t) for t in (1, 5)]


def fingerprint(t):
    """(sum of the bits, position-weighted sum of the bits, NaN count) of a bf16 tensor, on its device."""
    import torch

    v = t.detach().contiguous().view(-1).view(torch.int16).long()
    w = torch.arange(v.numel(), device=v.device) % 1000003 + 1
    return [int(v.sum()), int((v * w).sum()), int(torch.isnan(t).sum())]


def worker(out_path):
    import torch

    import swiglu

    print(f"swiglu from {swiglu.__file__}", file=sys.stderr, flush=True)
    res = {}
    for name, H, I, T in CASES:
        g = torch.Generator(device=DEV).manual_seed(H * 7 + I * 3 + T)

        def rn(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g, device=DEV) * scale).to(torch.bfloat16)

        x, go = rn(T, H), rn(T, H)
        gw, uw, dw = rn(I, H, scale=H**-0.5), rn(I, H, scale=H**-0.5), rn(H, I, scale=I**-0.5)
        gate, up = x @ gw.T, x @ uw.T
        act = torch.nn.functional.silu(gate.float()).to(torch.bfloat16)
        grads = swiglu.swiglu_mlp_backward(go, x, gate, up, act, gw, uw, dw, impl="triton")
        row = {f"bwd {n}": fingerprint(t) for n, t in zip(("grad_x", "grad_gate", "grad_up", "grad_down"), grads)}
        del grads
        leaves = [t.clone().requires_grad_() for t in (x, gw, uw, dw)]
        out = swiglu.swiglu_mlp(*leaves, impl="triton")
        fgrads = torch.autograd.grad(out, leaves, go)
        row["fwd out"] = fingerprint(out)
        row.update({f"fwd+bwd {n}": fingerprint(t) for n, t in zip(("grad_x", "grad_gate", "grad_up", "grad_down"), fgrads)})
        res[f"{name} T={T}"] = row
        del out, fgrads, leaves, x, go, gw, uw, dw, gate, up, act
        torch.cuda.empty_cache()
        print(f"{name} T={T} done", file=sys.stderr, flush=True)
    json.dump(res, open(out_path, "w"))


def main(trees):
    got = []
    for tree in trees:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(tree), os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, __file__, "--worker", path], env=env, check=True)
        got.append(json.load(open(path)))
    a, b = got
    same = total = 0
    print(f"\n{'case':20s} {'output':20s} same bits   ({trees[0]} vs {trees[1]})")
    for case in a:
        for out in a[case]:
            ok = a[case][out] == b.get(case, {}).get(out)
            same += ok
            total += 1
            print(f"{case:20s} {out:20s} {ok}{'' if ok else f'  {a[case][out]} vs {b.get(case, {}).get(out)}'}")
    print(f"\n{same} of {total} outputs with the same bits")


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main(sys.argv[1:3])
