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
from swiglu.kernels.moe import _dswiglu_piece, _wgrad_operand
from swiglu.kernels.tl_kernels import _activated_gate, _bf16, _dot, _f32, _pdl_start


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
    ks = tl.arange(0, BK)
    for t in tl.range(tl.program_id(0), tl.sum(tiles, axis=0) * num_n, NUM_PROGRAMS, flatten=FLATTEN):
        e, row0, rows, row_ok, pid_n = _tile_rows(t, num_n, bins, lo, hi, tiles, cum, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        col_ok = cols < I
        tok = tl.load(order_ptr + rows, mask=row_ok, other=0) // TOP_K
        a_ptrs = x_ptr + tok.to(tl.int64)[:, None] * stride_xt + ks[None, :] * stride_xh
        if not B_TMA:
            w_base = w_ptr + e.to(tl.int64) * stride_we
            g_ptrs = w_base + cols.to(tl.int64)[None, :] * stride_wn + ks[:, None] * stride_wh
            u_ptrs = g_ptrs + I * stride_wn
        w_row = e * 2 * I + pid_n * BN
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, H, BK):
            k_ok = (k0 + ks) < H
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            if B_TMA:
                bg = tl.trans(w_ptr.load([w_row, k0]))
                bu = tl.trans(w_ptr.load([w_row + I, k0]))
            else:
                bg = tl.load(g_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                bu = tl.load(u_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                g_ptrs += BK * stride_wh
                u_ptrs += BK * stride_wh
            acc_g = _dot(a, bg, acc_g, UPCAST)
            acc_u = _dot(a, bu, acc_u, UPCAST)
            a_ptrs += BK * stride_xh
        gate = _bf16(acc_g, UPCAST)
        up = _bf16(acc_u, UPCAST)
        act = _activated_gate(_f32(gate, UPCAST), UPCAST)
        h = _bf16(_f32(act, UPCAST) * _f32(up, UPCAST), UPCAST)
        out = rows.to(tl.int64)[:, None] * I + cols[None, :]
        ok = row_ok[:, None] & col_ok[None, :]
        tl.store(gate_ptr + out, gate, mask=ok)
        tl.store(up_ptr + out, up, mask=ok)
        tl.store(h_ptr + out, h, mask=ok)


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
    """``moe_down_kernel``'s tiles (one A buffer), walked by NUM_PROGRAMS programs."""
    _pdl_start(PDL)
    bins, lo, hi, tiles, cum = _expert_tiles(expert_start_ptr, E, BM, E_PAD)
    ks = tl.arange(0, BK)
    for t in tl.range(tl.program_id(0), tl.sum(tiles, axis=0) * num_n, NUM_PROGRAMS, flatten=FLATTEN):
        e, row0, rows, row_ok, pid_n = _tile_rows(t, num_n, bins, lo, hi, tiles, cum, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        col_ok = cols < N
        if not A_TMA:
            a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + ks[None, :]
        if not B_TMA:
            w_base = w_ptr + e.to(tl.int64) * stride_we
            if B_TRANS:
                b_ptrs = w_base + cols.to(tl.int64)[None, :] * stride_w0 + ks[:, None] * stride_w1
                b_step = BK * stride_w1
            else:
                b_ptrs = w_base + ks.to(tl.int64)[:, None] * stride_w0 + cols[None, :] * stride_w1
                b_step = BK * stride_w0
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            k_ok = (k0 + ks) < K
            if A_TMA:
                a = a_ptr.load([row0, k0])
            else:
                a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                a_ptrs += BK
            if B_TMA:
                if B_TRANS:
                    b = tl.trans(w_ptr.load([e * N + pid_n * BN, k0]))
                else:
                    b = w_ptr.load([e * K + k0, pid_n * BN])
            else:
                b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                b_ptrs += b_step
            acc = _dot(a, b, acc, UPCAST)
        pair = tl.load(order_ptr + rows, mask=row_ok, other=0)
        if SCALE:
            w = tl.load(rw_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
            acc = _f32(_bf16(acc, UPCAST), UPCAST) * w[:, None]
        out = pair.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(y_ptr + out, _bf16(acc, UPCAST), mask=row_ok[:, None] & col_ok[None, :])


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
    IN_PLACE: tl.constexpr,
    FLATTEN: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """``moe_dswiglu_kernel``'s tiles, walked by NUM_PROGRAMS programs (its epilogue, the heaviest
    of the grouped kernels, then overlaps the next tile's loads)."""
    _pdl_start(PDL)
    bins, lo, hi, tiles, cum = _expert_tiles(expert_start_ptr, E, BM, E_PAD)
    ks = tl.arange(0, BK)
    for t in tl.range(tl.program_id(0), tl.sum(tiles, axis=0) * num_n, NUM_PROGRAMS, flatten=FLATTEN):
        e, row0, rows, row_ok, pid_n = _tile_rows(t, num_n, bins, lo, hi, tiles, cum, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        col_ok = cols < I
        pair = tl.load(order_ptr + rows, mask=row_ok, other=0)
        a_ptrs = go_ptr + (pair // TOP_K).to(tl.int64)[:, None] * stride_gt + ks[None, :] * stride_gh
        if not B_TMA:
            b_ptrs = w_ptr + e.to(tl.int64) * stride_we + ks.to(tl.int64)[:, None] * stride_wh + cols[None, :] * stride_wi
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, H, BK):
            k_ok = (k0 + ks) < H
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            a_ptrs += BK * stride_gh
            if B_TMA:
                b = w_ptr.load([e * H + k0, pid_n * BN])
            else:
                b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                b_ptrs += BK * stride_wh
            acc = _dot(a, b, acc, UPCAST)
        w = tl.load(rw_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        if EPI_SPLIT == 1:
            part = _dswiglu_piece(acc, rows, row_ok, cols, w, gate_ptr, up_ptr, dgu_ptr, hw_ptr, I, UPCAST, IN_PLACE)
        else:
            a0, a1 = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
            c0 = pid_n * BN + tl.arange(0, BN // 2)
            part = _dswiglu_piece(
                a0, rows, row_ok, c0, w, gate_ptr, up_ptr, dgu_ptr, hw_ptr, I, UPCAST, IN_PLACE
            ) + _dswiglu_piece(a1, rows, row_ok, c0 + BN // 2, w, gate_ptr, up_ptr, dgu_ptr, hw_ptr, I, UPCAST, IN_PLACE)
        tl.store(part_ptr + pair.to(tl.int64) * num_n + pid_n, part, mask=row_ok)


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
    ks = tl.arange(0, BK)
    for t in tl.range(tl.program_id(0), E * per_e, NUM_PROGRAMS, flatten=FLATTEN):
        e = t // per_e
        pid_m = (t % per_e) // num_n
        pid_n = t % num_n
        start = tl.load(expert_start_ptr + e)
        end = tl.load(expert_start_ptr + e + 1)
        ms = pid_m * BM + tl.arange(0, BM)
        ns = pid_n * BN + tl.arange(0, BN)
        full = start + (end - start) // BK * BK
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for r0 in range(start, full, BK):
            r_ok = r0 + ks < end
            a = _wgrad_operand(a_ptr, r0, r_ok, ms, pid_m * BM, M, stride_at, A_TMA, False)
            b = _wgrad_operand(b_ptr, r0, r_ok, ns, pid_n * BN, N, stride_bt, B_TMA, False)
            acc = _dot(tl.trans(a), b, acc, UPCAST)
        if full < end:
            r_ok = full + ks < end
            a = _wgrad_operand(a_ptr, full, r_ok, ms, pid_m * BM, M, stride_at, A_TMA, True)
            b = _wgrad_operand(b_ptr, full, r_ok, ns, pid_n * BN, N, stride_bt, B_TMA, True)
            acc = _dot(tl.trans(a), b, acc, UPCAST)
        c = c_ptr + e.to(tl.int64) * stride_ce + ms.to(tl.int64)[:, None] * stride_cm + ns[None, :] * stride_cn
        tl.store(c, _bf16(acc, UPCAST), mask=(ms < M)[:, None] & (ns < N)[None, :])


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
    """``swiglu.kernels.moe.launch_pairs`` (one A buffer) through ``moe_down_persistent_kernel``."""
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
        gate if dgu is None else dgu,
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
        IN_PLACE=dgu is None,
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
