"""Triton kernels for the SwiGLU MLP backward on Hopper (sm_90): persistent TMA GEMMs.

Three launches compute the four gradients (T tokens, H = hidden_size, I = intermediate_size):

1. ``dswiglu_gemm_kernel``: ``g = grad_output @ down_weight`` [T, I] with the SwiGLU backward in
   its epilogue; ``g`` never touches memory. Writes ``d_gate``, ``d_up`` and
   ``h = activated_gate * up_output`` (the B operand of grad_down_weight), all [T, I] bf16.
2. ``grad_weight_kernel``, launched three times: ``grad_down_weight = grad_output.T @ h``
   ([H, I]), then ``grad_gate_weight = d_gate.T @ x`` and ``grad_up_weight = d_up.T @ x`` ([I, H]).
3. ``grad_x_kernel``: ``grad_x = d_gate @ gate_weight + d_up @ up_weight`` [T, H], one fp32
   accumulator over both products (two K loops), no concatenated tensors. Where its last wave
   would leave most SMs idle, ``grad_x_split_tail_kernel`` splits that wave's tiles over K.

Every operand moves through host-side TMA tensor descriptors (out-of-bounds loads are zero-filled
and out-of-bounds stores dropped, so token counts that are not tile multiples are exact at the
edges). Tile coordinates are int32 per dimension, fine for any tensor the hardware can address.
Every output element is written once by one program, and the only atomic (the split-tail
grad_x's arrival count) chooses which program adds the fp32 runs, not their order: results are
bitwise reproducible.

Under ``TRITON_INTERPRET=1`` (CPU tests) bf16 arithmetic is wrong in the interpreter
(docs/triton-on-cpu.md), so the ``UPCAST`` constexpr converts every tile to fp32 before
``tl.dot``; compiled GPU code keeps bf16 operands.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _f32(x, UPCAST: tl.constexpr):
    """bf16 -> fp32 (exact). The interpreter converts bf16 subnormals (|v| < 2**-126) wrongly, so
    there the bits are moved instead: a bf16 is the top half of the fp32 with the same value."""
    if UPCAST:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(_f32(a, UPCAST), _f32(b, UPCAST), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _bf16(x, UPCAST: tl.constexpr):
    """fp32 -> bf16, round to nearest even. The interpreter truncates plain casts and converts
    subnormals wrongly, so there the whole conversion is done on the bit pattern: adding 0x7FFF
    plus the kept part's lowest bit rounds to nearest even for normals, subnormals (same linear
    bit layout in both formats) and overflow to inf alike; NaN is kept a (quiet) NaN."""
    if UPCAST:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        bits = tl.where(x == x, rounded, bits | 0x400000) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _pdl_start(PDL: tl.constexpr):
    """With programmatic dependent launch (``launch.PDL`` 1 or 2): wait until the previous kernel
    on the stream has finished and its writes are visible (before any global memory access, reads
    and writes alike: a freed buffer may be reused); mode 1 then lets the next kernel launch."""
    if PDL:
        gdc_wait()
    if PDL == 1:
        gdc_launch_dependents()


@triton.jit
def _pdl_end(PDL: tl.constexpr):
    """PDL mode 2: let the next kernel launch once this program's tiles are done."""
    if PDL == 2:
        gdc_launch_dependents()


@triton.jit
def _tile_mn(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row-tiles sweep the columns together, so the B panel they share
    stays in L2 (Triton matmul tutorial)."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % group_m
    pid_n = (tile % per_group) // group_m
    return pid_m, pid_n


@triton.jit
def _tile_grid(M, N, BM: tl.constexpr, BN: tl.constexpr):
    """(num_m, num_n): the BM x BN tiles covering an [M, N] output."""
    return tl.cdiv(M, BM), tl.cdiv(N, BN)


@triton.jit
def _tile_offsets(tile, num_m, num_n, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(off_m, off_n): the first row and column of ``tile``, in ``_tile_mn``'s grouped order."""
    pid_m, pid_n = _tile_mn(tile, num_m, num_n, GROUP_M)
    return pid_m * BM, pid_n * BN


@triton.jit
def _halves(x, BN: tl.constexpr):
    """The column halves of a [rows, BN] tile (an epilogue's pieces)."""
    return tl.split(tl.permute(tl.reshape(x, (x.shape[0], 2, BN // 2)), (0, 2, 1)))


@triton.jit
def _mainloop(
    a_desc,
    b_desc,
    off_m,
    off_n,
    K,
    acc,
    A_TRANS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """acc += A[off_m:off_m+BM, :K] @ B[:K, off_n:off_n+BN]; A is stored [K, M] when A_TRANS."""
    for k in tl.range(0, tl.cdiv(K, BK)):
        off_k = k * BK
        if A_TRANS:
            a = tl.trans(a_desc.load([off_k, off_m]))
        else:
            a = a_desc.load([off_m, off_k])
        b = b_desc.load([off_k, off_n])
        acc = _dot(a, b, acc, UPCAST)
    return acc


@triton.jit
def _store_split(c_desc, acc, off_m, off_n, BN: tl.constexpr, EPI_SPLIT: tl.constexpr, UPCAST: tl.constexpr):
    """Store an fp32 tile as bf16 in EPI_SPLIT column pieces (less shared memory for the store)."""
    if EPI_SPLIT == 1:
        c_desc.store([off_m, off_n], _bf16(acc, UPCAST))
    else:
        a0, a1 = _halves(acc, BN)
        if EPI_SPLIT == 2:
            c_desc.store([off_m, off_n], _bf16(a0, UPCAST))
            c_desc.store([off_m, off_n + BN // 2], _bf16(a1, UPCAST))
        else:
            a00, a01 = _halves(a0, BN // 2)
            a10, a11 = _halves(a1, BN // 2)
            c_desc.store([off_m, off_n], _bf16(a00, UPCAST))
            c_desc.store([off_m, off_n + BN // 4], _bf16(a01, UPCAST))
            c_desc.store([off_m, off_n + BN // 2], _bf16(a10, UPCAST))
            c_desc.store([off_m, off_n + 3 * BN // 4], _bf16(a11, UPCAST))


@triton.jit
def _activated_gate(gate, UPCAST: tl.constexpr):
    """activated_gate = bf16(silu(gate)) from fp32 gate values (themselves bf16-exact). The one
    silu formula of the Triton path: the forward epilogues and the memory-lean backward both call
    it, so the backward's recomputed values are bitwise the forward's."""
    return _bf16(gate * tl.sigmoid(gate), UPCAST)


@triton.jit
def _dswiglu_piece(
    acc,
    gate_desc,
    up_desc,
    act_desc,
    dgate_desc,
    dup_desc,
    h_desc,
    off_m,
    off_n,
    UPCAST: tl.constexpr,
    RECOMPUTE_ACT: tl.constexpr = False,
):
    """SwiGLU backward on one [BM, BN/EPI_SPLIT] piece of g, in the reference's bf16 rounding
    order (docs/problem.md steps 2-4): g, d_act, d_up, d_gate and h are each rounded to
    bf16 where the reference's bf16 tensors are. RECOMPUTE_ACT: activated_gate is not read
    (act_desc unused) but recomputed from the gate values loaded here (memory-lean mode)."""
    g = _f32(_bf16(acc, UPCAST), UPCAST)
    gate = _f32(gate_desc.load([off_m, off_n]), UPCAST)
    up = _f32(up_desc.load([off_m, off_n]), UPCAST)
    if RECOMPUTE_ACT:
        act = _f32(_activated_gate(gate, UPCAST), UPCAST)
    else:
        act = _f32(act_desc.load([off_m, off_n]), UPCAST)
    d_act = _f32(_bf16(g * up, UPCAST), UPCAST)
    dup_desc.store([off_m, off_n], _bf16(g * act, UPCAST))
    s = tl.sigmoid(gate)
    dgate_desc.store([off_m, off_n], _bf16(d_act * s * (1.0 + gate * (1.0 - s)), UPCAST))
    h_desc.store([off_m, off_n], _bf16(act * up, UPCAST))


@triton.jit
def dswiglu_gemm_kernel(
    go_desc,
    down_desc,  # grad_output [T, H], down_weight [H, I]
    gate_desc,
    up_desc,
    act_desc,  # gate_output, up_output, activated_gate [T, I]
    dgate_desc,
    dup_desc,
    h_desc,  # outputs [T, I]
    T,
    H,
    I,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FLATTEN: tl.constexpr,
    UPCAST: tl.constexpr,
    RECOMPUTE_ACT: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    num_m, num_n = _tile_grid(T, I, BM, BN)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        off_m, off_n = _tile_offsets(tile, num_m, num_n, BM, BN, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc = _mainloop(go_desc, down_desc, off_m, off_n, H, acc, False, BM, BN, BK, UPCAST)
        if EPI_SPLIT == 1:
            _dswiglu_piece(acc, gate_desc, up_desc, act_desc, dgate_desc, dup_desc, h_desc, off_m, off_n, UPCAST, RECOMPUTE_ACT)
        else:
            a0, a1 = _halves(acc, BN)
            if EPI_SPLIT == 2:
                _dswiglu_piece(
                    a0, gate_desc, up_desc, act_desc, dgate_desc, dup_desc, h_desc, off_m, off_n, UPCAST, RECOMPUTE_ACT
                )
                _dswiglu_piece(
                    a1, gate_desc, up_desc, act_desc, dgate_desc, dup_desc, h_desc, off_m, off_n + BN // 2, UPCAST, RECOMPUTE_ACT
                )
            else:
                a00, a01 = _halves(a0, BN // 2)
                a10, a11 = _halves(a1, BN // 2)
                _dswiglu_piece(
                    a00, gate_desc, up_desc, act_desc, dgate_desc, dup_desc, h_desc, off_m, off_n, UPCAST, RECOMPUTE_ACT
                )
                _dswiglu_piece(
                    a01, gate_desc, up_desc, act_desc, dgate_desc, dup_desc, h_desc, off_m, off_n + BN // 4, UPCAST, RECOMPUTE_ACT
                )
                _dswiglu_piece(
                    a10, gate_desc, up_desc, act_desc, dgate_desc, dup_desc, h_desc, off_m, off_n + BN // 2, UPCAST, RECOMPUTE_ACT
                )
                _dswiglu_piece(
                    a11,
                    gate_desc,
                    up_desc,
                    act_desc,
                    dgate_desc,
                    dup_desc,
                    h_desc,
                    off_m,
                    off_n + 3 * BN // 4,
                    UPCAST,
                    RECOMPUTE_ACT,
                )
    _pdl_end(PDL)


@triton.jit
def grad_weight_kernel(
    a_desc,  # A [K, M] (d_gate, d_up or grad_output), used transposed; rows >= K read as zeros
    b_desc,  # B [K, N] (x or h); rows >= K read as zeros
    c_desc,  # output C [M, N]
    c_ptr,  # the same output as a pointer (row stride N), for TMA_STORE=False
    M,
    N,
    K_PAD,
    NUM_PROGRAMS,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FLATTEN: tl.constexpr,
    TMA_STORE: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """C = A.T @ B (a weight gradient: K = tokens, rounded up to BK by the launcher; the
    descriptors zero-fill the rows past the real K)."""
    _pdl_start(PDL)
    num_m, num_n = _tile_grid(M, N, BM, BN)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        off_m, off_n = _tile_offsets(tile, num_m, num_n, BM, BN, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc = _mainloop(a_desc, b_desc, off_m, off_n, K_PAD, acc, True, BM, BN, BK, UPCAST)
        if TMA_STORE:
            _store_split(c_desc, acc, off_m, off_n, BN, EPI_SPLIT, UPCAST)
        else:
            # Plain stores do not wait for completion: the next tile's loads start at once, which
            # matters when K (tokens) is small and the kernel is bound by writing C.
            rm = off_m + tl.arange(0, BM)
            rn = off_n + tl.arange(0, BN)
            ptrs = c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :]
            tl.store(ptrs, _bf16(acc, UPCAST), mask=(rm[:, None] < M) & (rn[None, :] < N))
    _pdl_end(PDL)


@triton.jit
def _grad_x_tile(
    dgate_desc,
    dup_desc,
    gw_desc,
    uw_desc,
    gx_desc,
    tile,
    num_m,
    num_n,
    I,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One whole grad_x tile: both K loops into one fp32 accumulator, then its bf16 store."""
    off_m, off_n = _tile_offsets(tile, num_m, num_n, BM, BN, GROUP_M)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc = _mainloop(dgate_desc, gw_desc, off_m, off_n, I, acc, False, BM, BN, BK, UPCAST)
    acc = _mainloop(dup_desc, uw_desc, off_m, off_n, I, acc, False, BM, BN, BK, UPCAST)
    _store_split(gx_desc, acc, off_m, off_n, BN, EPI_SPLIT, UPCAST)


@triton.jit
def grad_x_kernel(
    dgate_desc,
    dup_desc,  # [T, I]
    gw_desc,
    uw_desc,  # gate_weight, up_weight [I, H]
    gx_desc,  # grad_x [T, H]
    T,
    H,
    I,
    NUM_PROGRAMS,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FLATTEN: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    num_m, num_n = _tile_grid(T, H, BM, BN)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        _grad_x_tile(
            dgate_desc, dup_desc, gw_desc, uw_desc, gx_desc, tile, num_m, num_n, I, BM, BN, BK, GROUP_M, EPI_SPLIT, UPCAST
        )
    _pdl_end(PDL)


@triton.jit
def _grad_x_steps(
    dgate_desc, dup_desc, gw_desc, uw_desc, off_m, off_n, k0, k1, K_STEPS, acc, BK: tl.constexpr, UPCAST: tl.constexpr
):
    """acc += k-steps [k0, k1) of one grad_x tile: steps below K_STEPS over (d_gate, gate_weight),
    the rest over (d_up, up_weight)."""
    for k in tl.range(k0, tl.minimum(k1, K_STEPS)):
        acc = _dot(dgate_desc.load([off_m, k * BK]), gw_desc.load([k * BK, off_n]), acc, UPCAST)
    for k in tl.range(tl.maximum(k0, K_STEPS), k1):
        off_k = (k - K_STEPS) * BK
        acc = _dot(dup_desc.load([off_m, off_k]), uw_desc.load([off_k, off_n]), acc, UPCAST)
    return acc


@triton.jit
def grad_x_split_tail_kernel(
    dgate_desc,
    dup_desc,  # [T, I]
    gw_desc,
    uw_desc,  # gate_weight, up_weight [I, H]
    gx_desc,  # grad_x [T, H]
    ws_ptr,  # fp32 [tail * SPLITS, BM, BN]: the runs of the last tiles
    count_ptr,  # int32 [tail], zeros: the runs of each last tile done so far
    T,
    H,
    I,
    NUM_PROGRAMS,
    SPLITS,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FLATTEN: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """``grad_x_kernel``'s result with its last partial wave split over K. The whole waves run as
    in ``grad_x_kernel`` (one tile per program per wave); each of the ``tail = tiles %
    NUM_PROGRAMS`` tiles left is split into SPLITS runs of k-steps, one per program (tail * SPLITS
    <= NUM_PROGRAMS), so the last wave keeps most SMs busy instead of ``tail``. Each run's fp32 sum
    goes to its own ``ws_ptr`` slot; the program that counts a tile's last arrival adds its
    SPLITS runs in run order (the same bits whichever program arrives last: deterministic for a
    given NUM_PROGRAMS and SPLITS) and stores the tile. Every output element is written once."""
    _pdl_start(PDL)
    pid = tl.program_id(0)
    num_m, num_n = _tile_grid(T, H, BM, BN)
    tiles = num_m * num_n
    tail = tiles % NUM_PROGRAMS
    for tile in tl.range(pid, tiles - tail, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        _grad_x_tile(
            dgate_desc, dup_desc, gw_desc, uw_desc, gx_desc, tile, num_m, num_n, I, BM, BN, BK, GROUP_M, EPI_SPLIT, UPCAST
        )
    if pid < tail * SPLITS:
        local = pid // SPLITS
        run = pid % SPLITS
        k_steps = tl.cdiv(I, BK)
        off_m, off_n = _tile_offsets(tiles - tail + local, num_m, num_n, BM, BN, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc = _grad_x_steps(
            dgate_desc,
            dup_desc,
            gw_desc,
            uw_desc,
            off_m,
            off_n,
            run * 2 * k_steps // SPLITS,
            (run + 1) * 2 * k_steps // SPLITS,
            k_steps,
            acc,
            BK,
            UPCAST,
        )
        tile_elems = BM * BN
        offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        tl.store(ws_ptr + pid.to(tl.int64) * tile_elems + offs, acc)
        # Every thread's run stored before one thread's release (CUTLASS's arrive_inc).
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + local, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            tl.debug_barrier()  # the acquire seen by every thread before they read the other runs
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            first = (local * SPLITS).to(tl.int64)
            for r in tl.range(0, SPLITS):
                acc += tl.load(ws_ptr + (first + r) * tile_elems + offs, cache_modifier=".cg")
            _store_split(gx_desc, acc, off_m, off_n, BN, EPI_SPLIT, UPCAST)
    _pdl_end(PDL)


# --------------------------------------------------------------------------- forward
#
# The forward's gate/up projections and the SwiGLU product, for the memory-lean training mode:
# ``swiglu.kernels.forward`` launches these (down_proj stays a cuBLAS GEMM). Both epilogues compute
# activated_gate with ``_activated_gate``, the formula the backward's RECOMPUTE_ACT epilogue uses.


@triton.jit
def _swiglu_forward_piece(
    acc_gate, acc_up, gate_desc, up_desc, act_desc, h_desc, off_m, off_n, STORE_ACT: tl.constexpr, UPCAST: tl.constexpr
):
    """Round the two fp32 projections to bf16, store them (saved for the backward), and store
    h = bf16(bf16(silu(gate)) * up), the nn.Linear module's rounding order; activated_gate too
    when STORE_ACT."""
    gate = _bf16(acc_gate, UPCAST)
    up = _bf16(acc_up, UPCAST)
    gate_desc.store([off_m, off_n], gate)
    up_desc.store([off_m, off_n], up)
    act = _activated_gate(_f32(gate, UPCAST), UPCAST)
    if STORE_ACT:
        act_desc.store([off_m, off_n], act)
    h_desc.store([off_m, off_n], _bf16(_f32(act, UPCAST) * _f32(up, UPCAST), UPCAST))


@triton.jit
def swiglu_forward_kernel(
    x_desc,  # x [T, H], block [BM, BK]
    gw_desc,
    uw_desc,  # gate_weight, up_weight [I, H], block [BN, BK] (B = W.T, read K-major)
    gate_desc,
    up_desc,
    act_desc,
    h_desc,  # outputs [T, I], block [BM, BN // EPI_SPLIT]
    T,
    H,
    I,
    NUM_PROGRAMS,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FLATTEN: tl.constexpr,
    STORE_ACT: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """gate_output = x @ gate_weight.T and up_output = x @ up_weight.T for one [BM, BN] tile
    each (two fp32 accumulators sharing the x tile), then ``_swiglu_forward_piece``
    (activated_gate is written only when STORE_ACT; act_desc is unused otherwise)."""
    _pdl_start(PDL)
    num_m, num_n = _tile_grid(T, I, BM, BN)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        off_m, off_n = _tile_offsets(tile, num_m, num_n, BM, BN, GROUP_M)
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k in tl.range(0, tl.cdiv(H, BK)):
            off_k = k * BK
            a = x_desc.load([off_m, off_k])
            acc_g = _dot(a, tl.trans(gw_desc.load([off_n, off_k])), acc_g, UPCAST)
            acc_u = _dot(a, tl.trans(uw_desc.load([off_n, off_k])), acc_u, UPCAST)
        if EPI_SPLIT == 1:
            _swiglu_forward_piece(acc_g, acc_u, gate_desc, up_desc, act_desc, h_desc, off_m, off_n, STORE_ACT, UPCAST)
        else:
            g0, g1 = _halves(acc_g, BN)
            u0, u1 = _halves(acc_u, BN)
            _swiglu_forward_piece(g0, u0, gate_desc, up_desc, act_desc, h_desc, off_m, off_n, STORE_ACT, UPCAST)
            _swiglu_forward_piece(g1, u1, gate_desc, up_desc, act_desc, h_desc, off_m, off_n + BN // 2, STORE_ACT, UPCAST)
    _pdl_end(PDL)


@triton.jit
def swiglu_product_kernel(
    gate_ptr,
    up_ptr,
    act_ptr,
    h_ptr,
    numel,
    BLOCK: tl.constexpr,
    STORE_ACT: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """h = bf16(bf16(silu(gate)) * up) elementwise over contiguous [T, I] bf16 tensors: the
    forward's cuBLAS path (where the fused kernel does not win), same formula as its epilogue;
    activated_gate is written too when STORE_ACT."""
    _pdl_start(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    gate = _f32(tl.load(gate_ptr + offs, mask=mask, other=0.0), UPCAST)
    up = _f32(tl.load(up_ptr + offs, mask=mask, other=0.0), UPCAST)
    act = _activated_gate(gate, UPCAST)
    if STORE_ACT:
        tl.store(act_ptr + offs, act, mask=mask)
    tl.store(h_ptr + offs, _bf16(_f32(act, UPCAST) * up, UPCAST), mask=mask)
    _pdl_end(PDL)
