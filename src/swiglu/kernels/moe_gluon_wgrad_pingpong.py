"""The MoE experts' weight gradients with the dense backward's ping-pong tile (sm_90).

    c[e] = a_e^T @ b_e  for every expert e: ``moe_gluon_wgrad``'s contract, on its walk over the tiles.

Each expert's K is only its ~512 rows at Qwen3-30B-A3B (8 k-steps of 64), so a tile's epilogue is a
large share of its time. As in the dense table at K = 129-2048 tokens (``gluon_wgrad`` with
``pingpong`` and ``wg_store``), two 4-warp MMA warpgroups take alternate tiles of BM x (BN + BN2)
(128 x 192), so one's epilogue runs under the other's MMAs, and each stores its own tile by TMA in
three BN2-wide chunks; their main loops take turns (``order``), and each adds the other's k-steps
from ``expert_start`` to keep its place in the ring. The loader reads both operands through one
host descriptor each over all S rows, so an expert's last K box runs into the next expert's rows:
before that step's MMAs the warpgroup zeroes its rows past the expert's end in shared memory, in
16-row pieces (an inf there stays out). Descriptors made on the device per run of tiles instead
(a tensormap fence each, one per tile at Qwen3-30B-A3B) cost 1.15-1.18x this kernel's time there
(H100, ``lab/probes/moe_wgrad_desc.py``, data/tuning/moe_wgrad_desc_20261206/). Columns past N are
zero-filled loads and stores TMA drops. ``GATHER`` 1 / 2: the A (grad_out's) or B (x's) rows are
gathered by four loader warps with cp.async instead of read from an expert-order copy, the stage's
barrier tracking them before the expect of the other operand's TMA boxes
(``launch_moe_wgrad_gather``); rows past the expert are masked to zeros. Bitwise the tl kernel.
Limit: the gathering loader's cp.async lose to a copy's TMA boxes at Mixtral-8x7B's 2048 rows per
expert (``GATHER_MAX_ROWS``); measurements in docs/moe.md.
"""

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate  # as Triton's gluon tutorial 08 does

from .configs import GluonConfig
from .devices import device_sms
from .gluon_wgrad import _cta_barrier, _fill_stage, _layout, _mma_layout, _ring_barriers, _store_chunk
from .moe_gluon_wgrad import _expert_tile, _program_tiles, _smem_layout, _tile_of
from .moe_gluon_wgrad import supports as _supports

#: The dense table's 128 x (128 + 64) ping-pong tile at K = 512 (backward_configs.json, bucket 512),
#: 64-deep k-steps, 4 stages (160 KB) and two 128 x 64 chunk buffers per warpgroup (64 KB).
CONFIG = GluonConfig(
    BM=128, BN=128, BK=64, STAGES=4, NC=1, GROUP_M=8, num_warps=4, maxnreg=168, pingpong=True, BN2=64, mma_regs=232,
    wg_store=2,
)  # fmt: skip


#: The gathering form's: four loader warps (``LOAD_WARPS``) at 56 registers and the second MMA
#: warpgroup at 224 (the first gets 232): no spills under triton 3.6 (at 48 the B gather spilled
#: 8 bytes; at 56 beside 232, the first warpgroup's 224 spilled 384).
GATHER_CONFIG = dataclasses.replace(CONFIG, load_regs=56, mma_regs=224)

#: Both forms by their chunk buffers per warpgroup (``swiglu.kernels.moe.Tile.CHUNKS``: the plan's choice).
CONFIGS = {n: dataclasses.replace(CONFIG, wg_store=n) for n in (1, 2)}
GATHER_CONFIGS = {n: dataclasses.replace(GATHER_CONFIG, wg_store=n) for n in (1, 2)}


@gluon.constexpr_function
def gather_layout(cols, num_warps):
    """The cp.async copies' layout of a [rows, cols] bf16 block: 16-byte vectors along a row."""
    return gl.BlockedLayout([1, 8], [32 * 8 // cols, cols // 8], [num_warps, 1], [1, 0])


@aggregate
class Args:
    """What every partition reads (sizes as tensors: an argument of 1 that Triton specializes is
    made one first)."""

    a_desc: tma.tensor_descriptor
    b_desc: tma.tensor_descriptor
    b2_desc: tma.tensor_descriptor
    start_ptr: gl.tensor
    c_desc: tma.tensor_descriptor
    a_bufs: gl.shared_memory_descriptor
    b_bufs: gl.shared_memory_descriptor
    b2_bufs: gl.shared_memory_descriptor
    c_bufs: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    order: gl.shared_memory_descriptor
    E: gl.tensor
    M: gl.tensor
    N: gl.tensor
    GROUP_M: gl.constexpr
    # GATHER 1 (A) or 2 (B): that operand's rows read from src (x or grad_out [T, H], row stride
    # stride_src) at token pair_order[row] // TOP_K by cp.async, instead of a copy in expert order.
    src_ptr: gl.tensor
    pair_order: gl.tensor
    stride_src: gl.tensor
    TOP_K: gl.constexpr
    GATHER: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, a_desc, b_desc, b2_desc, start_ptr, c_desc, a_bufs, b_bufs, b2_bufs, c_bufs, ready, empty, order,
                 E, M, N, GROUP_M, src_ptr, pair_order, stride_src, TOP_K, GATHER):  # fmt: skip
        self.a_desc = a_desc
        self.b_desc = b_desc
        self.b2_desc = b2_desc
        self.start_ptr = start_ptr
        self.c_desc = c_desc
        self.a_bufs = a_bufs
        self.b_bufs = b_bufs
        self.b2_bufs = b2_bufs
        self.c_bufs = c_bufs
        self.ready = ready
        self.empty = empty
        self.order = order
        self.E = E
        self.M = M
        self.N = N
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.src_ptr = src_ptr
        self.pair_order = pair_order
        self.stride_src = stride_src
        self.TOP_K = gl.constexpr(TOP_K)
        self.GATHER = gl.constexpr(GATHER)


@gluon.jit
def _gather_piece(dst, p, roff, ok, col0, ncols, cols):
    """dst [BK, 64] = the rows ``roff`` (element offsets into src, ``ok`` where the expert has
    them: zeros elsewhere) at columns col0 .. col0 + 63 by cp.async; zeros where col0 >= ncols
    (a piece past N: every model shape has N % 64 == 0)."""
    ptrs = p.src_ptr + gl.expand_dims(roff, 1) + (col0 + cols)
    async_copy.async_copy_global_to_shared(dst, ptrs, mask=gl.expand_dims(ok & (col0 < ncols), 1))


@gluon.jit
def _load_partition(p):
    """The loader: each of this program's tiles' k-steps, boxes at rows lo + kk * BK of all S rows
    (an expert's last box runs into the next expert's rows or past S: ``_mma_wg`` zeroes them;
    an expert without rows takes one step); with ``p.GATHER``, the gathered operand's rows by
    cp.async instead (each stage's barrier tracks them before the expect of the TMA boxes, so the
    stage completes only with both)."""
    BK: gl.constexpr = p.a_bufs.type.shape[1]
    BM: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.b_bufs.type.shape[2]  # the tile's first column chunk
    BN2: gl.constexpr = p.b2_bufs.type.shape[2]  # and its second
    STAGES: gl.constexpr = p.a_bufs.type.shape[0]
    GATHER: gl.constexpr = p.GATHER
    TMA_COLS: gl.constexpr = (0 if GATHER == 1 else BM) + (0 if GATHER == 2 else BN + BN2)
    STAGE_BYTES: gl.constexpr = 2 * BK * TMA_COLS
    layout: gl.constexpr = gather_layout(64, 4)  # [BK, 64] pieces over the four loader warps
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(p.E, p.M, p.N, BM, BN + BN2)
    if GATHER != 0:
        i = gl.arange(0, BK, layout=gl.SliceLayout(1, layout))
        cols = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, layout)), 0)
        # A gathered operand's [BK, W] stage as W // 64 pieces of [BK, 64] (128-byte swizzle: its
        # column blocks lie one after another, as moe_gluon_up._handover's pieces do).
        if GATHER == 1:
            pieces = p.a_bufs._reinterpret(gl.bfloat16, [STAGES * (BM // 64), BK, 64], _smem_layout([BK, 64]))
        else:
            pieces = p.b_bufs._reinterpret(gl.bfloat16, [STAGES * (BN // 64), BK, 64], _smem_layout([BK, 64]))
    q = 0
    for t in range(num_tiles):
        e, pid_m, pid_n, lo, rows = _expert_tile(pid + t * nprog, num_m, num_n, p.start_ptr, p.GROUP_M)
        col = pid_n * (BN + BN2)
        if GATHER != 0:  # the first k-step's token rows; each step loads the next one's
            tok = gl.load(p.pair_order + lo + i, mask=i < rows, other=0) // p.TOP_K
        for kk in range(gl.maximum(gl.cdiv(rows, BK), 1)):
            if GATHER == 0:
                s, bar = _fill_stage(q, p.ready, p.empty, STAGE_BYTES)
            else:
                s = q % STAGES
                bar = p.ready.index(s)
                ok = i + kk * BK < rows
                nxt = i + (kk + 1) * BK
                tok_next = gl.load(p.pair_order + lo + nxt, mask=nxt < rows, other=0) // p.TOP_K
                roff = tok.to(gl.int64) * p.stride_src
                mbarrier.wait(p.empty.index(s), ((q // STAGES) & 1) ^ 1)
                if GATHER == 1:
                    for j in gl.static_range(BM // 64):
                        _gather_piece(pieces.index(s * (BM // 64) + j), p, roff, ok, pid_m * BM + j * 64, p.M, cols)
                else:
                    for j in gl.static_range(BN // 64):
                        _gather_piece(pieces.index(s * (BN // 64) + j), p, roff, ok, col + j * 64, p.N, cols)
                    _gather_piece(p.b2_bufs.index(s), p, roff, ok, col + BN, p.N, cols)
                async_copy.mbarrier_arrive(bar)
                _cta_barrier()
                mbarrier.expect(bar, STAGE_BYTES)
                tok = tok_next
            if GATHER != 1:
                tma.async_copy_global_to_shared(p.a_desc, [lo + kk * BK, pid_m * BM], bar, p.a_bufs.index(s))
            if GATHER != 2:
                tma.async_copy_global_to_shared(p.b_desc, [lo + kk * BK, col], bar, p.b_bufs.index(s))
                tma.async_copy_global_to_shared(p.b2_desc, [lo + kk * BK, col + BN], bar, p.b2_bufs.index(s))
            q += 1


@gluon.jit
def _tile_rows(i, pid, nprog, last, num_m, num_n, p):
    """The expert rows of this program's tile i (the last tile's past the end: no read past
    expert_start[E])."""
    return _expert_tile(gl.minimum(pid + i * nprog, last), num_m, num_n, p.start_ptr, p.GROUP_M)[4]


@gluon.jit
def _k_steps(rows, BK: gl.constexpr):
    """A tile's k-steps: one per BK rows, at least one."""
    return gl.maximum(gl.cdiv(rows, BK), 1)


@gluon.jit
def _zero_rows(buf, rem):
    """Rows rem .. BK - 1 of the [BK, W] stage ``buf`` set to zero, in 16-row pieces."""
    BK: gl.constexpr = buf.type.shape[0]
    W: gl.constexpr = buf.type.shape[1]
    layout: gl.constexpr = gather_layout(W, 4)
    for j in gl.static_range(BK // 16):
        if rem < (j + 1) * 16:
            piece = buf.slice(j * 16, 16, dim=0)
            v = piece.load(layout)
            r = gl.arange(0, 16, layout=gl.SliceLayout(1, layout)) + j * 16
            piece.store(gl.where(gl.expand_dims(r < rem, 1), v, gl.zeros_like(v)))


@gluon.jit
def _zero_past(p, s, rem):
    """Rows rem .. BK - 1 of stage s zeroed in each TMA-read operand (a gathered one's are zeros,
    inf rows of the next expert included), made visible to the MMAs (async proxy, every warp)."""
    if p.GATHER != 1:
        _zero_rows(p.a_bufs.index(s), rem)
    if p.GATHER != 2:
        _zero_rows(p.b_bufs.index(s), rem)
        _zero_rows(p.b2_bufs.index(s), rem)
    fence_async_shared()
    _cta_barrier()


@gluon.jit
def _mma_wg(p, WHICH: gl.constexpr):
    # Warpgroup WHICH takes the program's tiles WHICH, WHICH + 2, ...; the loader fills the ring in
    # tile order, so tile i's steps start at c, the k-steps of tiles 0 .. i - 1 (both warpgroups').
    # Its main loop starts once the other warpgroup passed every ready wait of tile i - 1 (its
    # arrival j - 1 on ``order`` for warpgroup 0, a fresh barrier passing at j = 0; j for warpgroup 1):
    # running ahead into tile i + 2 it would wait on a stage's parity two phases early.
    BM: gl.constexpr = p.a_bufs.type.shape[2]
    BK: gl.constexpr = p.a_bufs.type.shape[1]
    BN: gl.constexpr = p.b_bufs.type.shape[2]  # the tile's first column chunk
    BN2: gl.constexpr = p.b2_bufs.type.shape[2]  # and its second
    STAGES: gl.constexpr = p.a_bufs.type.shape[0]
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(p.E, p.M, p.N, BM, BN + BN2)
    last = p.E * num_m * num_n - 1
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=_mma_layout(BM, BN, gl.num_warps()))
    acc2 = gl.zeros((BM, BN2), dtype=gl.float32, layout=_mma_layout(BM, BN2, gl.num_warps()))
    c = 0
    if WHICH == 1:
        c = _k_steps(_tile_rows(0, pid, nprog, last, num_m, num_n, p), BK)
    rows = _tile_rows(WHICH, pid, nprog, last, num_m, num_n, p)
    j = 0  # this warpgroup's tiles so far
    q = 0  # its chunks stored so far
    for i in range(WHICH, num_tiles, 2):
        k_tiles = _k_steps(rows, BK)
        mbarrier.wait(p.order.index(1 - WHICH), (j - 1 + WHICH) & 1)
        for kk in range(k_tiles):
            g = c + kk
            s = g % STAGES
            mbarrier.wait(p.ready.index(s), (g // STAGES) & 1)
            # The expert's last step: the rows past its end (the next expert's, or past S) zeroed.
            rem = rows - kk * BK
            if rem < BK:
                _zero_past(p, s, rem)
            elif p.GATHER != 0:  # cp.async's writes (generic proxy) before wgmma's reads (async proxy)
                fence_async_shared()
            a_s = p.a_bufs.index(s).permute((1, 0))
            acc = warpgroup_mma(a_s, p.b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
            acc2 = warpgroup_mma(a_s, p.b2_bufs.index(s), acc2, use_acc=kk > 0, is_async=True)
            # The two wgmma groups of step g may run on; step g - 1's are done.
            acc, acc2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc2))
            _cta_barrier()
            mbarrier.arrive(p.empty.index((g + STAGES - 1) % STAGES), pred=kk > 0)
        mbarrier.arrive(p.order.index(WHICH))  # every thread of this warpgroup passed its last ready wait
        acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
        _cta_barrier()
        mbarrier.arrive(p.empty.index((c + k_tiles - 1) % STAGES))
        # The next two tiles' rows, loaded before the epilogue: their latency hides under it.
        rows_next = _tile_rows(i + 1, pid, nprog, last, num_m, num_n, p)
        rows_mine = _tile_rows(i + 2, pid, nprog, last, num_m, num_n, p)
        e, pid_m, pid_n = _tile_of(pid + i * nprog, num_m, num_n, p.GROUP_M)
        row = e * p.M + pid_m * BM
        col = pid_n * (BN + BN2)
        # The narrower chunk first (its registers free before the others' conversions), then acc's halves.
        q = _store_chunk(acc2, q, WHICH, p.c_desc, p.c_bufs, row, col + BN)
        lo, hi = gl.split(gl.permute(gl.reshape(acc, [BM, 2, BN2]), (0, 2, 1)))
        q = _store_chunk(lo, q, WHICH, p.c_desc, p.c_bufs, row, col)
        q = _store_chunk(hi, q, WHICH, p.c_desc, p.c_bufs, row, col + BN2)
        c += k_tiles + _k_steps(rows_next, BK)
        rows = rows_mine
        j += 1
    tma.store_wait(pendings=0)


@gluon.jit
def _mma_first(p):
    _mma_wg(p, 0)


@gluon.jit
def _mma_second(p):
    # A worker partition's arguments arrive as values, so its constexpr is set here.
    _mma_wg(p, 1)


@gluon.jit
def moe_wgrad_pingpong_kernel(
    a_desc, b_desc, b2_desc, start_ptr, c_desc, E, M, N, src_ptr, pair_order, stride_src,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, WG_STORE: gl.constexpr, LOAD_REGS: gl.constexpr,
    MMA_REGS: gl.constexpr, TOP_K: gl.constexpr = 1, GATHER: gl.constexpr = 0,
):  # fmt: skip
    """c[e] = a_e^T @ b_e for every expert (module docstring): a_desc over a [S, M] in [BK, BM]
    boxes, b_desc and b2_desc over b [S, N] in [BK, BN] and [BK, BN2] boxes, c_desc the output as
    [E * M, N] in [BM, BN2] boxes, BN = 2 * BN2; launch with num_warps=4. GATHER 1 / 2: a / b not
    read (its descriptor over any tensor), their rows gathered from src_ptr (``Args``); 0:
    src_ptr, pair_order unused."""
    BK: gl.constexpr = a_desc.block_type.shape[0]
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    BN2: gl.constexpr = c_desc.block_type.shape[1]
    gl.static_assert(BN == 2 * BN2, "the tile's first chunk is two store chunks wide")
    gl.static_assert(BK % 16 == 0, "an expert's last step is zeroed in 16-row pieces")
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BM], _smem_layout([BK, BM]))
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN], _smem_layout([BK, BN]))
    b2_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN2], _smem_layout([BK, BN2]))
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2 * WG_STORE, BM, BN2], c_desc.layout)
    ready, empty, order, _unused = _ring_barriers(STAGES, 2)
    p = Args(a_desc, b_desc, b2_desc, start_ptr, c_desc, a_bufs, b_bufs, b2_bufs, c_bufs, ready, empty, order,
             gl.to_tensor(E), gl.to_tensor(M), gl.to_tensor(N), GROUP_M, src_ptr, pair_order, gl.to_tensor(stride_src),
             TOP_K, GATHER)  # fmt: skip
    LOAD_WARPS: gl.constexpr = 4 if GATHER else 1  # the gathers' cp.async: 12 16-byte vectors per thread a stage
    gl.warp_specialize([(_mma_first, (p,)), (_mma_second, (p,)), (_load_partition, (p,))], [4, LOAD_WARPS], [MMA_REGS, LOAD_REGS])


def _launch(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, expert_start, cfg: GluonConfig, num_programs, src, order, k, gather):  # fmt: skip
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    E, M, N = c.shape
    c_desc = TensorDescriptor.from_tensor(c.view(E * M, N), [cfg.BM, cfg.BN2], _layout((cfg.BM, cfg.BN2)))
    a_desc = TensorDescriptor.from_tensor(a, [cfg.BK, cfg.BM], _layout((cfg.BK, cfg.BM)))
    b_desc = TensorDescriptor.from_tensor(b, [cfg.BK, cfg.BN], _layout((cfg.BK, cfg.BN)))
    b2_desc = TensorDescriptor.from_tensor(b, [cfg.BK, cfg.BN2], _layout((cfg.BK, cfg.BN2)))
    moe_wgrad_pingpong_kernel[(num_programs or device_sms(c.device),)](
        a_desc, b_desc, b2_desc, expert_start, c_desc, E, M, N, src, order, src.stride(0),
        cfg.GROUP_M, cfg.STAGES, cfg.wg_store, cfg.load_regs, cfg.mma_regs or cfg.maxnreg, k, gather,
        num_warps=4, maxnreg=cfg.maxnreg,
    )  # fmt: skip


def launch_moe_wgrad_pingpong(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, expert_start: torch.Tensor, cfg: GluonConfig = CONFIG, num_programs: int | None = None) -> None:  # fmt: skip
    """c [E, M, N] = each expert's a_e^T @ b_e (``moe_gluon_wgrad``'s contract): a [S, M], b [S, N]
    and c as ``supports`` takes them (check it first), expert_start [E + 1] int32 on the same device,
    a ping-pong ``cfg`` (BN = 2 * BN2); ``num_programs`` persistent programs (default: one per SM)."""
    _launch(c, a, b, expert_start, cfg, num_programs, a, expert_start, 1, 0)


def launch_moe_wgrad_gather(c: torch.Tensor, a, b, r, cfg: GluonConfig = GATHER_CONFIG, num_programs: int | None = None) -> None:  # fmt: skip
    """``launch_moe_wgrad_pingpong``'s product with one operand a ``swiglu.kernels.moe.TokenRows``
    (x or grad_out not copied): its rows gathered from the source by the loader (``Args.GATHER``),
    the routing ``r``'s order and expert_start. Check ``supports_gather`` first."""
    which = 2 if isinstance(a, torch.Tensor) else 1
    rows, dense = (a, b) if which == 1 else (b, a)
    a_t, b_t = (rows.src, dense) if which == 1 else (dense, rows.src)  # the gathered one's descriptor: unused
    _launch(c, a_t, b_t, r.expert_start, cfg, num_programs, rows.src, r.order, rows.k, which)


def supports(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, cfg: GluonConfig = CONFIG) -> bool:
    """Whether ``launch_moe_wgrad_pingpong`` takes these operands: ``moe_gluon_wgrad.supports`` (its
    M % BM and 16-byte rows; the caller checks that Gluon runs on the device)."""
    return _supports(c, a, b, cfg)


# Mean rows per expert up to which the gathering form runs: on an H100 it was 0.02-0.06 ms slower
# than the copy-fed kernel at 256-512 rows (Qwen3-30B-A3B, Qwen3-235B-A22B), less than the copy it
# saves (x's took 0.15 ms at Qwen3-30B-A3B in the up probe's Gluon rows), and 1.17 ms slower at 2048
# (Mixtral-8x7B): data/tuning/moe_gluon_pingpong_gather_20261205.log.
GATHER_MAX_ROWS = 1024


def supports_gather(c: torch.Tensor, a, b, cfg: GluonConfig = GATHER_CONFIG) -> bool:
    """Whether ``launch_moe_wgrad_gather`` takes these operands: exactly one a ``TokenRows`` whose
    source rows are 16-byte vectors (unit column stride, a row stride multiple of 16, 16-byte
    aligned, bf16) of the width the product needs, a multiple of 64 (whole [BK, 64] pieces); the
    other as ``supports`` takes it (with itself in the gathered one's place)."""
    if isinstance(a, torch.Tensor) == isinstance(b, torch.Tensor):  # exactly one TokenRows
        return False
    rows, dense = (b, a) if isinstance(a, torch.Tensor) else (a, b)
    src, width = rows.src, c.shape[1] if rows is a else c.shape[2]
    return (
        src.is_cuda
        and src.dtype == torch.bfloat16
        and src.dim() == 2
        and src.shape[1] == width
        and width % 64 == 0
        and src.stride(1) == 1
        and src.stride(0) % 16 == 0
        and src.data_ptr() % 16 == 0
        and supports(c, dense, dense, cfg)
    )
