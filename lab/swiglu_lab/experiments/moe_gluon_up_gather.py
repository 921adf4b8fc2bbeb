"""The MoE up projection with SwiGLU reading x's rows where they are (sm_90): no expert-order copy.

    gate | up = x[order[rows of e] // k] @ gate_up_proj[e].T,  h = bf16(bf16(silu(gate)) * up)

``swiglu.kernels.moe_gluon_up``'s kernel (its MMA and epilogue partitions, its tile table) with
another loader: instead of TMA boxes of ``xs`` (``gather_rows``' [S, H] copy of x in expert order,
0.13 of the 0.83 ms at Qwen3-30B-A3B, 8192 tokens: data/tuning/moe_gluon_20261205.log), the loader
warp reads each tile's BM token ids once and gathers their rows of x into the A stage with cp.async
(16-byte vectors, rows past the expert's end zero-filled: never read), arriving on the stage's
ready barrier through ``cp.async.mbarrier.arrive`` before it announces the TMA bytes of the B
boxes, so the stage completes only when both have landed. The MMA warps fence each stage
(cp.async writes through the generic proxy, wgmma reads through the async one: ``Args.GATHER``).
Needs H % BK == 0 (no K tail: masks constant along K keep 16-byte vectors), x 16-byte aligned with
unit column stride and a row stride of 16k elements.
Compiled for sm_90 without a GPU (tests/kernels/test_moe_gluon.py); on the GPU:
``lab/probes/moe_gluon_up.py`` checks it bitwise against the library's kernels and times them.
"""

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.core import _aggregate as aggregate  # as Triton's gluon tutorial 08 does

from swiglu.kernels.configs import MoEGluonConfig
from swiglu.kernels.devices import device_sms, gluon_unavailable_reason
from swiglu.kernels.gluon_wgrad import _cta_barrier, _ring_barriers
from swiglu.kernels.moe_gluon_up import _epilogue_partition, _handover, _layout, _mma_partition, _program_tiles, _tile
from swiglu.kernels.moe_gluon_up import supports as _up_supports
from swiglu.kernels.moe_gluon_wgrad import _smem_layout
from swiglu.kernels.moe_gluon_wgrad_pingpong import gather_layout
from swiglu.kernels.moe_gluon_up import tile_table

#: The library's tile; the loader warp shares a warpgroup with the two epilogue warps, whose 168
#: registers it may use (its [BM, BK] pointers).
CONFIG = dataclasses.replace(MoEGluonConfig(), load_regs=168)


@aggregate
class Args:
    """``moe_gluon_up.Args`` (what its MMA and epilogue partitions read; ``xs_desc`` a descriptor of
    x [T, H], used for H alone) and what the gathering loader reads."""

    xs_desc: tma.tensor_descriptor
    w_desc: tma.tensor_descriptor
    table_ptr: gl.tensor
    gate_ptr: gl.tensor
    up_ptr: gl.tensor
    h_ptr: gl.tensor
    a_bufs: gl.shared_memory_descriptor
    bg_bufs: gl.shared_memory_descriptor
    bu_bufs: gl.shared_memory_descriptor
    g_bufs: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    g_ready: gl.shared_memory_descriptor
    g_empty: gl.shared_memory_descriptor
    E: gl.tensor
    I: gl.tensor
    MAX_M: gl.tensor
    GROUP_M: gl.constexpr
    GATHER: gl.constexpr
    x_ptr: gl.tensor
    order_ptr: gl.tensor
    stride_x: gl.tensor
    TOP_K: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, xs_desc, w_desc, table_ptr, gate_ptr, up_ptr, h_ptr, a_bufs, bg_bufs, bu_bufs, g_bufs, ready, empty,
                 g_ready, g_empty, E, I, MAX_M, GROUP_M, x_ptr, order_ptr, stride_x, TOP_K):  # fmt: skip
        self.xs_desc = xs_desc
        self.w_desc = w_desc
        self.table_ptr = table_ptr
        self.gate_ptr = gate_ptr
        self.up_ptr = up_ptr
        self.h_ptr = h_ptr
        self.a_bufs = a_bufs
        self.bg_bufs = bg_bufs
        self.bu_bufs = bu_bufs
        self.g_bufs = g_bufs
        self.ready = ready
        self.empty = empty
        self.g_ready = g_ready
        self.g_empty = g_empty
        self.E = E
        self.I = I
        self.MAX_M = MAX_M
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.GATHER = gl.constexpr(True)
        self.x_ptr = x_ptr
        self.order_ptr = order_ptr
        self.stride_x = stride_x
        self.TOP_K = gl.constexpr(TOP_K)


@gluon.jit
def token_rows(p, m, i, src_ptr, stride):
    """(rows, ok) [BM, 1] of M tile m (``p``: an Args with the tile table, order_ptr and TOP_K): a
    pointer to src's row of each of its pairs' tokens, and whether the expert has that row."""
    row0 = gl.load(p.table_ptr + p.MAX_M + m)
    end = gl.load(p.table_ptr + 2 * p.MAX_M + m)
    ok = row0 + i < end
    tok = gl.load(p.order_ptr + row0 + i, mask=ok, other=0) // p.TOP_K
    return gl.expand_dims(src_ptr + tok.to(gl.int64) * stride, 1), gl.expand_dims(ok, 1)


@gluon.jit
def gather_stage(p, q, rows, ok, k0, cols, NBYTES: gl.constexpr):
    """The loader's step q with a gathered A: waits for its stage, copies the rows' columns k0 ..
    k0 + BK into it by cp.async (rows not ok: zeros; H % BK == 0 keeps the mask constant along K,
    so the copies stay 16-byte vectors), then arms its ready barrier: the cp.async arrivals first
    (each adds a pending arrival, released when that thread's copies land), then the expect of the
    NBYTES of TMA boxes, so the phase cannot complete before the copies. Returns (stage, barrier)."""
    STAGES: gl.constexpr = p.a_bufs.type.shape[0]
    s = q % STAGES
    bar = p.ready.index(s)
    mbarrier.wait(p.empty.index(s), ((q // STAGES) & 1) ^ 1)
    async_copy.async_copy_global_to_shared(p.a_bufs.index(s), rows + (k0 + cols), mask=ok)
    async_copy.mbarrier_arrive(bar)
    _cta_barrier()
    mbarrier.expect(bar, NBYTES)
    return s, bar


@gluon.jit
def _gather_load_partition(p):
    # One warp: per tile its BM token rows, then per k-step the A stage by cp.async and the B
    # boxes by TMA (``gather_stage``).
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.bg_bufs.type.shape[1]
    layout: gl.constexpr = gather_layout(BK, gl.num_warps())
    H = p.xs_desc.shape[1]
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    k_tiles = gl.cdiv(H, BK)
    i = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cols = gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, layout)), 0)
    q = 0  # ring step
    for t in range(num_tiles):
        m, pid_n, e = _tile(p, t, num_n, pid, nprog)
        if e < p.E:
            rows, ok = token_rows(p, m, i, p.x_ptr, p.stride_x)
            w_row = e * 2 * p.I + pid_n * BN
            for kk in range(k_tiles):
                s, bar = gather_stage(p, q, rows, ok, kk * BK, cols, 2 * BK * 2 * BN)
                tma.async_copy_global_to_shared(p.w_desc, [w_row, kk * BK], bar, p.bg_bufs.index(s))
                tma.async_copy_global_to_shared(p.w_desc, [w_row + p.I, kk * BK], bar, p.bu_bufs.index(s))
                q += 1


@gluon.jit
def moe_up_gather_kernel(
    xs_desc, w_desc, table_ptr, gate_ptr, up_ptr, h_ptr, E, I, MAX_M, x_ptr, order_ptr, stride_x,
    TOP_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_M: gl.constexpr, EPI_WARPS: gl.constexpr,
    LOAD_REGS: gl.constexpr, EPI_REGS: gl.constexpr,
):  # fmt: skip
    """``moe_gluon_up.moe_up_gluon_kernel``'s outputs from x itself (module docstring); xs_desc: a
    descriptor of x with [BM, BK] blocks (its shape and block only); launch with num_warps=8."""
    BM: gl.constexpr = xs_desc.block_type.shape[0]
    BK: gl.constexpr = xs_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    NG: gl.constexpr = 1
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], _smem_layout([BM, BK]))
    bg_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], w_desc.layout)
    bu_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], w_desc.layout)
    g_bufs, g_pieces = _handover(2 * NG, BM, BN, EPI_M)  # gate and up
    ready, empty, g_ready, g_empty = _ring_barriers(STAGES, NG)
    p = Args(xs_desc, w_desc, table_ptr, gate_ptr, up_ptr, h_ptr, a_bufs, bg_bufs, bu_bufs, g_bufs, ready, empty, g_ready,
             g_empty, gl.to_tensor(E), gl.to_tensor(I), gl.to_tensor(MAX_M), GROUP_M, x_ptr, order_ptr,
             gl.to_tensor(stride_x), TOP_K)  # fmt: skip
    gl.warp_specialize(
        [(_mma_partition, (p,)), (_gather_load_partition, (p,)), (_epilogue_partition, (p, g_pieces, EPI_M))],
        [1, EPI_WARPS],
        [LOAD_REGS, EPI_REGS],
    )


def supports(x: torch.Tensor, gate_up_proj: torch.Tensor, cfg: MoEGluonConfig = CONFIG) -> bool:
    """``moe_gluon_up.supports`` on a device the Gluon kernels run on, with x's rows readable as
    16-byte vectors: unit column stride, a row stride multiple of 16, x 16-byte aligned, and
    H % BK == 0."""
    H = gate_up_proj.shape[2]
    return (
        _up_supports(x, gate_up_proj, cfg)
        and gluon_unavailable_reason(x.device) is None
        and x.stride(1) == 1
        and x.stride(0) % 16 == 0
        and H % cfg.BK == 0
        and x.data_ptr() % 16 == 0
    )


def launch_moe_up_gather(x, gate_up_proj, r, k: int, gate, up, h, cfg: MoEGluonConfig = CONFIG, num_programs=None):
    """``swiglu.kernels.moe.launch_up``'s contract (gate, up, h [S, I] of the routing ``r``'s sorted
    pairs, x [T, H], top-k ``k``) through this kernel; check ``supports`` first."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    E, I2, H = gate_up_proj.shape
    if r.order.numel() == 0:
        return
    table = tile_table(r, cfg.BM)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.BM, cfg.BK], _layout((cfg.BM, cfg.BK)))
    w_desc = TensorDescriptor.from_tensor(gate_up_proj.view(E * I2, H), [cfg.BN, cfg.BK], _layout((cfg.BN, cfg.BK)))
    moe_up_gather_kernel[(num_programs or device_sms(x.device),)](
        x_desc, w_desc, table, gate, up, h, E, I2 // 2, table.shape[1], x, r.order, x.stride(0),
        k, cfg.GROUP_M, cfg.STAGES, cfg.EPI_M, cfg.epi_warps, cfg.load_regs, cfg.epi_regs,
        num_warps=cfg.num_warps, maxnreg=cfg.maxnreg,
    )  # fmt: skip


def install(cfg: MoEGluonConfig = CONFIG):
    """Sends the library's up projection (``swiglu.kernels.moe.launch_up``) to this kernel where the
    plan takes the Gluon one (``Tile.GLUON``) and ``supports`` holds, in the plan's tile order, the
    library's launcher elsewhere, for the rest of the process. For measurements
    (``scripts/moe_bench_gpu.py --lab-moe-gluon up_gather``), not for training jobs. Returns a
    function that undoes it."""
    from swiglu.kernels import moe

    library = moe.launch_up

    def launch_up(x, gate_up_proj, r, k, gate, up, h, tile, limit=None, alpha=None, bias=None, interleaved=False):
        plain = limit is None and alpha is None and bias is None and not interleaved
        if tile.GLUON and plain and supports(x, gate_up_proj, cfg):
            launch_moe_up_gather(x, gate_up_proj, r, k, gate, up, h, dataclasses.replace(cfg, GROUP_M=tile.GROUP_M))
        else:
            library(x, gate_up_proj, r, k, gate, up, h, tile, limit, alpha, bias, interleaved)

    moe.launch_up = launch_up

    def undo():
        moe.launch_up = library

    return undo
