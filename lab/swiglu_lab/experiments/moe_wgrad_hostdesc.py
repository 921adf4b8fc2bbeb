"""Variants of the ping-pong MoE weight-gradient kernel (``swiglu.kernels.moe_gluon_wgrad_pingpong``)
as it was before it took host descriptors (``HOST`` 0: its loader made descriptors of each
expert's rows on the device), with switches that take out one per-tile cost at a time, to find
what a tile at 256-512 rows per expert waits on. ``HOST`` 1 and ``STORE`` 0 give wrong sums (an
expert's last K box reads the next expert's rows; no output): only their time means anything.

- ``HOST`` 1: the library's loader since (``moe_gluon_wgrad_pingpong._load_partition``): both
  TMA operands through host-made descriptors over all S rows (box row lo + kk * BK) instead of
  descriptors of each expert's rows made on the device per run of tiles (``tma.make_tensor_descriptor`` and its tensormap fence, once per tile at
  Qwen3-30B-A3B, where each program's consecutive tiles are 132 tiles apart, one expert each).
- ``HOST`` 2: right sums with host descriptors: the loader as with 1, and the MMA warpgroup sets
  the rows of an expert's last K box past its end to zero in shared memory before that step's
  MMAs (each TMA-loaded operand's, in 16-row pieces; a gathered operand's are zeros already).
  Cutting that last step's MMAs to the 16-row pieces that hold rows instead (K-sliced wgmma of
  the M-major A; this module's ``HOST`` 3 at commit 71211b0) gave wrong weight gradients on an
  H100 in the library's form and was dropped.
- A ``HOST`` 4 (as 2, storing whole 16-row pieces past the end as zeros without reading them)
  was bitwise and no faster where the library gathers (0.99-1.03x ``HOST`` 2's time; 0.91-0.95x
  copy-fed at Qwen3-30B-A3B; H100,
  data/tuning/moe_wgrad_bound_h100_20261206/lean_zeroing_h100.log); dropped.
- ``STORE`` 0: the epilogue converts but stores nothing (its TMA stores left out).
- ``RUN`` r > 1: each program takes r consecutive tiles of the walk (tiles
  b * nprog * r + pid * r + j, j < r), so a run of tiles in one expert is r tiles long where the
  library's strided walk gives one: a descriptor per r tiles, right sums (not a diagnostic; with
  ``HOST`` 0 only).
``HOST`` 0, ``STORE`` 1 and ``RUN`` 1 is the device-descriptor kernel; ``HOST`` 2 the library's
since; both bitwise the library's launcher (``lab/probes/moe_wgrad_desc.py`` checks them).
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.language.core import _aggregate as aggregate

from swiglu.kernels import moe_gluon_wgrad_pingpong as PP
from swiglu.kernels.devices import device_sms
from swiglu.kernels.gluon_wgrad import _cta_barrier, _fill_stage, _layout, _mma_layout, _ring_barriers, _store_chunk
from swiglu.kernels.moe_gluon_wgrad import _expert_tile, _smem_layout, _tile_of
from swiglu_lab.experiments.moe_gluon_wgrad_cooperative import _load_runs, _scratch, _walk_index, _walk_tiles


@aggregate
class HArgs:
    a_ptr: gl.tensor
    b_ptr: gl.tensor
    start_ptr: gl.tensor
    c_desc: tma.tensor_descriptor
    a_desc: tma.tensor_descriptor
    b_desc: tma.tensor_descriptor
    b2_desc: tma.tensor_descriptor
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
    stride_a: gl.tensor
    stride_b: gl.tensor
    GROUP_M: gl.constexpr
    src_ptr: gl.tensor
    pair_order: gl.tensor
    stride_src: gl.tensor
    TOP_K: gl.constexpr
    GATHER: gl.constexpr
    HOST: gl.constexpr
    STORE: gl.constexpr
    RUN: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, a_ptr, b_ptr, start_ptr, c_desc, a_desc, b_desc, b2_desc, a_bufs, b_bufs, b2_bufs, c_bufs,
                 ready, empty, order, E, M, N, stride_a, stride_b, GROUP_M, src_ptr, pair_order, stride_src, TOP_K,
                 GATHER, HOST, STORE, RUN):  # fmt: skip
        self.a_ptr = a_ptr
        self.b_ptr = b_ptr
        self.start_ptr = start_ptr
        self.c_desc = c_desc
        self.a_desc = a_desc
        self.b_desc = b_desc
        self.b2_desc = b2_desc
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
        self.stride_a = stride_a
        self.stride_b = stride_b
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.src_ptr = src_ptr
        self.pair_order = pair_order
        self.stride_src = stride_src
        self.TOP_K = gl.constexpr(TOP_K)
        self.GATHER = gl.constexpr(GATHER)
        self.HOST = gl.constexpr(HOST)
        self.STORE = gl.constexpr(STORE)
        self.RUN = gl.constexpr(RUN)


@gluon.jit
def _load_run(p, pid, nprog, num_m, num_n, num_tiles, t, q):
    """The old library kernel's ``_load_run`` (descriptors made on the device) on the RUN walk."""
    BK: gl.constexpr = p.a_bufs.type.shape[1]
    BM: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    BN2: gl.constexpr = p.b2_bufs.type.shape[2]
    STAGES: gl.constexpr = p.a_bufs.type.shape[0]
    GATHER: gl.constexpr = p.GATHER
    TMA_COLS: gl.constexpr = (0 if GATHER == 1 else BM) + (0 if GATHER == 2 else BN + BN2)
    STAGE_BYTES: gl.constexpr = 2 * BK * TMA_COLS
    layout: gl.constexpr = PP.gather_layout(64, 4)
    e_run, pid_m, pid_n, lo, rows = _expert_tile(_walk_index(t, pid, nprog, p.RUN), num_m, num_n, p.start_ptr, p.GROUP_M)
    shape_k = gl.maximum(rows, 1)
    if GATHER != 1:
        a_desc = tma.make_tensor_descriptor(
            p.a_ptr + lo.to(gl.int64) * p.stride_a, [shape_k, p.M], [p.stride_a, 1], [BK, BM], _smem_layout([BK, BM])
        )
    if GATHER != 2:
        b_base = p.b_ptr + lo.to(gl.int64) * p.stride_b
        b_desc = tma.make_tensor_descriptor(b_base, [shape_k, p.N], [p.stride_b, 1], [BK, BN], _smem_layout([BK, BN]))
        b2_desc = tma.make_tensor_descriptor(b_base, [shape_k, p.N], [p.stride_b, 1], [BK, BN2], _smem_layout([BK, BN2]))
    if GATHER != 0:
        i = gl.arange(0, BK, layout=gl.SliceLayout(1, layout))
        cols = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, layout)), 0)
        if GATHER == 1:
            pieces = p.a_bufs._reinterpret(gl.bfloat16, [STAGES * (BM // 64), BK, 64], _smem_layout([BK, 64]))
        else:
            pieces = p.b_bufs._reinterpret(gl.bfloat16, [STAGES * (BN // 64), BK, 64], _smem_layout([BK, 64]))
    first = (rows == 0).to(gl.int32)
    e = e_run
    while (e == e_run) & (t < num_tiles):
        col = pid_n * (BN + BN2)
        if GATHER != 0:
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
                        PP._gather_piece(pieces.index(s * (BM // 64) + j), p, roff, ok, pid_m * BM + j * 64, p.M, cols)
                else:
                    for j in gl.static_range(BN // 64):
                        PP._gather_piece(pieces.index(s * (BN // 64) + j), p, roff, ok, col + j * 64, p.N, cols)
                    PP._gather_piece(p.b2_bufs.index(s), p, roff, ok, col + BN, p.N, cols)
                PP.async_copy.mbarrier_arrive(bar)
                _cta_barrier()
                mbarrier.expect(bar, STAGE_BYTES)
                tok = tok_next
            if GATHER != 1:
                tma.async_copy_global_to_shared(a_desc, [first + kk * BK, pid_m * BM], bar, p.a_bufs.index(s))
            if GATHER != 2:
                tma.async_copy_global_to_shared(b_desc, [first + kk * BK, col], bar, p.b_bufs.index(s))
                tma.async_copy_global_to_shared(b2_desc, [first + kk * BK, col + BN], bar, p.b2_bufs.index(s))
            q += 1
        t += 1
        e, pid_m, pid_n, lo, rows = _expert_tile(
            _walk_index(gl.minimum(t, num_tiles - 1), pid, nprog, p.RUN), num_m, num_n, p.start_ptr, p.GROUP_M
        )
    return t, q


@gluon.jit
def _load_partition(p):
    if p.HOST:  # the library's loader: host descriptors, the library's walk
        gl.static_assert(p.RUN == 1, "RUN walks take the device descriptors (HOST 0)")
        PP._load_partition(p)
    else:  # the old loader: descriptors made on the device per run, two slots
        _load_runs(p, _load_run, p.a_bufs.type.shape[2], p.b_bufs.type.shape[2] + p.b2_bufs.type.shape[2], p.RUN)


@gluon.jit
def _rows(i, pid, nprog, last, num_m, num_n, p):
    tile = gl.minimum(_walk_index(i, pid, nprog, p.RUN), last)
    return _expert_tile(tile, num_m, num_n, p.start_ptr, p.GROUP_M)[4]


@gluon.jit
def _mma_wg(p, WHICH: gl.constexpr):
    """The library's ``_mma_wg`` on the RUN walk, zeroing only with ``HOST`` 2 (the old kernel's
    without), its stores left out when ``p.STORE`` is 0."""
    BM: gl.constexpr = p.a_bufs.type.shape[2]
    BK: gl.constexpr = p.a_bufs.type.shape[1]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    BN2: gl.constexpr = p.b2_bufs.type.shape[2]
    STAGES: gl.constexpr = p.a_bufs.type.shape[0]
    num_m, num_n, pid, nprog, num_tiles = _walk_tiles(p.E, p.M, p.N, BM, BN + BN2, p.RUN)
    last = p.E * num_m * num_n - 1
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=_mma_layout(BM, BN, gl.num_warps()))
    acc2 = gl.zeros((BM, BN2), dtype=gl.float32, layout=_mma_layout(BM, BN2, gl.num_warps()))
    c = 0
    if WHICH == 1:
        c = PP._k_steps(_rows(0, pid, nprog, last, num_m, num_n, p), BK)
    rows = _rows(WHICH, pid, nprog, last, num_m, num_n, p)
    k_tiles = PP._k_steps(rows, BK)
    j = 0
    q = 0
    for i in range(WHICH, num_tiles, 2):
        mbarrier.wait(p.order.index(1 - WHICH), (j - 1 + WHICH) & 1)
        for kk in range(k_tiles):
            g = c + kk
            s = g % STAGES
            mbarrier.wait(p.ready.index(s), (g // STAGES) & 1)
            if p.HOST == 2:  # the library's zeroing of the rows past the expert
                rem = rows - kk * BK
                if rem < BK:
                    PP._zero_past(p, s, rem)
            if p.GATHER != 0:
                fence_async_shared()
            a_s = p.a_bufs.index(s).permute((1, 0))
            acc = warpgroup_mma(a_s, p.b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
            acc2 = warpgroup_mma(a_s, p.b2_bufs.index(s), acc2, use_acc=kk > 0, is_async=True)
            acc, acc2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc2))
            _cta_barrier()
            mbarrier.arrive(p.empty.index((g + STAGES - 1) % STAGES), pred=kk > 0)
        mbarrier.arrive(p.order.index(WHICH))
        acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
        _cta_barrier()
        mbarrier.arrive(p.empty.index((c + k_tiles - 1) % STAGES))
        k_next = PP._k_steps(_rows(i + 1, pid, nprog, last, num_m, num_n, p), BK)
        rows_mine = _rows(i + 2, pid, nprog, last, num_m, num_n, p)
        k_mine = PP._k_steps(rows_mine, BK)
        if p.STORE:
            e, pid_m, pid_n = _tile_of(_walk_index(i, pid, nprog, p.RUN), num_m, num_n, p.GROUP_M)
            row = e * p.M + pid_m * BM
            col = pid_n * (BN + BN2)
            q = _store_chunk(acc2, q, WHICH, p.c_desc, p.c_bufs, row, col + BN)
            lo, hi = gl.split(gl.permute(gl.reshape(acc, [BM, 2, BN2]), (0, 2, 1)))
            q = _store_chunk(lo, q, WHICH, p.c_desc, p.c_bufs, row, col)
            q = _store_chunk(hi, q, WHICH, p.c_desc, p.c_bufs, row, col + BN2)
        c += k_tiles + k_next
        k_tiles = k_mine
        rows = rows_mine
        j += 1
    tma.store_wait(pendings=0)


@gluon.jit
def _mma_first(p):
    _mma_wg(p, 0)


@gluon.jit
def _mma_second(p):
    _mma_wg(p, 1)


@gluon.jit
def wgrad_diag_kernel(
    a_ptr, b_ptr, start_ptr, c_desc, a_desc, b_desc, b2_desc, E, M, N, stride_a, stride_b, src_ptr, pair_order,
    stride_src, BK: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
    WG_STORE: gl.constexpr, LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr, TOP_K: gl.constexpr, GATHER: gl.constexpr,
    HOST: gl.constexpr, STORE: gl.constexpr, RUN: gl.constexpr,
):  # fmt: skip
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN2: gl.constexpr = c_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BM], _smem_layout([BK, BM]))
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN], _smem_layout([BK, BN]))
    b2_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN2], _smem_layout([BK, BN2]))
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2 * WG_STORE, BM, BN2], c_desc.layout)
    ready, empty, order, _unused = _ring_barriers(STAGES, 2)
    p = HArgs(a_ptr, b_ptr, start_ptr, c_desc, a_desc, b_desc, b2_desc, a_bufs, b_bufs, b2_bufs, c_bufs, ready, empty,
              order, gl.to_tensor(E), gl.to_tensor(M), gl.to_tensor(N), gl.to_tensor(stride_a), gl.to_tensor(stride_b),
              GROUP_M, src_ptr, pair_order, gl.to_tensor(stride_src), TOP_K, GATHER, HOST, STORE, RUN)  # fmt: skip
    LOAD_WARPS: gl.constexpr = 4 if GATHER else 1
    gl.warp_specialize([(_mma_first, (p,)), (_mma_second, (p,)), (_load_partition, (p,))], [4, LOAD_WARPS], [MMA_REGS, LOAD_REGS])


def launch(c, a, b, r, host: int, store: bool, run: int = 1, num_programs=None):
    """c [E, M, N] = each expert's a_e^T @ b_e as the library's launchers (a or b may be a
    ``TokenRows``: gathered), with the diagnostic switches (module docstring)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from swiglu.kernels.moe import TokenRows

    E, M, N = c.shape
    gather = 1 if isinstance(a, TokenRows) else 2 if isinstance(b, TokenRows) else 0
    cfg = PP.GATHER_CONFIG if gather else PP.CONFIG
    rows = a if gather == 1 else b if gather == 2 else None
    a_t = rows.src if gather == 1 else a
    b_t = rows.src if gather == 2 else b
    triton.set_allocator(_scratch)
    c_desc = TensorDescriptor.from_tensor(c.view(E * M, N), [cfg.BM, cfg.BN2], _layout((cfg.BM, cfg.BN2)))
    # Host descriptors over all rows (a gathered operand's: its source's, unused).
    a_desc = TensorDescriptor.from_tensor(a_t, [cfg.BK, cfg.BM], _layout((cfg.BK, cfg.BM)))
    b_desc = TensorDescriptor.from_tensor(b_t, [cfg.BK, cfg.BN], _layout((cfg.BK, cfg.BN)))
    b2_desc = TensorDescriptor.from_tensor(b_t, [cfg.BK, cfg.BN2], _layout((cfg.BK, cfg.BN2)))
    src = rows.src if rows is not None else a_t
    wgrad_diag_kernel[(num_programs or device_sms(c.device),)](
        a_t, b_t, r.expert_start, c_desc, a_desc, b_desc, b2_desc, E, M, N, a_t.stride(0), b_t.stride(0), src,
        r.order if rows is not None else r.expert_start, src.stride(0) if rows is not None else 0,
        cfg.BK, cfg.BN, cfg.GROUP_M, cfg.STAGES, cfg.wg_store, cfg.load_regs, cfg.mma_regs or cfg.maxnreg,
        rows.k if rows is not None else 1, gather, int(host), int(store), run, num_warps=4, maxnreg=cfg.maxnreg,
    )  # fmt: skip
