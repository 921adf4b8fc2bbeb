"""The MoE experts' down-projection-shaped GEMMs on the weight gradients' ping-pong tile (sm_90).

    y[order[row]] = a[row] @ w[e].T * top_k_weights   (the forward's down projection, B_TRANS)
    y[order[row]] = a[row] @ w[e]                      (grad_x's pieces from d_gate | d_up)

``swiglu.kernels.moe.launch_pairs``'s contract (y [S, N] in pair order, bf16). K is short at the
experts' sizes (I = 768 at Qwen3-30B-A3B: 12 k-steps of 64), so a tile's epilogue (the routing
weight, BM scattered rows) costs about what its MMAs do. The lab's first Gluon form
(``moe_gluon_pairs``: both MMA warpgroups on one tile, two epilogue warps) lost to the tl kernel;
here, as in ``swiglu.kernels.moe_gluon_wgrad_pingpong``, two 4-warp MMA warpgroups take alternate
BM x BN tiles, each running its own epilogue under the other's main loop: the accumulator to bf16
in two [BM, 64] shared-memory pieces, read back in 16-byte rows, the routing weight applied (the
tl kernel's rounding: bf16(f32(bf16(acc)) * w)), rows past the expert's end masked, stored by
pointer to y[pair]. A TMA loader warp feeds both through one ring: A the sorted rows of ``a`` in
[BM, BK] boxes (past an expert's rows they feed only masked rows), B ``w`` viewed as [E * N, K] in
[BN, BK] boxes (B_TRANS) or [E * K, N] in [BK, BN] boxes (K % BK == 0: a box stays in its expert).
Tiles: the real M tiles (``moe_gluon_up.tile_table``'s, counted from ``expert_start``) x N tiles in
``_tile_mn``'s order; every tile has K / BK steps, so tile i's ring position is i * k_tiles, and
the warpgroups' main loops take turns as the weight gradients' do (``order``).
On an H100 (``lab/probes/moe_gluon_pairs.py --pingpong``, ``lab/probes/moe_pingpong_ab.py``,
data/tuning/moe_pairs_pingpong_h100_20261206/): bitwise the tl kernel; 0.876x its time at
Qwen3-30B-A3B's down projection alone, but the whole forward + backward 0.997x there, and slower at
the larger shapes (the tl kernel's 128 x 256 tiles read A half as often): not in the library.
"""

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.language.core import _aggregate as aggregate  # as Triton's gluon tutorial 08 does

from swiglu.kernels.devices import device_sms, gluon_unavailable_reason
from swiglu.kernels.gluon_wgrad import _cta_barrier, _fill_stage, _mma_layout, _ring_barriers
from swiglu.kernels.moe_gluon_up import _layout, tile_table
from swiglu.kernels.moe_gluon_wgrad import _smem_layout
from swiglu.kernels.moe_gluon_wgrad_pingpong import gather_layout
from swiglu.kernels.tl_kernels import _tile_mn


@dataclasses.dataclass(frozen=True)
class Config:
    """BM x BN tiles per MMA warpgroup (BN = 128: two 64-wide epilogue pieces), STAGES k-steps of
    BK in flight (4 x 32 KB) and one [BM, BN] bf16 epilogue buffer per warpgroup (2 x 32 KB);
    registers: maxnreg at launch, mma_regs for the second MMA warpgroup, load_regs for the loader."""

    BM: int = 128
    BN: int = 128
    BK: int = 64
    STAGES: int = 4
    GROUP_M: int = 1
    maxnreg: int = 168
    mma_regs: int = 232
    load_regs: int = 40


CONFIG = Config()


@aggregate
class Args:
    """What every partition reads (sizes as tensors: an argument of 1 that Triton specializes is
    made one first)."""

    a_desc: tma.tensor_descriptor
    w_desc: tma.tensor_descriptor
    start_ptr: gl.tensor
    table_ptr: gl.tensor
    order_ptr: gl.tensor
    rw_ptr: gl.tensor
    y_ptr: gl.tensor
    a_bufs: gl.shared_memory_descriptor
    b_bufs: gl.shared_memory_descriptor
    c_bufs: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    order: gl.shared_memory_descriptor
    E: gl.tensor
    N: gl.tensor
    K: gl.tensor
    MAX_M: gl.tensor
    GROUP_M: gl.constexpr
    B_TRANS: gl.constexpr
    E_PAD: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, a_desc, w_desc, start_ptr, table_ptr, order_ptr, rw_ptr, y_ptr, a_bufs, b_bufs, c_bufs, ready,
                 empty, order, E, N, K, MAX_M, GROUP_M, B_TRANS, E_PAD):  # fmt: skip
        self.a_desc = a_desc
        self.w_desc = w_desc
        self.start_ptr = start_ptr
        self.table_ptr = table_ptr
        self.order_ptr = order_ptr
        self.rw_ptr = rw_ptr
        self.y_ptr = y_ptr
        self.a_bufs = a_bufs
        self.b_bufs = b_bufs
        self.c_bufs = c_bufs
        self.ready = ready
        self.empty = empty
        self.order = order
        self.E = E
        self.N = N
        self.K = K
        self.MAX_M = MAX_M
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.B_TRANS = gl.constexpr(B_TRANS)
        self.E_PAD = gl.constexpr(E_PAD)


@gluon.jit
def _program_tiles(p, BM: gl.constexpr, BN: gl.constexpr):
    """(num_m, num_n, pid, nprog, num_tiles): the real M tiles (sum over experts of cdiv(rows, BM),
    from expert_start) x the N tiles, and this persistent program's share (tiles pid, pid + nprog, ...)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    bins = gl.arange(0, p.E_PAD, layout=layout)
    lo = gl.load(p.start_ptr + bins, mask=bins < p.E, other=0)
    hi = gl.load(p.start_ptr + bins + 1, mask=bins < p.E, other=0)
    num_m = gl.sum((hi - lo + BM - 1) // BM, axis=0)
    num_n = gl.cdiv(p.N, BN)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    return num_m, num_n, pid, nprog, gl.cdiv(num_m * num_n - pid, nprog)


@gluon.jit
def _load_partition(p):
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.c_bufs.type.shape[2] * 2
    STAGE_BYTES: gl.constexpr = 2 * BK * (BM + BN)
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(p, BM, BN)
    k_tiles = gl.cdiv(p.K, BK)
    q = 0  # ring step
    for t in range(num_tiles):
        m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, p.GROUP_M)
        e = gl.load(p.table_ptr + m)
        row0 = gl.load(p.table_ptr + p.MAX_M + m)
        for kk in range(k_tiles):
            s, bar = _fill_stage(q, p.ready, p.empty, STAGE_BYTES)
            tma.async_copy_global_to_shared(p.a_desc, [row0, kk * BK], bar, p.a_bufs.index(s))
            if p.B_TRANS:  # w[e] is [N, K]: rows e * N + the tile's columns
                tma.async_copy_global_to_shared(p.w_desc, [e * p.N + pid_n * BN, kk * BK], bar, p.b_bufs.index(s))
            else:  # w[e] is [K, N]: rows e * K + the step's k
                tma.async_copy_global_to_shared(p.w_desc, [e * p.K + kk * BK, pid_n * BN], bar, p.b_bufs.index(s))
            q += 1


@gluon.jit
def _epilogue(acc, p, WHICH: gl.constexpr, m, pid_n):
    # This warpgroup's tile to y: acc as bf16 in two [BM, 64] pieces of its buffer, read back in
    # 16-byte rows (coalesced stores), each row's routing weight (B_TRANS) and pair id.
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    W: gl.constexpr = p.c_bufs.type.shape[2]  # 64
    layout: gl.constexpr = gather_layout(W, 4)
    row0 = gl.load(p.table_ptr + p.MAX_M + m)
    rows_left = gl.load(p.table_ptr + 2 * p.MAX_M + m) - row0
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cc = gl.expand_dims(gl.arange(0, W, layout=gl.SliceLayout(0, layout)), 0)
    ok = r < rows_left
    pair = gl.load(p.order_ptr + row0 + r, mask=ok, other=0)
    lo, hi = gl.split(gl.permute(gl.reshape(acc.to(gl.bfloat16), [BM, 2, W]), (0, 2, 1)))
    _cta_barrier()  # the previous tile's reads of the buffer are done in every warp
    p.c_bufs.index(2 * WHICH).store(lo)
    p.c_bufs.index(2 * WHICH + 1).store(hi)
    _cta_barrier()
    if p.B_TRANS:
        wt = gl.expand_dims(gl.load(p.rw_ptr + pair, mask=ok, other=0.0).to(gl.float32), 1)
    base = p.y_ptr + gl.expand_dims(pair.to(gl.int64) * p.N, 1) + pid_n * (2 * W) + cc
    for j in gl.static_range(2):
        v = p.c_bufs.index(2 * WHICH + j).load(layout)
        if p.B_TRANS:
            v = (v.to(gl.float32) * wt).to(gl.bfloat16)
        gl.store(base + j * W, v, mask=gl.expand_dims(ok, 1) & (pid_n * (2 * W) + j * W + cc < p.N))


@gluon.jit
def _tile_mma(p, acc, i, j, k_tiles, WHICH: gl.constexpr, B_TRANS: gl.constexpr):
    # Tile i of the program, this warpgroup's j-th (it takes tiles WHICH, WHICH + 2, ...): its
    # k-steps are ring steps i * k_tiles ..., run once the other warpgroup passed every ready wait
    # of tile i - 1 (``moe_gluon_wgrad_pingpong._mma_wg``'s handshake on ``order``); returns the
    # finished accumulator with the tile's stages released.
    STAGES: gl.constexpr = p.a_bufs.type.shape[0]
    c = i * k_tiles
    mbarrier.wait(p.order.index(1 - WHICH), (j - 1 + WHICH) & 1)
    for kk in range(k_tiles):
        g = c + kk
        s = g % STAGES
        mbarrier.wait(p.ready.index(s), (g // STAGES) & 1)
        b = p.b_bufs.index(s)
        if B_TRANS:
            b = b.permute((1, 0))
        acc = warpgroup_mma(p.a_bufs.index(s), b, acc, use_acc=kk > 0, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # step g - 1's wgmma is done
        _cta_barrier()
        mbarrier.arrive(p.empty.index((g + STAGES - 1) % STAGES), pred=kk > 0)
    mbarrier.arrive(p.order.index(WHICH))  # every thread of this warpgroup passed its last ready wait
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _cta_barrier()
    mbarrier.arrive(p.empty.index((c + k_tiles - 1) % STAGES))
    return acc


@gluon.jit
def _mma_wg(p, WHICH: gl.constexpr):
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.c_bufs.type.shape[2] * 2
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(p, BM, BN)
    k_tiles = gl.cdiv(p.K, BK)
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=_mma_layout(BM, BN, gl.num_warps()))
    j = 0  # this warpgroup's tiles so far
    for i in range(WHICH, num_tiles, 2):
        acc = _tile_mma(p, acc, i, j, k_tiles, WHICH, p.B_TRANS)
        m, pid_n = _tile_mn(pid + i * nprog, num_m, num_n, p.GROUP_M)
        _epilogue(acc, p, WHICH, m, pid_n)
        j += 1


@gluon.jit
def _mma_first(p):
    _mma_wg(p, 0)


@gluon.jit
def _mma_second(p):
    # A worker partition's arguments arrive as values, so its constexpr is set here.
    _mma_wg(p, 1)


@gluon.constexpr_function
def _block_n(w_block, B_TRANS):
    # The tile's width: w's box is [BN, BK] with B_TRANS, [BK, BN] without.
    return w_block[0] if B_TRANS else w_block[1]


@gluon.jit
def moe_pairs_pingpong_kernel(
    a_desc, w_desc, start_ptr, table_ptr, order_ptr, rw_ptr, y_ptr, E, N, K, MAX_M,
    B_TRANS: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, E_PAD: gl.constexpr,
    LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr,
):  # fmt: skip
    """y[pair] of every expert's sorted rows (module docstring); launch with num_warps=4."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = _block_n(w_desc.block_type.shape, B_TRANS)
    gl.static_assert(BN == 128, "the epilogue stores a tile in two 64-wide pieces")
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    c_bufs = gl.allocate_shared_memory(gl.bfloat16, [4, BM, BN // 2], _smem_layout([BM, BN // 2]))
    ready, empty, order, _unused = _ring_barriers(STAGES, 2)
    p = Args(a_desc, w_desc, start_ptr, table_ptr, order_ptr, rw_ptr, y_ptr, a_bufs, b_bufs, c_bufs, ready, empty, order,
             gl.to_tensor(E), gl.to_tensor(N), gl.to_tensor(K), gl.to_tensor(MAX_M), GROUP_M, B_TRANS, E_PAD)  # fmt: skip
    gl.warp_specialize([(_mma_first, (p,)), (_mma_second, (p,)), (_load_partition, (p,))], [4, 1], [MMA_REGS, LOAD_REGS])


# ----------------------------------------------------------------------------- launcher


def supports(a, w, y, transposed: bool, cfg: Config = CONFIG) -> bool:
    """Whether ``launch_moe_pairs_pingpong`` takes these operands: bf16 tensors on a device the
    Gluon kernels run on, contiguous and 16-byte aligned, K a multiple of BK (every model shape),
    N of 8 (TMA's row strides)."""
    N, K = y.shape[1], a.shape[1]
    return (
        a.is_cuda
        and gluon_unavailable_reason(a.device) is None
        and a.dtype == w.dtype == y.dtype == torch.bfloat16
        and a.is_contiguous()
        and w.is_contiguous()
        and y.is_contiguous()
        and all(t.data_ptr() % 16 == 0 for t in (a, w))
        and N % 8 == 0
        and K > 0
        and K % cfg.BK == 0
    )


def launch_moe_pairs_pingpong(a, w, r, weights, y, transposed: bool, cfg: Config = CONFIG, num_programs: int | None = None):
    """``swiglu.kernels.moe.launch_pairs``'s contract through this kernel: the tile table, then the
    kernel on ``num_programs`` persistent programs (default one per SM). Check ``supports`` first.
    ``weights``: top_k_weights [T, k] contiguous (read only when ``transposed``)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if r.order.numel() == 0:
        return
    E, N, K = w.shape[0], y.shape[1], a.shape[1]
    table = tile_table(r, cfg.BM)
    a_desc = TensorDescriptor.from_tensor(a, [cfg.BM, cfg.BK], _layout((cfg.BM, cfg.BK)))
    if transposed:  # w [E, N, K]
        w_desc = TensorDescriptor.from_tensor(w.view(E * N, K), [cfg.BN, cfg.BK], _layout((cfg.BN, cfg.BK)))
    else:  # w [E, K, N]
        w_desc = TensorDescriptor.from_tensor(w.view(E * K, N), [cfg.BK, cfg.BN], _layout((cfg.BK, cfg.BN)))
    moe_pairs_pingpong_kernel[(num_programs or device_sms(a.device),)](
        a_desc, w_desc, r.expert_start, table, r.order, weights, y, E, N, K, table.shape[1],
        transposed, cfg.GROUP_M, cfg.STAGES, r.E_PAD, cfg.load_regs, cfg.mma_regs,
        num_warps=4, maxnreg=cfg.maxnreg,
    )  # fmt: skip
