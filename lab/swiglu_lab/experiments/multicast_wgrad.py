"""Pipelined 2-CTA cluster weight gradients with the shared operand TMA-multicast (Gluon, triton
>= 3.7): out[M, N] = A^T @ B, A [K, M], B [K, N].

Each program is a cluster of two CTAs on a [2*BM, BN] tile: A split along M, B held by both and
loaded once per cluster (``multicast=True``). A stage may be refilled only when both CTAs' wgmmas
have read it, so its free barrier counts two arrivals: this CTA's, and the peer's through inline
PTX (``mapa`` + ``mbarrier.arrive.shared::cluster``, as CUTLASS's ``ClusterBarrier::arrive``), at
the barrier's offset in shared memory, read from a first compile's PTX (``planned``; Gluon 3.7 has
no API for either). Two kernels: ``multicast_wgrad_kernel``, one partition of two warpgroups per
CTA, and ``multicast_wgrad_ws_kernel``, the library's warp-specialized 1-CTA kernel (TMA loader,
two MMA warpgroups, TMA storer) on the cluster tile. ``compile_check`` compiles either for sm_90
on any machine. The probe that runs and times them: lab/probes/probe_multicast_wgrad.py.
"""

from __future__ import annotations

import re

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from swiglu.kernels.gluon_wgrad import _epilogue_store, _program_tiles, _store_partition, _tile_mn
from swiglu_lab.experiments.multicast_tile import cluster, compile_sm90

BM, BN, BK, STAGES, NUM_WARPS, GROUP_M = 128, 128, 64, 4, 8, 16  # per CTA: two warpgroups on 128 x 128
NC = 2  # the warp-specialized kernel's output buffers (the 1-CTA table's at T = 256-512; --nc)
TAG = 3  # the free barriers' count in the first pass, which finds them in the PTX


@gluon.jit
def _peer_arrive(offset):
    # Arrive on the mbarrier at byte `offset` of shared memory in the other CTA of the cluster,
    # from thread 0 of this CTA.
    gl.inline_asm_elementwise(
        """{
        .reg .b32 %pa_t, %pa_a, %pa_r, %pa_k;
        .reg .pred %pa_p;
        mov.u32 %pa_t, %tid.x;
        setp.eq.u32 %pa_p, %pa_t, 0;
        mov.u32 %pa_a, global_smem;
        add.u32 %pa_a, %pa_a, $1;
        mov.u32 %pa_k, %cluster_ctarank;
        xor.b32 %pa_k, %pa_k, 1;
        mapa.shared::cluster.u32 %pa_r, %pa_a, %pa_k;
        @%pa_p mbarrier.arrive.shared::cluster.b64 _, [%pa_r];
        mov.u32 $0, 0;
        }""",
        "=r,r",
        [offset],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _load_step(a_desc, b_desc, a_bufs, b_bufs, ready, free, j, kk, pid_m, pid_n, MULTICAST: gl.constexpr):
    # Step j of this program (k-step kk of tile (pid_m, pid_n)) into stage j % STAGES, once both
    # CTAs have freed it (a fresh barrier passes parity 1 at once).
    BK_: gl.constexpr = a_desc.block_type.shape[0]
    BM2: gl.constexpr = a_desc.block_type.shape[1]
    BN_: gl.constexpr = b_desc.block_type.shape[1]
    STAGES_: gl.constexpr = a_bufs.type.shape[0]
    s = j % STAGES_
    mbarrier.wait(free.index(s), ((j // STAGES_) & 1) ^ 1)
    mbarrier.expect(ready.index(s), a_desc.nbytes_per_cta + b_desc.nbytes_per_cta)
    tma.async_copy_global_to_shared(a_desc, [kk * BK_, pid_m * BM2], ready.index(s), a_bufs.index(s))
    tma.async_copy_global_to_shared(b_desc, [kk * BK_, pid_n * BN_], ready.index(s), b_bufs.index(s), multicast=MULTICAST)


@gluon.jit
def _load(
    a_desc,
    b_desc,
    a_bufs,
    b_bufs,
    ready,
    free,
    j,
    pid,
    nprog,
    num_m,
    num_n,
    k_tiles,
    MULTICAST: gl.constexpr,
    GROUP_M: gl.constexpr,
):
    # Step j of this program: its tile j // k_tiles, k-step j % k_tiles.
    pid_m, pid_n = _tile_mn(pid + (j // k_tiles) * nprog, num_m, num_n, GROUP_M)
    _load_step(a_desc, b_desc, a_bufs, b_bufs, ready, free, j, j % k_tiles, pid_m, pid_n, MULTICAST)


@gluon.jit
def _release(free, s, FREE_OFF: gl.constexpr, PEER: gl.constexpr):
    gl.barrier()  # every warp's wgmma on stage s is done before thread 0 frees it
    mbarrier.arrive(free.index(s))
    if PEER:
        _peer_arrive(FREE_OFF + s * 8)


@gluon.jit
def multicast_wgrad_kernel(
    a_desc,
    b_desc,
    c_desc,
    FREE_OFF: gl.constexpr,
    PEER: gl.constexpr,
    FREE_COUNT: gl.constexpr,
    MULTICAST: gl.constexpr,
    STAGES: gl.constexpr,
    GROUP_M: gl.constexpr,
):
    BK_: gl.constexpr = a_desc.block_type.shape[0]
    BM2: gl.constexpr = a_desc.block_type.shape[1]
    BN_: gl.constexpr = b_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BK_, BM2], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BK_, BN_], b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BM2, BN_], c_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)  # per CTA
    free = mbarrier.allocate_mbarrier(batch=STAGES)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=FREE_COUNT)
    mbarrier.sync_cluster_init()

    num_m, num_n, pid, nprog, num_tiles = _program_tiles(c_desc, BM2, BN_)  # a program is a cluster
    k_tiles = gl.cdiv(a_desc.shape[0], BK_)
    total = num_tiles * k_tiles  # this program's k-steps over all its tiles
    for j in range(0, min(STAGES - 1, total)):
        _load(a_desc, b_desc, a_bufs, b_bufs, ready, free, j, pid, nprog, num_m, num_n, k_tiles, MULTICAST, GROUP_M)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BN_, 16], cga_layout=[[1, 0]]
    )
    acc = gl.zeros([BM2, BN_], gl.float32, acc_layout)
    for g in range(total):
        s = g % STAGES
        kk = g % k_tiles
        mbarrier.wait(ready.index(s), (g // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s).permute((1, 0)), b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        if kk > 0:  # step g - 1's wgmma is done: free its stage
            _release(free, (g + STAGES - 1) % STAGES, FREE_OFF, PEER)
        if g + STAGES - 1 < total:
            _load(
                a_desc, b_desc, a_bufs, b_bufs, ready, free, g + STAGES - 1, pid, nprog, num_m, num_n, k_tiles, MULTICAST, GROUP_M
            )
        if kk == k_tiles - 1:  # the tile's last step: epilogue
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _release(free, s, FREE_OFF, PEER)
            pid_m, pid_n = _tile_mn(pid + (g // k_tiles) * nprog, num_m, num_n, GROUP_M)
            tma.store_wait(0)
            gl.barrier()
            c_smem.store(acc.to(c_desc.dtype))
            fence_async_shared()
            gl.barrier()
            tma.async_copy_shared_to_global(c_desc, [pid_m * BM2, pid_n * BN_], c_smem)
    tma.store_wait(0)
    cluster.arrive()  # no CTA exits while its peer may still multicast into it or arrive on it
    cluster.wait()


# ----------------------------------------------------------------------------- warp-specialized form
# The library's 1-CTA weight gradient (gluon_wgrad.wgrad_kernel: a TMA loader warp, two MMA
# warpgroups, a TMA storer warp with NC stores in flight) on a 2-CTA cluster tile: its storer and
# epilogue hand-off as they are; the loader expects each CTA's bytes and multicasts B; the MMA
# warps free a stage in both CTAs. No closing cluster barrier (the suspect of the first attempt's
# hang, docs/kernels.md): the MMA warps of each CTA arrive on the peer's done barrier (the free
# barriers' last entry) after their last peer arrive and wait for the peer's, so no CTA exits while
# its peer may still arrive on it; every multicast into a CTA is a step that CTA waited for.
# The barriers' init is made visible to the peer inside the partitions: warp_specialize sends the
# worker warps to their dispatch loop at the kernel's entry, so a cluster barrier before it
# (sync_cluster_init) waits for threads that never reach it (the hang at first launch, seen in the
# PTX). Every partition arrives on the cluster barrier first instead, and the workers take 2 warps
# each (8 + 2 + 2 = 12 warps: no idle padding warp that would never arrive).


@gluon.jit
def _cluster_sync():
    cluster.arrive(relaxed=True)  # after the init fence: sync_cluster_init's pattern
    cluster.wait()


@gluon.jit
def _ws_load(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, free, c_ready, c_empty, GROUP_M: gl.constexpr, MULTICAST: gl.constexpr
):
    BK_: gl.constexpr = a_desc.block_type.shape[0]
    BM2: gl.constexpr = a_desc.block_type.shape[1]
    BN_: gl.constexpr = b_desc.block_type.shape[1]
    _cluster_sync()
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(c_desc, BM2, BN_)
    k_tiles = gl.cdiv(a_desc.shape[0], BK_)
    p = 0
    for t in range(num_tiles):
        pid_m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, GROUP_M)
        for kk in range(k_tiles):
            _load_step(a_desc, b_desc, a_bufs, b_bufs, ready, free, p, kk, pid_m, pid_n, MULTICAST)
            p += 1


@gluon.jit
def _ws_mma(
    a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, free, c_ready, c_empty, FREE_OFF: gl.constexpr, PEER: gl.constexpr
):
    BK_: gl.constexpr = a_desc.block_type.shape[0]
    BM2: gl.constexpr = a_desc.block_type.shape[1]
    BN_: gl.constexpr = b_desc.block_type.shape[1]
    STAGES_: gl.constexpr = a_bufs.type.shape[0]
    _cluster_sync()
    num_tiles = _program_tiles(c_desc, BM2, BN_)[4]
    k_tiles = gl.cdiv(a_desc.shape[0], BK_)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BN_, 16], cga_layout=[[1, 0]]
    )
    acc = gl.zeros([BM2, BN_], gl.float32, acc_layout)
    c = 0
    for t in range(num_tiles):
        for kk in range(k_tiles):
            s = c % STAGES_
            mbarrier.wait(ready.index(s), (c // STAGES_) & 1)
            acc = warpgroup_mma(a_bufs.index(s).permute((1, 0)), b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            if kk > 0:
                _release(free, (c + STAGES_ - 1) % STAGES_, FREE_OFF, PEER)
            c += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _release(free, (c + STAGES_ - 1) % STAGES_, FREE_OFF, PEER)
        _epilogue_store(acc.to(c_desc.dtype), t, c_desc, c_bufs, c_ready, c_empty)
    # done: this CTA's arrive and the peer's on the last entry; past it neither CTA touches the other
    _release(free, STAGES_, FREE_OFF, PEER)
    mbarrier.wait(free.index(STAGES_), 0)


@gluon.jit
def _ws_store(a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, free, c_ready, c_empty, GROUP_M: gl.constexpr):
    _cluster_sync()
    _store_partition(
        a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, free, c_ready, c_empty, GROUP_M, c_desc, c_bufs
    )  # no second output chunk


@gluon.jit
def multicast_wgrad_ws_kernel(
    a_desc,
    b_desc,
    c_desc,
    FREE_OFF: gl.constexpr,
    PEER: gl.constexpr,
    FREE_COUNT: gl.constexpr,
    MULTICAST: gl.constexpr,
    STAGES: gl.constexpr,
    GROUP_M: gl.constexpr,
    NC: gl.constexpr,
):
    BK_: gl.constexpr = a_desc.block_type.shape[0]
    BM2: gl.constexpr = a_desc.block_type.shape[1]
    BN_: gl.constexpr = b_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BK_, BM2], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BK_, BN_], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [NC, BM2, BN_], c_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    free = mbarrier.allocate_mbarrier(batch=STAGES + 1)  # the last: done
    c_ready = mbarrier.allocate_mbarrier(batch=NC)
    c_empty = mbarrier.allocate_mbarrier(batch=NC)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(STAGES + 1):
        mbarrier.init(free.index(i), count=FREE_COUNT)
    for i in gl.static_range(NC):
        mbarrier.init(c_ready.index(i), count=1)
        mbarrier.init(c_empty.index(i), count=1)
    mbarrier.fence_init_release_cluster()  # the cluster barrier: at each partition's start
    # The worker partitions' argument tuples written out: a constexpr appended with + reaches them
    # as a plain int (triton 3.7.1).
    gl.warp_specialize(
        [
            (_ws_mma, (a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, free, c_ready, c_empty, FREE_OFF, PEER)),
            (_ws_load, (a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, free, c_ready, c_empty, GROUP_M, MULTICAST)),
            (_ws_store, (a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, free, c_ready, c_empty, GROUP_M)),
        ],
        [2, 2],
        [40, 40],
    )


def free_offsets(ptx: str, count: int) -> list[int]:
    """Byte offsets into ``global_smem`` of the barriers the PTX initializes with ``count``."""
    bases = set(re.findall(r"mov\.(?:b|u)32\s+(%r\d+),\s*global_smem;", ptx))
    adds = {m[0]: (m[1], int(m[2])) for m in re.findall(r"add\.(?:s|u)32\s+(%r\d+),\s*(%r\d+),\s*(-?\d+);", ptx)}
    offsets = []
    for reg in re.findall(rf"mbarrier\.init\.shared::cta\.b64\s+\[(%r\d+)\],\s*{count};", ptx):
        if reg in bases:
            offsets.append(0)
        elif reg in adds and adds[reg][0] in bases:
            offsets.append(adds[reg][1])
    return sorted(offsets)


def constexprs(multicast: bool, free_off: int = 0, peer: bool = False, ws: bool = False) -> dict:
    """The kernel's constexprs (``ws``: ``multicast_wgrad_ws_kernel``'s)."""
    return dict(
        FREE_OFF=free_off,
        PEER=peer,
        FREE_COUNT=2 if peer else TAG,
        MULTICAST=multicast,
        STAGES=STAGES,
        GROUP_M=GROUP_M,
        **(dict(NC=NC) if ws else {}),
    )


def planned(compile_fn, multicast: bool, ws: bool = False) -> dict:
    """The second pass's constexprs: the free barriers found in the first pass's PTX, checked
    unmoved in the second's. ``compile_fn(constexprs) -> PTX``. The warp-specialized kernel has
    one more (done) after the stages'."""
    n = STAGES + (1 if ws else 0)
    offsets = free_offsets(compile_fn(constexprs(multicast, ws=ws)), TAG)
    if len(offsets) != n or offsets != [offsets[0] + 8 * i for i in range(n)]:
        raise RuntimeError(f"expected {n} consecutive free barriers in the PTX, found {offsets}")
    second = constexprs(multicast, offsets[0], True, ws)
    moved = free_offsets(compile_fn(second), 2)
    if moved != offsets:
        raise RuntimeError(f"the free barriers moved between passes: {offsets} -> {moved}")
    return second


MAXNREG = 168  # the warp-specialized kernel's, as the library's launch of its 1-CTA twin


def compile_check(ws: bool = False) -> str:
    """Both passes for sm_90 here, with multicast; the second pass's PTX (``ws``: the
    warp-specialized kernel's)."""
    out = {}

    def ptx_of(consts):
        kernel = multicast_wgrad_ws_kernel if ws else multicast_wgrad_kernel
        out["ptx"] = compile_sm90(kernel, BM, BN, BK, consts, NUM_WARPS, MAXNREG if ws else None).asm["ptx"]
        return out["ptx"]

    planned(ptx_of, True, ws)
    return out["ptx"]
