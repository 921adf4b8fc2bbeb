"""The MoE experts' up projection with SwiGLU as one warp-specialized Gluon kernel (sm_90).

    gate | up = xs[rows of e] @ gate_up_proj[e].T,  h = bf16(bf16(silu(gate)) * up)

for every expert's sorted rows: the contract of the library's ``moe_up_kernel``
(``swiglu.kernels.moe.launch_up``: gate, up, h [S, I] in expert order, bf16), with the SwiGLU
epilogue in its own warps while the MMA warps run the next tile, as the dense backward's Gluon
dSwiGLU kernel (``kernels/gluon_dswiglu.py``) does. Partitions: a TMA loader warp (A from ``xs``,
the rows of x in expert order, ``gather_rows``; B the expert's gate rows and up rows of
``gate_up_proj`` viewed as [E * 2I, H]); two MMA warpgroups on one BM x (BN gate + BN up) tile, two
fp32 accumulators handed over as bf16 (gate and up are stored rounded, and h is computed from the
rounded values: the tl kernel's rounding points); ``epi_warps`` warps computing h and storing gate,
up and h with masked pointer stores, [EPI_M, 64] pieces at a time (rows past the expert's end are
the next expert's, never written). The tiles (expert, first row, end) come from a table built by
``moe_tile_table_kernel`` on the device (no host synchronization); a tile past the experts' last
is idle in every partition. A rows past an expert's end feed only rows that are not stored.
Requires I % BN == 0 (a B box stays in its half) and H % 8 == 0 (TMA strides): every model shape.
Bitwise the tl kernel's on an H200 (lab/probes/moe_gluon_up.py); 1.08-1.21x its time at the
four model shapes, 8192 tokens, the x copy included (data/tuning/moe_gluon_20261205.log).
"""

from functools import lru_cache

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate  # as Triton's gluon tutorial 08 does

from .gluon_dswiglu import _epi_layout, _sigmoid
from .configs import MoEGluonConfig
from .devices import device_sms
from .gluon_wgrad import _cta_barrier, _fill_stage, _mma_layout, _ring_barriers
from .tl_kernels import _tile_mn  # scalar integer code only: compiles the same in a Gluon kernel


#: A BM x (2 BN) tile (BN gate and BN up columns) is the dense Gluon dSwiGLU kernel's 128 x 256
#: (``DswigluGluonConfig``'s registers: 12 warps in all, 168 each); 3 stages of 48 KB and the gate +
#: up handover of 64 KB: 208 KB of shared memory.
CONFIG = MoEGluonConfig()


# ----------------------------------------------------------------------------- the tile table


@triton.jit
def moe_tile_table_kernel(start_ptr, table_ptr, E, MAX_M, BM: tl.constexpr, E_PAD: tl.constexpr, MB: tl.constexpr):
    """table [3, MAX_M] int32: for M tile m of the grouped GEMM (each expert's cdiv(count, BM)
    tiles in expert order, as ``moe._grouped_tile`` finds them), its expert (>= E: idle), its
    first sorted row and its expert's end row. One program per MB tiles: 4.2 us at Qwen3-30B-A3B's
    640 tiles (8192 tokens, H100), against 46 us for one program over all (lab/probes/moe_kernel_profile.py)."""
    bins = tl.arange(0, E_PAD)
    lo = tl.load(start_ptr + bins, mask=bins < E, other=0)
    hi = tl.load(start_ptr + bins + 1, mask=bins < E, other=0)
    tiles = (hi - lo + BM - 1) // BM
    cum = tl.cumsum(tiles, 0)
    first = cum - tiles
    m = tl.program_id(0) * MB + tl.arange(0, MB)
    e = tl.sum((cum[None, :] <= m[:, None]).to(tl.int32), axis=1)
    sel = bins[None, :] == e[:, None]
    row0 = tl.sum(tl.where(sel, lo[None, :] + (m[:, None] - first[None, :]) * BM, 0), axis=1)
    end = tl.sum(tl.where(sel, hi[None, :], 0), axis=1)
    ok = m < MAX_M
    tl.store(table_ptr + m, e, mask=ok)
    tl.store(table_ptr + MAX_M + m, row0, mask=ok)
    tl.store(table_ptr + 2 * MAX_M + m, end, mask=ok)


# ----------------------------------------------------------------------------- partitions


@aggregate
class Args:
    """What every partition reads (sizes as tensors: an argument of 1 that Triton specializes is
    made one first)."""

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
    GATHER: gl.constexpr  # A written by cp.async (a gathering loader), not TMA: the MMAs fence first

    @gluon.constexpr_function
    def __init__(self, xs_desc, w_desc, table_ptr, gate_ptr, up_ptr, h_ptr, a_bufs, bg_bufs, bu_bufs, g_bufs, ready, empty,
                 g_ready, g_empty, E, I, MAX_M, GROUP_M, GATHER=False):  # fmt: skip
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
        self.GATHER = gl.constexpr(GATHER)


@gluon.jit
def _program_tiles(p, BN: gl.constexpr):
    """(num_n, pid, nprog, num_tiles): the MAX_M x num_n tiles (idle ones included) and this
    persistent program's share (tiles pid, pid + nprog, ...), as every partition counts."""
    num_n = p.I // BN
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    return num_n, pid, nprog, gl.cdiv(p.MAX_M * num_n - pid, nprog)


@gluon.jit
def _tile(p, t, num_n, pid, nprog):
    """(m, pid_n, e) of this program's tile t: its M tile, N tile and expert (>= E: idle)."""
    m, pid_n = _tile_mn(pid + t * nprog, p.MAX_M, num_n, p.GROUP_M)
    return m, pid_n, gl.load(p.table_ptr + m)


@gluon.jit
def _load_partition(p):
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.bg_bufs.type.shape[1]
    STAGE_BYTES: gl.constexpr = 2 * BK * (BM + 2 * BN)
    H = p.xs_desc.shape[1]
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    k_tiles = gl.cdiv(H, BK)
    q = 0  # ring step
    for t in range(num_tiles):
        m, pid_n, e = _tile(p, t, num_n, pid, nprog)
        if e < p.E:
            row0 = gl.load(p.table_ptr + p.MAX_M + m)
            w_row = e * 2 * p.I + pid_n * BN
            for kk in range(k_tiles):
                s, bar = _fill_stage(q, p.ready, p.empty, STAGE_BYTES)
                tma.async_copy_global_to_shared(p.xs_desc, [row0, kk * BK], bar, p.a_bufs.index(s))
                tma.async_copy_global_to_shared(p.w_desc, [w_row, kk * BK], bar, p.bg_bufs.index(s))
                tma.async_copy_global_to_shared(p.w_desc, [w_row + p.I, kk * BK], bar, p.bu_bufs.index(s))
                q += 1


@gluon.jit
def _mma_partition(p):
    # Both MMA warpgroups on one tile: a gate and an up accumulator from the same A stage, handed
    # to the epilogue as bf16 (gate and up are stored rounded; h is computed from the rounded values).
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.bg_bufs.type.shape[1]
    STAGES: gl.constexpr = p.a_bufs.type.shape[0]
    NG: gl.constexpr = p.g_ready.type.shape[0]
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    k_tiles = gl.cdiv(p.xs_desc.shape[1], BK)
    layout: gl.constexpr = _mma_layout(BM, BN, gl.num_warps())
    acc_g = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
    acc_u = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
    c = 0  # ring step
    w = 0  # tiles worked (the handover's counter)
    for t in range(num_tiles):
        e = _tile(p, t, num_n, pid, nprog)[2]
        if e < p.E:
            for kk in range(k_tiles):
                s = c % STAGES
                mbarrier.wait(p.ready.index(s), (c // STAGES) & 1)
                if p.GATHER:  # cp.async's writes (generic proxy) before wgmma's reads (async proxy)
                    fence_async_shared()
                a_s = p.a_bufs.index(s)
                acc_g = warpgroup_mma(a_s, p.bg_bufs.index(s).permute((1, 0)), acc_g, use_acc=kk > 0, is_async=True)
                acc_u = warpgroup_mma(a_s, p.bu_bufs.index(s).permute((1, 0)), acc_u, use_acc=kk > 0, is_async=True)
                # The previous step's two wgmma are done in this warpgroup; sync the partition
                # before thread 0 releases that stage to the loader.
                acc_g, acc_u = warpgroup_mma_wait(num_outstanding=2, deps=(acc_g, acc_u))
                _cta_barrier()
                mbarrier.arrive(p.empty.index((c + STAGES - 1) % STAGES), pred=kk > 0)
                c += 1
            acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))
            _cta_barrier()
            mbarrier.arrive(p.empty.index((c + STAGES - 1) % STAGES))
            buf = w % NG
            mbarrier.wait(p.g_empty.index(buf), ((w // NG) & 1) ^ 1)
            p.g_bufs.index(2 * buf).store(acc_g.to(gl.bfloat16))
            p.g_bufs.index(2 * buf + 1).store(acc_u.to(gl.bfloat16))
            _cta_barrier()
            mbarrier.arrive(p.g_ready.index(buf))
            w += 1


@gluon.jit
def _epilogue_partition(p, g_pieces, EPI_M: gl.constexpr, LIMIT: gl.constexpr = None, ALPHA: gl.constexpr = None):
    # g_pieces: the handover ring as [2 * NG * NP, EPI_M, 64] pieces (gate buffer 2b, up 2b + 1;
    # the kernel's comment says why a piece is a view). h = bf16(bf16(gate * sigmoid(gate)) * up),
    # the tl kernel's _activated_gate and product, of gate and up clamped by LIMIT as its _clamped;
    # with ALPHA its _glu_parts' form.
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BN: gl.constexpr = p.bg_bufs.type.shape[1]
    NG: gl.constexpr = p.g_ready.type.shape[0]
    NPM: gl.constexpr = BM // EPI_M
    NP: gl.constexpr = NPM * (BN // 64)
    layout: gl.constexpr = _epi_layout(64, gl.num_warps())
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    r = gl.expand_dims(gl.arange(0, EPI_M, layout=gl.SliceLayout(1, layout)), 1)
    cc = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, layout)), 0)
    offs = r * p.I + cc
    w = 0
    for t in range(num_tiles):
        m, pid_n, e = _tile(p, t, num_n, pid, nprog)
        if e < p.E:
            row0 = gl.load(p.table_ptr + p.MAX_M + m)
            rows = gl.load(p.table_ptr + 2 * p.MAX_M + m) - row0  # rows of this expert from row0
            buf = w % NG
            mbarrier.wait(p.g_ready.index(buf), (w // NG) & 1)
            for q in range(NP):
                gate_bf = g_pieces.index((2 * buf) * NP + q).load(layout)
                up_bf = g_pieces.index((2 * buf + 1) * NP + q).load(layout)
                # After the last piece is in registers, hand the buffers back to the MMA warps.
                _cta_barrier()
                mbarrier.arrive(p.g_empty.index(buf), pred=q == NP - 1)
                gate = gate_bf.to(gl.float32)
                up = up_bf.to(gl.float32)
                if LIMIT is not None:  # gate and up are stored unclamped
                    gate = gl.minimum(gate, LIMIT)
                    up = gl.minimum(gl.maximum(up, -LIMIT), LIMIT)
                if ALPHA is None:
                    act = (gate * _sigmoid(gate)).to(gl.bfloat16).to(gl.float32)
                    h = (act * up).to(gl.bfloat16)
                else:
                    act = (gate * _sigmoid(ALPHA * gate)).to(gl.bfloat16).to(gl.float32)
                    h = (act * (up + 1.0)).to(gl.bfloat16)
                pm = q % NPM
                base = (row0 + pm * EPI_M).to(gl.int64) * p.I + pid_n * BN + (q // NPM) * 64
                ok = (r + pm * EPI_M < rows) & (cc < 64)
                gl.store(p.gate_ptr + base + offs, gate_bf, mask=ok)
                gl.store(p.up_ptr + base + offs, up_bf, mask=ok)
                gl.store(p.h_ptr + base + offs, h, mask=ok)
            w += 1


@gluon.jit
def _handover(NBUF: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, EPI_M: gl.constexpr):
    """(bufs, pieces): NBUF [BM, BN] bf16 buffers (128-byte swizzle) from the MMA warps to the
    epilogue, and the epilogue's view of the same bytes (gluon_dswiglu's): a [BM, BN] tile is BN // 64
    consecutive [BM, 64] column blocks, so piece (pm, pn) of EPI_M x 64 in buffer b is the swizzled
    tile at byte offset (pn * BM + pm * EPI_M) * 128 of it: index b * NP + pn * (BM // EPI_M) + pm."""
    gl.static_assert(BN % 64 == 0)
    gl.static_assert(EPI_M % 8 == 0)
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.bfloat16)
    bufs = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BM, BN], layout)
    NP: gl.constexpr = (BM // EPI_M) * (BN // 64)
    piece_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([EPI_M, 64], gl.bfloat16)
    return bufs, bufs._reinterpret(gl.bfloat16, [NBUF * NP, EPI_M, 64], piece_layout)


@gluon.jit
def moe_up_gluon_kernel(
    xs_desc, w_desc, table_ptr, gate_ptr, up_ptr, h_ptr, E, I, MAX_M,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_M: gl.constexpr, EPI_WARPS: gl.constexpr, LOAD_REGS: gl.constexpr,
    EPI_REGS: gl.constexpr, LIMIT: gl.constexpr = None, ALPHA: gl.constexpr = None,
):  # fmt: skip
    """gate, up, h of every expert's sorted rows (module docstring; LIMIT: the swiglu_limit rounded
    to bf16, or None; ALPHA: the swiglu_alpha, or None); launch with num_warps=8."""
    BM: gl.constexpr = xs_desc.block_type.shape[0]
    BK: gl.constexpr = xs_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    NG: gl.constexpr = 1
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], xs_desc.layout)
    bg_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], w_desc.layout)
    bu_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], w_desc.layout)
    g_bufs, g_pieces = _handover(2 * NG, BM, BN, EPI_M)  # gate and up
    ready, empty, g_ready, g_empty = _ring_barriers(STAGES, NG)
    p = Args(xs_desc, w_desc, table_ptr, gate_ptr, up_ptr, h_ptr, a_bufs, bg_bufs, bu_bufs, g_bufs, ready, empty, g_ready,
             g_empty, gl.to_tensor(E), gl.to_tensor(I), gl.to_tensor(MAX_M), GROUP_M)  # fmt: skip
    gl.warp_specialize(
        [(_mma_partition, (p,)), (_load_partition, (p,)), (_epilogue_partition, (p, g_pieces, EPI_M, LIMIT, ALPHA))],
        [1, EPI_WARPS],
        [LOAD_REGS, EPI_REGS],
    )


# ----------------------------------------------------------------------------- launcher


@lru_cache(maxsize=None)
def _layout(block: tuple[int, int]):
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.bfloat16)


def supports(x: torch.Tensor, gate_up_proj: torch.Tensor, cfg: MoEGluonConfig = CONFIG) -> bool:
    """Whether ``launch_moe_up_gluon`` takes these operands: bf16 CUDA tensors (the caller checks that
    Gluon runs on the device: ``devices.gluon_unavailable_reason``), contiguous expert weights,
    I % BN == 0, H > 0 and H % 8 == 0."""
    E, I2, H = gate_up_proj.shape
    return (
        x.is_cuda
        and x.dtype == gate_up_proj.dtype == torch.bfloat16
        and gate_up_proj.is_contiguous()
        and gate_up_proj.data_ptr() % 16 == 0
        and (I2 // 2) % cfg.BN == 0
        and H > 0
        and H % 8 == 0
    )


def tile_table(r, BM: int) -> torch.Tensor:
    """[3, MAX_M] int32 (``moe_tile_table_kernel``) of the routing ``r`` (``swiglu.kernels.moe.Routing``),
    MAX_M = cdiv(S, BM) + E, an upper bound of the grouped GEMM's M tiles."""
    S, E = r.order.numel(), r.expert_start.numel() - 1
    max_m = triton.cdiv(S, BM) + E
    table = torch.empty(3, max_m, dtype=torch.int32, device=r.expert_start.device)
    mb = max(8, min(64, 8192 // r.E_PAD))  # [MB, E_PAD] comparisons of ~8K elements per block
    moe_tile_table_kernel[(triton.cdiv(max_m, mb),)](r.expert_start, table, E, max_m, BM, r.E_PAD, mb, num_warps=4)
    return table


def launch_moe_up_gluon(xs, gate_up_proj, r, gate, up, h, cfg: MoEGluonConfig = CONFIG, num_programs: int | None = None,
                        limit: float | None = None, alpha: float | None = None):  # fmt: skip
    """``swiglu.kernels.moe.launch_up``'s contract (gate, up, h [S, I] of the routing ``r``'s
    sorted pairs; ``limit`` bf16-exact or None, ``alpha`` or None) through this kernel, from xs [S, H], x's rows in
    expert order (``gather_rows``): the tile table, then the kernel on ``num_programs`` persistent
    programs (default one per SM). Check ``supports`` first."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    E, I2, H = gate_up_proj.shape
    I = I2 // 2
    if r.order.numel() == 0:
        return
    table = tile_table(r, cfg.BM)
    xs_desc = TensorDescriptor.from_tensor(xs, [cfg.BM, cfg.BK], _layout((cfg.BM, cfg.BK)))
    w_desc = TensorDescriptor.from_tensor(gate_up_proj.view(E * I2, H), [cfg.BN, cfg.BK], _layout((cfg.BN, cfg.BK)))
    num_programs = num_programs or device_sms(xs.device)
    moe_up_gluon_kernel[(num_programs,)](
        xs_desc, w_desc, table, gate, up, h, E, I, table.shape[1],
        cfg.GROUP_M, cfg.STAGES, cfg.EPI_M, cfg.epi_warps, cfg.load_regs, cfg.epi_regs, LIMIT=limit, ALPHA=alpha,
        num_warps=cfg.num_warps, maxnreg=cfg.maxnreg,
    )  # fmt: skip
