"""Persistent forms of the MoE grouped GEMMs and weight gradients (an experiment).

The library's grouped kernels (``swiglu.kernels.moe``) launch one program per tile: with one
program per SM (their tiles take 100-150 KB of shared memory), each tile's pipeline fill and its
epilogue's stores run with the tensor cores idle. Here NUM_PROGRAMS programs walk the tiles
(``tl.range(..., flatten=True)``: Triton's pipeliner then issues the next tile's loads while the
epilogue of this one runs, as in Triton's tutorial 09), each finding its tile's expert from
``expert_start`` as the library's kernels do. Same arithmetic, same order of the fp32 sums:
bitwise the library's outputs. Timed against them by ``lab/probes/moe_persistent.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swiglu.kernels import moe as M
from swiglu.kernels.devices import INTERPRET, cdiv
from swiglu.kernels.moe import _dswiglu_tile, _pairs_tile, _up_tile, _wgrad_tile
from swiglu.kernels.tl_kernels import _pdl_start


@triton.jit
def _expert_tiles(expert_start_ptr, E, BM: tl.constexpr, E_PAD: tl.constexpr):
    """Per expert bin (E_PAD >= E): first sorted row, end, M tiles and their running sum."""
    bins = tl.arange(0, E_PAD)
    lo = tl.load(expert_start_ptr + bins, mask=bins < E, other=0)
    hi = tl.load(expert_start_ptr + bins + 1, mask=bins < E, other=0)
    tiles = (hi - lo + BM - 1) // BM
    return bins, lo, hi, tiles, tl.cumsum(tiles, 0)


@triton.jit
def _tile_rows(t, num_n, bins, lo, hi, tiles, cum, BM: tl.constexpr):
    """Tile t (N tiles fastest, as the library's grid): its expert, first row, rows, which rows
    are real and its N tile."""
    pid_m = t // num_n
    e = tl.sum((cum <= pid_m).to(tl.int32), axis=0)
    sel = bins == e
    first = tl.sum(tl.where(sel, cum - tiles, 0), axis=0)
    end = tl.sum(tl.where(sel, hi, 0), axis=0)
    row0 = tl.sum(tl.where(sel, lo, 0), axis=0) + (pid_m - first) * BM
    rows = row0 + tl.arange(0, BM)
    return e, row0, rows, rows < end, t % num_n


@triton.jit
def moe_up_persistent_kernel(
    x_ptr,
    w_ptr,
    order_ptr,
    expert_start_ptr,
    gate_ptr,
    up_ptr,
    h_ptr,
    H,
    I,
    E,
    TOP_K,
    num_n,
    NUM_PROGRAMS,
    stride_xt,
    stride_xh,
    stride_we,
    stride_wn,
    stride_wh,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    E_PAD: tl.constexpr,
    B_TMA: tl.constexpr,
    FLATTEN: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """``moe_up_kernel``'s tiles, walked by NUM_PROGRAMS programs."""
    _pdl_start(PDL)
    bins, lo, hi, tiles, cum = _expert_tiles(expert_start_ptr, E, BM, E_PAD)
    for t in tl.range(tl.program_id(0), tl.sum(tiles, axis=0) * num_n, NUM_PROGRAMS, flatten=FLATTEN):
        e, row0, rows, row_ok, pid_n = _tile_rows(t, num_n, bins, lo, hi, tiles, cum, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        # fmt: off
        _up_tile(x_ptr, w_ptr, order_ptr, gate_ptr, up_ptr, h_ptr, None, H, I, TOP_K, stride_xt, stride_xh, stride_we,
                 stride_wn, stride_wh, e, rows, row_ok, cols, cols < I, pid_n, BM, BN, BK, B_TMA, UPCAST)
        # fmt: on


@triton.jit
def moe_down_persistent_kernel(
    a_ptr,
    w_ptr,
    order_ptr,
    expert_start_ptr,
    rw_ptr,
    y_ptr,
    N,
    K,
    E,
    num_n,
    NUM_PROGRAMS,
    stride_am,
    stride_we,
    stride_w0,
    stride_w1,
    B_TRANS: tl.constexpr,
    SCALE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    E_PAD: tl.constexpr,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    FLATTEN: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """``moe_down_kernel``'s tiles, walked by NUM_PROGRAMS programs."""
    _pdl_start(PDL)
    bins, lo, hi, tiles, cum = _expert_tiles(expert_start_ptr, E, BM, E_PAD)
    for t in tl.range(tl.program_id(0), tl.sum(tiles, axis=0) * num_n, NUM_PROGRAMS, flatten=FLATTEN):
        e, row0, rows, row_ok, pid_n = _tile_rows(t, num_n, bins, lo, hi, tiles, cum, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        # fmt: off
        _pairs_tile(a_ptr, w_ptr, order_ptr, rw_ptr, y_ptr, N, K, stride_am, stride_we, stride_w0, stride_w1, e, row0,
                    rows, row_ok, cols, cols < N, pid_n, B_TRANS, SCALE, BM, BN, BK, A_TMA, B_TMA, UPCAST)
        # fmt: on


@triton.jit
def moe_dswiglu_persistent_kernel(
    go_ptr,
    w_ptr,
    order_ptr,
    expert_start_ptr,
    rw_ptr,
    gate_ptr,
    up_ptr,
    dgu_ptr,
    hw_ptr,
    part_ptr,
    H,
    I,
    E,
    TOP_K,
    num_n,
    NUM_PROGRAMS,
    stride_gt,
    stride_gh,
    stride_we,
    stride_wh,
    stride_wi,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    E_PAD: tl.constexpr,
    B_TMA: tl.constexpr,
    FLATTEN: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """``moe_dswiglu_kernel``'s tiles, walked by NUM_PROGRAMS programs (its epilogue, the heaviest
    of the grouped kernels, then overlaps the next tile's loads)."""
    _pdl_start(PDL)
    bins, lo, hi, tiles, cum = _expert_tiles(expert_start_ptr, E, BM, E_PAD)
    for t in tl.range(tl.program_id(0), tl.sum(tiles, axis=0) * num_n, NUM_PROGRAMS, flatten=FLATTEN):
        e, row0, rows, row_ok, pid_n = _tile_rows(t, num_n, bins, lo, hi, tiles, cum, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        # fmt: off
        _dswiglu_tile(go_ptr, w_ptr, order_ptr, rw_ptr, gate_ptr, up_ptr, dgu_ptr, hw_ptr, part_ptr, H, I, TOP_K, num_n,
                      stride_gt, stride_gh, stride_we, stride_wh, stride_wi, e, rows, row_ok, cols, cols < I, pid_n, BM,
                      BN, BK, EPI_SPLIT, B_TMA, UPCAST)
        # fmt: on


@triton.jit
def moe_wgrad_persistent_kernel(
    a_ptr,
    b_ptr,
    expert_start_ptr,
    c_ptr,
    M,
    N,
    E,
    num_m,
    num_n,
    NUM_PROGRAMS,
    stride_at,
    stride_bt,
    stride_ce,
    stride_cm,
    stride_cn,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    FLATTEN: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """``moe_wgrad_kernel``'s (expert, output tile) programs as tiles walked by NUM_PROGRAMS
    programs: its tiles are short (an expert's rows: 512 at Qwen3-30B-A3B, 8192 tokens), so the
    pipeline fill and the store are a large share of each. An earlier persistent form (gathers in
    its loads, commit 146a697) measured slower than one program per tile, two of which share an SM
    (docs/moe.md); this one reads the TMA copies. FLATTEN does nothing here under triton
    3.6 (the same TTGIR): its loop fusion takes only inner loops whose bounds do not change with
    the tile (checked by compiling variants), and these run over each expert's rows."""
    _pdl_start(PDL)
    per_e = num_m * num_n
    for t in tl.range(tl.program_id(0), E * per_e, NUM_PROGRAMS, flatten=FLATTEN):
        # fmt: off
        _wgrad_tile(a_ptr, b_ptr, expert_start_ptr, c_ptr, M, N, stride_at, stride_bt, stride_ce, stride_cm, stride_cn,
                    t // per_e, (t % per_e) // num_n, t % num_n, A_TMA, B_TMA, BM, BN, BK, UPCAST)
        # fmt: on


def num_programs(device: torch.device, per_sm: int = 1) -> int:
    """Programs of a persistent launch: per_sm per SM (4 in the interpreter)."""
    if INTERPRET or device.type != "cuda":
        return 4
    return per_sm * torch.cuda.get_device_properties(device).multi_processor_count


def _persistent(kernel, r: M.Routing, N: int, tile: M.Tile, programs: int, flatten: bool, *args, strides: tuple, **meta):
    """As ``M._grouped``, with ``programs`` programs (at most the tile bound) walking the tiles."""
    num_n = cdiv(N, tile.BN)
    grid = (max(1, min(programs, (cdiv(r.S, tile.BM) + r.E) * num_n)),)
    M._launch(
        kernel,
        grid,
        tile.num_warps,
        tile.num_stages,
        *args,
        num_n,
        grid[0],
        *strides,
        **meta,
        BM=tile.BM,
        BN=tile.BN,
        BK=tile.BK,
        E_PAD=r.E_PAD,
        FLATTEN=flatten,
        UPCAST=INTERPRET,
    )


def launch_up(x, gate_up_proj, r: M.Routing, k: int, gate, up, h, tile: M.Tile, programs: int, flatten: bool = True):
    """``swiglu.kernels.moe.launch_up`` through ``moe_up_persistent_kernel``."""
    H, I = x.shape[1], gate.shape[1]
    w = M._tma(gate_up_proj, [tile.BN, tile.BK], tile.TMA_B)
    args = (x, w or gate_up_proj, r.order, r.expert_start, gate, up, h, H, I, r.E, k)
    strides = (x.stride(0), x.stride(1), *gate_up_proj.stride())
    _persistent(moe_up_persistent_kernel, r, I, tile, programs, flatten, *args, strides=strides, B_TMA=w is not None)


def launch_pairs(a, w, r: M.Routing, weights, y, tile: M.Tile, transposed: bool, programs: int, flatten: bool = True):
    """``swiglu.kernels.moe.launch_pairs`` through ``moe_down_persistent_kernel``."""
    N, K = y.shape[1], a.shape[1]
    a_desc = M._tma(a, [tile.BM, tile.BK], tile.TMA_A)
    w_desc = M._tma(w, [tile.BN, tile.BK] if transposed else [tile.BK, tile.BN], tile.TMA_B and (transposed or K % tile.BK == 0))
    args = (a_desc or a, w_desc or w, r.order, r.expert_start, weights, y, N, K, r.E)
    _persistent(
        moe_down_persistent_kernel,
        r,
        N,
        tile,
        programs,
        flatten,
        *args,
        strides=(a.stride(0), *w.stride()),
        B_TRANS=transposed,
        SCALE=transposed,
        A_TMA=a_desc is not None,
        B_TMA=w_desc is not None,
    )


def launch_dswiglu(
    grad_out, down_proj, r: M.Routing, k: int, weights, gate, up, dgu, hw, part, tile: M.Tile, programs: int, flatten: bool = True
):
    """``swiglu.kernels.moe.launch_dswiglu`` through ``moe_dswiglu_persistent_kernel``."""
    H, I = grad_out.shape[1], gate.shape[1]
    w = M._tma(down_proj, [tile.BK, tile.BN], tile.TMA_B and H % tile.BK == 0)
    args = (
        grad_out,
        w or down_proj,
        r.order,
        r.expert_start,
        weights,
        gate,
        up,
        dgu,
        hw,
        part,
        H,
        I,
        r.E,
        k,
    )
    _persistent(
        moe_dswiglu_persistent_kernel,
        r,
        I,
        tile,
        programs,
        flatten,
        *args,
        strides=(grad_out.stride(0), grad_out.stride(1), *down_proj.stride()),
        EPI_SPLIT=tile.EPI_SPLIT,
        B_TMA=w is not None,
    )


def launch_wgrad(c, a, b, r: M.Routing, tile: M.Tile, programs: int, flatten: bool = True):
    """``swiglu.kernels.moe.launch_wgrad`` through ``moe_wgrad_persistent_kernel``."""
    E, Mc, N = c.shape
    num_m, num_n = cdiv(Mc, tile.BM), cdiv(N, tile.BN)
    a_desc = M._tma(a, [tile.BK, tile.BM], tile.TMA_A)
    b_desc = M._tma(b, [tile.BK, tile.BN], tile.TMA_B)
    grid = (max(1, min(programs, E * num_m * num_n)),)
    M._launch(
        moe_wgrad_persistent_kernel,
        grid,
        tile.num_warps,
        tile.num_stages,
        a_desc or a,
        b_desc or b,
        r.expert_start,
        c,
        Mc,
        N,
        E,
        num_m,
        num_n,
        grid[0],
        a.stride(0),
        b.stride(0),
        *c.stride(),
        A_TMA=a_desc is not None,
        B_TMA=b_desc is not None,
        BM=tile.BM,
        BN=tile.BN,
        BK=tile.BK,
        FLATTEN=flatten,
        UPCAST=INTERPRET,
    )
