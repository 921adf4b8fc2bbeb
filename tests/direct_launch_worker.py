"""Run with triton 3.6 on the path (tests/kernels/test_direct_launch.py): compares what triton 3.6's own
descriptor wrapper hands its C launcher with what ``swiglu.kernels.launch.direct_runner`` hands it,
for a signature with descriptors, ints and constexprs; a fake fill and a fake C launcher record
the calls (no GPU). Prints one JSON line."""

import json
import sys
from types import SimpleNamespace

import torch
import triton
import triton.runtime
from triton.backends.nvidia import driver as drv

fills = []


def fill(ptr, swizzle, elem_size, dtype, block, shape, strides, padding):
    fills.append((swizzle, block))
    return (
        f"map(ptr={ptr}, swizzle={swizzle}, elem={elem_size}, dtype={dtype}, block={list(block)}, "
        f"shape={list(shape)}, strides={list(strides)}, padding={padding})"
    )


triton.runtime.driver = SimpleNamespace(
    active=SimpleNamespace(
        utils=SimpleNamespace(fill_tma_descriptor=fill), get_current_device=lambda: 0, get_current_stream=lambda d: 1234
    )
)

from swiglu.kernels import launch, tma  # noqa: E402

signature = {"a": "tensordesc<bf16[64, 32]>", "n": "i32", "BM": "constexpr", "b": "*bf16", "c": "tensordesc<bf16[16, 64]>"}
meta = [
    dict(swizzle=128, elem_size=2, elem_type=9, block_size=[64, 32], fp4_padded=False),
    dict(swizzle=64, elem_size=2, elem_type=9, block_size=[16, 64], fp4_padded=False),
]
calls = []
wrapped = drv.wrap_handle_tensordesc(lambda *a: calls.append(a), signature, meta)
a, c = torch.empty(100, 96, dtype=torch.bfloat16), torch.empty(30, 64, dtype=torch.bfloat16)[:, :48]
args = (tma.Tma(a, [64, 32]), 100, 64, "ptr-b", tma.Tma(c, [16, 64]))
launcher = SimpleNamespace(
    launch=wrapped, global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False
)


class Compiled(SimpleNamespace):
    def __getitem__(self, grid):
        def slow(*kernel_args):  # what CompiledKernel's runner and CudaLauncher.__call__ do, hooks unset
            launcher.launch(*grid, 1234, 77, False, False, None, None, ("packed",), None, None, None, *kernel_args)

        return slow


compiled = Compiled(run=launcher, function=77, packed_metadata=("packed",))
run = launch.direct_runner(compiled, (132, 1, 1))
compiled[(132, 1, 1)](*tma.as_descriptors(args))  # (the runner passes its launch metadata and empty hook chains: no-ops)
run(args)
run(args)  # the same memory: the maps are reused, no fill
moved = (tma.Tma(a.clone(), [64, 32]), *args[1:])
run(moved)  # one descriptor on new memory: one fill
launch.direct_runner(compiled, (132, 1, 1), ("rest",))(args)  # the keyword values a key's first launch gave, appended
hooked = []
triton.knobs.runtime.launch_enter_hook.add(lambda metadata: hooked.append(metadata))
slow_before = len(calls)
Compiled.__getitem__ = lambda self, grid: lambda *a: hooked.append("slow")
run_hooked = launch.direct_runner(compiled, (132, 1, 1))
run_hooked(args)
print(
    json.dumps(
        dict(
            triton=triton.__version__,
            direct=run is not None and run.__name__ == "run",
            triton_call=[repr(x) for x in calls[0]],
            direct_call=[repr(x) for x in calls[1]],
            repeat_call=[repr(x) for x in calls[2]],
            moved_call=[repr(x) for x in calls[3]],
            rest_call=[repr(x) for x in calls[4]],
            n_calls=slow_before,
            fills=[repr(f) for f in fills],
            hooked=hooked,
        )
    )
)
sys.exit(0)
