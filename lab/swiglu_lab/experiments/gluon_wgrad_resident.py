"""Gluon weight-gradient GEMM with A resident in shared memory, for short K (Hopper, sm_90).

    out[M, N] = A^T @ B,  A [K, M], B [K, N] row-major bf16, out bf16 [M, N], fp32 accumulation,
    K = tokens <= ``GluonConfig.resident_k`` (TMA zero-fills past K).

Each persistent program takes a contiguous run of row-major tiles, so its tiles share A's
[K, BM] column block for up to N / BN tiles in a row: the block is loaded once per run and only
B is streamed. L2-to-SM reads per output element drop from K (BM + BN) / (BM BN) to about K / BM
(half the ring kernel's at BM = BN); where the weight gradient runs at the 700 W cap, the bytes not
moved are power the SM clock gets back. The cost: the first tile of each run waits for A's block.
The partitions (TMA loader, two MMA warpgroups on one tile, TMA storer with NC stores in flight)
are ``gluon_wgrad``'s cooperative ones otherwise. Design and measurements: docs/kernels.md.

Measured, not dispatched: importing this module sets ``backward.RESIDENT_LAUNCHER``, so a table
entry with ``resident_k`` (``scripts/table_variant.py --gluon-resident``) runs this kernel in the
library's backward (lab/probes/probe_wgrad_table_ab.py imports it for such a table).
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
from swiglu.kernels.gluon_wgrad import _cta_barrier, _epilogue_store, _layout, _mma_layout, _pdl_end, _pdl_start


@gluon.jit
def _run(c_desc, BM: gl.constexpr, BN: gl.constexpr, GROUP: gl.constexpr):
    """(first, step, count, num_n): this program's tiles first + i * step, i < count, of the
    row-major tiles (tile t is rows (t // num_n) * BM, columns (t % num_n) * BN), as every
    partition counts. GROUP programs share a contiguous run of tiles in turn (program j of the
    group takes the run's tiles j, j + GROUP, ...), so at any time they write GROUP neighbouring
    tiles of one row block, each holding that row block's A."""
    num_n = gl.cdiv(c_desc.shape[1], BN)
    total = gl.cdiv(c_desc.shape[0], BM) * num_n
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    groups = gl.cdiv(nprog, GROUP)
    g = pid // GROUP
    step = min(GROUP, nprog - g * GROUP)
    first = g * total // groups + pid % GROUP
    end = (g + 1) * total // groups
    return first, step, gl.cdiv(gl.maximum(end - first, 0), step), num_n


@gluon.jit
def _load_partition(a_desc, b_desc, c_desc, a_res, b_bufs, c_bufs, a_ready, a_empty, ready, empty, c_ready, c_empty):
    BK: gl.constexpr = a_desc.block_type.shape[0]
    BM: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    KT: gl.constexpr = a_res.type.shape[0]
    first, step, count, num_n = _run(c_desc, BM, BN, a_empty.type.shape[0])
    k_tiles = gl.cdiv(a_desc.shape[0], BK)
    p = 0  # B stages filled
    r = 0  # A blocks loaded
    cur_m = -1
    for i in range(count):
        t = first + i * step
        pid_m = t // num_n
        pid_n = t % num_n
        # B's first stage ahead of A's block: at a new row block it goes out while the MMA warps
        # finish the previous block's last tile, whose epilogue then covers the wait for A (not
        # with DEFER: that epilogue runs after the new block's first wgmma). Only
        # the first: a later stage's slot may need this tile's own first stage consumed, which
        # waits for A (a deadlock where STAGES < the k-steps).
        p = _load_b(b_desc, b_bufs, ready, empty, p, 0, pid_n)
        if pid_m != cur_m:
            # A's block is rewritten only once the MMA warps are done with the previous one (a fresh
            # barrier passes parity 1 at once: the first load does not wait). All KT blocks, whatever
            # K: a box wholly past K is zero-filled (no memory read) and its bytes counted, so the
            # expected byte count is a constant (expect takes no runtime value).
            mbarrier.wait(a_empty.index(0), (r & 1) ^ 1)
            mbarrier.expect(a_ready.index(0), KT * a_desc.block_type.nbytes)
            for ka in gl.static_range(KT):
                tma.async_copy_global_to_shared(a_desc, [ka * BK, pid_m * BM], a_ready.index(0), a_res.index(ka))
            r += 1
            cur_m = pid_m
        for kk in range(1, k_tiles):
            p = _load_b(b_desc, b_bufs, ready, empty, p, kk, pid_n)


@gluon.jit
def _load_b(b_desc, b_bufs, ready, empty, p, kk, pid_n):
    # B's block (k-step kk, column tile pid_n) into ring slot p % STAGES; returns p + 1.
    BK: gl.constexpr = b_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    STAGES: gl.constexpr = b_bufs.type.shape[0]
    s = p % STAGES
    mbarrier.wait(empty.index(s), ((p // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(b_desc, [kk * BK, pid_n * BN], ready.index(s), b_bufs.index(s))
    return p + 1


@gluon.jit
def _store_partition(a_desc, b_desc, c_desc, a_res, b_bufs, c_bufs, a_ready, a_empty, ready, empty, c_ready, c_empty):
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    NC: gl.constexpr = c_bufs.type.shape[0]
    first, step, count, num_n = _run(c_desc, BM, BN, a_empty.type.shape[0])
    for j in range(count):
        t = first + j * step
        buf = j % NC
        mbarrier.wait(c_ready.index(buf), (j // NC) & 1)
        tma.async_copy_shared_to_global(c_desc, [(t // num_n) * BM, (t % num_n) * BN], c_bufs.index(buf))
        # At most NC-1 stores pending: tile j-(NC-1)'s buffer, index (j+1) % NC, is free
        # (gluon_wgrad._store_partition).
        tma.store_wait(pendings=NC - 1)
        mbarrier.arrive(c_empty.index((j + 1) % NC), pred=j >= NC - 1)
    tma.store_wait(pendings=0)


@gluon.jit
def _mma_partition(
    a_desc, b_desc, c_desc, a_res, b_bufs, c_bufs, a_ready, a_empty, ready, empty, c_ready, c_empty, DEFER: gl.constexpr
):
    BK: gl.constexpr = a_desc.block_type.shape[0]
    BM: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    STAGES: gl.constexpr = b_bufs.type.shape[0]
    dtype: gl.constexpr = c_desc.dtype
    first, step, count, num_n = _run(c_desc, BM, BN, a_empty.type.shape[0])
    k_tiles = gl.cdiv(a_desc.shape[0], BK)
    mma_layout: gl.constexpr = _mma_layout(BM, BN, gl.num_warps())
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=mma_layout)
    prev = gl.zeros((BM, BN), dtype=dtype, layout=mma_layout)  # DEFER: the last tile's output, not stored yet
    c = 0  # B stages consumed
    r = 0  # A blocks waited for
    cur_m = -1
    for i in range(count):
        t = first + i * step
        pid_m = t // num_n
        if pid_m != cur_m:
            mbarrier.wait(a_ready.index(0), r & 1)
            r += 1
            cur_m = pid_m
        for kk in range(k_tiles):
            s = c % STAGES
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            acc = warpgroup_mma(a_res.index(kk).permute((1, 0)), b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
            if DEFER:
                if kk == 0 and i > 0:  # the previous tile's epilogue while this tile's first wgmma runs
                    _epilogue_store(prev, i - 1, c_desc, c_bufs, c_ready, c_empty)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            # Step c-1's wgmma is done in both warpgroups before its stage goes back to the loader.
            _cta_barrier()
            mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), pred=kk > 0)
            c += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _cta_barrier()
        mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES))
        # The run's last tile on these rows: A's block is free for the next rows.
        mbarrier.arrive(a_empty.index(0), pred=((i + 1) == count) | (((t + step) // num_n) != pid_m))
        if DEFER:
            prev = acc.to(dtype)
        else:
            _epilogue_store(acc.to(dtype), i, c_desc, c_bufs, c_ready, c_empty)
    if DEFER:
        if count > 0:
            _epilogue_store(prev, count - 1, c_desc, c_bufs, c_ready, c_empty)


@gluon.jit
def wgrad_resident_kernel(
    a_desc,
    b_desc,
    c_desc,
    KT: gl.constexpr,
    STAGES: gl.constexpr,
    NC: gl.constexpr,
    LOAD_REGS: gl.constexpr,
    STORE_REGS: gl.constexpr,
    GROUP: gl.constexpr = 1,
    DEFER: gl.constexpr = False,
    PDL: gl.constexpr = False,
):
    """``out = A^T @ B`` with A's [K, BM] block resident: KT = resident_k / BK blocks of
    [BK, BM] (K <= KT * BK, the launcher checks), STAGES B stages [BK, BN], NC output buffers,
    GROUP programs taking each run of tiles in turn (``GluonConfig.GROUP_M``; ``_run``); DEFER: each
    tile's epilogue after the next tile's first wgmma is issued (``GluonConfig.defer``).
    Launch with num_warps = 8 (the MMA partition: two warpgroups on one tile)."""
    BK: gl.constexpr = a_desc.block_type.shape[0]
    BM: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    a_res = gl.allocate_shared_memory(a_desc.dtype, [KT, BK, BM], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BK, BN], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [NC, BM, BN], c_desc.layout)
    a_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    # GROUP barriers, only the first used: a worker's arguments are IR values, so GROUP travels
    # to the partitions in this array's shape (``_run``'s GROUP).
    a_empty = gl.allocate_shared_memory(gl.int64, [GROUP, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    c_ready = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    c_empty = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    mbarrier.init(a_ready.index(0), count=1)
    mbarrier.init(a_empty.index(0), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(NC):
        mbarrier.init(c_ready.index(i), count=1)
        mbarrier.init(c_empty.index(i), count=1)
    _pdl_start(PDL)
    args = (a_desc, b_desc, c_desc, a_res, b_bufs, c_bufs, a_ready, a_empty, ready, empty, c_ready, c_empty)
    gl.warp_specialize(
        [
            (_mma_partition, args + (DEFER,)),
            (_load_partition, args),
            (_store_partition, args),
        ],
        [1, 1],
        [LOAD_REGS, STORE_REGS],
    )
    _pdl_end(PDL)


def launch_grad_weight_resident(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: GluonConfig, num_programs: int) -> None:
    """out = a.T @ b: a [K, M], b [K, N], out [M, N]; bf16 CUDA sm_90 tensors usable by TMA
    (``tma.tma_ready``), 1 <= K <= ``cfg.resident_k`` (ValueError otherwise); ``num_programs``
    persistent programs (one per SM). The contract of ``gluon_wgrad.launch_grad_weight_gluon``;
    ``backward.launch_grad_weight_gluon_or_tl`` calls this for a config with ``resident_k`` once this module
    is imported (``backward.RESIDENT_LAUNCHER``)."""
    K = a.shape[0]
    if not 1 <= K <= cfg.resident_k:
        raise ValueError(f"the resident weight gradient takes 1 <= tokens <= resident_k={cfg.resident_k}, got {K}")
    (a_block, a_layout), (b_block, b_layout), (c_block, c_layout), consts, kw = _launch_constants(cfg)
    M, N = out.shape
    launch(
        wgrad_resident_kernel,
        (num_programs,),
        ("gluon_wgrad_resident", a.device, M, N, K, num_programs, cfg),
        Tma(a, a_block, a_layout),
        Tma(b, b_block, b_layout),
        Tma(out, c_block, c_layout),
        *consts,
        **kw,
    )


@lru_cache(maxsize=None)
def _launch_constants(cfg: GluonConfig):
    # What a launch takes from its config alone, built once per config (host time per launch).
    blocks = ([cfg.BK, cfg.BM], [cfg.BK, cfg.BN], [cfg.BM, cfg.BN])
    consts = (cfg.resident_k // cfg.BK, cfg.STAGES, cfg.NC, cfg.load_regs, cfg.store_regs, cfg.GROUP_M, cfg.defer)
    return tuple((b, _layout(tuple(b))) for b in blocks) + (consts, dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg))


#: Candidates, compiled for sm_90 by the CPU tests: A's block [resident_k, BM] beside the B ring and
#: the output buffers (each within the H200's 227 KB of shared memory). Measured and dropped (the
#: configs are named in data/tuning's files): 256 x 128 for T <= 256, and at T <= 128 4-5 stores in
#: flight with 2-3 B stages, or 6-8 B stages with 2-3 stores.
RESIDENT_CANDIDATES = (
    GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=3, GROUP_M=2, resident_k=128),
    GluonConfig(BM=256, BN=128, BK=64, STAGES=4, NC=1, GROUP_M=2, resident_k=128),
    GluonConfig(BM=128, BN=256, BK=64, STAGES=3, NC=1, GROUP_M=2, resident_k=128),
    GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=2, GROUP_M=2, resident_k=256),
    GluonConfig(BM=128, BN=128, BK=64, STAGES=3, NC=1, GROUP_M=2, resident_k=512),
)

# The library's backward runs a table entry with resident_k through this launcher.
backward.RESIDENT_LAUNCHER = launch_grad_weight_resident
