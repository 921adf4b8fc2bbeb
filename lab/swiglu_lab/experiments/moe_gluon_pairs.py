"""The MoE experts' down-projection-shaped GEMMs as one warp-specialized Gluon kernel (sm_90).

    y[order[row]] = a[row] @ w[e].T * top_k_weights   (the forward's down projection, B_TRANS)
    y[order[row]] = a[row] @ w[e]                      (grad_x's pieces from d_gate | d_up)

for every expert's sorted rows: the contract of the library's ``moe_down_kernel``
(``swiglu.kernels.moe.launch_pairs`` without ``a2``: y [S, N] in pair order, bf16), with the
epilogue (the routing weight, the scattered row stores) in its own warps while the MMA warps run the
next tile. K is short at the experts' sizes (I = 768 at Qwen3-30B-A3B: 12 steps of 64), so each
tile's epilogue is a large part of its time; these two GEMMs took 1.18 of the 4.49 ms kernel sum
at Qwen3-30B-A3B, 8192 tokens (docs/moe.md). Partitions: a TMA loader warp (A: the sorted rows of
``a``, h or d_gate | d_up, read as they are; B: ``w`` viewed as [E * N, K] with [BN, BK] boxes
(B_TRANS) or [E * K, N] with [BK, BN] boxes); two MMA warpgroups on one tile, the accumulator handed
over as bf16 (the tl kernel rounds it there first: y = bf16(bf16(acc) * w) or bf16(acc)); the
epilogue warps reading [EPI_M, 64] pieces of it (``moe_gluon_up``'s piece view), each row's pair
id and routing weight, and storing rows to y[pair] with masks (rows past the expert's end belong to
the next expert's tile). The tiles come from ``moe_gluon_up.tile_table``. Requires K % BK == 0
without B_TRANS (a B box stays in its expert's rows) and N % BN == 0: every model shape.
Compiled for sm_90 without a GPU (tests/kernels/test_moe_gluon.py); not yet run on one:
``lab/probes/moe_gluon_pairs.py`` checks it bitwise against the library's kernel and times both.
"""

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.language.core import _aggregate as aggregate  # as Triton's gluon tutorial 08 does

from swiglu.kernels.configs import MoEGluonConfig
from swiglu.kernels.devices import gluon_unavailable_reason
from swiglu.kernels.gluon_dswiglu import _epi_layout
from swiglu.kernels.gluon_wgrad import _cta_barrier, _fill_stage, _mma_layout, _ring_barriers

# The tile walk (p: any Args with I, MAX_M, table_ptr and GROUP_M; here I is the output's N), the
# handover buffers and the tile table are the up projection's.
from swiglu.kernels.moe_gluon_up import _handover, _layout, _program_tiles, _tile, tile_table


#: 128 x 128 tiles with 4 stages of 64-deep k-steps (128 KB) and one bf16 handover buffer (32 KB);
#: 8 MMA + 1 loader + 2 epilogue warps in 12 (maxnreg 168).
CONFIG = MoEGluonConfig(STAGES=4)


@aggregate
class Args:
    """What every partition reads (sizes as tensors: an argument of 1 that Triton specializes is
    made one first). ``I`` is the output's width N (the name the shared tile walk reads)."""

    a_desc: tma.tensor_descriptor
    w_desc: tma.tensor_descriptor
    table_ptr: gl.tensor
    order_ptr: gl.tensor
    rw_ptr: gl.tensor
    y_ptr: gl.tensor
    a_bufs: gl.shared_memory_descriptor
    b_bufs: gl.shared_memory_descriptor
    g_bufs: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    g_ready: gl.shared_memory_descriptor
    g_empty: gl.shared_memory_descriptor
    E: gl.tensor
    I: gl.tensor
    K: gl.tensor
    MAX_M: gl.tensor
    GROUP_M: gl.constexpr
    B_TRANS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, a_desc, w_desc, table_ptr, order_ptr, rw_ptr, y_ptr, a_bufs, b_bufs, g_bufs, ready, empty, g_ready,
                 g_empty, E, I, K, MAX_M, GROUP_M, B_TRANS):  # fmt: skip
        self.a_desc = a_desc
        self.w_desc = w_desc
        self.table_ptr = table_ptr
        self.order_ptr = order_ptr
        self.rw_ptr = rw_ptr
        self.y_ptr = y_ptr
        self.a_bufs = a_bufs
        self.b_bufs = b_bufs
        self.g_bufs = g_bufs
        self.ready = ready
        self.empty = empty
        self.g_ready = g_ready
        self.g_empty = g_empty
        self.E = E
        self.I = I
        self.K = K
        self.MAX_M = MAX_M
        self.GROUP_M = gl.constexpr(GROUP_M)
        self.B_TRANS = gl.constexpr(B_TRANS)


@gluon.jit
def _load_partition(p):
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.g_bufs.type.shape[2]
    STAGE_BYTES: gl.constexpr = 2 * BK * (BM + BN)
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    k_tiles = gl.cdiv(p.K, BK)
    q = 0  # ring step
    for t in range(num_tiles):
        m, pid_n, e = _tile(p, t, num_n, pid, nprog)
        if e < p.E:
            row0 = gl.load(p.table_ptr + p.MAX_M + m)
            for kk in range(k_tiles):
                s, bar = _fill_stage(q, p.ready, p.empty, STAGE_BYTES)
                tma.async_copy_global_to_shared(p.a_desc, [row0, kk * BK], bar, p.a_bufs.index(s))
                if p.B_TRANS:  # w[e] is [N, K]: rows e * N + the tile's columns
                    tma.async_copy_global_to_shared(p.w_desc, [e * p.I + pid_n * BN, kk * BK], bar, p.b_bufs.index(s))
                else:  # w[e] is [K, N]: rows e * K + the step's k
                    tma.async_copy_global_to_shared(p.w_desc, [e * p.K + kk * BK, pid_n * BN], bar, p.b_bufs.index(s))
                q += 1


@gluon.jit
def _mma_partition(p):
    # Both MMA warpgroups on one tile; the accumulator goes to the epilogue as bf16 (the tl
    # kernel's first rounding of it).
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.g_bufs.type.shape[2]
    STAGES: gl.constexpr = p.a_bufs.type.shape[0]
    NG: gl.constexpr = p.g_ready.type.shape[0]
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    k_tiles = gl.cdiv(p.K, BK)
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=_mma_layout(BM, BN, gl.num_warps()))
    c = 0  # ring step
    w = 0  # tiles worked (the handover's counter)
    for t in range(num_tiles):
        e = _tile(p, t, num_n, pid, nprog)[2]
        if e < p.E:
            for kk in range(k_tiles):
                s = c % STAGES
                mbarrier.wait(p.ready.index(s), (c // STAGES) & 1)
                b = p.b_bufs.index(s)
                if p.B_TRANS:
                    b = b.permute((1, 0))
                acc = warpgroup_mma(p.a_bufs.index(s), b, acc, use_acc=kk > 0, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                # The previous step's wgmma is done in this warpgroup; sync the partition before
                # thread 0 releases that stage to the loader.
                _cta_barrier()
                mbarrier.arrive(p.empty.index((c + STAGES - 1) % STAGES), pred=kk > 0)
                c += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _cta_barrier()
            mbarrier.arrive(p.empty.index((c + STAGES - 1) % STAGES))
            buf = w % NG
            mbarrier.wait(p.g_empty.index(buf), ((w // NG) & 1) ^ 1)
            p.g_bufs.index(buf).store(acc.to(gl.bfloat16))
            _cta_barrier()
            mbarrier.arrive(p.g_ready.index(buf))
            w += 1


@gluon.jit
def _epilogue_partition(p, g_pieces, EPI_M: gl.constexpr):
    # g_pieces: the handover ring as [NG * NP, EPI_M, 64] pieces (moe_gluon_up's view). The tl
    # kernel's epilogue: y = bf16(f32(bf16(acc)) * w) with B_TRANS (the forward), bf16(acc) else.
    BM: gl.constexpr = p.a_bufs.type.shape[1]
    BN: gl.constexpr = p.g_bufs.type.shape[2]
    NG: gl.constexpr = p.g_ready.type.shape[0]
    NPM: gl.constexpr = BM // EPI_M
    NP: gl.constexpr = NPM * (BN // 64)
    layout: gl.constexpr = _epi_layout(64, gl.num_warps())
    num_n, pid, nprog, num_tiles = _program_tiles(p, BN)
    r1 = gl.arange(0, EPI_M, layout=gl.SliceLayout(1, layout))
    cc = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, layout)), 0)
    w_t = 0
    for t in range(num_tiles):
        m, pid_n, e = _tile(p, t, num_n, pid, nprog)
        if e < p.E:
            row0 = gl.load(p.table_ptr + p.MAX_M + m)
            rows_left = gl.load(p.table_ptr + 2 * p.MAX_M + m) - row0
            buf = w_t % NG
            mbarrier.wait(p.g_ready.index(buf), (w_t // NG) & 1)
            for q in range(NP):
                y_bf = g_pieces.index(buf * NP + q).load(layout)
                # After the last piece is in registers, hand the buffer back to the MMA warps.
                _cta_barrier()
                mbarrier.arrive(p.g_empty.index(buf), pred=q == NP - 1)
                pm = q % NPM
                ok1 = r1 + pm * EPI_M < rows_left
                pair = gl.load(p.order_ptr + row0 + pm * EPI_M + r1, mask=ok1, other=0)
                if p.B_TRANS:
                    wt = gl.load(p.rw_ptr + pair, mask=ok1, other=0.0).to(gl.float32)
                    y_bf = (y_bf.to(gl.float32) * gl.expand_dims(wt, 1)).to(gl.bfloat16)
                dst = gl.expand_dims(pair.to(gl.int64) * p.I, 1) + pid_n * BN + (q // NPM) * 64 + cc
                gl.store(p.y_ptr + dst, y_bf, mask=gl.expand_dims(ok1, 1) & (cc < 64))
            w_t += 1


@gluon.constexpr_function
def _block_n(w_block, B_TRANS):
    # The output tile's width: w's box is [BN, BK] with B_TRANS, [BK, BN] without.
    return w_block[0] if B_TRANS else w_block[1]


@gluon.jit
def moe_pairs_gluon_kernel(
    a_desc, w_desc, table_ptr, order_ptr, rw_ptr, y_ptr, E, N, K, MAX_M,
    B_TRANS: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, EPI_M: gl.constexpr, EPI_WARPS: gl.constexpr,
    LOAD_REGS: gl.constexpr, EPI_REGS: gl.constexpr,
):  # fmt: skip
    """y[pair] of every expert's sorted rows (module docstring); launch with num_warps=8."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = _block_n(w_desc.block_type.shape, B_TRANS)
    NG: gl.constexpr = 1
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    g_bufs, g_pieces = _handover(NG, BM, BN, EPI_M)
    ready, empty, g_ready, g_empty = _ring_barriers(STAGES, NG)
    p = Args(a_desc, w_desc, table_ptr, order_ptr, rw_ptr, y_ptr, a_bufs, b_bufs, g_bufs, ready, empty, g_ready, g_empty,
             gl.to_tensor(E), gl.to_tensor(N), gl.to_tensor(K), gl.to_tensor(MAX_M), GROUP_M, B_TRANS)  # fmt: skip
    gl.warp_specialize(
        [(_mma_partition, (p,)), (_load_partition, (p,)), (_epilogue_partition, (p, g_pieces, EPI_M))],
        [1, EPI_WARPS],
        [LOAD_REGS, EPI_REGS],
    )


# ----------------------------------------------------------------------------- launcher


def supports(a, w, y, transposed: bool, cfg: MoEGluonConfig = CONFIG) -> bool:
    """Whether ``launch_moe_pairs_gluon`` takes these operands: bf16 tensors on a device the Gluon
    kernels run on, contiguous a and w, N % BN == 0, K > 0 and, without ``transposed``, K % BK == 0."""
    N, K = y.shape[1], a.shape[1]
    return (
        a.is_cuda
        and gluon_unavailable_reason(a.device) is None
        and a.dtype == w.dtype == y.dtype == torch.bfloat16
        and a.is_contiguous()
        and w.is_contiguous()
        and y.is_contiguous()
        and all(t.data_ptr() % 16 == 0 for t in (a, w))
        and N % cfg.BN == 0
        and K > 0
        and K % 8 == 0
        and (transposed or K % cfg.BK == 0)
    )


def launch_moe_pairs_gluon(a, w, r, weights, y, transposed: bool, cfg: MoEGluonConfig = CONFIG, num_programs: int | None = None):
    """``swiglu.kernels.moe.launch_pairs``'s contract through this kernel: the tile
    table, then the kernel on ``num_programs`` persistent programs (default one per SM). Check
    ``supports`` first. ``weights``: top_k_weights [T, k] contiguous (read only when ``transposed``)."""
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
    num_programs = num_programs or torch.cuda.get_device_properties(a.device).multi_processor_count
    moe_pairs_gluon_kernel[(num_programs,)](
        a_desc, w_desc, table, r.order, weights, y, E, N, K, table.shape[1],
        transposed, cfg.GROUP_M, cfg.STAGES, cfg.EPI_M, cfg.epi_warps, cfg.load_regs, cfg.epi_regs,
        num_warps=cfg.num_warps, maxnreg=cfg.maxnreg,
    )  # fmt: skip


def install(cfg: MoEGluonConfig = CONFIG):
    """Sends the library's down-projection-shaped GEMMs (``swiglu.kernels.moe.launch_pairs``: the
    forward's down projection and grad_x's pieces) to this kernel wherever ``supports`` holds, the
    library's kernel elsewhere, for the rest of the
    process, in the library plan's tile order (``Tile.GROUP_M``). For measurements
    (``scripts/moe_bench_gpu.py --lab-moe-gluon pairs``), not for training jobs. Returns a function
    that undoes it."""
    from swiglu.kernels import moe

    library = moe.launch_pairs

    def launch_pairs(a, w, r, weights, y, tile, transposed):
        if supports(a, w, y, transposed, cfg):
            launch_moe_pairs_gluon(a, w, r, weights, y, transposed, dataclasses.replace(cfg, GROUP_M=tile.GROUP_M))
        else:
            library(a, w, r, weights, y, tile, transposed)

    moe.launch_pairs = launch_pairs

    def undo():
        moe.launch_pairs = library

    return undo
