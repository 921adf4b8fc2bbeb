"""The MoE experts' dSwiGLU GEMM on the weight gradients' ping-pong tile (sm_90).

    g = gos[rows of e] @ down_proj[e]  with the SwiGLU backward in the epilogue

``swiglu.kernels.moe_gluon_dswiglu``'s contract (d_gate | d_up [S, 2I], h * w [S, I], the
routing-weight gradient's partial sums [S, I / 128] by pair id; no swiglu_limit or swiglu_alpha),
from gos, grad_out's rows in expert order. The library's Gluon kernel runs both MMA warpgroups on
one tile and the epilogue in four epilogue warps; its epilogue (gate and up loads, three stores
per element, a sum per row) looked like memory work as long as a tile's MMAs at Qwen3-30B-A3B
(K = 2048, 350 TFLOP/s there). Here, as in ``swiglu.kernels.moe_gluon_wgrad_pingpong``, two
4-warp MMA warpgroups take alternate 128 x 128 tiles, each running its own epilogue under the
other's main loop: the fp32 accumulator in two 64-column halves through the warpgroup's [128, 64]
fp32 buffer, read back EPI_M rows at a time in 16-byte row pieces, the library kernel's formulas
op for op (d_gate, d_up, h * w bitwise its), each row's sum of g * h over the half added to the
other half's through shared memory (a third summation order: fp32, not bitwise). A TMA loader warp
feeds both through one ring (A: gos in [BM, BK] boxes; B: down_proj as [E * H, I] in [BK, BN]
boxes, H % BK == 0). Tiles: the real M tiles x the N tiles (``moe_gluon_pairs_pingpong``'s walk).
On an H100 (``lab/probes/moe_gluon_dswiglu.py --pingpong``, ``lab/probes/moe_pingpong_ab.py
--dswiglu``, data/tuning/moe_dswiglu_pingpong_h100_20261206/): right (d_gate, d_up, h * w bitwise),
alone the library's Gluon kernel's speed (0.598 against 0.605 ms at Qwen3-30B-A3B), and the whole
op 0.996-1.018x the library's: not in the library. What bounds the dSwiGLU GEMM is its GEMM
(``lab/probes/moe_dswiglu_bound.py``: cuBLAS's product plus the epilogue's traffic in sequence is
faster than either kernel). ``moe_dswiglu_coop_kernel`` (``COOP_CONFIG``) takes cuBLAS's tile for
it, both warpgroups on one 256 x 128 tile, without the cluster: right, and slower at every shape
(0.723 against 0.592 ms alone at Qwen3-30B-A3B, the whole op 1.011-1.095x the library's; H100,
data/tuning/moe_dswiglu_coop256_h100_20261206/): the tensor cores idle through each tile's epilogue.
"""

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.language.core import _aggregate as aggregate  # as Triton's gluon tutorial 08 does

from swiglu.kernels.devices import device_sms
from swiglu.kernels.gluon_wgrad import _cta_barrier, _fill_stage, _mma_layout, _ring_barriers
from swiglu.kernels.moe_gluon_dswiglu import _dswiglu_values, _row_layout
from swiglu.kernels.moe_gluon_up import _layout, tile_table
from swiglu.kernels.tl_kernels import _tile_mn
from swiglu_lab.experiments.moe_gluon_pairs_pingpong import Config as PairsConfig
from swiglu_lab.experiments.moe_gluon_pairs_pingpong import _program_tiles, _tile_mma


@dataclasses.dataclass(frozen=True)
class Config(PairsConfig):
    """``moe_gluon_pairs_pingpong.Config`` (128 x 128 tiles per MMA warpgroup, 4 stages of 64-deep
    k-steps, the registers) with the epilogue EPI_M rows at a time; one [BM, 64] fp32 epilogue
    buffer per warpgroup (2 x 32 KB)."""

    EPI_M: int = 16


CONFIG = Config()
#: ``moe_dswiglu_coop_kernel``'s: 256 x 128 tiles, three stages.
COOP_CONFIG = Config(BM=256, STAGES=3)


@aggregate
class Args:
    """What every partition reads (sizes as tensors: an argument of 1 that Triton specializes is
    made one first). ``N`` is I (the name ``_program_tiles`` reads)."""

    gos_desc: tma.tensor_descriptor
    dp_desc: tma.tensor_descriptor
    start_ptr: gl.tensor
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
    s_bufs: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    order: gl.shared_memory_descriptor
    E: gl.tensor
    H: gl.tensor
    N: gl.tensor
    MAX_M: gl.tensor
    GROUP_M: gl.constexpr
    E_PAD: gl.constexpr
    EPI_M: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, gos_desc, dp_desc, start_ptr, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr,
                 part_ptr, a_bufs, b_bufs, g_bufs, s_bufs, ready, empty, order, E, H, N, MAX_M, GROUP_M, E_PAD,
                 EPI_M):  # fmt: skip
        self.gos_desc = gos_desc
        self.dp_desc = dp_desc
        self.start_ptr = start_ptr
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
        self.s_bufs = s_bufs
        self.ready = ready
        self.empty = empty
        self.order = order
        self.E = E
        self.H = H
        self.N = N
        self.MAX_M = MAX_M
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.E_PAD = gl.constexpr(E_PAD)
        self.EPI_M = gl.constexpr(EPI_M)


@gluon.jit
def _load_partition(p):
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    STAGE_BYTES: gl.constexpr = 2 * BK * (BM + BN)
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(p, BM, BN)
    k_tiles = p.H // BK
    q = 0  # ring step
    for t in range(num_tiles):
        m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, p.GROUP_M)
        e = gl.load(p.table_ptr + m)
        row0 = gl.load(p.table_ptr + p.MAX_M + m)
        for kk in range(k_tiles):
            s, bar = _fill_stage(q, p.ready, p.empty, STAGE_BYTES)
            tma.async_copy_global_to_shared(p.gos_desc, [row0, kk * BK], bar, p.a_bufs.index(s))
            tma.async_copy_global_to_shared(p.dp_desc, [e * p.H + kk * BK, pid_n * BN], bar, p.b_bufs.index(s))
            q += 1


@gluon.jit
def _half(p, buf, sums, half, j: gl.constexpr, row0, rows_left, col0, pid_n, num_n):
    # Columns col0 .. col0 + 63 of the tile (j: which half) through the warpgroup's fp32 buffer,
    # EPI_M rows at a time: the library kernel's epilogue (``moe_gluon_dswiglu._epilogue_partition``,
    # no LIMIT, no ALPHA); each row's sum of g * h kept in ``sums`` after the first half, stored after the second.
    BM: gl.constexpr = buf.type.shape[0]
    W: gl.constexpr = buf.type.shape[1]
    EPI_M: gl.constexpr = p.EPI_M
    layout: gl.constexpr = _row_layout(W, 4)
    r1 = gl.arange(0, EPI_M, layout=gl.SliceLayout(1, layout))
    cc = gl.expand_dims(gl.arange(0, W, layout=gl.SliceLayout(0, layout)), 0)
    _cta_barrier()  # every warp's reads of the buffer's last contents are done
    buf.store(half)
    _cta_barrier()
    # EPI_M-row blocks indexed at run time: a loop ptxas does not unroll (unrolled, its hoisted
    # loads spilled ~1 KB beside the other half's 64 registers). EPI_M % 8 == 0: whole swizzle periods.
    blocks = buf._reinterpret(gl.float32, [BM // EPI_M, EPI_M, W], gl.SwizzledSharedLayout(2, 1, 8, [1, 0]))
    sum_blocks = sums._reinterpret(gl.float32, [BM // EPI_M, EPI_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    for q in range(BM // EPI_M):
        acc = blocks.index(q).load(layout)
        ok1 = r1 + q * EPI_M < rows_left
        rows = row0 + q * EPI_M + r1
        pair = gl.load(p.order_ptr + rows, mask=ok1, other=0)
        wt = gl.expand_dims(gl.load(p.rw_ptr + pair, mask=ok1, other=0.0).to(gl.float32), 1)
        ok = gl.expand_dims(ok1, 1) & (cc < W)
        src = gl.expand_dims(rows.to(gl.int64) * p.N, 1) + col0 + cc
        gate = gl.load(p.gate_ptr + src, mask=ok, other=0.0).to(gl.float32)
        up = gl.load(p.up_ptr + src, mask=ok, other=0.0).to(gl.float32)
        d_gate, d_up, h = _dswiglu_values(acc, wt, gate, up)
        dst = gl.expand_dims(rows.to(gl.int64) * (2 * p.N), 1) + col0 + cc
        gl.store(p.dgu_ptr + dst, d_gate.to(gl.bfloat16), mask=ok)
        gl.store(p.dgu_ptr + dst + p.N, d_up.to(gl.bfloat16), mask=ok)
        gl.store(p.hw_ptr + src, (h * wt).to(gl.bfloat16), mask=ok)
        part = gl.sum(acc * h, axis=1)
        piece = sum_blocks.index(q)
        if j == 0:
            piece.store(part)  # read back by the same threads (the same layout) in the second half
        else:
            part = piece.load(part.type.layout) + part
            gl.store(p.part_ptr + pair.to(gl.int64) * num_n + pid_n, part, mask=ok1)


@gluon.jit
def _tile_epilogue(p, acc, buf, sums, tile, num_m, num_n, row_off):
    # The epilogue of ``acc`` (this warpgroup's [rows, BN] of ``tile``, its rows from row_off of the
    # M tile's) in its two 64-column halves.
    ROWS: gl.constexpr = acc.type.shape[0]
    BN: gl.constexpr = acc.type.shape[1]
    m, pid_n = _tile_mn(tile, num_m, num_n, p.GROUP_M)
    row0 = gl.load(p.table_ptr + p.MAX_M + m) + row_off
    rows_left = gl.load(p.table_ptr + 2 * p.MAX_M + m) - row0
    lo, hi = gl.split(gl.permute(gl.reshape(acc, [ROWS, 2, BN // 2]), (0, 2, 1)))
    _half(p, buf, sums, lo, 0, row0, rows_left, pid_n * BN, pid_n, num_n)
    _half(p, buf, sums, hi, 1, row0, rows_left, pid_n * BN + BN // 2, pid_n, num_n)


@gluon.jit
def _mma_wg(p, WHICH: gl.constexpr):
    # ``moe_gluon_pairs_pingpong``'s main loop and handshake; the dSwiGLU epilogue.
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(p, BM, BN)
    k_tiles = p.H // BK
    buf = p.g_bufs.index(WHICH)
    sums = p.s_bufs.index(WHICH)
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=_mma_layout(BM, BN, gl.num_warps()))
    j = 0  # this warpgroup's tiles so far
    for i in range(WHICH, num_tiles, 2):
        acc = _tile_mma(p, acc, i, j, k_tiles, WHICH, False)
        _tile_epilogue(p, acc, buf, sums, pid + i * nprog, num_m, num_n, 0)
        j += 1


@gluon.jit
def _mma_first(p):
    _mma_wg(p, 0)


@gluon.jit
def _mma_second(p):
    # A worker partition's arguments arrive as values, so its constexpr is set here.
    _mma_wg(p, 1)


@gluon.jit
def moe_dswiglu_pingpong_kernel(
    gos_desc, dp_desc, start_ptr, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, E, H, I,
    MAX_M, GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_M: gl.constexpr, E_PAD: gl.constexpr,
    LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr,
):  # fmt: skip
    """d_gate | d_up, h * w and the partial sums of every expert's sorted rows (module docstring);
    launch with num_warps=4."""
    BM: gl.constexpr = gos_desc.block_type.shape[0]
    BK: gl.constexpr = gos_desc.block_type.shape[1]
    BN: gl.constexpr = dp_desc.block_type.shape[1]
    gl.static_assert(BN == 128, "two 64-column halves; partial sums per 128 columns")
    gl.static_assert(BM % EPI_M == 0)
    gl.static_assert(EPI_M % 8 == 0)
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], gos_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN], dp_desc.layout)
    # fp32, 8-byte units swizzled by row (``moe_gluon_dswiglu``'s handover layout), one per warpgroup.
    g_bufs = gl.allocate_shared_memory(gl.float32, [2, BM, BN // 2], gl.SwizzledSharedLayout(2, 1, 8, [1, 0]))
    s_bufs = gl.allocate_shared_memory(gl.float32, [2, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready, empty, order, _unused = _ring_barriers(STAGES, 2)
    p = Args(gos_desc, dp_desc, start_ptr, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, a_bufs,
             b_bufs, g_bufs, s_bufs, ready, empty, order, gl.to_tensor(E), gl.to_tensor(H), gl.to_tensor(I),
             gl.to_tensor(MAX_M), GROUP_M, E_PAD, EPI_M)  # fmt: skip
    gl.warp_specialize([(_mma_first, (p,)), (_mma_second, (p,)), (_load_partition, (p,))], [4, 1], [MMA_REGS, LOAD_REGS])


# ----------------------------------------------------------------------------- cooperative 256 x 128
# Both MMA warpgroups on one 256 x 128 tile (rows 0-127 and 128-255 of each stage's [256, BK] A
# box, one B box): 85 FLOP per operand byte from L2 against the 128 x 128 tile's 64, the intensity
# of cuBLAS's 256 x 128 tile without its cluster; each warpgroup runs the epilogue of its 128 rows
# (``_half``) with no MMAs under it. Three stages (48 KB each) beside the two fp32 buffers.


@gluon.jit
def _coop_wg(p, WHICH: gl.constexpr):
    BM: gl.constexpr = p.a_bufs.type.shape[1]  # the tile's 256 rows
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    STAGES: gl.constexpr = p.a_bufs.type.shape[0]
    HM: gl.constexpr = BM // 2
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(p, BM, BN)
    k_tiles = p.H // BK
    buf = p.g_bufs.index(WHICH)
    sums = p.s_bufs.index(WHICH)
    acc = gl.zeros((HM, BN), dtype=gl.float32, layout=_mma_layout(HM, BN, gl.num_warps()))
    for t in range(num_tiles):
        c = t * k_tiles
        for kk in range(k_tiles):
            g = c + kk
            s = g % STAGES
            mbarrier.wait(p.ready.index(s), (g // STAGES) & 1)
            a = p.a_bufs.index(s).slice(WHICH * HM, HM, dim=0)
            acc = warpgroup_mma(a, p.b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # step g - 1's wgmma is done
            _cta_barrier()
            mbarrier.arrive(p.empty.index((g + STAGES - 1) % STAGES), pred=kk > 0)  # one of the stage's two arrivals
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _cta_barrier()
        mbarrier.arrive(p.empty.index((c + k_tiles - 1) % STAGES))
        _tile_epilogue(p, acc, buf, sums, pid + t * nprog, num_m, num_n, WHICH * HM)  # <= 0 rows left: none


@gluon.jit
def _coop_first(p):
    _coop_wg(p, 0)


@gluon.jit
def _coop_second(p):
    _coop_wg(p, 1)


@gluon.jit
def moe_dswiglu_coop_kernel(
    gos_desc, dp_desc, start_ptr, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, E, H, I,
    MAX_M, GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_M: gl.constexpr, E_PAD: gl.constexpr,
    LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr,
):  # fmt: skip
    """``moe_dswiglu_pingpong_kernel``'s outputs on 256 x 128 tiles (gos_desc's boxes [256, BK]; the
    tile table of 256-row M tiles); launch with num_warps=4."""
    BM: gl.constexpr = gos_desc.block_type.shape[0]
    BK: gl.constexpr = gos_desc.block_type.shape[1]
    BN: gl.constexpr = dp_desc.block_type.shape[1]
    gl.static_assert(BM == 256, "two warpgroups of 128 rows")
    gl.static_assert(BN == 128, "two 64-column halves; partial sums per 128 columns")
    gl.static_assert((BM // 2) % EPI_M == 0)
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], gos_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN], dp_desc.layout)
    g_bufs = gl.allocate_shared_memory(gl.float32, [2, BM // 2, BN // 2], gl.SwizzledSharedLayout(2, 1, 8, [1, 0]))
    s_bufs = gl.allocate_shared_memory(gl.float32, [2, BM // 2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # a stage is free once both warpgroups read it
    # No ``order`` handshake (both warpgroups on one tile): ``empty`` in its place.
    p = Args(gos_desc, dp_desc, start_ptr, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, a_bufs,
             b_bufs, g_bufs, s_bufs, ready, empty, empty, gl.to_tensor(E), gl.to_tensor(H), gl.to_tensor(I),
             gl.to_tensor(MAX_M), GROUP_M, E_PAD, EPI_M)  # fmt: skip
    gl.warp_specialize([(_coop_first, (p,)), (_coop_second, (p,)), (_load_partition, (p,))], [4, 1], [MMA_REGS, LOAD_REGS])


# ----------------------------------------------------------------------------- launcher


def supports(grad_out, down_proj, dgu, part, cfg: Config = CONFIG) -> bool:
    """``moe_gluon_dswiglu.supports``'s test at this kernel's tile."""
    E, H, I = down_proj.shape
    return (
        grad_out.is_cuda
        and grad_out.dtype == down_proj.dtype == torch.bfloat16
        and down_proj.is_contiguous()
        and down_proj.data_ptr() % 16 == 0
        and I % cfg.BN == 0
        and H > 0
        and H % cfg.BK == 0
        and part.shape[1] == I // cfg.BN
    )


def launch_moe_dswiglu_pingpong(gos, down_proj, r, weights, gate, up, dgu, hw, part, cfg: Config = CONFIG,
                                num_programs: int | None = None):  # fmt: skip
    """``moe_gluon_dswiglu.launch_moe_dswiglu_gluon``'s contract without ``limit`` and ``alpha``
    (gos [S, H]: grad_out's rows in expert order) through this kernel: the tile table, then the
    kernel on ``num_programs`` persistent programs (default one per SM); ``cfg.BM`` 256: the
    cooperative kernel. Check ``supports`` first."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    E, H, I = down_proj.shape
    if r.order.numel() == 0:
        return
    table = tile_table(r, cfg.BM)
    gos_desc = TensorDescriptor.from_tensor(gos, [cfg.BM, cfg.BK], _layout((cfg.BM, cfg.BK)))
    dp_desc = TensorDescriptor.from_tensor(down_proj.view(E * H, I), [cfg.BK, cfg.BN], _layout((cfg.BK, cfg.BN)))
    kernel = moe_dswiglu_coop_kernel if cfg.BM == 256 else moe_dswiglu_pingpong_kernel
    kernel[(num_programs or device_sms(gos.device),)](
        gos_desc, dp_desc, r.expert_start, table, r.order, weights, gate, up, dgu, hw, part, E, H, I, table.shape[1],
        cfg.GROUP_M, cfg.STAGES, cfg.EPI_M, r.E_PAD, cfg.load_regs, cfg.mma_regs,
        num_warps=4, maxnreg=cfg.maxnreg,
    )  # fmt: skip
