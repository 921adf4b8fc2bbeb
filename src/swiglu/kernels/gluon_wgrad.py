"""Gluon weight-gradient GEMM for Hopper (sm_90), written for triton 3.6 and 3.7 (``devices.GLUON_TRITONS``).

    out[M, N] = A^T @ B,  A [K, M] row-major (d_gate, d_up or grad_output),  B [K, N] row-major (x or h),
    out bf16 [M, N], fp32 accumulation, K = tokens (any K >= 1: TMA zero-fills past K).

At small K this GEMM is bound by writing ``out``; a TMA loader, two MMA warpgroups and a TMA storer
with NC stores in flight overlap the stores with the next tiles' MMAs, which tl-level Triton cannot.
The table dispatches it at T <= 2048 (backward_configs.json: each entry's measurement against the
tl kernel or the entry it replaced, and its data file): at T <= 128 the two warpgroups on one tile
with one output buffer; at T = 129-2048 they take alternate tiles (ping-pong), handed to the storer
warp. The MMA warpgroups storing their own tiles by TMA (``GluonConfig.wg_store``, the MoE weight
gradient's epilogue) took 0.95-1.01x the storer's whole-backward time there, but a preempted
launch loses 16 columns of a tile when another process time-slices the GPU (H100,
lab/probes/time_slicing.py), so the table does not run them. At T = 4096 and 8192 that ping-pong
tile took 0.987-1.012x the tl kernel's whole-backward time in four A/B runs
(data/tuning/table_ab_wide_buckets_6f59c81_20261202.csv), so those buckets keep the tl kernel.
The probes' and tests' variants of this kernel (ablations, st.global stores, a slowed storer, the
grad_x orientation, the ping-pong tile without a second column chunk) are
``swiglu_lab.experiments.gluon_wgrad_probe``'s.
Design and measurements: docs/kernels.md.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .configs import GluonConfig
from .launch import CONFIG_TOKENS, launch
from .tl_kernels import _tile_mn  # scalar integer code only: compiles the same in a Gluon kernel
from .tma import Tma, tuple_new

#: The barrier of a CTA's threads: ``gl.thread_barrier`` in triton 3.6, ``gl.barrier`` from 3.7
#: (the same ``bar.sync`` of the CTA where the launch has one CTA per cluster).
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


# ----------------------------------------------------------------------------- helpers


@gluon.constexpr_function
def _warps_per_cta(BM, num_warps):
    # 05-wgmma.py get_warps_per_cta: tile the [4, 1] atom along M while M has rows left, then along N.
    w = [4, 1]
    while w[0] * w[1] != num_warps:
        if BM > 16 * w[0]:
            w[0] *= 2
        else:
            w[1] *= 2
    return w


@gluon.constexpr_function
def _instr_n(BM, BN, num_warps):
    # 05-wgmma.py get_instr_shape_n
    m_reps = triton.cdiv(BM, 16)
    n_reps = triton.cdiv(num_warps, m_reps)
    max_n = max(BN // n_reps, 8)
    n = 256
    while n > max_n or BN % n != 0:
        n -= 8
    return n


@gluon.constexpr_function
def _mma_layout(BM, BN, num_warps):
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=_warps_per_cta(BM, num_warps), instr_shape=[16, _instr_n(BM, BN, num_warps), 16]
    )


@gluon.jit
def _pdl_start(PDL: gl.constexpr):
    """``tl_kernels._pdl_start`` for Gluon kernels (before ``warp_specialize``: every partition
    then runs after the previous kernel finished): PTX griddepcontrol, as triton's
    ``tl.extra.cuda.gdc_wait`` / ``gdc_launch_dependents`` emit it; ``_pdl_end`` after the
    partitions join."""
    if PDL:
        _griddepcontrol("griddepcontrol.wait; // dummy $0")
    if PDL == 1:
        _griddepcontrol("griddepcontrol.launch_dependents; // dummy $0")


@gluon.jit
def _pdl_end(PDL: gl.constexpr):
    if PDL == 2:
        _griddepcontrol("griddepcontrol.launch_dependents; // dummy $0")


@gluon.jit
def _griddepcontrol(ASM: gl.constexpr):
    gl.inline_asm_elementwise(ASM, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _ring_barriers(STAGES: gl.constexpr, NOUT: gl.constexpr):
    """(ready, empty, out_ready, out_empty): initialized mbarriers (count 1) of a STAGES-deep
    operand ring and of NOUT output buffers, in that allocation order."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    out_ready = gl.allocate_shared_memory(gl.int64, [NOUT, 1], mbarrier.MBarrierLayout())
    out_empty = gl.allocate_shared_memory(gl.int64, [NOUT, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(NOUT):
        mbarrier.init(out_ready.index(i), count=1)
        mbarrier.init(out_empty.index(i), count=1)
    return ready, empty, out_ready, out_empty


@gluon.constexpr_function
def _chunk2(b_block, b2_block):
    # The second chunk's width: the wide kernel's b2 block is narrower than b's (BN2 < BN); the
    # ping-pong kernel without one passes b's own descriptor in its place. (Ints in a partition's
    # arguments arrive as runtime values, so the width travels in the descriptor's block type.)
    return b2_block[-1] if b2_block[-1] != b_block[-1] else 0


@gluon.jit
def _program_tiles(c_desc, BM: gl.constexpr, BN: gl.constexpr):
    """(num_m, num_n, pid, nprog, num_tiles): the output's grid of BM x BN tiles and this
    persistent program's share of it (tiles pid, pid + nprog, ...), as every partition counts."""
    num_m = gl.cdiv(c_desc.shape[0], BM)
    num_n = gl.cdiv(c_desc.shape[1], BN)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    return num_m, num_n, pid, nprog, gl.cdiv(num_m * num_n - pid, nprog)


@gluon.jit
def _fill_stage(p, ready, empty, NBYTES: gl.constexpr):
    """The loader's step p: waits until its stage (p % STAGES) is free, announces NBYTES on its
    ready barrier; returns (stage, ready barrier) for the step's TMA loads."""
    STAGES: gl.constexpr = ready.type.shape[0]
    s = p % STAGES
    # Fresh barriers: waiting on parity 1 passes at once (08-warp-specialization.py).
    mbarrier.wait(empty.index(s), ((p // STAGES) & 1) ^ 1)
    bar = ready.index(s)
    mbarrier.expect(bar, NBYTES)
    return s, bar


# ----------------------------------------------------------------------------- kernel


@gluon.jit
def _load_partition(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M: gl.constexpr, b2_desc, b2_bufs
):
    # BN2 > 0 (the wide kernel): each stage also brings the tile's second B chunk, columns
    # BN .. BN + BN2 (b2_desc, b2_bufs: b_desc, b_bufs otherwise, unused).
    BK: gl.constexpr = a_desc.block_type.shape[0]
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    BN2: gl.constexpr = _chunk2(b_desc.block_type.shape, b2_desc.block_type.shape)
    BNT: gl.constexpr = BN + BN2
    STAGE_BYTES: gl.constexpr = (
        a_desc.block_type.nbytes + b_desc.block_type.nbytes + (b2_desc.block_type.nbytes if BN2 > 0 else 0)
    )
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(c_desc, BM, BNT)
    k_tiles = gl.cdiv(a_desc.shape[0], BK)
    p = 0
    for t in range(num_tiles):
        pid_m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, GROUP_M)
        for kk in range(k_tiles):
            s, bar = _fill_stage(p, ready, empty, STAGE_BYTES)
            tma.async_copy_global_to_shared(a_desc, [kk * BK, pid_m * BM], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [kk * BK, pid_n * BNT], bar, b_bufs.index(s))
            if BN2 > 0:  # a box wholly past N (the last column tile) is zero-filled, its bytes counted
                tma.async_copy_global_to_shared(b2_desc, [kk * BK, pid_n * BNT + BN], bar, b2_bufs.index(s))
            p += 1


@gluon.jit
def _store_partition(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M: gl.constexpr, c2_desc, c2_bufs
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
        tma.async_copy_shared_to_global(c_desc, [pid_m * BM, pid_n * BNT], c_bufs.index(buf))
        if BN2 > 0:  # TMA writes nothing of a box past N
            tma.async_copy_shared_to_global(c2_desc, [pid_m * BM, pid_n * BNT + BN], c2_bufs.index(buf))
        # At most NC-1 stores left pending: the stores of tiles <= t-(NC-1) have been read out of
        # smem, so the buffer of tile t-(NC-1), index (t+1) % NC, is free (NC=1: this tile's own).
        tma.store_wait(pendings=NC - 1)
        mbarrier.arrive(c_empty.index((t + 1) % NC), pred=t >= NC - 1)
    tma.store_wait(pendings=0)


@gluon.jit
def _epilogue_store(out, t, c_desc, c_bufs, c_ready, c_empty, out2=None, c2_bufs=None):
    # Tile t's output (and its second chunk, out2, where given) into its smem buffer in the
    # output dtype, handed to the storer. The narrower second chunk first: its fp32 registers
    # are free before the first's conversion needs room (232 registers hold a 128 x 192 tile's).
    NC: gl.constexpr = c_bufs.type.shape[0]
    buf = t % NC
    c_buf = c_bufs.index(buf)
    mbarrier.wait(c_empty.index(buf), ((t // NC) & 1) ^ 1)
    if out2 is not None:
        c2_bufs.index(buf).store(out2.to(c2_bufs.dtype))
    c_buf.store(out.to(c_bufs.dtype))
    fence_async_shared()
    _cta_barrier()
    mbarrier.arrive(c_ready.index(buf))


@gluon.jit
def _store_partition_idle(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M: gl.constexpr, c2_desc, c2_bufs
):
    # WG_STORE: the MMA warpgroups store their own tiles; the storer has none.
    pass


@gluon.jit
def _store_chunk(vals, q, WHICH: gl.constexpr, c2_desc, c_bufs, row, col):
    # WG_STORE: one BM x BN2 chunk through this warpgroup's ring of chunk buffers (q: its chunks
    # so far), stored by TMA from here. The same elected thread issues every store of the
    # partition, so its store_wait sees them all; the barriers pass that on to the other warps.
    NCH: gl.constexpr = c_bufs.type.shape[0] // 2
    buf = c_bufs.index(WHICH * NCH + q % NCH)
    tma.store_wait(pendings=NCH - 1)  # the store that last read this buffer is done reading it
    _cta_barrier()
    buf.store(vals.to(c_bufs.dtype))
    fence_async_shared()
    _cta_barrier()
    tma.async_copy_shared_to_global(c2_desc, [row, col], buf)
    return q + 1


@gluon.jit
def _epilogue_wg_store(acc, acc2, q, i, WHICH: gl.constexpr, c2_desc, c_bufs, GROUP_M: gl.constexpr):
    # WG_STORE: tile i (BM x (BN + BN2), BN = 2 * BN2) in three BN2-wide chunks: acc2's first
    # (its registers free before the others' conversions), then acc's two halves (split in
    # registers). Returns the warpgroup's chunk count after them.
    BM: gl.constexpr = c2_desc.block_type.shape[0]
    BN2: gl.constexpr = c2_desc.block_type.shape[1]
    num_m, num_n, pid, nprog, _ = _program_tiles(c2_desc, BM, 3 * BN2)
    pid_m, pid_n = _tile_mn(pid + i * nprog, num_m, num_n, GROUP_M)
    row = pid_m * BM
    col = pid_n * (3 * BN2)
    q = _store_chunk(acc2, q, WHICH, c2_desc, c_bufs, row, col + 2 * BN2)
    lo, hi = gl.split(gl.permute(gl.reshape(acc, [BM, 2, BN2]), (0, 2, 1)))
    q = _store_chunk(lo, q, WHICH, c2_desc, c_bufs, row, col)
    q = _store_chunk(hi, q, WHICH, c2_desc, c_bufs, row, col + BN2)
    return q


@gluon.jit
def _mma_tile(a_bufs, b_bufs, ready, empty, acc, c, k_tiles, A_T: gl.constexpr, FENCE: gl.constexpr = False):
    """One tile's mainloop of MMA warps that share it: k_tiles wgmma steps through the ring from the
    program's step c, each stage released once its wgmma is done; returns (acc, the next step).
    A_T: A's stages are [BK, BM], used transposed. FENCE: a stage written by cp.async (the generic
    proxy) is fenced before wgmma reads it (the async proxy)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    for kk in range(k_tiles):
        s = c % STAGES
        mbarrier.wait(ready.index(s), (c // STAGES) & 1)
        if FENCE:
            fence_async_shared()
        a_s = a_bufs.index(s)
        if A_T:
            a_s = a_s.permute((1, 0))
        acc = warpgroup_mma(a_s, b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        # wgmma of step c-1 is done in this warpgroup; sync the partition (both warpgroups) before
        # thread 0 releases its stage to the loader.
        _cta_barrier()
        mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), pred=kk > 0)
        c += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _cta_barrier()
    mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES))
    return acc, c


@gluon.jit
def _mma_partition(a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, GROUP_M: gl.constexpr):
    # Both MMA warpgroups on one tile. Its deferred epilogue (``GluonConfig.defer``) and the wide
    # cooperative tile (BN2 without pingpong) are the lab's (``swiglu_lab.experiments.gluon_wgrad_probe``).
    BK: gl.constexpr = a_desc.block_type.shape[0]
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    dtype: gl.constexpr = c_desc.dtype
    num_tiles = _program_tiles(c_desc, BM, BN)[4]
    k_tiles = gl.cdiv(a_desc.shape[0], BK)

    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=_mma_layout(BM, BN, gl.num_warps()))
    c = 0
    for t in range(num_tiles):
        acc, c = _mma_tile(a_bufs, b_bufs, ready, empty, acc, c, k_tiles, True)
        _epilogue_store(acc.to(dtype), t, c_desc, c_bufs, c_ready, c_empty)


# ----------------------------------------------------------------------------- ping-pong partitions
# Two MMA warpgroups on alternate tiles, so one's epilogue runs under the other's MMAs (quack's
# ping-pong schedule), instead of two warpgroups on one tile; the table's choice at T = 129-2048,
# the storer warp storing the tiles, or with WG_STORE each warpgroup its own.
# Candidates: swiglu_lab.experiments.candidates (PINGPONG_CANDIDATES, WIDE_CANDIDATES).


@gluon.jit
def _mma_pingpong_partition(
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
    order,
    GROUP_M: gl.constexpr,
    b2_bufs,
    c2_bufs,
    c2_desc,
    WG_STORE: gl.constexpr,
    WHICH: gl.constexpr,
):
    # Both MMA warpgroups run this partition: the first as the default partition, the second
    # through _mma_pingpong_second_wg_store or _mma_pingpong_second (c2_desc: unused without
    # WG_STORE).
    # Warpgroup WHICH (0 or 1) takes the program's tiles WHICH, WHICH + 2, ...; the loader fills
    # the shared ring in tile order, so each epilogue overlaps the other warpgroup's mainloop.
    # Step g of the program (tile i, k-step kk: g = i * k_tiles + kk) uses stage g % STAGES with
    # phase (g // STAGES) & 1, as the loader counts. The mainloops take turns (``order``: each
    # warpgroup arrives on its barrier when its tile's last stage has landed): a warpgroup running
    # ahead into tile i + 2 would otherwise wait on a stage's parity two phases early and pass at
    # once, reading a stage being refilled (docs/kernels.md).
    # BN2 > 0: a second accumulator for the tile's columns BN .. BN + BN2, a second wgmma per step.
    BK: gl.constexpr = a_desc.block_type.shape[0]
    BM: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    BN2: gl.constexpr = _chunk2(b_bufs.type.shape, b2_bufs.type.shape)
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    NC: gl.constexpr = c_bufs.type.shape[0]
    dtype: gl.constexpr = c_desc.dtype
    num_tiles = _program_tiles(c_desc, BM, BN + BN2)[4]
    k_tiles = gl.cdiv(a_desc.shape[0], BK)

    mma_layout: gl.constexpr = _mma_layout(BM, BN, gl.num_warps())
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=mma_layout)
    if BN2 > 0:
        mma_layout2: gl.constexpr = _mma_layout(BM, BN2, gl.num_warps())
        acc2 = gl.zeros((BM, BN2), dtype=gl.float32, layout=mma_layout2)
    j = 0  # this warpgroup's tiles so far
    q = 0  # WG_STORE: this warpgroup's chunks stored so far
    for i in range(WHICH, num_tiles, 2):
        # The other warpgroup's mainloop of tile i - 1: its arrival j - 1 (warpgroup 0; a fresh
        # barrier passes parity 1 at once, so tile 0 does not wait) or j (warpgroup 1).
        mbarrier.wait(order.index(1 - WHICH), (j - 1 + WHICH) & 1)
        base = i * k_tiles
        for kk in range(k_tiles):
            g = base + kk
            s = g % STAGES
            mbarrier.wait(ready.index(s), (g // STAGES) & 1)
            a_s = a_bufs.index(s).permute((1, 0))
            acc = warpgroup_mma(a_s, b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
            if BN2 > 0:
                acc2 = warpgroup_mma(a_s, b2_bufs.index(s), acc2, use_acc=kk > 0, is_async=True)
                # The two wgmma groups of step g may run on; step g - 1's are done.
                acc, acc2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc2))
            else:
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            _cta_barrier()
            mbarrier.arrive(empty.index((g + STAGES - 1) % STAGES), pred=kk > 0)
        mbarrier.arrive(order.index(WHICH))  # every thread of this warpgroup passed its last ready wait
        if BN2 > 0:
            acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _cta_barrier()
        mbarrier.arrive(empty.index((base + k_tiles - 1) % STAGES))
        if WG_STORE:
            q = _epilogue_wg_store(acc, acc2, q, i, WHICH, c2_desc, c_bufs, GROUP_M)
        else:
            if NC == 1:
                # One output buffer: the epilogues take turns (tile i - 1's handed to the storer
                # first). Without it this warpgroup, its own tile i - 2 stored, could wait on c_empty
                # for tile i while tile i - 1's phase is still open, pass two phases early and write
                # the buffer under a TMA store still reading it (seen on the H200 at T = 200).
                mbarrier.wait(c_ready.index(0), (i - 1) & 1, pred=i > 0)
            if BN2 > 0:
                _epilogue_store(acc, i, c_desc, c_bufs, c_ready, c_empty, acc2, c2_bufs)
            else:
                _epilogue_store(acc.to(dtype), i, c_desc, c_bufs, c_ready, c_empty)
        j += 1
    if WG_STORE:
        tma.store_wait(pendings=0)


@gluon.jit
def _mma_pingpong_second_wg_store(pp_args, c2_desc):
    # A worker partition's arguments arrive as values, so its constexprs are set here.
    _mma_pingpong_partition(*pp_args, c2_desc, True, 1)


@gluon.jit
def _mma_pingpong_second(pp_args, c2_desc):
    # The second MMA warpgroup with the storer warp (no WG_STORE).
    _mma_pingpong_partition(*pp_args, c2_desc, False, 1)


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
    PINGPONG: gl.constexpr = False,
    MMA_REGS: gl.constexpr = 0,
    b2_desc=None,
    c2_desc=None,
    BN2: gl.constexpr = 0,
    PDL: gl.constexpr = False,
    WG_STORE: gl.constexpr = 0,
):
    """``out = A^T @ B``. The default partition is the MMA warps: two warpgroups on one tile
    (num_warps=8), or with PINGPONG the first of two 4-warp MMA warpgroups on alternate tiles
    (launch with num_warps=4; the second gets MMA_REGS registers). PINGPONG takes BN2 > 0: tiles
    BM x (BN + BN2), the second chunk through ``b2_desc`` / ``c2_desc`` (blocks [BK, BN2] /
    [BM, BN2] on the same B and out), handed to the storer in NC tile buffers; WG_STORE > 0 (BN =
    2 * BN2): each MMA warpgroup stores its own tiles by TMA in three BN2-wide chunks through
    WG_STORE chunk buffers of its own (c2_desc's blocks), the storer idle and NC unused; the same
    values."""
    BK: gl.constexpr = a_desc.block_type.shape[0]
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    dtype: gl.constexpr = c_desc.dtype
    gl.static_assert(
        not WG_STORE or (PINGPONG and BN2 > 0 and BN == 2 * BN2), "WG_STORE is the ping-pong kernel's with BN = 2 * BN2"
    )
    gl.static_assert(BN2 == 0 or PINGPONG, "the wide cooperative tile (BN2 without PINGPONG) is the lab's (gluon_wgrad_probe)")
    gl.static_assert(not PINGPONG or BN2 > 0, "the ping-pong tile has a second column chunk (BN2 > 0)")

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BK, BM], a_desc.layout)
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
        b2_bufs = gl.allocate_shared_memory(b2_desc.dtype, [STAGES, BK, BN2], b2_desc.layout)
        c2_bufs = gl.allocate_shared_memory(dtype, [NC, BM, BN2], c2_desc.layout)
        pp_args = args[:-1] + (order, GROUP_M, b2_bufs, c2_bufs)
        if WG_STORE:
            gl.warp_specialize(
                [
                    (_mma_pingpong_partition, pp_args + (c2_desc, True, 0)),
                    (_mma_pingpong_second_wg_store, (pp_args, c2_desc)),
                    (_load_partition, args + (b2_desc, b2_bufs)),
                    (_store_partition_idle, args + (c2_desc, c2_bufs)),
                ],
                [4, 1, 1],
                [MMA_REGS, LOAD_REGS, STORE_REGS],
            )
        else:
            gl.warp_specialize(
                [
                    (_mma_pingpong_partition, pp_args + (c2_desc, False, 0)),
                    (_mma_pingpong_second, (pp_args, c2_desc)),
                    (_load_partition, args + (b2_desc, b2_bufs)),
                    (_store_partition, args + (c2_desc, c2_bufs)),
                ],
                [4, 1, 1],
                [MMA_REGS, LOAD_REGS, STORE_REGS],
            )
    else:
        gl.warp_specialize(
            [
                (_mma_partition, args),
                (_load_partition, args + (b_desc, b_bufs)),
                (_store_partition, args + (c_desc, c_bufs)),
            ],
            [1, 1],
            [LOAD_REGS, STORE_REGS],
        )
    _pdl_end(PDL)


# ----------------------------------------------------------------------------- launcher


@lru_cache(maxsize=None)
def _layout(block: tuple[int, int]):
    # Built once per block shape: get_default_for costs host time on every launch otherwise.
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.bfloat16)


def launch_grad_weight_gluon(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: GluonConfig, num_programs: int) -> None:
    """out = a.T @ b: a [K, M], b [K, N], out [M, N]; bf16 CUDA sm_90 tensors usable by TMA
    (``tma.tma_ready``), K >= 1; ``num_programs`` persistent programs (one per SM). The same
    contract as ``backward.launch_grad_weight``; the caller checks device, sizes and shared memory.
    A config with ``resident_k`` is ``swiglu_lab.experiments.gluon_wgrad_resident``'s, one with
    ``plain_store`` (or any ``GluonConfig.lab_only`` one: a ping-pong config without ``BN2``
    among them) ``swiglu_lab.experiments.gluon_wgrad_probe``'s (ValueError here). A ping-pong
    config's ``wg_store`` (BN = 2 * BN2) is ``wgrad_kernel``'s WG_STORE."""
    M, N = out.shape
    K = a.shape[0]
    (a_block, a_layout), (b_block, b_layout), (c_block, c_layout), wide, consts, kw, token = _launch_constants(cfg)
    descs = (
        tuple_new(Tma, (a, a_block, a_layout)),
        tuple_new(Tma, (b, b_block, b_layout)),
        tuple_new(Tma, (out, c_block, c_layout)),
        *consts,
    )
    if wide:  # the second chunk's blocks on the same b and out
        (b2_block, b2_layout), (c2_block, c2_layout) = wide
        descs += (tuple_new(Tma, (b, b2_block, b2_layout)), tuple_new(Tma, (out, c2_block, c2_layout)), cfg.BN2)
    launch(wgrad_kernel, (num_programs,), ("gluon_wgrad", a.device, M, N, K, num_programs, token), *descs, **kw)


@lru_cache(maxsize=None)
def _launch_constants(cfg: GluonConfig):
    # What a launch takes from its config alone, built once per config (host time per launch).
    if cfg.resident_k:
        raise ValueError(
            f"a config with resident_k runs swiglu_lab.experiments.gluon_wgrad_resident.launch_grad_weight_resident, got {cfg}"
        )
    if cfg.lab_only:
        raise ValueError(
            "a config with plain_store, a deferred cooperative epilogue, the wide cooperative tile or a ping-pong "
            "tile without BN2 runs "
            f"swiglu_lab.experiments.gluon_wgrad_probe.launch_grad_weight_gluon, got {cfg}"
        )
    blocks = ([cfg.BK, cfg.BM], [cfg.BK, cfg.BN], [cfg.BM, cfg.BN]) + (([cfg.BK, cfg.BN2], [cfg.BM, cfg.BN2]) if cfg.BN2 else ())
    consts = (
        cfg.GROUP_M,
        cfg.STAGES,
        cfg.NC,
        cfg.load_regs,
        cfg.store_regs,
        cfg.pingpong,
        (cfg.mma_regs or cfg.maxnreg) if cfg.pingpong else 0,
    )
    kw = dict(num_warps=4 if cfg.pingpong else cfg.num_warps, maxnreg=cfg.maxnreg)
    if not cfg.BN2:  # the wide kernel's arguments, absent (positional after the constants where present)
        kw.update(b2_desc=None, c2_desc=None, BN2=0)
    kw.update(WG_STORE=cfg.wg_store)
    specs = tuple((b, _layout(tuple(b))) for b in blocks)
    # a, b, out, the wide kernel's second (b, out) or (), ..., the config's token in launch keys
    return (*specs[:3], specs[3:], consts, kw, next(CONFIG_TOKENS))
