"""The MoE experts' weight gradients as one warp-specialized Gluon kernel over all experts (sm_90).

    c[e] = a_e^T @ b_e  for every expert e,  a [S, M] and b [S, N] bf16 in expert order (rows
    expert_start[e] .. expert_start[e + 1]), c [E, M, N] bf16, fp32 accumulation,

the library's ``moe_wgrad_kernel`` contract (``swiglu.kernels.moe.launch_wgrad``). Its tiles are
``gluon_wgrad``'s cooperative ones: a TMA loader warp, two MMA warpgroups on one tile, a TMA
storer warp with NC stores in flight, so each tile's store overlaps the next tiles' MMAs, which
the one-program-per-tile tl kernel leaves to a second program on the SM. The persistent programs
walk (expert, M tile, N tile) in expert order (``_tile_mn``'s bands within an expert). An
expert's K range is read from ``expert_start``; the loader makes TMA descriptors of the
expert's rows on the device (``tma.make_tensor_descriptor``) once per run of its tiles in one
expert, so the last K box is zero-filled past the expert's end instead of reading the next
expert's rows; runs alternate between two descriptor slots, and a slot is rewritten only once the
loads that read it have landed (TMA reads a descriptor asynchronously). An expert with no rows
writes zeros. M % BM == 0 (the output's TMA boxes never cross experts): true at every model shape.
Bitwise the tl kernel's on an H200 (lab/probes/moe_gluon_wgrad.py); 1.07-1.24x its time at
hidden_size >= 4096, a tie or slower at 2048 (data/tuning/moe_gluon_20261205.log). The library's
plan ran it until the ping-pong kernel (``swiglu.kernels.moe_gluon_wgrad_pingpong``) beat it at
every shape on an H100 (data/tuning/moe_gluon_pingpong_gather_20261205.log); the probe's baseline.
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from triton.language.core import _aggregate as aggregate  # as Triton's gluon tutorial 08 does

from swiglu.kernels.configs import GluonConfig
from swiglu.kernels.devices import device_sms
from swiglu.kernels.gluon_wgrad import _epilogue_store, _fill_stage, _layout, _mma_layout, _mma_tile, _ring_barriers
from swiglu.kernels.moe_gluon_wgrad import _expert_tile, _program_tiles, _smem_layout, _tile_of


@gluon.jit
def _walk_tiles(E, M, N, BM: gl.constexpr, BN: gl.constexpr, RUN: gl.constexpr = 1):
    """``_program_tiles`` (RUN 1: tiles pid, pid + nprog, ...), or the walk of RUN consecutive
    tiles per program (tiles b * nprog * RUN + pid * RUN + j, j < RUN; ``_walk_index``)."""
    if RUN == 1:
        r = _program_tiles(E, M, N, BM, BN)
    else:
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        total = E * num_m * num_n
        wave = nprog * RUN
        rest = total - (total // wave) * wave
        r = num_m, num_n, pid, nprog, (total // wave) * RUN + gl.minimum(gl.maximum(rest - pid * RUN, 0), RUN)
    return r


@gluon.jit
def _walk_index(t, pid, nprog, RUN: gl.constexpr):
    """The walk's tile of this program's t-th tile."""
    return (t // RUN) * nprog * RUN + pid * RUN + t % RUN


@gluon.jit
def _wait_landed(p, q_end, ready):
    """Waits until the loads of ring steps before ``q_end`` have landed. The loader is at step p;
    steps before p - STAGES have (their stages were filled again since), and only the loader
    arms ``ready``, so a landed step's phase cannot move on while this waits."""
    STAGES: gl.constexpr = ready.type.shape[0]
    for j in gl.static_range(STAGES):
        q = p - STAGES + j
        mbarrier.wait(ready.index((p + j) % STAGES), (q // STAGES) & 1, pred=(q >= 0) & (q < q_end))


@gluon.jit
def _load_runs(p, load_run: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, RUN: gl.constexpr = 1):
    """A loader partition's walk (``_walk_tiles``) over its program's BM x BN tiles: runs of tiles
    of one expert (``load_run(p, pid, nprog, num_m, num_n, num_tiles, t, q) -> (t, q)``, q the ring
    step) alternate between two descriptor slots, the two call sites of ``load_run``, each with its
    own scratch. A slot is rewritten only after the loads of the run that last used it, two runs
    back, have landed: TMA reads a descriptor asynchronously, so a copy still in flight would read
    the new one (the race DeepGEMM's k-grouped wgrad had)."""
    num_m, num_n, pid, nprog, num_tiles = _walk_tiles(p.E, p.M, p.N, BM, BN, RUN)
    q = 0
    t = 0
    run = 0
    prev_start = 0  # the first ring step of the previous run
    while t < num_tiles:
        _wait_landed(q, prev_start, p.ready)
        start = q
        if run % 2 == 0:
            t, q = load_run(p, pid, nprog, num_m, num_n, num_tiles, t, q)
        else:
            t, q = load_run(p, pid, nprog, num_m, num_n, num_tiles, t, q)
        prev_start = start
        run += 1


def _scratch(size: int, alignment: int, stream):
    """Triton's allocator for the device-made descriptors' scratch."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


#: The default tile: the dense table's cooperative 128 x 128 entry at small K (GROUP_M within an expert).
CONFIG = GluonConfig(BM=128, BN=128, BK=64, STAGES=4, NC=2, GROUP_M=8, num_warps=8)


@aggregate
class Args:
    """What every partition reads: the operands, the output's descriptor, the shared buffers and
    their barriers, the sizes (tensors: an argument of 1 that Triton specializes is made one first)."""

    a_ptr: gl.tensor
    b_ptr: gl.tensor
    start_ptr: gl.tensor
    c_desc: tma.tensor_descriptor
    a_bufs: gl.shared_memory_descriptor
    b_bufs: gl.shared_memory_descriptor
    c_bufs: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    c_ready: gl.shared_memory_descriptor
    c_empty: gl.shared_memory_descriptor
    E: gl.tensor
    M: gl.tensor
    N: gl.tensor
    stride_a: gl.tensor
    stride_b: gl.tensor
    GROUP_M: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, a_ptr, b_ptr, start_ptr, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, E, M, N,
                 stride_a, stride_b, GROUP_M):  # fmt: skip
        self.a_ptr = a_ptr
        self.b_ptr = b_ptr
        self.start_ptr = start_ptr
        self.c_desc = c_desc
        self.a_bufs = a_bufs
        self.b_bufs = b_bufs
        self.c_bufs = c_bufs
        self.ready = ready
        self.empty = empty
        self.c_ready = c_ready
        self.c_empty = c_empty
        self.E = E
        self.M = M
        self.N = N
        self.stride_a = stride_a
        self.stride_b = stride_b
        self.GROUP_M = gl.constexpr(GROUP_M)


@gluon.jit
def _load_run(p, pid, nprog, num_m, num_n, num_tiles, t, q):
    """The loads of one run of this program's tiles, t, t + 1, ... while their expert lasts, through
    descriptors of the expert's rows made first (TMA zero-fills the last K box past them, so a box
    never reads the next expert's rows; at least one row: an empty expert's is never read).
    ``q``: the ring step. Returns (t, q) after the run."""
    BK: gl.constexpr = p.a_bufs.type.shape[1]
    BM: gl.constexpr = p.a_bufs.type.shape[2]
    BN: gl.constexpr = p.b_bufs.type.shape[2]
    STAGE_BYTES: gl.constexpr = 2 * BK * (BM + BN)
    e_run, pid_m, pid_n, lo, rows = _expert_tile(pid + t * nprog, num_m, num_n, p.start_ptr, p.GROUP_M)
    shape_k = gl.maximum(rows, 1)
    a_desc = tma.make_tensor_descriptor(
        p.a_ptr + lo.to(gl.int64) * p.stride_a, [shape_k, p.M], [p.stride_a, 1], [BK, BM], _smem_layout([BK, BM])
    )
    b_desc = tma.make_tensor_descriptor(
        p.b_ptr + lo.to(gl.int64) * p.stride_b, [shape_k, p.N], [p.stride_b, 1], [BK, BN], _smem_layout([BK, BN])
    )
    e = e_run
    while (e == e_run) & (t < num_tiles):
        for kk in range(gl.cdiv(rows, BK)):
            s, bar = _fill_stage(q, p.ready, p.empty, STAGE_BYTES)
            tma.async_copy_global_to_shared(a_desc, [kk * BK, pid_m * BM], bar, p.a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [kk * BK, pid_n * BN], bar, p.b_bufs.index(s))
            q += 1
        t += 1
        # The next tile (the last one again past the end: no read beyond expert_start[E]).
        e, pid_m, pid_n, lo, rows = _expert_tile(pid + gl.minimum(t, num_tiles - 1) * nprog, num_m, num_n, p.start_ptr, p.GROUP_M)
    return t, q


@gluon.jit
def _load_partition(p):
    _load_runs(p, _load_run, p.a_bufs.type.shape[2], p.b_bufs.type.shape[2])


@gluon.jit
def _mma_partition(p):
    # Both MMA warpgroups on one tile; an expert with no rows stores zeros (no ring step taken).
    BM: gl.constexpr = p.c_desc.block_type.shape[0]
    BN: gl.constexpr = p.c_desc.block_type.shape[1]
    BK: gl.constexpr = p.a_bufs.type.shape[1]
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(p.E, p.M, p.N, BM, BN)
    layout: gl.constexpr = _mma_layout(BM, BN, gl.num_warps())
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
    c = 0
    last = p.E * num_m * num_n - 1  # a tile index past it would read past expert_start[E]
    rows = _expert_tile(gl.minimum(pid, last), num_m, num_n, p.start_ptr, p.GROUP_M)[4]
    for t in range(num_tiles):
        k_tiles = gl.cdiv(rows, BK)
        if k_tiles > 0:
            acc, c = _mma_tile(p.a_bufs, p.b_bufs, p.ready, p.empty, acc, c, k_tiles, True)
        else:
            acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
        # The next tile's row count, loaded before this tile's epilogue: its latency hides there
        # instead of idling the tensor cores before the next main loop.
        rows = _expert_tile(gl.minimum(pid + (t + 1) * nprog, last), num_m, num_n, p.start_ptr, p.GROUP_M)[4]
        _epilogue_store(acc.to(p.c_desc.dtype), t, p.c_desc, p.c_bufs, p.c_ready, p.c_empty)


@gluon.jit
def _store_partition(p):
    # c_desc: the output as [E * M, N] (M % BM == 0: a box stays in its expert's rows).
    BM: gl.constexpr = p.c_desc.block_type.shape[0]
    BN: gl.constexpr = p.c_desc.block_type.shape[1]
    NC: gl.constexpr = p.c_bufs.type.shape[0]
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(p.E, p.M, p.N, BM, BN)
    for t in range(num_tiles):
        e, pid_m, pid_n = _tile_of(pid + t * nprog, num_m, num_n, p.GROUP_M)
        buf = t % NC
        mbarrier.wait(p.c_ready.index(buf), (t // NC) & 1)
        tma.async_copy_shared_to_global(p.c_desc, [e * p.M + pid_m * BM, pid_n * BN], p.c_bufs.index(buf))
        # At most NC-1 stores pending: tile t-(NC-1)'s buffer, index (t+1) % NC, is free again.
        tma.store_wait(pendings=NC - 1)
        mbarrier.arrive(p.c_empty.index((t + 1) % NC), pred=t >= NC - 1)
    tma.store_wait(pendings=0)


@gluon.jit
def moe_wgrad_gluon_kernel(
    a_ptr, b_ptr, start_ptr, c_desc, E, M, N, stride_a, stride_b,
    BK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, NC: gl.constexpr, LOAD_REGS: gl.constexpr,
    STORE_REGS: gl.constexpr,
):  # fmt: skip
    """c[e] = a_e^T @ b_e for every expert (module docstring); launch with num_warps=8."""
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BM], _smem_layout([BK, BM]))
    b_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, BN], _smem_layout([BK, BN]))
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [NC, BM, BN], c_desc.layout)
    ready, empty, c_ready, c_empty = _ring_barriers(STAGES, NC)
    p = Args(a_ptr, b_ptr, start_ptr, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, c_ready, c_empty, gl.to_tensor(E),
             gl.to_tensor(M), gl.to_tensor(N), gl.to_tensor(stride_a), gl.to_tensor(stride_b), GROUP_M)  # fmt: skip
    gl.warp_specialize(
        [(_mma_partition, (p,)), (_load_partition, (p,)), (_store_partition, (p,))], [1, 1], [LOAD_REGS, STORE_REGS]
    )


def launch_moe_wgrad_gluon(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, expert_start: torch.Tensor, cfg: GluonConfig = CONFIG, num_programs: int | None = None) -> None:  # fmt: skip
    """c [E, M, N] = each expert's a_e^T @ b_e (module docstring): a [S, M], b [S, N] and c as
    ``swiglu.kernels.moe_gluon_wgrad.supports`` takes them at ``cfg`` (check it first),
    expert_start [E + 1] int32 on the same device; ``num_programs`` persistent programs (default: one per SM). The device-side descriptors take
    their scratch memory from triton's allocator, set here for the calling thread to torch.empty
    on the device (the autograd engine runs a backward in its own thread)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    E, M, N = c.shape
    triton.set_allocator(_scratch)
    c_desc = TensorDescriptor.from_tensor(c.view(E * M, N), [cfg.BM, cfg.BN], _layout((cfg.BM, cfg.BN)))
    num_programs = num_programs or device_sms(c.device)
    moe_wgrad_gluon_kernel[(num_programs,)](
        a, b, expert_start, c_desc, E, M, N, a.stride(0), b.stride(0),
        cfg.BK, cfg.GROUP_M, cfg.STAGES, cfg.NC, cfg.load_regs, cfg.store_regs, num_warps=cfg.num_warps, maxnreg=cfg.maxnreg,
    )  # fmt: skip
