"""Compile every MoE kernel configuration the plan dispatches for sm_90 with whatever Triton this
interpreter imports (subprocess side of tests/kernels/test_moe_compile.py; TRITON_INTERPRET unset).

Integer arguments are given as the JIT specializes them on the GPU: unit strides as the constant 1,
sizes, row strides and pointers divisible by 16. Prints one JSON object: the triton version and, per
compiled kernel, its shared memory and wgmma count (or the error).
"""

from __future__ import annotations

import inspect
import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from swiglu.kernels import moe as M

UNIT_STRIDES = ("stride_xh", "stride_gh", "stride_wi", "stride_w1", "stride_cn", "stride_n")
INDEX_PTRS = {
    "order_ptr": "*i32",
    "expert_start_ptr": "*i32",
    "counts_ptr": "*i32",
    "rw_ptr": "*fp32",
    "part_ptr": "*fp32",
    "gw_ptr": "*fp32",
    "idx_ptr": "*i64",
}


def compile_one(fn, options: dict, descriptors: dict | None = None, **const) -> dict:
    """``descriptors``: argument name -> TMA box of the arguments given as descriptors."""
    descriptors = descriptors or {}
    const = dict(const, PDL=0)
    for p in fn.params:  # a constexpr left at its default is one: not an i32 argument and a runtime branch
        if p.is_constexpr and p.name not in const and p.default is not inspect.Parameter.empty:
            const[p.name] = p.default
    if "UPCAST" in fn.arg_names:
        const["UPCAST"] = False
    for name in fn.arg_names:
        if name in UNIT_STRIDES or (fn is M.moe_up_kernel and name == "stride_wh"):
            const[name] = 1
    signature = {
        n: "constexpr"
        if n in const
        else f"tensordesc<bf16{list(descriptors[n])}>"
        if n in descriptors
        else INDEX_PTRS.get(n, "*bf16")
        if n.endswith("_ptr")
        else "i32"
        for n in fn.arg_names
    }
    divisible = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if n not in const
        and n not in descriptors
        and (n.endswith("_ptr") or n in ("H", "I", "N", "K", "M") or n.startswith("stride_"))
    }
    label = {"kernel": fn.__name__, **{k: v for k, v in const.items() if not k.startswith("stride")}}
    try:
        c = triton.compile(
            ASTSource(fn=fn, signature=signature, constexprs=const, attrs=divisible),
            target=GPUTarget("cuda", 90, 32),
            options=options,
        )
    except Exception as err:  # reported per kernel; the test fails on it with the message
        return {**label, "error": f"{type(err).__name__}: {err}"[-3000:]}
    return {
        **label,
        "error": None,
        "shared": c.metadata.shared,
        "wgmma": c.asm["ptx"].count("wgmma.mma_async"),
        "num_stages": options["num_stages"],
    }


def main() -> None:
    results = []
    for n, (S, E, H, I) in enumerate(json.loads(sys.argv[1])):
        first = n == 0
        plan = M.moe_plan(S, E, H, I)
        e_pad = triton.next_power_of_2(E + 1)
        for role, fn, extra in (
            ("up", M.moe_up_kernel, {}),
            ("down", M.moe_down_kernel, dict(B_TRANS=True, SCALE=True)),
            ("grad_x", M.moe_down_kernel, dict(B_TRANS=False, SCALE=False)),
            ("dswiglu", M.moe_dswiglu_kernel, {}),
            ("wgrad_gu", M.moe_wgrad_kernel, {}),
            ("wgrad_dp", M.moe_wgrad_kernel, {}),
        ):
            t = getattr(plan, role)
            # With TMA where the launchers take it (these sizes allow it everywhere), and without.
            variants = [{}]
            if fn is M.moe_dswiglu_kernel:
                extra = dict(extra, EPI_SPLIT=t.EPI_SPLIT)
                variants = [dict(B_TMA=False), dict(B_TMA=True, descriptors={"w_ptr": (t.BK, t.BN)})]
                variants.append(dict(variants[1], LIMIT=7.0))  # swiglu_limit's clamped epilogue
                variants.append(dict(variants[1], LIMIT=7.0, ALPHA=1.702))  # swiglu_alpha's
                if first:  # gpt-oss's form (d_gate, d_up interleaved), also on its memory [E * I, H]: one plan
                    variants.append(dict(variants[3], INTERLEAVED=True))
                    variants.append(dict(variants[4], B_T=True, descriptors={"w_ptr": (t.BN, t.BK)}))
            if fn is M.moe_up_kernel:
                variants = [dict(B_TMA=False), dict(B_TMA=True, descriptors={"w_ptr": (t.BN, t.BK)})]
                variants.append(dict(variants[1], LIMIT=7.0))
                variants.append(dict(variants[1], LIMIT=7.0, ALPHA=1.702))
                if first:  # at one plan: gpt-oss's form (biases, interleaved rows, clamp and alpha), and
                    # boxes of a transposed model's memory [E * H, 2I] (Aria's; gpt-oss's with the above)
                    gpt_oss = dict(INTERLEAVED=True, BIAS=True, LIMIT=7.0, ALPHA=1.702)
                    b_t = dict(B_TMA=True, B_T=True, descriptors={"w_ptr": (t.BK, t.BN)})
                    variants += [dict(B_TMA=False, **gpt_oss), dict(variants[1], **gpt_oss), b_t, dict(b_t, **gpt_oss)]
            if fn is M.moe_down_kernel:
                box = (t.BN, t.BK) if extra["B_TRANS"] else (t.BK, t.BN)
                variants = [
                    dict(A_TMA=False, B_TMA=False, HALF=False),
                    dict(A_TMA=True, B_TMA=True, HALF=False, descriptors={"a_ptr": (t.BM, t.BK), "w_ptr": box}),
                ]
                # Half tiles (an expert's last BM / 2 rows by pointer loads) beside the full ones.
                variants.append(dict(variants[1], HALF=True))
            if fn is M.moe_wgrad_kernel:
                # Both operands through TMA (the launcher's choice at these sizes), and pointer loads.
                boxes = {"a_ptr": (t.BK, t.BM), "b_ptr": (t.BK, t.BN)}
                variants = [dict(A_TMA=False, B_TMA=False), dict(A_TMA=True, B_TMA=True, descriptors=boxes)]
            else:
                extra = dict(extra, E_PAD=e_pad)
            for v in variants:
                results.append(
                    {
                        "role": role,
                        "shape": [S, E, H, I],
                        **compile_one(
                            fn, dict(num_warps=t.num_warps, num_stages=t.num_stages), BM=t.BM, BN=t.BN, BK=t.BK, **{**extra, **v}
                        ),
                    }
                )
        # The wide dSwiGLU tile with its epilogue in two pieces: a candidate of lab/probes/moe_sweep.py.
        results.append(
            {
                "role": "dswiglu_split2",
                "shape": [S, E, H, I],
                **compile_one(
                    M.moe_dswiglu_kernel,
                    dict(num_warps=8, num_stages=3),
                    BM=128,
                    BN=128,
                    BK=64,
                    EPI_SPLIT=2,
                    E_PAD=e_pad,
                    B_TMA=True,
                    descriptors={"w_ptr": (64, 128)},
                ),
            }
        )
        chunk, sub, e_pad = M._route_blocks(S, E)
        for fn in (M.moe_count_kernel, M.moe_order_kernel):
            results.append(
                {
                    "role": "routing",
                    "shape": [S, E, H, I],
                    **compile_one(fn, dict(num_warps=4, num_stages=1), CHUNK=chunk, SUB=sub, E_PAD=e_pad),
                }
            )
    results.append({"role": "gather", **compile_one(M.moe_gather_kernel, dict(num_warps=4, num_stages=1), BR=32, BC=256)})
    # The forward's combine (no partial sums), the backward's (grad_x and the routing-weight
    # gradient) and the backward's with x frozen (the routing-weight gradient alone: no y, no out);
    # each also with down_proj's bias (gpt-oss), and the bias gradients' kernel in both forms.
    no_bias = dict(bias_ptr=None, w_ptr=None, go_ptr=None)
    options = dict(num_warps=4, num_stages=1)
    for const in (
        dict(no_bias, P_PAD=1, HAS_Y=True, HAS_PART=False, part_ptr=None, gw_ptr=None),
        dict(no_bias, P_PAD=16, HAS_Y=True, HAS_PART=True),
        dict(no_bias, P_PAD=16, HAS_Y=False, HAS_PART=True, y_ptr=None, out_ptr=None),
        dict(P_PAD=1, HAS_Y=True, HAS_PART=False, part_ptr=None, gw_ptr=None, go_ptr=None, BIAS_OUT=True),
        dict(P_PAD=16, HAS_Y=True, HAS_PART=True, w_ptr=None, BIAS_GW=True),
        dict(P_PAD=16, HAS_Y=False, HAS_PART=True, y_ptr=None, out_ptr=None, w_ptr=None, BIAS_GW=True),
    ):
        results.append({"role": "combine", **compile_one(M.moe_combine_kernel, options, TOP_K=8, BN=1024, **const)})
    BM, BN, warps, stages = M.BIAS_GRAD_LAUNCH  # as launch_bias_grad launches it
    bias_options = dict(num_warps=warps, num_stages=stages)
    for gather in (False, True):
        results.append({"role": "combine", **compile_one(M.moe_bias_grad_kernel, bias_options, BM=BM, BN=BN, GATHER=gather)})
    print(json.dumps({"triton": triton.__version__, "results": results}))


if __name__ == "__main__":
    main()
