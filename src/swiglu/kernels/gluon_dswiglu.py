"""Gluon dSwiGLU GEMM for Hopper (sm_90), written for triton 3.6 and 3.7 (``devices.GLUON_TRITONS``): the
contract of ``backward.launch_dswiglu`` (``g = grad_output @ down_weight`` with the SwiGLU backward
in the epilogue, writing d_gate, d_up, h), with the epilogue in its own warps while the MMA warps
run the next tile. Bitwise the tl kernel's outputs (same rounding points, same PTX ops, same K
order); dispatched per token bucket from backward_configs.json where it measured faster (T > 128).
Its limit: gate/up/act must share one row stride, and d_gate/d_up/h another.
Design, partitions, barrier phases and measurements: docs/kernels.md.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .configs import DswigluGluonConfig
from .devices import tile_programs
from .launch import CONFIG_TOKENS, launch
from .tma import Tma, tuple_new
from .gluon_wgrad import (
    _cta_barrier,
    _fill_stage,
    _layout,
    _mma_tile,
    _mma_layout,
    _pdl_end,
    _pdl_start,
    _ring_barriers,
    _tile_mn,
)


# Candidates (``DswigluGluonConfig`` variants the probes measure): swiglu_lab.experiments.candidates.


# ----------------------------------------------------------------------------- helpers
# (_mma_layout, _mma_tile, _ring_barriers, _fill_stage, _tile_mn and _layout are gluon_wgrad's)


@gluon.constexpr_function
def _epi_layout(EPI_N, num_warps):
    # 8 bf16 (16 bytes) per thread along a row; a warp covers 32 // (EPI_N // 8) rows.
    tpw_n = min(EPI_N // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // tpw_n, tpw_n], [num_warps, 1], [1, 0])


@gluon.jit
def _sigmoid(x):
    # tl.sigmoid in triton 3.6 (language/standard.py): 1 / (1 + math.exp(-x))
    return 1 / (1 + gl.exp(-x))


# ----------------------------------------------------------------------------- partitions


@gluon.jit
def _program_tiles(T, I, BM: gl.constexpr, BN: gl.constexpr):
    """This program's share of the persistent loop over the [T, I] output's BM x BN tiles, as every
    partition walks it: (num_m, num_n, pid, nprog, its tile count); tile t is pid + t * nprog."""
    num_m = gl.cdiv(T, BM)
    num_n = gl.cdiv(I, BN)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    return num_m, num_n, pid, nprog, gl.cdiv(num_m * num_n - pid, nprog)


@gluon.jit
def _load_partition(go_desc, down_desc, a_bufs, b_bufs, ready, empty, T, I, GROUP_M: gl.constexpr):
    BM: gl.constexpr = go_desc.block_type.shape[0]
    BK: gl.constexpr = go_desc.block_type.shape[1]
    BN: gl.constexpr = down_desc.block_type.shape[1]
    K = go_desc.shape[1]
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(T, I, BM, BN)
    k_tiles = gl.cdiv(K, BK)
    p = 0
    for t in range(num_tiles):
        pid_m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, GROUP_M)
        for kk in range(k_tiles):
            s, bar = _fill_stage(p, ready, empty, go_desc.block_type.nbytes + down_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(go_desc, [pid_m * BM, kk * BK], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(down_desc, [kk * BK, pid_n * BN], bar, b_bufs.index(s))
            p += 1


@gluon.jit
def _piece_base(
    t,
    p,
    pid,
    nprog,
    num_m,
    num_n,
    T,
    I,
    stride_in,
    stride_out,
    BM: gl.constexpr,
    BN: gl.constexpr,
    EPI_M: gl.constexpr,
    EPI_N: gl.constexpr,
    GROUP_M: gl.constexpr,
):
    """Piece p of the program's tile t: int64 element offsets of its first element in the input
    and output tensors, and how many of its rows and columns lie inside [T, I]. Pieces are
    column-major in the tile (p = pn * NPM + pm), the order of the g piece views."""
    NPM: gl.constexpr = BM // EPI_M
    pid_m, pid_n = _tile_mn(pid + t * nprog, num_m, num_n, GROUP_M)
    row0 = pid_m * BM + (p % NPM) * EPI_M
    col0 = pid_n * BN + (p // NPM) * EPI_N
    base_in = row0.to(gl.int64) * stride_in + col0
    base_out = row0.to(gl.int64) * stride_out + col0
    return base_in, base_out, T - row0, I - col0


@gluon.jit
def _load_inputs(ins, base, offs, mask, RECOMPUTE_ACT: gl.constexpr):
    """A piece's gate, up and activated gate at ``base + offs`` (masked loads from ``ins``, their
    pointers); gate again in the activated gate's place where RECOMPUTE_ACT (the epilogue recomputes it)."""
    gate_ptr, up_ptr, act_ptr = ins
    gate = gl.load(gate_ptr + base + offs, mask=mask)
    up = gl.load(up_ptr + base + offs, mask=mask)
    if RECOMPUTE_ACT:
        act = gate
    else:
        act = gl.load(act_ptr + base + offs, mask=mask)
    return gate, up, act


@gluon.jit
def _epilogue_partition(
    go_desc,
    down_desc,
    g_bufs,
    g_ready,
    g_empty,
    ins,
    outs,
    T,
    I,
    stride_in,
    stride_out,
    GROUP_M: gl.constexpr,
    EPI_M: gl.constexpr,
    EPI_N: gl.constexpr,
    RECOMPUTE_ACT: gl.constexpr,
):
    # g_bufs here is the [NG * NP, EPI_M, EPI_N] piece view of the g ring (see the kernel); ins:
    # the gate, up and activated gate pointers (row stride stride_in), outs: d_gate's, d_up's and h's.
    BM: gl.constexpr = go_desc.block_type.shape[0]
    BN: gl.constexpr = down_desc.block_type.shape[1]
    NPM: gl.constexpr = BM // EPI_M
    NPN: gl.constexpr = BN // EPI_N
    NP: gl.constexpr = NPM * NPN
    NG: gl.constexpr = g_bufs.type.shape[0] // NP
    layout: gl.constexpr = _epi_layout(EPI_N, gl.num_warps())
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(T, I, BM, BN)
    dgate_ptr, dup_ptr, h_ptr = outs

    # In-piece offsets (int32) and coordinates, shared by every piece.
    r = gl.expand_dims(gl.arange(0, EPI_M, layout=gl.SliceLayout(1, layout)), 1)
    c = gl.expand_dims(gl.arange(0, EPI_N, layout=gl.SliceLayout(0, layout)), 0)
    offs_in = r * stride_in + c
    offs_out = r * stride_out + c

    # Prefetch: inputs of piece 0 of tile 0.
    base_in, base_out, rows_left, cols_left = _piece_base(
        0, 0, pid, nprog, num_m, num_n, T, I, stride_in, stride_out, BM, BN, EPI_M, EPI_N, GROUP_M
    )
    mask = (r < rows_left) & (c < cols_left) & (num_tiles > 0)
    nx_gate, nx_up, nx_act = _load_inputs(ins, base_in, offs_in, mask, RECOMPUTE_ACT)

    for t in range(num_tiles):
        buf = t % NG
        mbarrier.wait(g_ready.index(buf), (t // NG) & 1)
        for p in range(NP):
            gate_bf = nx_gate
            up_bf = nx_up
            act_bf = nx_act
            g_bf = g_bufs.index(buf * NP + p).load(layout)
            # After the last piece of g is in registers, hand the buffer back to the MMA warps.
            _cta_barrier()
            mbarrier.arrive(g_empty.index(buf), pred=p == NP - 1)

            # Prefetch the next piece's inputs (piece 0 of the next tile after the last piece).
            nt = t + (p + 1) // NP
            npc = (p + 1) % NP
            nbase_in, nbase_out, nrows, ncols = _piece_base(
                nt, npc, pid, nprog, num_m, num_n, T, I, stride_in, stride_out, BM, BN, EPI_M, EPI_N, GROUP_M
            )
            mask = (r < nrows) & (c < ncols) & (nt < num_tiles)
            nx_gate, nx_up, nx_act = _load_inputs(ins, nbase_in, offs_in, mask, RECOMPUTE_ACT)

            # The tl kernel's _dswiglu_piece, op for op.
            g = g_bf.to(gl.float32)
            gate = gate_bf.to(gl.float32)
            up = up_bf.to(gl.float32)
            if RECOMPUTE_ACT:
                act = (gate * _sigmoid(gate)).to(gl.bfloat16).to(gl.float32)
            else:
                act = act_bf.to(gl.float32)
            d_act = (g * up).to(gl.bfloat16).to(gl.float32)
            d_up = (g * act).to(gl.bfloat16)
            s = _sigmoid(gate)
            d_gate = (d_act * s * (1.0 + gate * (1.0 - s))).to(gl.bfloat16)
            h = (act * up).to(gl.bfloat16)

            o_mask = (r < rows_left) & (c < cols_left)
            gl.store(dup_ptr + base_out + offs_out, d_up, mask=o_mask)
            gl.store(dgate_ptr + base_out + offs_out, d_gate, mask=o_mask)
            gl.store(h_ptr + base_out + offs_out, h, mask=o_mask)
            base_out = nbase_out
            rows_left = nrows
            cols_left = ncols


@gluon.jit
def _mma_partition(go_desc, down_desc, a_bufs, b_bufs, g_bufs, ready, empty, g_ready, g_empty, T, I, GROUP_M: gl.constexpr):
    BM: gl.constexpr = go_desc.block_type.shape[0]
    BK: gl.constexpr = go_desc.block_type.shape[1]
    BN: gl.constexpr = down_desc.block_type.shape[1]
    NG: gl.constexpr = g_bufs.type.shape[0]
    NUM_WARPS: gl.constexpr = gl.num_warps()
    K = go_desc.shape[1]
    num_m, num_n, pid, nprog, num_tiles = _program_tiles(T, I, BM, BN)
    k_tiles = gl.cdiv(K, BK)

    mma_layout: gl.constexpr = _mma_layout(BM, BN, NUM_WARPS)
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=mma_layout)
    c = 0
    for t in range(num_tiles):
        acc, c = _mma_tile(a_bufs, b_bufs, ready, empty, acc, c, k_tiles, False)
        buf = t % NG
        mbarrier.wait(g_empty.index(buf), ((t // NG) & 1) ^ 1)
        g_bufs.index(buf).store(acc.to(gl.bfloat16))
        _cta_barrier()
        mbarrier.arrive(g_ready.index(buf))


# ----------------------------------------------------------------------------- kernel


@gluon.jit
def dswiglu_gluon_kernel(
    go_desc,
    down_desc,
    gate_ptr,
    up_ptr,
    act_ptr,
    dgate_ptr,
    dup_ptr,
    h_ptr,
    T,
    I,
    stride_in,
    stride_out,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    NG: gl.constexpr,
    EPI_M: gl.constexpr,
    EPI_N: gl.constexpr,
    RECOMPUTE_ACT: gl.constexpr,
    EPI_WARPS: gl.constexpr,
    LOAD_REGS: gl.constexpr,
    EPI_REGS: gl.constexpr,
    PDL: gl.constexpr = False,
):
    BM: gl.constexpr = go_desc.block_type.shape[0]
    BK: gl.constexpr = go_desc.block_type.shape[1]
    BN: gl.constexpr = down_desc.block_type.shape[1]
    gl.static_assert(BM % EPI_M == 0)
    gl.static_assert(BN % EPI_N == 0)
    gl.static_assert(EPI_N == 64)  # a g piece is one 128-byte-swizzled column block (see below)
    gl.static_assert(EPI_M % 8 == 0)

    a_bufs = gl.allocate_shared_memory(go_desc.dtype, [STAGES, BM, BK], go_desc.layout)
    b_bufs = gl.allocate_shared_memory(down_desc.dtype, [STAGES, BK, BN], down_desc.layout)
    g_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.bfloat16)
    g_bufs = gl.allocate_shared_memory(gl.bfloat16, [NG, BM, BN], g_layout)
    # The epilogue's view of the same bytes: [NG * NP, EPI_M, 64] pieces. A [BM, BN] bf16 NVMMA tile with
    # 128-byte swizzle is stored as BN // 64 consecutive [BM, 64] column blocks (the TMA box; triton's
    # nvmmaSharedToLinearLayout), each BM rows of 128 bytes whose swizzle repeats every 8 rows, so the
    # [EPI_M, 64] piece (pm, pn) is the 128-byte-swizzled [EPI_M, 64] tile at byte offset
    # (pn * BM + pm * EPI_M) * 128: piece index pn * (BM // EPI_M) + pm.
    NP: gl.constexpr = (BM // EPI_M) * (BN // EPI_N)
    piece_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([EPI_M, EPI_N], gl.bfloat16)
    g_pieces = g_bufs._reinterpret(gl.bfloat16, [NG * NP, EPI_M, EPI_N], piece_layout)
    ready, empty, g_ready, g_empty = _ring_barriers(STAGES, NG)
    _pdl_start(PDL)

    # The worker argument tuples are written inline: a tuple assigned to a name first turns its
    # constexpr entries into tensors (code_generator.visit_Assign), and EPI_M etc. must stay constexpr.
    gl.warp_specialize(
        [
            (_mma_partition, (go_desc, down_desc, a_bufs, b_bufs, g_bufs, ready, empty, g_ready, g_empty, T, I, GROUP_M)),
            (_load_partition, (go_desc, down_desc, a_bufs, b_bufs, ready, empty, T, I, GROUP_M)),
            (
                _epilogue_partition,
                (
                    go_desc,
                    down_desc,
                    g_pieces,
                    g_ready,
                    g_empty,
                    (gate_ptr, up_ptr, act_ptr),
                    (dgate_ptr, dup_ptr, h_ptr),
                    T,
                    I,
                    stride_in,
                    stride_out,
                    GROUP_M,
                    EPI_M,
                    EPI_N,
                    RECOMPUTE_ACT,
                ),
            ),
        ],
        [1, EPI_WARPS],
        [LOAD_REGS, EPI_REGS],
    )
    _pdl_end(PDL)


# ----------------------------------------------------------------------------- launcher


def _check_2d(name, t, shape):
    if tuple(t.shape) != tuple(shape) or t.stride(-1) != 1 or t.dtype != torch.bfloat16:
        raise ValueError(
            f"{name}: expected a bf16 [{shape[0]}, {shape[1]}] tensor with unit last stride, got "
            f"{t.dtype} {tuple(t.shape)} strides {t.stride()}"
        )


def _prepare(go, down_w, gate, up, act, d_gate, d_up, h, cfg: DswigluGluonConfig, num_programs: int | None):
    """Checked launch arguments (grid, positional, keyword) for ``dswiglu_gluon_kernel``."""
    T = go.shape[0]
    I = down_w.shape[1]
    ins = [gate, up] + ([] if act is None else [act])
    outs = [d_gate, d_up, h]
    for name, t in zip(("gate", "up", "act"), ins):
        _check_2d(name, t, (T, I))
    for name, t in zip(("d_gate", "d_up", "h"), outs):
        _check_2d(name, t, (T, I))
    # The epilogue addresses the three inputs (and the three outputs) with one row stride each.
    stride_in, stride_out = gate.stride(0), d_gate.stride(0)
    if any(t.stride(0) != stride_in for t in ins) or any(t.stride(0) != stride_out for t in outs):
        raise ValueError("gate/up/act (and d_gate/d_up/h) must share one row stride")
    if num_programs is None:
        num_programs = tile_programs(go.device, T, I, cfg)
    go_desc = TensorDescriptor.from_tensor(go, [cfg.BM, cfg.BK], _layout((cfg.BM, cfg.BK)))
    down_desc = TensorDescriptor.from_tensor(down_w, [cfg.BK, cfg.BN], _layout((cfg.BK, cfg.BN)))
    args = _kernel_args(go_desc, down_desc, gate, up, act, d_gate, d_up, h, T, I, cfg, stride_in, stride_out)
    return (num_programs,), args, dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg)


def _kernel_args(
    go_desc, down_desc, gate, up, act, d_gate, d_up, h, T: int, I: int, cfg: DswigluGluonConfig, stride_in: int, stride_out: int
) -> tuple:
    """``dswiglu_gluon_kernel``'s positional arguments, constexprs included (``stride_in`` the one
    row stride of gate/up/act, ``stride_out`` that of d_gate/d_up/h; ``act`` None: recomputed,
    gate passed in its place)."""
    return (
        go_desc,
        down_desc,
        gate,
        up,
        gate if act is None else act,
        d_gate,
        d_up,
        h,
        T,
        I,
        stride_in,
        stride_out,
        cfg.GROUP_M,
        cfg.STAGES,
        cfg.NG,
        cfg.EPI_M,
        cfg.EPI_N,
        act is None,
        cfg.epi_warps,
        cfg.load_regs,
        cfg.epi_regs,
    )


def launch_dswiglu_gluon(
    go, down_w, gate, up, act, d_gate, d_up, h, cfg: DswigluGluonConfig = DswigluGluonConfig(), num_programs: int | None = None
) -> None:
    """The contract of ``backward.launch_dswiglu``: ``g = go @ down_w`` [T, I] with the SwiGLU backward
    epilogue, writes d_gate, d_up, h [T, I]; ``act`` None: activated_gate recomputed from gate.
    go [T, H], down_w [H, I] bf16 CUDA sm_90 tensors usable by TMA (``tma.tma_ready``); gate/up/act
    share one row stride, and so do d_gate/d_up/h (plain pointer accesses: any row stride >= I).
    ``num_programs`` persistent programs, default one per SM. Checks its tensors (ValueError)."""
    grid, args, kw = _prepare(go, down_w, gate, up, act, d_gate, d_up, h, cfg, num_programs)
    dswiglu_gluon_kernel[grid](*args, **kw)


def launch_dswiglu_gluon_trusted(go, down_w, gate, up, act, d_gate, d_up, h, cfg: DswigluGluonConfig, num_programs: int) -> None:
    """``launch_dswiglu_gluon`` without its checks, for ``backward.launch_backward``: the caller
    made every tensor TMA-ready (``tma.tma_ready``) and checked that gate/up/act share one row
    stride and d_gate/d_up/h another. The compiled kernel is looked up per key after the first
    launch (``launch.launch``)."""
    T, H = go.shape
    I = down_w.shape[1]
    # stride()[0]: torch parses stride(0)'s argument slower than it builds the tuple.
    stride_in, stride_out = gate.stride()[0], d_gate.stride()[0]
    go_block, go_layout, down_block, down_layout, kw, token = _trusted_constants(cfg)
    launch(
        dswiglu_gluon_kernel,
        (num_programs,),
        ("gluon_dswiglu", go.device, T, I, H, stride_in, stride_out, num_programs, act is None, token),
        *_kernel_args(
            tuple_new(Tma, (go, go_block, go_layout)),
            tuple_new(Tma, (down_w, down_block, down_layout)),
            gate,
            up,
            act,
            d_gate,
            d_up,
            h,
            T,
            I,
            cfg,
            stride_in,
            stride_out,
        ),
        **kw,
    )


@lru_cache(maxsize=None)
def _trusted_constants(cfg: DswigluGluonConfig) -> tuple:
    # The descriptors' blocks and layouts, the launch keywords and the config's token in launch
    # keys, built once per config (host time per launch).
    return (
        [cfg.BM, cfg.BK],
        _layout((cfg.BM, cfg.BK)),
        [cfg.BK, cfg.BN],
        _layout((cfg.BK, cfg.BN)),
        dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg),
        next(CONFIG_TOKENS),
    )
