"""The MoE experts' dSwiGLU GEMM as one warp-specialized Gluon kernel (sm_90).

    g = gos[rows of e] @ down_proj[e]  with the SwiGLU backward in the epilogue

for every expert's sorted rows: the contract of the library's ``moe_dswiglu_kernel``
(``swiglu.kernels.moe.launch_dswiglu``: d_gate | d_up [S, 2I],
h * w [S, I] and the routing-weight gradient's partial sums [S, I / BN] by pair id), with the
epilogue in its own warps while the MMA warps run the next tile (the dense Gluon dSwiGLU kernel's
arrangement, ``kernels/gluon_dswiglu.py``). Partitions: a TMA loader warp (A from ``gos``, the
rows of grad_out in expert order, ``gather_rows``; B the expert's [H, I] ``down_proj`` viewed as
[E * H, I]); two MMA warpgroups on one BM x BN tile, the fp32 accumulator handed over through
shared memory (the tl kernel's epilogue works on fp32 g: no bf16 rounding of it); ``epi_warps``
warps loading gate, up and the routing weights, computing and storing with masked pointer stores
[EPI_M, BN] rows at a time (rows past the expert's end are the next expert's, never written). The
tiles come from ``moe_gluon_up.tile_table``. d_gate, d_up and h * w are the tl kernel's bits (its
formulas op for op, fp32 sums over K in the same wgmma order); the partial sums add a row's BN
products in another order than ``tl.sum`` (fp32, not bitwise). Requires I % BN == 0 and
H % BK == 0 (a B box stays in its expert's rows): every model shape.
On an H200 (lab/probes/moe_gluon_dswiglu.py): d_gate, d_up, h * w bitwise the tl kernel's, the
partial sums within 2e-7; 1.07-1.21x its time at hidden_size >= 4096 with the grad_out copy,
slower at Qwen3-30B-A3B (data/tuning/moe_gluon_20261205.log).
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.language.core import _aggregate as aggregate  # as Triton's gluon tutorial 08 does

from .gluon_dswiglu import _sigmoid
from .configs import MoEGluonConfig
from .devices import device_sms
from .gluon_wgrad import _cta_barrier, _fill_stage, _mma_layout, _mma_tile, _ring_barriers

# The tile walk (p: any Args with I, MAX_M, table_ptr and GROUP_M) and the tile table are the up projection's.
from .moe_gluon_up import _layout, _program_tiles, _tile, tile_table


#: The dense Gluon dSwiGLU kernel's 128 x 128 x 64 candidate with 4 stages (8 MMA + 1 loader + 4
#: epilogue warps: 16 with the loader's warpgroup, maxnreg 128; the epilogue's 168 by setmaxnreg,
#: which its 8 unrolled row pieces need to compile without spills, the MMA warps' 160 the rest) and
#: one fp32 handover buffer: 4 x 32 KB + 64 KB of shared memory.
CONFIG = MoEGluonConfig(STAGES=4, epi_warps=4, maxnreg=128)


@aggregate
class Args:
    """What every partition reads (sizes as tensors: an argument of 1 that Triton specializes is
    made one first)."""

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
    GATHER: gl.constexpr  # A written by cp.async (a gathering loader), not TMA: the MMAs fence first

    @gluon.constexpr_function
    def __init__(self, gos_desc, dp_desc, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, a_bufs,
                 b_bufs, g_bufs, ready, empty, g_ready, g_empty, E, H, I, MAX_M, GROUP_M, GATHER=False):  # fmt: skip
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
        self.GATHER = gl.constexpr(GATHER)


@gluon.jit
def _load_partition(p):
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    STAGE_BYTES: gl.constexpr = 2 * BK * (BM + BN)
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    k_tiles = p.H // BK
    q = 0  # ring step
    for t in range(num_tiles):
        m, pid_n, e = _tile(p, t, num_n, pid, nprog)
        if e < p.E:
            row0 = gl.load(p.table_ptr + p.MAX_M + m)
            for kk in range(k_tiles):
                s, bar = _fill_stage(q, p.ready, p.empty, STAGE_BYTES)
                tma.async_copy_global_to_shared(p.gos_desc, [row0, kk * BK], bar, p.a_bufs.index(s))
                tma.async_copy_global_to_shared(p.dp_desc, [e * p.H + kk * BK, pid_n * BN], bar, p.b_bufs.index(s))
                q += 1


@gluon.jit
def _mma_partition(p):
    # Both MMA warpgroups on one tile; the fp32 accumulator goes to the epilogue as it is.
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    NG: gl.constexpr = p.g_ready.type.shape[0]
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    k_tiles = p.H // BK
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=_mma_layout(BM, BN, gl.num_warps()))
    c = 0  # ring step
    w = 0  # tiles worked (the handover's counter)
    for t in range(num_tiles):
        e = _tile(p, t, num_n, pid, nprog)[2]
        if e < p.E:
            acc, c = _mma_tile(p.a_bufs, p.b_bufs, p.ready, p.empty, acc, c, k_tiles, False, p.GATHER)
            buf = w % NG
            mbarrier.wait(p.g_empty.index(buf), ((w // NG) & 1) ^ 1)
            p.g_bufs.store(acc)  # one handover buffer (NG = 1)
            _cta_barrier()
            mbarrier.arrive(p.g_ready.index(buf))
            w += 1


@gluon.constexpr_function
def _row_layout(BN, num_warps):
    # 4 fp32 (16 bytes) per thread along a row; a warp covers 128 // BN rows of BN columns.
    tpw_n = min(BN // 4, 32)
    return gl.BlockedLayout([1, 4], [32 // tpw_n, tpw_n], [num_warps, 1], [1, 0])


@gluon.jit
def _dswiglu_values(acc, wt, gate, up, LIMIT: gl.constexpr = None, ALPHA: gl.constexpr = None):
    """(d_gate, d_up, h) of g = acc * wt at the saved gate and up (fp32): the tl kernel's
    ``_dswiglu_piece`` op for op (LIMIT, ALPHA as its), h rounded to bf16 as its."""
    if LIMIT is not None:
        gate_raw = gate
        up_raw = up
        gate = gl.minimum(gate, LIMIT)
        up = gl.minimum(gl.maximum(up, -LIMIT), LIMIT)
    if ALPHA is None:
        act = (gate * _sigmoid(gate)).to(gl.bfloat16).to(gl.float32)
        h = (act * up).to(gl.bfloat16).to(gl.float32)
        g = acc * wt
        s = _sigmoid(gate)
        d_up = g * act
        d_gate = g * up * s * (1.0 + gate * (1.0 - s))
    else:  # the tl kernel's _glu_parts form
        factor = up + 1.0
        act = (gate * _sigmoid(ALPHA * gate)).to(gl.bfloat16).to(gl.float32)
        h = (act * factor).to(gl.bfloat16).to(gl.float32)
        g = acc * wt
        s = _sigmoid(ALPHA * gate)
        d_up = g * act
        d_gate = g * factor * s * (1.0 + ALPHA * gate * (1.0 - s))
    if LIMIT is not None:  # the clamp's gradient: through where the saved values were in range
        d_gate = gl.where(gate_raw <= LIMIT, d_gate, 0.0)
        d_up = gl.where((up_raw >= -LIMIT) & (up_raw <= LIMIT), d_up, 0.0)
    return d_gate, d_up, h


@gluon.jit
def _epilogue_partition(p, EPI_M: gl.constexpr, LIMIT: gl.constexpr = None, ALPHA: gl.constexpr = None):
    # The tl kernel's _dswiglu_piece op for op (LIMIT, ALPHA as its), EPI_M rows of the tile at a time.
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    NG: gl.constexpr = p.g_ready.type.shape[0]
    NW: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = _row_layout(BN, NW)
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    r1 = gl.arange(0, EPI_M, layout=gl.SliceLayout(1, layout))
    cc = gl.expand_dims(gl.arange(0, BN, layout=gl.SliceLayout(0, layout)), 0)
    w_t = 0
    for t in range(num_tiles):
        m, pid_n, e = _tile(p, t, num_n, pid, nprog)
        if e < p.E:
            row0 = gl.load(p.table_ptr + p.MAX_M + m)
            rows_left = gl.load(p.table_ptr + 2 * p.MAX_M + m) - row0
            buf = w_t % NG
            mbarrier.wait(p.g_ready.index(buf), (w_t // NG) & 1)
            for q in gl.static_range(BM // EPI_M):  # a slice's start must be a constant
                acc = p.g_bufs.slice(q * EPI_M, EPI_M).load(layout)
                _cta_barrier()
                mbarrier.arrive(p.g_empty.index(buf), pred=q == BM // EPI_M - 1)
                ok1 = r1 + q * EPI_M < rows_left
                rows = row0 + q * EPI_M + r1
                pair = gl.load(p.order_ptr + rows, mask=ok1, other=0)
                wt = gl.expand_dims(gl.load(p.rw_ptr + pair, mask=ok1, other=0.0).to(gl.float32), 1)
                ok = gl.expand_dims(ok1, 1) & (cc < BN)
                src = gl.expand_dims(rows.to(gl.int64) * p.I, 1) + pid_n * BN + cc
                gate = gl.load(p.gate_ptr + src, mask=ok, other=0.0).to(gl.float32)
                up = gl.load(p.up_ptr + src, mask=ok, other=0.0).to(gl.float32)
                d_gate, d_up, h = _dswiglu_values(acc, wt, gate, up, LIMIT, ALPHA)
                dst = gl.expand_dims(rows.to(gl.int64) * (2 * p.I), 1) + pid_n * BN + cc
                gl.store(p.dgu_ptr + dst, d_gate.to(gl.bfloat16), mask=ok)
                gl.store(p.dgu_ptr + dst + p.I, d_up.to(gl.bfloat16), mask=ok)
                gl.store(p.hw_ptr + src, (h * wt).to(gl.bfloat16), mask=ok)
                part = gl.sum(acc * h, axis=1)
                gl.store(p.part_ptr + pair.to(gl.int64) * num_n + pid_n, part, mask=ok1)
            w_t += 1


@gluon.jit
def moe_dswiglu_gluon_kernel(
    gos_desc, dp_desc, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, E, H, I, MAX_M,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_M: gl.constexpr, EPI_WARPS: gl.constexpr, LOAD_REGS: gl.constexpr,
    EPI_REGS: gl.constexpr, LIMIT: gl.constexpr = None, ALPHA: gl.constexpr = None,
):  # fmt: skip
    """d_gate | d_up, h * w and the partial sums of every expert's sorted rows (module docstring;
    LIMIT: the swiglu_limit rounded to bf16, or None; ALPHA: the swiglu_alpha, or None); launch
    with num_warps=8."""
    BM: gl.constexpr = gos_desc.block_type.shape[0]
    BK: gl.constexpr = gos_desc.block_type.shape[1]
    BN: gl.constexpr = dp_desc.block_type.shape[1]
    NG: gl.constexpr = 1  # handover buffers: g_bufs is one
    gl.static_assert(BM % EPI_M == 0)
    gl.static_assert(EPI_M % 8 == 0)
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], gos_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN], dp_desc.layout)
    # fp32 handover, 8-byte units swizzled by row (the accumulator's stores hit 8 rows of the same
    # columns at once); the epilogue reads it EPI_M rows at a time (EPI_M a multiple of 8: whole
    # swizzle periods).
    g_bufs = gl.allocate_shared_memory(gl.float32, [BM, BN], gl.SwizzledSharedLayout(2, 1, 8, [1, 0]))
    ready, empty, g_ready, g_empty = _ring_barriers(STAGES, NG)
    p = Args(gos_desc, dp_desc, table_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, a_bufs, b_bufs,
             g_bufs, ready, empty, g_ready, g_empty, gl.to_tensor(E), gl.to_tensor(H), gl.to_tensor(I), gl.to_tensor(MAX_M),
             GROUP_M)  # fmt: skip
    gl.warp_specialize(
        [(_mma_partition, (p,)), (_load_partition, (p,)), (_epilogue_partition, (p, EPI_M, LIMIT, ALPHA))],
        [1, EPI_WARPS],
        [LOAD_REGS, EPI_REGS],
    )


# ----------------------------------------------------------------------------- launcher


def supports(grad_out, down_proj, dgu, part, cfg: MoEGluonConfig = CONFIG) -> bool:
    """Whether ``launch_moe_dswiglu_gluon`` takes these operands: bf16 CUDA tensors (the caller
    checks that Gluon runs on the device), contiguous expert weights, I % BN == 0, H > 0,
    H % BK == 0 and the partial sums [S, I / BN]."""
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


def launch_moe_dswiglu_gluon(gos, down_proj, r, weights, gate, up, dgu, hw, part, cfg: MoEGluonConfig = CONFIG,
                             num_programs: int | None = None, limit: float | None = None,
                             alpha: float | None = None):  # fmt: skip
    """``swiglu.kernels.moe.launch_dswiglu``'s contract (``limit`` bf16-exact or None, ``alpha``) through
    this kernel, from gos [S, H], grad_out's rows in expert order (``gather_rows``): the tile table,
    then the kernel on ``num_programs`` persistent programs (default one per SM). Check
    ``supports`` first. ``weights``: top_k_weights [T, k] contiguous, any float dtype."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    E, H, I = down_proj.shape
    if r.order.numel() == 0:
        return
    table = tile_table(r, cfg.BM)
    gos_desc = TensorDescriptor.from_tensor(gos, [cfg.BM, cfg.BK], _layout((cfg.BM, cfg.BK)))
    dp_desc = TensorDescriptor.from_tensor(down_proj.view(E * H, I), [cfg.BK, cfg.BN], _layout((cfg.BK, cfg.BN)))
    num_programs = num_programs or device_sms(gos.device)
    moe_dswiglu_gluon_kernel[(num_programs,)](
        gos_desc, dp_desc, table, r.order, weights, gate, up, dgu, hw, part, E, H, I, table.shape[1],
        cfg.GROUP_M, cfg.STAGES, cfg.EPI_M, cfg.epi_warps, cfg.load_regs, cfg.epi_regs, LIMIT=limit, ALPHA=alpha,
        num_warps=cfg.num_warps, maxnreg=cfg.maxnreg,
    )  # fmt: skip
