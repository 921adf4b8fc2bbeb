"""The library's Gluon weight-gradient kernel (``swiglu.kernels.gluon_wgrad``) with the switches
that only the probes and the tests use, which the library does not ship:

- ``ABLATE`` (``launch_grad_weight_gluon(..., ablate=)``; the cooperative kernel, the ping-pong
  one with the storer warp bit 1 only; the output is then wrong): bits 1 no stores, 2 no loads
  after the ring's first fill, 4 no wgmma (zeros stored), in any sum: what is left shows what the
  rest costs (``lab/probes/probe_wgrad_power.py --ablate``; docs/kernels.md).
- ``PLAIN_STORE`` (``plain_store=``, or ``GluonConfig.plain_store``): each tile stored with
  st.global instead of TMA stores, by the MMA warps (1) or the storer warp (2); the same bits
  (``probe_wgrad_power.py --tiles "... plain"``; data/tuning/wgrad_power_plain_store_75b285f_20261202.csv).
- ``STORE_DELAY_NS`` (``store_delay_ns=``; the ping-pong kernel with the storer warp): the storer
  waits that long before each store, which makes an epilogue that writes a buffer still being
  stored show in the output (``tests/kernels/test_gluon.py::test_pingpong_epilogues_wait_for_a_slow_storer``).
- ``A_KMAJOR``, the grad_x orientation (``launch_grad_x_gluon``): grad_x = d_gate @ gate_weight +
  d_up @ up_weight, A [M, K] row-major, two K halves in one accumulator, gate's then up's, as the
  tl grad_x kernel sums them; bitwise the tl grad_x kernel on the H200 and 0.74-1.01x its speed at
  T = 128-2048 (data/tuning/gluon_grad_x_probe_96ffe16_20261202.csv, lab/probes/probe_gluon_grad_x.py),
  so not dispatched.

The partitions with a switch are copied here; the rest (helpers, the ping-pong MMA partition,
the epilogue) are the library's, imported. The ping-pong tile without a second column chunk (a
ping-pong ``GluonConfig`` without ``BN2``, ``lab_only``) runs only here. With every switch off this
kernel compiles to the library kernel's PTX for every config the library runs (debug lines aside;
tests/kernels/test_gluon.py compiles both), so what a probe measures with a switch on is the
shipped kernel less that part.

Importing this module sets ``backward.PLAIN_STORE_LAUNCHER`` and ``backward.GRAD_X_LAUNCHER``, so
a table entry with ``plain_store`` (``gluon_grad_weights``) or a ``gluon_grad_x`` entry
(``scripts/table_variant.py``) runs here in the library's backward (lab/probes/probe_wgrad_table_ab.py
imports it for such a table).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from swiglu.kernels import backward
from swiglu.kernels.configs import GluonConfig
from swiglu.kernels.launch import launch
from swiglu.kernels.tma import Tma
from swiglu.kernels.gluon_wgrad import (
    _chunk2,
    _cta_barrier,
    _epilogue_store,
    _layout,
    _mma_layout,
    _mma_pingpong_partition,
    _mma_pingpong_second,
    _mma_pingpong_second_wg_store,
    _pdl_end,
    _pdl_start,
    _program_tiles,
    _ring_barriers,
    _store_partition_idle,
    _tile_mn,
)


# ----------------------------------------------------------------------------- grad_x's helpers


@gluon.constexpr_function
def _k_block(a_block, A_KMAJOR):
    # A's block is [BK, BM] for a weight gradient (A [K, M]) and [BM, BK] for grad_x (A [M, K]).
    return a_block[1] if A_KMAJOR else a_block[0]


@gluon.jit
def _k_steps(a_desc, BK: gl.constexpr, A_KMAJOR: gl.constexpr):
    """The k-steps of one tile: K = A's rows for a weight gradient; for grad_x two halves of
    K = intermediate_size each (d_gate's columns, then d_up's)."""
    n = gl.cdiv(a_desc.shape[0], BK)
    if A_KMAJOR:
        n = 2 * gl.cdiv(a_desc.shape[1], BK)
    return n


@gluon.jit
def _a_operand(a_bufs, s, A_KMAJOR: gl.constexpr):
    # wgmma's A operand [BM, BK]: grad_x's stage as loaded, a weight gradient's transposed.
    a = a_bufs.index(s)
    if not A_KMAJOR:
        a = a.permute((1, 0))
    return a


# ----------------------------------------------------------------------------- partitions


@gluon.jit
def _load_partition(
    a_desc,
    b_desc,
    c_desc,
    a_bufs,
    b_bufs,
    c_bufs,
    ready,
    empty,
    c_ready,
    c_empty,
    GROUP_M: gl.constexpr,
    b2_desc,
    b2_bufs,
    A_KMAJOR: gl.constexpr,
    a2_desc,
    bk2_desc,
    SKIP_LOADS: gl.constexpr = False,
):
    # BN2 > 0 (the wide kernel): each stage also brings the tile's second B chunk, columns
    # BN .. BN + BN2 (b2_desc, b2_bufs: b_desc, b_bufs otherwise, unused).
    # A_KMAJOR (grad_x): A [M, K] in blocks [BM, BK]; the second K half comes from a2_desc and
    # bk2_desc (d_up, up_weight; a_desc, b_desc otherwise, unused).
    # SKIP_LOADS (the probe's ablation, ``ABLATE``): after the ring's first fill each stage is
    # released without loading, so the MMA warps run on stale operands and no L2 reads happen.
    BK: gl.constexpr = _k_block(a_desc.block_type.shape, A_KMAJOR)
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    BN2: gl.constexpr = _chunk2(b_desc.block_type.shape, b2_desc.block_type.shape)
    BNT: gl.constexpr = BN + BN2
    STAGE_BYTES: gl.constexpr = (
        a_desc.block_type.nbytes + b_desc.block_type.nbytes + (b2_desc.block_type.nbytes if BN2 > 0 else 0)
    )
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(c_desc, BM, BNT)
    k_tiles = _k_steps(a_desc, BK, A_KMAJOR)
    p = 0
    for t in range(num_tiles):
        pid_m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, GROUP_M)
        for kk in range(k_tiles):
            s = p % STAGES
            # Fresh barriers: waiting on parity 1 passes at once (08-warp-specialization.py).
            mbarrier.wait(empty.index(s), ((p // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            if SKIP_LOADS:
                if p < STAGES:
                    _stage_loads(
                        a_desc,
                        b_desc,
                        a_bufs,
                        b_bufs,
                        bar,
                        s,
                        kk,
                        k_tiles,
                        pid_m,
                        pid_n,
                        BM,
                        BK,
                        BN,
                        BNT,
                        BN2,
                        STAGE_BYTES,
                        A_KMAJOR,
                        a2_desc,
                        bk2_desc,
                        b2_desc,
                        b2_bufs,
                    )
                else:
                    mbarrier.arrive(bar)
            else:
                _stage_loads(
                    a_desc,
                    b_desc,
                    a_bufs,
                    b_bufs,
                    bar,
                    s,
                    kk,
                    k_tiles,
                    pid_m,
                    pid_n,
                    BM,
                    BK,
                    BN,
                    BNT,
                    BN2,
                    STAGE_BYTES,
                    A_KMAJOR,
                    a2_desc,
                    bk2_desc,
                    b2_desc,
                    b2_bufs,
                )
            p += 1


@gluon.jit
def _stage_loads(
    a_desc,
    b_desc,
    a_bufs,
    b_bufs,
    bar,
    s,
    kk,
    k_tiles,
    pid_m,
    pid_n,
    BM: gl.constexpr,
    BK: gl.constexpr,
    BN: gl.constexpr,
    BNT: gl.constexpr,
    BN2: gl.constexpr,
    STAGE_BYTES: gl.constexpr,
    A_KMAJOR: gl.constexpr,
    a2_desc,
    bk2_desc,
    b2_desc,
    b2_bufs,
):
    # One stage of tile (pid_m, pid_n), k-step kk: its operands into stage s, counted on bar.
    mbarrier.expect(bar, STAGE_BYTES)
    if A_KMAJOR:
        k_half = k_tiles // 2  # d_up's half starts here
        if kk < k_half:
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kk * BK], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [kk * BK, pid_n * BNT], bar, b_bufs.index(s))
        else:
            tma.async_copy_global_to_shared(a2_desc, [pid_m * BM, (kk - k_half) * BK], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(bk2_desc, [(kk - k_half) * BK, pid_n * BNT], bar, b_bufs.index(s))
    else:
        tma.async_copy_global_to_shared(a_desc, [kk * BK, pid_m * BM], bar, a_bufs.index(s))
        tma.async_copy_global_to_shared(b_desc, [kk * BK, pid_n * BNT], bar, b_bufs.index(s))
    if BN2 > 0:  # a box wholly past N (the last column tile) is zero-filled, its bytes counted
        tma.async_copy_global_to_shared(b2_desc, [kk * BK, pid_n * BNT + BN], bar, b2_bufs.index(s))


# A worker partition's constexpr flags cannot travel in its argument tuple (worker arguments
# become IR values), so each orientation has its own entry.


@gluon.jit
def _load_partition_wgrad(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M: gl.constexpr, b2_desc, b2_bufs
):
    _load_partition(
        a_desc,
        b_desc,
        c_desc,
        a_bufs,
        b_bufs,
        c_bufs,
        ready,
        empty,
        c_ready,
        c_empty,
        GROUP_M,
        b2_desc,
        b2_bufs,
        False,
        a_desc,
        b_desc,
    )


@gluon.jit
def _load_partition_wgrad_unloaded(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M: gl.constexpr, b2_desc, b2_bufs
):
    # ABLATE & 2 (the probe's): the ring filled once, then released without loads.
    _load_partition(
        a_desc,
        b_desc,
        c_desc,
        a_bufs,
        b_bufs,
        c_bufs,
        ready,
        empty,
        c_ready,
        c_empty,
        GROUP_M,
        b2_desc,
        b2_bufs,
        False,
        a_desc,
        b_desc,
        True,
    )


@gluon.jit
def _load_partition_grad_x(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M: gl.constexpr, a2_desc, bk2_desc
):
    _load_partition(
        a_desc,
        b_desc,
        c_desc,
        a_bufs,
        b_bufs,
        c_bufs,
        ready,
        empty,
        c_ready,
        c_empty,
        GROUP_M,
        b_desc,
        b_bufs,
        True,
        a2_desc,
        bk2_desc,
    )


@gluon.jit
def _store_partition(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M: gl.constexpr, c2_desc, c2_bufs
):
    _store_tiles(c_desc, c_bufs, c_ready, c_empty, GROUP_M, c2_desc, c2_bufs, 0, False)


@gluon.jit
def _store_partition_delayed(
    a_desc,
    b_desc,
    c_desc,
    a_bufs,
    b_bufs,
    c_bufs,
    ready,
    empty,
    c_ready,
    c_empty,
    GROUP_M: gl.constexpr,
    c2_desc,
    c2_bufs,
    delay_ns,
):
    # The tests' storer (``STORE_DELAY_NS``): each store issued delay_ns after its tile is handed over.
    _store_tiles(c_desc, c_bufs, c_ready, c_empty, GROUP_M, c2_desc, c2_bufs, delay_ns, True)


@gluon.jit
def _store_partition_skipped(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M: gl.constexpr, c2_desc, c2_bufs
):
    # ABLATE & 1 (the probe's): each tile's buffer taken and freed in the same order, nothing stored.
    _store_tiles(c_desc, c_bufs, c_ready, c_empty, GROUP_M, c2_desc, c2_bufs, 0, False, True)


@gluon.jit
def _globaltimer():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _spin(ns):
    # A busy wait of ns nanoseconds on the global timer (nanosleep may sleep for none of it).
    start = _globaltimer()
    now = start
    while now - start < ns:
        now = _globaltimer()


@gluon.jit
def _store_tiles(
    c_desc,
    c_bufs,
    c_ready,
    c_empty,
    GROUP_M: gl.constexpr,
    c2_desc,
    c2_bufs,
    delay_ns,
    DELAY: gl.constexpr,
    SKIP: gl.constexpr = False,
):
    # BN2 > 0: each tile's second chunk too (c2_desc, c2_bufs: c_desc, c_bufs otherwise, unused).
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    BN2: gl.constexpr = _chunk2(c_desc.block_type.shape, c2_desc.block_type.shape)
    BNT: gl.constexpr = BN + BN2
    NC: gl.constexpr = c_bufs.type.shape[0]
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(c_desc, BM, BNT)
    for t in range(num_tiles):
        pid_m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, GROUP_M)
        buf = t % NC
        mbarrier.wait(c_ready.index(buf), (t // NC) & 1)
        if DELAY:
            _spin(delay_ns)
        if not SKIP:
            tma.async_copy_shared_to_global(c_desc, [pid_m * BM, pid_n * BNT], c_bufs.index(buf))
            if BN2 > 0:  # TMA writes nothing of a box past N
                tma.async_copy_shared_to_global(c2_desc, [pid_m * BM, pid_n * BNT + BN], c2_bufs.index(buf))
        # At most NC-1 stores left pending: the stores of tiles <= t-(NC-1) have been read out of
        # smem, so the buffer of tile t-(NC-1), index (t+1) % NC, is free (NC=1: this tile's own).
        tma.store_wait(pendings=NC - 1)
        mbarrier.arrive(c_empty.index((t + 1) % NC), pred=t >= NC - 1)
    tma.store_wait(pendings=0)


@gluon.constexpr_function
def _plain_store_layout(BN, num_warps):
    # 16 bytes (8 bf16) per thread along a row, a warp's 32 threads over as many columns as the
    # tile has (up to 256), the warps stacked along rows: whole 128-byte lines per store.
    cols = min(BN // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // cols, cols], [num_warps, 1], [1, 0])


@gluon.jit
def _store_rows(vals, out_ptr, row0, col0, M, N, layout: gl.constexpr):
    # vals [R, C] (``layout``) at out[row0:, col0:] with st.global, rows and columns past M, N masked.
    rows = row0 + gl.arange(0, vals.shape[0], layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, vals.shape[1], layout=gl.SliceLayout(0, layout))
    # N is a multiple of 8 (TMA's 16-byte row pitch): each thread's 8 columns are one 16-byte store.
    offs = gl.max_contiguous(gl.multiple_of(rows.to(gl.int64)[:, None] * N + cols[None, :], [8, 8]), [1, 8])
    # The column mask by groups of 8 (cols < N for N a multiple of 8): constant over each vector.
    gl.store(out_ptr + offs, vals, mask=(rows[:, None] < M) & (cols[None, :] // 8 < N // 8))


@gluon.jit
def _epilogue_plain(out, t, c_desc, c_ready, c_empty, out_ptr, GROUP_M: gl.constexpr, NC: gl.constexpr):
    # PLAIN_STORE 1: tile t's output stored by the MMA warps themselves with st.global (through a
    # layout conversion in shared memory), no TMA store. The storer's barriers keep their protocol
    # (an unused buffer handed over), so the storer that skips its stores pairs with this.
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    layout: gl.constexpr = _plain_store_layout(BN, gl.num_warps())
    num_m, num_n, pid, nprog, _ = _program_tiles(c_desc, BM, BN)
    pid_m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, GROUP_M)
    _store_rows(gl.convert_layout(out, layout), out_ptr, pid_m * BM, pid_n * BN, c_desc.shape[0], c_desc.shape[1], layout)
    buf = t % NC
    mbarrier.wait(c_empty.index(buf), ((t // NC) & 1) ^ 1)
    _cta_barrier()
    mbarrier.arrive(c_ready.index(buf))


@gluon.jit
def _store_partition_plain(
    a_desc,
    b_desc,
    c_desc,
    a_bufs,
    b_bufs,
    c_bufs,
    ready,
    empty,
    c_ready,
    c_empty,
    GROUP_M: gl.constexpr,
    c2_desc,
    c2_bufs,
    out_ptr,
):
    # PLAIN_STORE 2: the storer warp reads each tile's buffer in 8-row pieces and writes them with
    # st.global (no TMA store); the buffer is free once read.
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    NC: gl.constexpr = c_bufs.type.shape[0]
    layout: gl.constexpr = _plain_store_layout(BN, 1)
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(c_desc, BM, BN)
    M = c_desc.shape[0]
    N = c_desc.shape[1]
    for t in range(num_tiles):
        pid_m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, GROUP_M)
        buf = t % NC
        mbarrier.wait(c_ready.index(buf), (t // NC) & 1)
        c_buf = c_bufs.index(buf)
        for r in gl.static_range(0, BM, 8):
            _store_rows(c_buf.slice(r, 8).load(layout), out_ptr, pid_m * BM + r, pid_n * BN, M, N, layout)
        mbarrier.arrive(c_empty.index(buf))


@gluon.jit
def _mma_partition(
    a_desc,
    b_desc,
    c_desc,
    a_bufs,
    b_bufs,
    c_bufs,
    ready,
    empty,
    c_ready,
    c_empty,
    GROUP_M: gl.constexpr,
    DEFER: gl.constexpr,
    A_KMAJOR: gl.constexpr,
    SKIP_MMA: gl.constexpr = False,
    b2_bufs=None,
    c2_bufs=None,
    out_ptr=None,
    PLAIN_STORE: gl.constexpr = 0,
):
    # SKIP_MMA (the probe's ablation, ABLATE & 4): every barrier as it is, no wgmma: the tiles
    # stored are zeros, and what is left times the loads and the store path alone.
    # b2_bufs / c2_bufs narrower than b_bufs / c_bufs (the wide tile BM x (BN + BN2), e.g. quack's
    # 256 x 192; not with DEFER, SKIP_MMA or PLAIN_STORE): a second accumulator for the tile's
    # columns BN .. BN + BN2, a second wgmma per step on the same A stage, the narrower chunk
    # converted first (_epilogue_store). Placeholders b_bufs / c_bufs (or None): no second chunk.
    BK: gl.constexpr = _k_block(a_desc.block_type.shape, A_KMAJOR)
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    BN2: gl.constexpr = 0 if b2_bufs is None else _chunk2(b_bufs.type.shape, b2_bufs.type.shape)
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    NUM_WARPS: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = c_desc.dtype
    num_tiles = _program_tiles(c_desc, BM, BN + BN2)[4]
    k_tiles = _k_steps(a_desc, BK, A_KMAJOR)

    mma_layout: gl.constexpr = _mma_layout(BM, BN, NUM_WARPS)
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=mma_layout)
    prev = gl.zeros((BM, BN), dtype=dtype, layout=mma_layout)  # DEFER: the last tile's output, not stored yet
    if BN2 > 0:
        acc2 = gl.zeros((BM, BN2), dtype=gl.float32, layout=_mma_layout(BM, BN2, NUM_WARPS))
    c = 0
    for t in range(num_tiles):
        for kk in range(k_tiles):
            s = c % STAGES
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            if not SKIP_MMA:
                a_s = _a_operand(a_bufs, s, A_KMAJOR)
                acc = warpgroup_mma(a_s, b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
                if BN2 > 0:
                    acc2 = warpgroup_mma(a_s, b2_bufs.index(s), acc2, use_acc=kk > 0, is_async=True)
            if DEFER:
                if kk == 0 and t > 0:  # the previous tile's epilogue while this tile's first wgmma runs
                    _epilogue_store(prev, t - 1, c_desc, c_bufs, c_ready, c_empty)
            if not SKIP_MMA:
                if BN2 > 0:  # the two wgmma groups of step c may run on
                    acc, acc2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc2))
                else:
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            # wgmma of step c-1 is done in this warpgroup; sync the partition (both warpgroups) before
            # thread 0 releases its stage to the loader.
            _cta_barrier()
            mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), pred=kk > 0)
            c += 1
        if not SKIP_MMA:
            if BN2 > 0:
                acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _cta_barrier()
        mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES))
        if DEFER:
            prev = acc.to(dtype)
        elif PLAIN_STORE == 1:
            _epilogue_plain(acc.to(dtype), t, c_desc, c_ready, c_empty, out_ptr, GROUP_M, c_bufs.type.shape[0])
        elif BN2 > 0:
            _epilogue_store(acc, t, c_desc, c_bufs, c_ready, c_empty, acc2, c2_bufs)
        else:
            _epilogue_store(acc.to(dtype), t, c_desc, c_bufs, c_ready, c_empty)
    if DEFER:
        if num_tiles > 0:
            _epilogue_store(prev, num_tiles - 1, c_desc, c_bufs, c_ready, c_empty)


@gluon.jit
def wgrad_kernel(
    a_desc,
    b_desc,
    c_desc,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    NC: gl.constexpr,
    LOAD_REGS: gl.constexpr,
    STORE_REGS: gl.constexpr,
    DEFER: gl.constexpr = False,
    PINGPONG: gl.constexpr = False,
    MMA_REGS: gl.constexpr = 0,
    b2_desc=None,
    c2_desc=None,
    BN2: gl.constexpr = 0,
    A_KMAJOR: gl.constexpr = False,
    a2_desc=None,
    bk2_desc=None,
    STORE_DELAY_NS: gl.constexpr = 0,
    ABLATE: gl.constexpr = 0,
    out_ptr=None,
    PLAIN_STORE: gl.constexpr = 0,
    PDL: gl.constexpr = False,
    WG_STORE: gl.constexpr = 0,
):
    """``out = A^T @ B``. The default partition is the MMA warps: two warpgroups on one tile
    (num_warps=8), or with PINGPONG the first of two 4-warp MMA warpgroups on alternate tiles
    (launch with num_warps=4; the second gets MMA_REGS registers; DEFER unused). BN2 > 0:
    tiles BM x (BN + BN2), the second chunk through ``b2_desc`` / ``c2_desc`` (blocks [BK, BN2] /
    [BM, BN2] on the same B and out), in the ping-pong kernel or (without PINGPONG: the wide
    cooperative tile, no DEFER, A_KMAJOR, ABLATE or PLAIN_STORE) both MMA warpgroups on one tile.
    A_KMAJOR (not with PINGPONG): ``out = A @ B + A2 @ B2`` with A, A2 [M, K] (blocks [BM, BK])
    and B, B2 [K, N] (``a2_desc``, ``bk2_desc``), one accumulator over both K ranges in turn: grad_x. STORE_DELAY_NS > 0
    (PINGPONG, tests only): the storer waits that long before each store, which makes any
    epilogue that writes a buffer still being stored show in the output. ABLATE (the cooperative
    weight gradient, probes only; the output is then wrong): bits 1 no stores, 2 no loads after
    the ring's first fill, 4 no wgmma (zeros stored), in any sum; what is left shows what the rest
    costs (``lab/probes/probe_wgrad_power.py --ablate``). PLAIN_STORE (the cooperative weight
    gradient without DEFER or ABLATE bit 1, probes and tests): the MMA warps store each tile to
    ``out_ptr`` (``out``'s data, contiguous [M, N]) with st.global instead of handing it to the
    TMA storer (1), or the storer warp reads each tile's buffer and stores it so (2); the same
    values. WG_STORE > 0 (PINGPONG with BN = 2 * BN2): each MMA warpgroup stores its own tiles by
    TMA in three BN2-wide chunks through WG_STORE chunk buffers of its own (c2_desc's blocks),
    the storer idle and NC unused; the same values."""
    BK: gl.constexpr = _k_block(a_desc.block_type.shape, A_KMAJOR)
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    dtype: gl.constexpr = c_desc.dtype
    gl.static_assert(not (A_KMAJOR and PINGPONG), "grad_x (A_KMAJOR) runs the cooperative partitions only")
    gl.static_assert(STORE_DELAY_NS == 0 or PINGPONG, "STORE_DELAY_NS is the ping-pong kernel's test switch")
    gl.static_assert(
        not WG_STORE or (PINGPONG and BN2 > 0 and BN == 2 * BN2 and STORE_DELAY_NS == 0 and ABLATE == 0),
        "WG_STORE is the ping-pong kernel's with BN = 2 * BN2",
    )
    gl.static_assert(
        BN2 == 0 or PINGPONG or not (DEFER or A_KMAJOR or ABLATE or PLAIN_STORE),
        "the wide cooperative tile (BN2 without PINGPONG) takes no DEFER, A_KMAJOR, ABLATE or PLAIN_STORE",
    )
    gl.static_assert(
        ABLATE == 0 or not (A_KMAJOR or PINGPONG and ABLATE != 1),
        "ABLATE is the weight gradient's probe switch (ping-pong: 1 only)",
    )
    gl.static_assert(
        not PLAIN_STORE or not (PINGPONG or A_KMAJOR or DEFER or (ABLATE & 1)),
        "PLAIN_STORE is the cooperative weight gradient's probe switch (no DEFER, no ABLATE bit 1)",
    )

    # A's stages in A's block shape: [BK, BM] (weight gradients) or [BM, BK] (grad_x).
    a_bufs = gl.allocate_shared_memory(
        a_desc.dtype, [STAGES, a_desc.block_type.shape[0], a_desc.block_type.shape[1]], a_desc.layout
    )
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BK, BN], b_desc.layout)
    if WG_STORE:  # WG_STORE chunk buffers [BM, BN2] per MMA warpgroup; NC unused
        c_bufs = gl.allocate_shared_memory(dtype, [2 * WG_STORE, BM, BN2], c2_desc.layout)
    else:
        c_bufs = gl.allocate_shared_memory(dtype, [NC, BM, BN], c_desc.layout)
    ready, empty, c_ready, c_empty = _ring_barriers(STAGES, NC)
    _pdl_start(PDL)

    args = (a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M)
    if PINGPONG:
        order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(order.index(i), count=1)
        if BN2 > 0:
            b2_bufs = gl.allocate_shared_memory(b2_desc.dtype, [STAGES, BK, BN2], b2_desc.layout)
            c2_bufs = gl.allocate_shared_memory(dtype, [NC, BM, BN2], c2_desc.layout)
        else:  # placeholders (partition arguments must be values), never read
            b2_desc, c2_desc, b2_bufs, c2_bufs = b_desc, c_desc, b_bufs, c_bufs
        pp_args = args[:-1] + (order, GROUP_M, b2_bufs, c2_bufs)
        if WG_STORE:
            gl.warp_specialize(
                [
                    (_mma_pingpong_partition, pp_args + (c2_desc, True, 0)),
                    (_mma_pingpong_second_wg_store, (pp_args, c2_desc)),
                    (_load_partition_wgrad, args + (b2_desc, b2_bufs)),
                    (_store_partition_idle, args + (c2_desc, c2_bufs)),
                ],
                [4, 1, 1],
                [MMA_REGS, LOAD_REGS, STORE_REGS],
            )
        elif STORE_DELAY_NS > 0:
            delay = gl.program_id(0) * 0 + STORE_DELAY_NS  # a value: worker arguments cannot be constexprs
            gl.warp_specialize(
                [
                    (_mma_pingpong_partition, pp_args + (c2_desc, False, 0)),
                    (_mma_pingpong_second, (pp_args, c2_desc)),
                    (_load_partition_wgrad, args + (b2_desc, b2_bufs)),
                    (_store_partition_delayed, args + (c2_desc, c2_bufs, delay)),
                ],
                [4, 1, 1],
                [MMA_REGS, LOAD_REGS, STORE_REGS],
            )
        else:
            gl.warp_specialize(
                [
                    (_mma_pingpong_partition, pp_args + (c2_desc, False, 0)),
                    (_mma_pingpong_second, (pp_args, c2_desc)),
                    (_load_partition_wgrad, args + (b2_desc, b2_bufs)),
                    (_store_partition_skipped if ABLATE & 1 else _store_partition, args + (c2_desc, c2_bufs)),
                ],
                [4, 1, 1],
                [MMA_REGS, LOAD_REGS, STORE_REGS],
            )
    elif A_KMAJOR:
        gl.warp_specialize(
            [
                (_mma_partition, args + (False, A_KMAJOR)),
                (_load_partition_grad_x, args + (a2_desc, bk2_desc)),
                (_store_partition, args + (c_desc, c_bufs)),
            ],
            [1, 1],
            [LOAD_REGS, STORE_REGS],
        )
    elif BN2 > 0:  # the wide cooperative tile
        b2_bufs = gl.allocate_shared_memory(b2_desc.dtype, [STAGES, BK, BN2], b2_desc.layout)
        c2_bufs = gl.allocate_shared_memory(dtype, [NC, BM, BN2], c2_desc.layout)
        gl.warp_specialize(
            [
                (_mma_partition, args + (False, False, False, b2_bufs, c2_bufs)),
                (_load_partition_wgrad, args + (b2_desc, b2_bufs)),
                (_store_partition, args + (c2_desc, c2_bufs)),
            ],
            [1, 1],
            [LOAD_REGS, STORE_REGS],
        )
    else:
        # ABLATE (probes): bit 1 the storer that skips its stores, bit 2 the loader that stops
        # loading, bit 4 the MMA warps without wgmma. PLAIN_STORE 1: out_ptr goes to the MMA warps
        # (a partition argument only where given: None is no value) and the storer only keeps the
        # barriers; 2: the storer that writes with st.global.
        gl.warp_specialize(
            [
                (
                    _mma_partition,
                    args
                    + (DEFER, A_KMAJOR, (ABLATE & 4) != 0)
                    + ((b_bufs, c_bufs, out_ptr, PLAIN_STORE) if PLAIN_STORE == 1 else ()),
                ),
                (_load_partition_wgrad_unloaded if ABLATE & 2 else _load_partition_wgrad, args + (b_desc, b_bufs)),
                (_store_partition_plain, args + (c_desc, c_bufs, out_ptr))
                if PLAIN_STORE == 2
                else (_store_partition_skipped if ABLATE & 1 or PLAIN_STORE == 1 else _store_partition, args + (c_desc, c_bufs)),
            ],
            [1, 1],
            [LOAD_REGS, STORE_REGS],
        )
    _pdl_end(PDL)


# ----------------------------------------------------------------------------- launchers


def launch_grad_weight_gluon(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    cfg: GluonConfig,
    num_programs: int,
    store_delay_ns: int = 0,
    ablate: int = 0,
    plain_store: int = 0,
) -> None:
    """``gluon_wgrad.launch_grad_weight_gluon`` (the library's launcher: its contract, a config's
    ``wg_store`` too; a config with ``resident_k`` is ``swiglu_lab.experiments.gluon_wgrad_resident``'s,
    ValueError here) with the switches. ``store_delay_ns`` (tests, a ping-pong ``cfg`` with the
    storer warp): the storer waits that long before each store. ``ablate`` (probes, a cooperative
    ``cfg``, or bit 1 on a ping-pong one with the storer warp; ``out`` is then wrong): 1 skips the
    stores, 2 the loads after the ring's first fill, 4 the wgmmas (zeros stored), or a sum of them
    (``wgrad_kernel``'s ABLATE). ``plain_store`` (probes, tests; a cooperative ``cfg`` without
    ``defer``, ``out`` contiguous; a ``cfg`` with ``plain_store`` always): the tiles stored with
    st.global, not by TMA, by the MMA warps (1) or the storer warp (2) (``wgrad_kernel``'s
    PLAIN_STORE). The library's backward calls this for a config with ``plain_store``
    (``backward.PLAIN_STORE_LAUNCHER``)."""
    M, N, K = out.shape[0], out.shape[1], a.shape[0]
    (a_block, a_layout), (b_block, b_layout), (c_block, c_layout), *wide, consts, kw = _launch_constants(cfg)
    descs = [Tma(a, a_block, a_layout), Tma(b, b_block, b_layout), Tma(out, c_block, c_layout)]
    if wide:  # the second chunk's blocks on the same b and out
        (b2_block, b2_layout), (c2_block, c2_layout) = wide
        descs += [*consts, Tma(b, b2_block, b2_layout), Tma(out, c2_block, c2_layout), cfg.BN2]
    else:
        descs += consts
    if store_delay_ns or ablate:
        kw = dict(kw, STORE_DELAY_NS=store_delay_ns, ABLATE=ablate)
    plain = plain_store or cfg.plain_store
    if plain:
        if cfg.pingpong or cfg.defer or ablate & 1 or not out.is_contiguous():
            raise ValueError(
                f"plain_store takes a cooperative config without defer, ablate without bit 1 and a contiguous "
                f"out, got {cfg}, ablate={ablate}, out strides {out.stride()}"
            )
        # out's pointer positionally (keyword values are kept per launch key), after every
        # argument before it in the signature (kw is the cached constants' dict: copied).
        kw = dict(kw)
        descs += [
            kw.pop(name) for name in ("b2_desc", "c2_desc", "BN2", "A_KMAJOR", "a2_desc", "bk2_desc", "STORE_DELAY_NS", "ABLATE")
        ] + [out]
        kw.pop("out_ptr")
        kw = dict(kw, PLAIN_STORE=int(plain))
    launch(
        wgrad_kernel,
        (num_programs,),
        ("gluon_wgrad_probe", a.device, M, N, K, num_programs, cfg, store_delay_ns, ablate, plain),
        *descs,
        **kw,
    )


@lru_cache(maxsize=None)
def _launch_constants(cfg: GluonConfig):
    # What a launch takes from its config alone, built once per config (host time per launch).
    if cfg.resident_k:
        raise ValueError(
            f"a config with resident_k runs swiglu_lab.experiments.gluon_wgrad_resident.launch_grad_weight_resident, got {cfg}"
        )
    blocks = ([cfg.BK, cfg.BM], [cfg.BK, cfg.BN], [cfg.BM, cfg.BN]) + (([cfg.BK, cfg.BN2], [cfg.BM, cfg.BN2]) if cfg.BN2 else ())
    consts = (
        cfg.GROUP_M,
        cfg.STAGES,
        cfg.NC,
        cfg.load_regs,
        cfg.store_regs,
        cfg.defer,
        cfg.pingpong,
        (cfg.mma_regs or cfg.maxnreg) if cfg.pingpong else 0,
    )
    kw = dict(num_warps=4 if cfg.pingpong else cfg.num_warps, maxnreg=cfg.maxnreg)
    if not cfg.BN2:  # the wide kernel's arguments, absent (positional after the constants where present)
        kw.update(b2_desc=None, c2_desc=None, BN2=0)
    kw.update(
        A_KMAJOR=False,
        a2_desc=None,
        bk2_desc=None,
        STORE_DELAY_NS=0,
        ABLATE=0,  # grad_x's, tests', probes' switches
        out_ptr=None,
        PLAIN_STORE=0,
        WG_STORE=cfg.wg_store,
    )
    return tuple((b, _layout(tuple(b))) for b in blocks) + (consts, kw)


# ----------------------------------------------------------------------------- grad_x


# Candidates: swiglu_lab.experiments.candidates.GRAD_X_CANDIDATES.


def launch_grad_x_gluon(
    d_gate: torch.Tensor,
    d_up: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    grad_x: torch.Tensor,
    cfg: GluonConfig,
    num_programs: int,
) -> None:
    """grad_x = d_gate @ gate_weight + d_up @ up_weight: d_gate, d_up [T, I], gate_weight,
    up_weight [I, H], grad_x [T, H]; bf16 CUDA sm_90 tensors usable by TMA (``tma.tma_ready``),
    one fp32 accumulator over gate's K range then up's (the tl grad_x kernel's order);
    ``num_programs`` persistent programs. The contract of ``backward.launch_grad_x``; the caller
    checks device, sizes and shared memory. A cooperative ``cfg`` only (no ``pingpong``, ``BN2``,
    ``defer``: ValueError). The library's backward calls this for a ``gluon_grad_x`` table entry
    (``backward.GRAD_X_LAUNCHER``)."""
    (a_block, a_layout), (b_block, b_layout), (c_block, c_layout), consts = _grad_x_constants(cfg)
    T, H, I = grad_x.shape[0], grad_x.shape[1], d_gate.shape[1]
    launch(
        wgrad_kernel,
        (num_programs,),
        ("gluon_grad_x", d_gate.device, T, H, I, num_programs, cfg),
        Tma(d_gate, a_block, a_layout),
        Tma(gate_weight, b_block, b_layout),
        Tma(grad_x, c_block, c_layout),
        *consts,
        None,
        None,
        0,
        True,
        Tma(d_up, a_block, a_layout),
        Tma(up_weight, b_block, b_layout),
        STORE_DELAY_NS=0,
        ABLATE=0,
        out_ptr=None,
        PLAIN_STORE=0,
        WG_STORE=0,
        num_warps=cfg.num_warps,
        maxnreg=cfg.maxnreg,
    )


@lru_cache(maxsize=None)
def _grad_x_constants(cfg: GluonConfig):
    # _launch_constants' for the grad_x orientation (A's block [BM, BK]), checked once per config.
    if cfg.pingpong or cfg.BN2 or cfg.defer:
        raise ValueError(f"grad_x takes a cooperative GluonConfig (no pingpong, BN2 or defer), got {cfg}")
    blocks = ([cfg.BM, cfg.BK], [cfg.BK, cfg.BN], [cfg.BM, cfg.BN])
    consts = _launch_constants(cfg)[-2]
    return tuple((b, _layout(tuple(b))) for b in blocks) + (consts,)


# The library's backward runs a table entry with plain_store, and a gluon_grad_x entry, through these.
backward.PLAIN_STORE_LAUNCHER = launch_grad_weight_gluon
backward.GRAD_X_LAUNCHER = launch_grad_x_gluon
