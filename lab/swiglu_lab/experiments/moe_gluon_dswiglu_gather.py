"""The MoE dSwiGLU GEMM reading grad_out's rows where they are (sm_90): no expert-order copy.

    g = grad_out[order[rows of e] // k] @ down_proj[e]  with the SwiGLU backward in the epilogue

``swiglu.kernels.moe_gluon_dswiglu``'s kernel (its MMA and epilogue partitions, the tile table)
with the loader of ``moe_gluon_up_gather`` in four warps: each tile's BM token ids read once, their
rows of grad_out gathered into the A stage by cp.async (16-byte vectors, rows past the expert's end
zero-filled), the stage's barrier tracking the copies before the expect of the B box, the MMA warps
fencing each stage (``Args.GATHER``). Where the plan takes the library's Gluon kernel (hidden_size
>= 4096) this drops its [S, H] copy of grad_out; at Qwen3-30B-A3B the kernel alone took 0.549 ms
against the tl kernel's 0.594, which reads the rows in place (data/tuning/moe_gluon_20261205.log).
Needs H % BK == 0 (as the library's kernel), grad_out 16-byte aligned, unit column stride, a row
stride of 16k elements. Compiled for sm_90 without a GPU (tests/kernels/test_moe_gluon.py); on the
GPU: ``lab/probes/moe_gluon_dswiglu.py`` checks it against the library's kernels and times them.
"""

import dataclasses

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma
from triton.language.core import _aggregate as aggregate  # as Triton's gluon tutorial 08 does

from swiglu.kernels.configs import MoEGluonConfig
from swiglu.kernels.devices import device_sms, gluon_unavailable_reason
from swiglu.kernels.gluon_wgrad import _ring_barriers
from swiglu.kernels.moe_gluon_dswiglu import CONFIG as LIBRARY_CONFIG
from swiglu.kernels.moe_gluon_dswiglu import _epilogue_partition, _mma_partition
from swiglu.kernels.moe_gluon_dswiglu import supports as _dswiglu_supports
from swiglu.kernels.moe_gluon_up import _layout, _program_tiles, _tile, tile_table
from swiglu.kernels.moe_gluon_wgrad import _smem_layout
from swiglu.kernels.moe_gluon_wgrad_pingpong import gather_layout
from swiglu_lab.experiments.moe_gluon_up_gather import gather_stage, token_rows

#: The library's tile; four loader warps (the warpgroup the one loader warp padded out to) at 48
#: registers (8 16-byte vectors per thread a stage; at 40 ptxas spilled 4 bytes).
CONFIG = dataclasses.replace(LIBRARY_CONFIG, load_regs=48)


@aggregate
class Args:
    """``moe_gluon_dswiglu.Args`` (what its MMA and epilogue partitions read; ``gos_desc`` a
    descriptor of grad_out [T, H], for its block alone) and what the gathering loader reads."""

    gos_desc: tma.tensor_descriptor
    dp_desc: tma.tensor_descriptor
    table_ptr: gl.tensor
    order_ptr: gl.tensor
    rw_ptr: gl.tensor
    gate_ptr: gl.tensor
    up_ptr: gl.tensor
    dgu_ptr: gl.tensor
    hw_ptr: gl.tensor
    part_ptr: gl.tensor
    a_bufs: gl.shared_memory_descriptor
    b_bufs: gl.shared_memory_descriptor
    g_bufs: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    g_ready: gl.shared_memory_descriptor
    g_empty: gl.shared_memory_descriptor
    E: gl.tensor
    H: gl.tensor
    I: gl.tensor
    MAX_M: gl.tensor
    GROUP_M: gl.constexpr
    GATHER: gl.constexpr
    go_ptr: gl.tensor
    stride_go: gl.tensor
    TOP_K: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, gos_desc, dp_desc, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, a_bufs,
                 b_bufs, g_bufs, ready, empty, g_ready, g_empty, E, H, I, MAX_M, GROUP_M, go_ptr, stride_go, TOP_K):  # fmt: skip
        self.gos_desc = gos_desc
        self.dp_desc = dp_desc
        self.table_ptr = table_ptr
        self.order_ptr = order_ptr
        self.rw_ptr = rw_ptr
        self.gate_ptr = gate_ptr
        self.up_ptr = up_ptr
        self.dgu_ptr = dgu_ptr
        self.hw_ptr = hw_ptr
        self.part_ptr = part_ptr
        self.a_bufs = a_bufs
        self.b_bufs = b_bufs
        self.g_bufs = g_bufs
        self.ready = ready
        self.empty = empty
        self.g_ready = g_ready
        self.g_empty = g_empty
        self.E = E
        self.H = H
        self.I = I
        self.MAX_M = MAX_M
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.GATHER = gl.constexpr(True)
        self.go_ptr = go_ptr
        self.stride_go = stride_go
        self.TOP_K = gl.constexpr(TOP_K)


@gluon.jit
def _gather_load_partition(p):
    # Four warps: per tile its BM token rows of grad_out, then per k-step the A stage by cp.async
    # and the B box by TMA (``moe_gluon_up_gather.gather_stage``).
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    layout: gl.constexpr = gather_layout(BK, gl.num_warps())
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    k_tiles = p.H // BK
    i = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cols = gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, layout)), 0)
    q = 0  # ring step
    for t in range(num_tiles):
        m, pid_n, e = _tile(p, t, num_n, pid, nprog)
        if e < p.E:
            rows, ok = token_rows(p, m, i, p.go_ptr, p.stride_go)
            for kk in range(k_tiles):
                s, bar = gather_stage(p, q, rows, ok, kk * BK, cols, 2 * BK * BN)
                tma.async_copy_global_to_shared(p.dp_desc, [e * p.H + kk * BK, pid_n * BN], bar, p.b_bufs.index(s))
                q += 1


@gluon.jit
def moe_dswiglu_gather_kernel(
    gos_desc, dp_desc, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, E, H, I, MAX_M,
    go_ptr, stride_go,
    TOP_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_M: gl.constexpr, EPI_WARPS: gl.constexpr,
    LOAD_REGS: gl.constexpr, EPI_REGS: gl.constexpr,
):  # fmt: skip
    """``moe_gluon_dswiglu.moe_dswiglu_gluon_kernel``'s outputs from grad_out itself (module
    docstring); gos_desc: a descriptor of grad_out with [BM, BK] blocks (its block only); launch
    with num_warps=8."""
    BM: gl.constexpr = gos_desc.block_type.shape[0]
    BK: gl.constexpr = gos_desc.block_type.shape[1]
    BN: gl.constexpr = dp_desc.block_type.shape[1]
    NG: gl.constexpr = 1
    gl.static_assert(BM % EPI_M == 0)
    gl.static_assert(EPI_M % 8 == 0)
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], _smem_layout([BM, BK]))
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN], dp_desc.layout)
    g_bufs = gl.allocate_shared_memory(gl.float32, [BM, BN], gl.SwizzledSharedLayout(2, 1, 8, [1, 0]))
    ready, empty, g_ready, g_empty = _ring_barriers(STAGES, NG)
    p = Args(gos_desc, dp_desc, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, a_bufs, b_bufs,
             g_bufs, ready, empty, g_ready, g_empty, gl.to_tensor(E), gl.to_tensor(H), gl.to_tensor(I), gl.to_tensor(MAX_M),
             GROUP_M, go_ptr, gl.to_tensor(stride_go), TOP_K)  # fmt: skip
    gl.warp_specialize(
        [(_mma_partition, (p,)), (_gather_load_partition, (p,)), (_epilogue_partition, (p, EPI_M))],
        [4, EPI_WARPS],
        [LOAD_REGS, EPI_REGS],
    )


def supports(grad_out, down_proj, dgu, part, cfg: MoEGluonConfig = CONFIG) -> bool:
    """``moe_gluon_dswiglu.supports`` on a device the Gluon kernels run on, with grad_out's rows
    readable as 16-byte vectors: unit column stride, a row stride multiple of 16, 16-byte aligned."""
    return (
        _dswiglu_supports(grad_out, down_proj, dgu, part, cfg)
        and gluon_unavailable_reason(grad_out.device) is None
        and grad_out.stride(1) == 1
        and grad_out.stride(0) % 16 == 0
        and grad_out.data_ptr() % 16 == 0
    )


def launch_moe_dswiglu_gather(grad_out, down_proj, r, k: int, weights, gate, up, dgu, hw, part,
                              cfg: MoEGluonConfig = CONFIG, num_programs=None):  # fmt: skip
    """``swiglu.kernels.moe.launch_dswiglu``'s contract (without ``reuse_saved_buffers``) from
    grad_out [T, H] itself, top-k ``k``; check ``supports`` first."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    E, H, I = down_proj.shape
    if r.order.numel() == 0:
        return
    table = tile_table(r, cfg.BM)
    go_desc = TensorDescriptor.from_tensor(grad_out, [cfg.BM, cfg.BK], _layout((cfg.BM, cfg.BK)))
    dp_desc = TensorDescriptor.from_tensor(down_proj.view(E * H, I), [cfg.BK, cfg.BN], _layout((cfg.BK, cfg.BN)))
    moe_dswiglu_gather_kernel[(num_programs or device_sms(grad_out.device),)](
        go_desc, dp_desc, table, r.order, weights, gate, up, dgu, hw, part, E, H, I, table.shape[1], grad_out,
        grad_out.stride(0), k, cfg.GROUP_M, cfg.STAGES, cfg.EPI_M, cfg.epi_warps, cfg.load_regs, cfg.epi_regs,
        num_warps=cfg.num_warps, maxnreg=cfg.maxnreg,
    )  # fmt: skip


def install(cfg: MoEGluonConfig = CONFIG):
    """Sends the library's dSwiGLU GEMM (``swiglu.kernels.moe.launch_dswiglu``) to this kernel where
    ``supports`` holds, whatever the plan's tile says, in its tile order, the library's launcher
    elsewhere, for the rest of the process; the plans share no grad_out copy between dSwiGLU and
    grad_down_proj (``MoEPlan.share_grad_out_copy`` off: this kernel reads grad_out in place). For
    measurements (``scripts/moe_bench_gpu.py --lab-moe-gluon dswiglu_gather``), not for training
    jobs. Returns a function that undoes it."""
    from swiglu.kernels import moe

    library, library_plan = moe.launch_dswiglu, moe.moe_plan

    def launch_dswiglu(grad_out, down_proj, r, k, weights, gate, up, dgu, hw, part, tile, gos=None, limit=None, alpha=None,
                       interleaved=False):  # fmt: skip
        plain = gos is None and limit is None and alpha is None and not interleaved
        if plain and supports(grad_out, down_proj, dgu, part, cfg):
            launch_moe_dswiglu_gather(
                grad_out, down_proj, r, k, weights, gate, up, dgu, hw, part, dataclasses.replace(cfg, GROUP_M=tile.GROUP_M)
            )
        else:
            library(grad_out, down_proj, r, k, weights, gate, up, dgu, hw, part, tile, gos, limit, alpha, interleaved)

    def moe_plan(*args):
        return dataclasses.replace(library_plan(*args), share_grad_out_copy=False)

    moe_plan.cache_clear = library_plan.cache_clear  # swiglu.ops.clear_plans clears the library's cache

    moe.launch_dswiglu, moe.moe_plan = launch_dswiglu, moe_plan

    def undo():
        moe.launch_dswiglu, moe.moe_plan = library, library_plan

    return undo
