"""A 2-CTA cluster tile in Gluon (triton >= 3.7) with the shared operand TMA-multicast on
Hopper: one k-step of out[2*BM, BN] = A^T @ B per cluster, A [BK, 2*BM] split over the two CTAs
along M, B [BK, BN] held by both and loaded once per cluster with ``multicast=True``, each CTA's
wgmma on its half, a TMA store. ``compile_check`` compiles it for sm_90 on any machine and names
what the PTX lacks. The probe that runs it: lab/probes/probe_multicast.py."""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

try:  # triton >= 3.7; too_old() names the version otherwise
    from triton.experimental.gluon.language.nvidia.hopper import cluster
except ImportError:
    cluster = None

BM, BN, BK, NUM_WARPS = 64, 128, 64, 4  # per CTA: one warpgroup on a 64 x 128 half
# cga_layout bases (triton 3.7's CTA layouts): non-zero splits that dimension over the CTAs,
# all-zero broadcasts (both CTAs hold the whole block).
A_CGA, B_CGA, C_CGA = [[0, 1]], [[0, 0]], [[1, 0]]
#: What the compiled kernel must contain (PTX).
PTX_NEEDS = ("multicast::cluster", ".reqnctapercluster 2", "fence.mbarrier_init.release.cluster")


def smem_layout(block, cga):
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.bfloat16, cga_layout=cga)


def blocks(bm: int, bn: int, bk: int):
    """(block, cga_layout) of A, B and C for a [2*bm, bn] cluster tile, k-step bk."""
    return ([bk, 2 * bm], A_CGA), ([bk, bn], B_CGA), ([2 * bm, bn], C_CGA)


def too_old() -> str | None:
    """Why this triton cannot run the probes (None when it can)."""
    if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 7):
        return f"needs triton >= 3.7 (multicast TMA loads, CTA layouts); this is {triton.__version__}"
    return None


def compile_sm90(fn, bm: int, bn: int, bk: int, consts: dict, num_warps: int, maxnreg: int | None = None):
    """``fn(a_desc, b_desc, c_desc, **consts)`` compiled here for sm_90 with 2-CTA clusters."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {
        name: f"tensordesc<bf16{list(block)},{smem_layout(block, cga)!r}>"
        for name, (block, cga) in zip(("a_desc", "b_desc", "c_desc"), blocks(bm, bn, bk))
    }
    signature.update({k: "constexpr" for k in consts})
    return triton.compile(
        GluonASTSource(fn, signature, consts),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_ctas": 2, "maxnreg": maxnreg},
    )


def descriptors(a, b, c, bm: int, bn: int, bk: int) -> list:
    """Host TMA descriptors of A [K, M], B [K, N] and C [M, N] for ``blocks(bm, bn, bk)``."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return [
        TensorDescriptor.from_tensor(t, block, smem_layout(block, cga)) for t, (block, cga) in zip((a, b, c), blocks(bm, bn, bk))
    ]


@gluon.jit
def multicast_tile_kernel(a_desc, b_desc, c_desc, MULTICAST: gl.constexpr):
    BK_: gl.constexpr = a_desc.block_type.shape[0]
    BM2: gl.constexpr = a_desc.block_type.shape[1]
    BN_: gl.constexpr = b_desc.block_type.shape[1]
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [BK_, BM2], a_desc.layout)
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [BK_, BN_], b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BM2, BN_], c_desc.layout)
    bar = mbarrier.allocate_mbarrier()  # one per CTA: on Hopper each CTA waits on its own
    mbarrier.init(bar, count=1)
    mbarrier.sync_cluster_init()  # the peer's multicast signals this CTA's barrier
    pid = gl.program_id(0)  # one program is one cluster
    mbarrier.expect(bar, a_desc.nbytes_per_cta + b_desc.nbytes_per_cta)
    tma.async_copy_global_to_shared(a_desc, [0, pid * BM2], bar, a_smem)
    tma.async_copy_global_to_shared(b_desc, [0, 0], bar, b_smem, multicast=MULTICAST)
    mbarrier.wait(bar, 0)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BN_, 16], cga_layout=[[1, 0]]
    )
    acc = warpgroup_mma(
        a_smem.permute((1, 0)), b_smem, gl.zeros([BM2, BN_], gl.float32, acc_layout), use_acc=False, is_async=True
    )
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [pid * BM2, 0], c_smem)
    tma.store_wait(0)
    cluster.arrive()  # no CTA exits while its peer may still write into its shared memory
    cluster.wait()


def compile_check(multicast: bool = True) -> list[str]:
    """Compile for sm_90 on this machine; return the PTX_NEEDS entries missing from the PTX."""
    ptx = compile_sm90(multicast_tile_kernel, BM, BN, BK, {"MULTICAST": multicast}, NUM_WARPS).asm["ptx"]
    return [s for s in PTX_NEEDS if s not in ptx]
