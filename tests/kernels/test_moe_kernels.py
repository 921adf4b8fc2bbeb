"""``swiglu_moe``'s Triton path at small shapes: under TRITON_INTERPRET=1 on a CPU, on the GPU
when present.

Every output and gradient (and each expert's slice of the weight gradients) is checked against
the float64 oracle, bounded by the bf16 reference's own error (``moe_checks.failures``). The
kernel functions called directly (``swiglu.kernels.moe.moe_forward`` / ``moe_backward``, which skip
the CPU range check) run with every kernel output in a view of a larger NaN-filled buffer
(``guard_kernels``): a store outside its output changes the guards, and an element a kernel
should have written but did not stays NaN and would leak into the results; the inputs sit in
NaN-filled buffers too (an expert past the last, a row past the last), so a read out of bounds
poisons the results.
"""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import torch

import swiglu
import swiglu.kernels.moe as kmoe
from swiglu.moe import moe_float64, moe_reference

from moe_checks import (
    NAMES,
    assert_matches,
    binding_limit,
    bound_failure,
    check_impl,
    failures,
    fresh_seed,
    make_moe,
    oracle,
    run,
    same_rounding,
)

PAD = 64

# (T, H, I, E, k, routing kind, x's leading dims, routing-weight dtype, index dtype)
CASES = {
    "T13_balanced": (13, 64, 96, 4, 2, "balanced", None, torch.float32, torch.int64),
    "T20_skewed": (20, 64, 64, 8, 2, "skewed", None, torch.float32, torch.int32),
    "k1": (9, 32, 64, 4, 1, "balanced", None, torch.float32, torch.int64),
    "E64_T5": (5, 32, 32, 64, 2, "balanced", None, torch.float32, torch.int64),
    "E256_k8": (5, 32, 32, 256, 8, "balanced", None, torch.float32, torch.int64),  # DeepSeek-V3's E and k
    "T1": (1, 32, 64, 8, 4, "balanced", None, torch.float32, torch.int64),
    "all_on_one_expert": (11, 32, 64, 4, 1, "one", None, torch.float32, torch.int64),
    "duplicate_in_each_row": (6, 32, 32, 4, 3, "dup", None, torch.float32, torch.int64),
    "BSH_bf16_weights_int32": (10, 32, 64, 4, 2, "balanced", (2, 5), torch.bfloat16, torch.int32),
}


def _assert_untouched(inp, before, seed):
    for name, t, b in zip(("x", "top_k_index", "top_k_weights", "gate_up_proj", "down_proj", "grad_out"), inp.tensors(), before):
        assert torch.equal(t, b), f"seed={seed}: {name} was modified"


def _assert_no_alias(got, inp, seed):
    ptrs = {t.untyped_storage().data_ptr() for t in inp.tensors() if t.numel()}
    for name, g in zip(NAMES, got):
        if g.numel():
            assert g.untyped_storage().data_ptr() not in ptrs, f"seed={seed}: {name} aliases an input"


@pytest.mark.parametrize("case", list(CASES))
def test_against_float64(device, case):
    T, H, I, E, k, kind, lead, wdt, idt = CASES[case]
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, kind=kind, lead=lead, weights_dtype=wdt, index_dtype=idt, device=device)
    before = [t.clone() for t in inp.tensors()]
    got, ref = check_impl(inp, "triton", seed)
    _assert_untouched(inp, before, seed)
    _assert_no_alias(got, inp, seed)
    assert got[0].shape == inp.x.shape and got[0].dtype == inp.x.dtype
    assert got[2].shape == inp.top_k_weights.shape and got[2].dtype == wdt, "routing-weight gradient's dtype"
    empty = sorted(set(range(E)) - set(inp.top_k_index.unique().tolist()))
    for e in empty:  # an expert with no tokens: weight gradients exactly zero
        assert not got[3][e].count_nonzero() and not got[4][e].count_nonzero(), f"seed={seed}: expert {e}"
    if case == "all_on_one_expert":
        assert empty == [1, 2, 3]
    if case == "E64_T5":
        assert len(empty) >= 54
    if case == "E256_k8":
        assert len(empty) >= 216


@pytest.mark.parametrize("lead", [(0,), (2, 0)], ids=str)
def test_zero_tokens(device, lead):
    seed = fresh_seed()
    inp = make_moe(seed, 0, 32, 32, 4, 2, lead=lead, device=device)
    got = run(inp, "triton")
    assert got[0].shape == inp.x.shape and got[1].shape == inp.x.shape
    assert got[2].shape == inp.top_k_weights.shape
    for g, w in zip(got[3:], (inp.gate_up_proj, inp.down_proj)):
        assert g.shape == w.shape and g.dtype == w.dtype and not g.count_nonzero()


def test_repeated_runs_bitwise_equal(device):
    seed = fresh_seed()
    inp = make_moe(seed, 13, 32, 64, 4, 2, kind="skewed", device=device)
    first, second = run(inp, "triton"), run(inp, "triton")
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), f"seed={seed}: {name} differs between two runs"


def test_non_contiguous_inputs(device):
    """x, grad_out, top_k_index, top_k_weights and both expert weights as strided slices."""
    seed = fresh_seed()
    T, H, I, E, k = 7, 32, 64, 4, 2
    inp = make_moe(seed, T, H, I, E, k, device=device)
    wide = lambda t, dim: torch.cat([t, torch.randn_like(t.float()).to(t.dtype)], dim=dim)  # noqa: E731
    inp.x = wide(inp.x, 1)[:, :H]  # row stride 2H
    inp.grad_out = inp.grad_out.t().contiguous().t()  # column-major
    inp.top_k_index = torch.stack([inp.top_k_index, inp.top_k_index], dim=2)[:, :, 0]
    inp.top_k_weights = wide(inp.top_k_weights, 0)[:T]
    inp.top_k_weights = torch.stack([inp.top_k_weights, inp.top_k_weights], dim=2)[:, :, 1]
    inp.gate_up_proj = wide(inp.gate_up_proj, 2)[:, :, :H]
    inp.down_proj = wide(inp.down_proj, 0)[E:]
    assert not any(t.is_contiguous() for t in (inp.x, inp.grad_out, inp.top_k_index, inp.top_k_weights, inp.gate_up_proj))
    check_impl(inp, "triton", seed)


def test_transposed_expert_weights(device, monkeypatch):
    """Aria's layout: gate_up_proj stored [E, H, 2I] and down_proj [E, I, H], passed as their
    ``mT``. Every output and gradient against the oracle, the weight gradients in the weights' own
    strides, and every GEMM given that memory in its own order (TMA boxes of it in the up and
    dSwiGLU GEMMs, B's other form in the down projection and grad_x, the transposed product written
    contiguous in the weight gradients), no strided expert weight."""
    seed = fresh_seed()
    inp = make_moe(seed, 13, 64, 96, 4, 2, device=device)
    inp.gate_up_proj = inp.gate_up_proj.mT.contiguous().mT
    inp.down_proj = inp.down_proj.mT.contiguous().mT
    strided = []
    launch = kmoe._launch

    def spy(kernel, grid, num_warps, num_stages, *args, **meta):
        if kernel in (kmoe.moe_up_kernel, kmoe.moe_down_kernel, kmoe.moe_dswiglu_kernel, kmoe.moe_wgrad_kernel):
            strided.append(any(isinstance(a, torch.Tensor) and a.dim() == 3 and not a.is_contiguous() for a in args))
        return launch(kernel, grid, num_warps, num_stages, *args, **meta)

    monkeypatch.setattr(kmoe, "_launch", spy)
    got, _ = check_impl(inp, "triton", seed)
    assert got[3].stride() == inp.gate_up_proj.stride() and got[4].stride() == inp.down_proj.stride()
    assert len(strided) >= 4 and not any(strided), strided  # up, down, dSwiGLU, grad_x at least


# --------------------------------------------------------------------------- the kernel functions directly

#: Each kernel's output arguments, passed as NaN (integers: their lowest value) before the launch.
KERNEL_OUTPUTS = {
    "moe_count_kernel": ("counts_ptr",),
    "moe_order_kernel": ("order_ptr", "expert_start_ptr"),
    "moe_up_kernel": ("gate_ptr", "up_ptr", "h_ptr"),
    "moe_down_kernel": ("y_ptr",),
    "moe_dswiglu_kernel": ("dgu_ptr", "hw_ptr", "part_ptr"),
    "moe_wgrad_kernel": ("c_ptr",),
    "moe_gather_kernel": ("dst_ptr",),
    "moe_combine_kernel": ("out_ptr", "gw_ptr"),
}


def _fill(dtype):
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


def _intact(guard):
    return torch.isnan(guard).all() if guard.dtype.is_floating_point else (guard == _fill(guard.dtype)).all()


class _Guarded:
    """A kernel whose outputs are passed as views (with their strides) of NaN-filled (integers:
    lowest-value-filled) buffers with PAD guard elements on each side, copied back after the
    launch; the guards must be unchanged."""

    def __init__(self, kernel, outputs, launches):
        self.kernel, self.outputs, self.launches = kernel, outputs, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            args = list(args)
            names = self.kernel.arg_names
            copies = []
            for name in self.outputs:
                i = names.index(name)
                t = args[i]
                if t is None:  # an output this launch does not write (e.g. the forward's gw)
                    continue
                # The span of t's elements (d_gate, d_up: the halves of a [S, 2I] buffer, rows of 2I).
                span = sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1 if t.numel() else 0
                buf = torch.full((span + 2 * PAD,), _fill(t.dtype), dtype=t.dtype, device=t.device)
                view = buf[PAD : PAD + span].as_strided(t.shape, t.stride())
                args[i] = view
                copies.append((name, t, view, buf))
            self.kernel[grid](*args, **kwargs)
            for name, t, view, buf in copies:
                assert _intact(buf[:PAD]) and _intact(buf[-PAD:]), f"{self.kernel.fn.__name__}: store outside {name}"
                t.copy_(view)
            self.launches.append(self.kernel.fn.__name__)

        return launch


@pytest.fixture
def guard_kernels(monkeypatch):
    launches = []
    for name, outs in KERNEL_OUTPUTS.items():
        monkeypatch.setattr(kmoe, name, _Guarded(getattr(kmoe, name), outs, launches))
    return launches


def test_gpu_routing_blocks_stay_in_their_chunk(monkeypatch):
    """The GPU's counting-sort blocks (the interpreter uses others): a sub-block never runs past its
    chunk (SUB <= CHUNK, CHUNK a multiple of SUB), at most 256 chunks, every expert and the
    out-of-range key have a bin. With SUB > CHUNK (once, at E < 8) a chunk counted its
    neighbours' pairs."""
    monkeypatch.setattr(kmoe, "INTERPRET", False)
    for E in (1, 2, 3, 7, 8, 15, 64, 128, 256, 384):
        for S in (1, 255, 256, 400, 4096, 65536, 1 << 20, 5 << 20):
            chunk, sub, e_pad = kmoe._route_blocks(S, E)
            assert sub <= chunk and chunk % sub == 0 and -(-S // chunk) <= 256 and e_pad > E, (E, S, chunk, sub, e_pad)


@pytest.mark.parametrize("E", [3, 8, 64, 256])
def test_routing_is_a_stable_sort_by_expert(device, E):
    """``Routing``'s counting sort (several chunks and sub-blocks under the interpreter) against
    torch's stable sort, ids outside [0, E) sorting last in pair order; expert_start the counts'
    exclusive prefix sums."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    for T, k in ((1, 1), (37, 2), (50, 8)):
        idx = torch.randint(-2, E + 2, (T, k), generator=gen)
        idx[torch.rand(T, k, generator=gen) < 0.3] = E // 3  # a crowded expert
        idx = idx.to(device=device, dtype=torch.int32 if E % 2 else torch.int64)
        r = kmoe.Routing(idx, E)
        flat = idx.reshape(-1).long().cpu()
        key = torch.where((flat >= 0) & (flat < E), flat, E)
        want = torch.sort(key, stable=True).indices
        assert torch.equal(r.order.long().cpu(), want), f"seed={seed} T={T} k={k}: order"
        counts = torch.bincount(key, minlength=E + 1)[:E]
        start = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        assert torch.equal(r.expert_start.long().cpu(), start), f"seed={seed} T={T} k={k}: expert_start"


def _poisoned(t, before=1, after=1):
    """t in the middle of a NaN-filled buffer with ``before`` / ``after`` extra slices of dim 0."""
    buf = torch.full((t.shape[0] + before + after, *t.shape[1:]), float("nan"), dtype=t.dtype, device=t.device)
    buf[before : before + t.shape[0]] = t
    return buf[before : before + t.shape[0]]


def _direct(inp, x, idx, w, gu, dp, go):
    out, gate, up, _ = kmoe.moe_forward(x, idx, w, gu, dp)
    return (out, *kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up))


def _reference(x, idx, w, gu, dp, go):
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, gu, dp)]
    out = moe_reference(leaves[0], idx, leaves[1], leaves[2], leaves[3])
    out.backward(go)
    return (out.detach(), *(t.grad for t in leaves))


@pytest.mark.parametrize("kind", ["some", "all"])
def test_direct_out_of_range_ids_are_skipped(device, guard_kernels, kind):
    """Ids >= E or negative contribute nothing, get a zero routing-weight gradient, and no kernel
    reads or writes out of bounds; every other pair matches the oracle (which skips them too)."""
    seed = fresh_seed()
    T, H, I, E, k = 9, 32, 64, 4, 3
    inp = make_moe(seed, T, H, I, E, k, device=device)
    x, idx, w, gu, dp, go = inp.flat()
    idx = idx.clone()
    gen = torch.Generator().manual_seed(seed)
    bad = torch.rand(T, k, generator=gen) < 0.4 if kind == "some" else torch.ones(T, k, dtype=torch.bool)
    bad[0, 0] = True
    choices = torch.tensor([-1, -7, E, E + 1, 1 << 20])
    idx[bad] = choices[torch.randint(len(choices), (int(bad.sum()),), generator=gen)].to(device)
    with pytest.raises(ValueError, match="top_k_index"):  # the public op's CPU check
        swiglu.swiglu_moe(inp.x.cpu(), idx.cpu(), w.cpu(), gu.cpu(), dp.cpu(), impl="reference")
    args = (_poisoned(x), idx, _poisoned(w), _poisoned(gu), _poisoned(dp), _poisoned(go))
    got = _direct(inp, *args)
    assert set(guard_kernels) >= set(KERNEL_OUTPUTS) - ({"moe_up_kernel"} if kind == "all" else set())
    assert torch.equal(got[2][bad], torch.zeros_like(got[2][bad])), f"seed={seed}: gradient of a skipped pair"
    if kind == "all":
        for name, g in zip(NAMES, got):
            assert not g.count_nonzero(), f"seed={seed}: {name} nonzero with every id out of range"
        return
    o = moe_float64(x, idx, w, gu, dp, go)
    o_zeroed = moe_float64(x, idx.clamp(0, E - 1), w.masked_fill(bad.to(w.device), 0), gu, dp, go)
    for name, a, b in zip(NAMES, o, o_zeroed):  # the oracle skips them: as if their weights were zero
        if name == "grad_top_k_weights":
            a, b = a[~bad], b[~bad]
        assert torch.allclose(a, b), name
    # the scale check against the kernels' roundings: an expert left with one or two pairs has a
    # rank-1 or -2 gradient, where the bf16 reference's other roundings of h are no baseline
    same = same_rounding(dataclasses.replace(inp, top_k_index=idx))
    assert_matches(got, _reference(x, idx, w, gu, dp, go), o, seed, same)


def test_rows_grouped_by_expert_as_k_1_with_unit_weights(device):
    """docs/moe.md's recipe for rows already grouped by expert (an all-to-all's output): ids from
    the counts by ``searchsorted``, k = 1, weights of one. The sort keeps the rows' order (the
    identity), and every output and gradient passes the oracle check, an expert without rows
    among them."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    H, I, E = 32, 48, 5
    counts = torch.randint(1, 9, (E,), generator=gen)
    counts[int(torch.randint(E, (1,), generator=gen))] = 0
    T = int(counts.sum())
    idx = torch.searchsorted(counts.cumsum(0), torch.arange(T), right=True)[:, None]
    inp = make_moe(seed, T, H, I, E, 1, device=device)
    inp = dataclasses.replace(inp, top_k_index=idx.to(device), top_k_weights=torch.ones(T, 1, device=device))
    order = kmoe.Routing(inp.top_k_index, E).order
    assert torch.equal(order.cpu(), torch.arange(T, dtype=order.dtype)), f"seed={seed}: the sort moved grouped rows"
    check_impl(inp, "triton", seed)


def test_direct_matches_public_op_and_leaves_nothing_unwritten(device, guard_kernels):
    """With every intermediate buffer NaN before its kernel, the direct calls give finite results,
    bitwise the public op's."""
    seed = fresh_seed()
    inp = make_moe(seed, 14, 32, 64, 8, 2, kind="skewed", device=device)
    x, idx, w, gu, dp, go = inp.flat()
    got = _direct(inp, _poisoned(x), idx, _poisoned(w), _poisoned(gu), _poisoned(dp), _poisoned(go))
    public = run(inp, "triton")
    for name, a, b in zip(NAMES, got, public):
        assert torch.isfinite(a).all() and torch.equal(a, b), f"seed={seed}: {name}"


def test_dswiglu_epilogue_in_two_pieces(device):
    """The dSwiGLU kernel's epilogue in two column pieces (``Tile.EPI_SPLIT = 2``): every
    elementwise output bitwise the one-piece epilogue's, so grad_x and the weight gradients are too;
    the routing-weight gradient (its row sums taken in two halves) against the oracle."""
    seed = fresh_seed()
    T, H, I, E, k = 13, 32, 96, 4, 2
    inp = make_moe(seed, T, H, I, E, k, kind="skewed", device=device)
    x, idx, w, gu, dp, go = inp.flat()
    out, gate, up, routing = kmoe.moe_forward(x, idx, w, gu, dp)
    plan = kmoe.moe_plan(T * k, E, H, I)
    assert plan.dswiglu.BN % 4 == 0
    plan, split = (dataclasses.replace(plan, dswiglu=dataclasses.replace(plan.dswiglu, EPI_SPLIT=n)) for n in (1, 2))
    one = kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan=plan)
    two = kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan=split)
    for name, a, b in zip(NAMES[1:], one, two):
        if name != "grad_top_k_weights":
            assert torch.equal(a, b), f"seed={seed}: {name}"
    assert_matches((out, *two), run(inp, "reference"), oracle(inp), seed, same_rounding(inp))


def _backward_buffer_peak(monkeypatch, *args, held=(), **kwargs):
    """``(grads, peak)``: ``kmoe.moe_backward(*args, **kwargs)`` and the peak bytes of the buffers
    it makes itself (every torch.empty / empty_like, tracked until freed), plus, at each of those
    allocations, the storage ``held`` tensors have then (the saved gate/up until released)."""
    live, peak = {}, [0]
    empty, empty_like = torch.empty, torch.empty_like

    def track(t):
        key = id(t)
        live[key] = t.untyped_storage().nbytes()
        peak[0] = max(peak[0], sum(live.values()) + sum(h.untyped_storage().nbytes() for h in held))
        weakref.finalize(t, live.pop, key, None)
        return t

    with monkeypatch.context() as m:
        m.setattr(torch, "empty", lambda *a, **kw: track(empty(*a, **kw)))
        m.setattr(torch, "empty_like", lambda *a, **kw: track(empty_like(*a, **kw)))
        grads = kmoe.moe_backward(*args, **kwargs)
    return grads, peak[0]


def test_backward_frees_each_buffer_after_its_last_reader(device, monkeypatch):
    """The backward's own buffers (every torch.empty / empty_like it makes, tracked until freed):
    their peak is that of the order grad_x (its [S, H] pieces freed), grad_gate_up_proj (d_gate|d_up
    and the [S, H] copy of x's rows freed), grad_down_proj (with its copy of grad_out's rows),
    below the peak of computing grad_down_proj first."""
    seed = fresh_seed()
    T, H, I, E, k = 16, 32, 64, 4, 2
    S = T * k
    inp = make_moe(seed, T, H, I, E, k, device=device)
    x, idx, w, gu, dp, go = inp.flat()
    out, gate, up, routing = kmoe.moe_forward(x, idx, w, gu, dp)
    grads, peak = _backward_buffer_peak(monkeypatch, go, x, idx, w, gu, dp, gate, up, routing=routing)
    b = 2  # bf16
    dgu, hw, dx_pairs, g_gu, g_dp = S * 2 * I * b, S * I * b, S * H * b, gu.numel() * b, dp.numel() * b
    part = S * (-(-I // kmoe.moe_plan(S, E, H, I).dswiglu.BN)) * 4
    outs = T * H * b + S * 4  # grad_x and the fp32 routing-weight gradient, made by the combine
    copy = S * H * b  # the weight gradients' operand in expert order (x's rows, then grad_out's)
    want = max(dgu + hw + part + dx_pairs + outs, dgu + hw + outs + g_gu + copy, hw + outs + g_gu + g_dp + copy)
    before = max(dgu + hw + part + g_dp + copy, dgu + part + g_dp + dx_pairs + g_gu)
    assert peak == want < before, (peak, want, before)
    assert_matches((out, *grads), run(inp, "reference"), oracle(inp), seed, same_rounding(inp))


TMA_SIZES = [(13, 64, 96, 4, 2), (7, 48, 40, 3, 2), (40, 32, 48, 3, 2)]


@pytest.mark.parametrize(
    "sizes, layout",
    [(s, "own") for s in TMA_SIZES]
    + [(s, "transposed interleaved") for s in TMA_SIZES]
    + [(TMA_SIZES[1], "transposed")],  # the plain transposed form: H % BK != 0 (pointer loads in the up projection)
)
def test_tma_and_pointer_loads_agree(device, sizes, layout, monkeypatch):
    """Weights, sorted rows (the down projections' A) and the weight gradients' operands read
    through TMA descriptors or through pointer loads give bitwise the same outputs and gradients;
    the second shape has K % BK != 0 (grad_x and dSwiGLU keep pointer loads for B; a transposed
    model's up projection too) and boxes wider than H and I (zero-filled); in the third an expert
    has full weight-gradient K steps and a tail (its box reaches the next expert's rows, which must
    not count). Transposed: the expert weights stored [E, H, 2I] / [E, I, H] (Aria's, gpt-oss's),
    boxes of that memory; interleaved: gate/up rows alternating (gpt-oss's)."""
    seed = fresh_seed()
    T, H, I, E, k = sizes
    inp = make_moe(seed, T, H, I, E, k, kind="skewed", device=device)
    if layout != "own":
        inp.gate_up_proj = inp.gate_up_proj.mT.contiguous().mT
        inp.down_proj = inp.down_proj.mT.contiguous().mT
    il = layout.endswith("interleaved")
    x, idx, w, gu, dp, go = inp.flat()
    plan = kmoe.moe_plan(T * k, E, H, I)
    ptr = plan.replace_tiles(TMA_A=False, TMA_B=False)
    got, b_t = [], {}
    launch = kmoe._launch

    def spy(kernel, grid, num_warps, num_stages, *args, **meta):
        if "B_T" in meta:
            b_t.setdefault(kernel.__name__, []).append(meta["B_T"])
        return launch(kernel, grid, num_warps, num_stages, *args, **meta)

    monkeypatch.setattr(kmoe, "_launch", spy)
    for p in (plan, ptr):
        out, gate, up, routing = kmoe.moe_forward(x, idx, w, gu, dp, plan=p, interleaved=il)
        grads = kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan=p, routing=routing, interleaved=il)
        got.append((out, *grads))
    # Boxes of a transposed model's own memory in the TMA plan (the up projection's where H % BK == 0).
    t = layout != "own"
    assert b_t == {"moe_up_kernel": [t and H % plan.up.BK == 0, False], "moe_dswiglu_kernel": [t, False]}, b_t
    for name, a, b in zip(NAMES, *got):
        assert torch.equal(a, b), f"seed={seed}: {name}"
    ref = run(inp, "reference", interleaved=il)
    assert_matches(got[0], ref, oracle(inp, interleaved=il), seed, same_rounding(inp, interleaved=il))


@pytest.mark.parametrize("sizes", [(24, 32, 48, 3, 2), (9, 32, 80, 4, 3)])
def test_tile_order_gives_the_same_bits(device, guard_kernels, sizes):
    """Every kernel's tiles in bands of GROUP_M M tiles (``Tile.GROUP_M``; the last band partial,
    bands across experts) write every output element once, bitwise the N-fastest order's, with
    every kernel output NaN before its launch (a tile left out stays NaN)."""
    seed = fresh_seed()
    T, H, I, E, k = sizes
    inp = make_moe(seed, T, H, I, E, k, kind="skewed", device=device)
    x, idx, w, gu, dp, go = inp.flat()
    got = []
    for g in (1, 4):
        t = kmoe.Tile(BN=16, BK=16, num_warps=4, num_stages=1, BM=16, GROUP_M=g)
        plan = kmoe.MoEPlan(up=t, down=t, dswiglu=t, grad_x=t, wgrad_gu=t, wgrad_dp=t)
        out, gate, up, routing = kmoe.moe_forward(x, idx, w, gu, dp, plan=plan)
        got.append((out, *kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan=plan, routing=routing)))
    for other in got[1:]:
        for name, a, b in zip(NAMES, got[0], other):
            assert torch.isfinite(b).all() and torch.equal(a, b), f"seed={seed}: {name}"
    assert_matches(got[0], run(inp, "reference"), oracle(inp), seed, same_rounding(inp))


@pytest.mark.parametrize("layout", ["own", "transposed"])
def test_half_tiles_give_the_same_bits(device, guard_kernels, layout):
    """The down projections' half tiles (``Tile.HALF``: an expert's last tile of <= BM / 2 rows run
    as a BM / 2 tile): expert counts with last tiles of exactly BM / 2 rows, one row more, a second
    tile of BM / 2 and of one row, and an expert without rows; bitwise the full tiles' outputs and
    gradients, every kernel output NaN before its launch (a row left out stays NaN) and guarded
    against stores outside it; with the op's weight layout and with Aria's transposed one (B read
    in its other form)."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    counts = torch.tensor([16, 17, 48, 33, 0])  # BM 32 below
    T, H, I, E = int(counts.sum()), 32, 48, len(counts)
    inp = make_moe(seed, T, H, I, E, 1, device=device)
    idx = torch.repeat_interleave(torch.arange(E), counts)[torch.randperm(T, generator=gen)][:, None]
    inp = dataclasses.replace(inp, top_k_index=idx.to(device))
    if layout == "transposed":
        inp = dataclasses.replace(
            inp, gate_up_proj=inp.gate_up_proj.mT.contiguous().mT, down_proj=inp.down_proj.mT.contiguous().mT
        )
    x, idx, w, gu, dp, go = inp.flat()
    base = kmoe.moe_plan(T, E, H, I)
    got = []
    for half in (False, True):
        t = kmoe.Tile(BN=16, BK=16, num_warps=4, num_stages=1, BM=32, TMA_A=not half, HALF=half)
        plan = dataclasses.replace(base, down=t, grad_x=dataclasses.replace(t, TMA_A=half))
        out, gate, up, routing = kmoe.moe_forward(x, idx, w, gu, dp, plan=plan)
        got.append((out, *kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan=plan, routing=routing)))
    for name, a, b in zip(NAMES, *got):
        assert torch.isfinite(b).all() and torch.equal(a, b), f"seed={seed}: {name}"
    assert_matches(got[1], run(inp, "reference"), oracle(inp), seed, same_rounding(inp))


# --------------------------------------------------------------------------- the checker catches planted bugs


def _scaled_weights(w, mask, factor):
    return torch.where(mask, w * factor, w)


def test_checker_rejects_one_expert_weight_gradient_scaled(device, monkeypatch):
    """One expert's grad_gate_up_proj 0.1% too large before its rounding (its pairs' routing
    weights scaled by 1.001 in fp32 inside the backward: the same scaling of the already rounded
    bf16 gradient would change nothing). The clean run passes; the planted one fails on that
    expert's slice."""
    seed = fresh_seed()
    E, target = 2, 1
    # 64 pairs per expert; hidden_size 128: at 64 the planted scale sat within 5 s.e. at some seeds
    # (721140822: 1.10e-3 against a limit of 1.17e-3; 0.95-2.2x the limit over 12 seeds, 1.6-2.2x at 128).
    inp = make_moe(seed, 64, 128, 128, E, 2, device=device)
    got, ref = check_impl(inp, "triton", seed)
    o, same = oracle(inp), same_rounding(inp)
    real = kmoe.moe_backward

    def planted(grad_out, x, top_k_index, top_k_weights, *rest, **kw):
        return real(grad_out, x, top_k_index, _scaled_weights(top_k_weights, top_k_index == target, 1.001), *rest, **kw)

    monkeypatch.setattr(kmoe, "moe_backward", planted)
    bad = run(inp, "triton")
    assert not torch.equal(bad[3][target], got[3][target])
    msg = bound_failure(f"grad_gate_up_proj[{target}]", bad[3][target], ref[3][target], o[3][target], same[3][target])
    assert msg is not None, f"seed={seed}: a 0.1% error in one expert's grad_gate_up_proj passed the check"
    assert any(m.startswith(f"grad_gate_up_proj[{target}]") for m in failures(bad, ref, o, same))


def test_checker_rejects_one_pair_output_scaled(device, monkeypatch):
    """One routed pair's output 0.1% too large before its rounding (its routing weight scaled by
    1.001 in fp32 inside the forward); that token's row of out is checked on its own, its scale
    against the kernels' own roundings (``same_rounding``: the bf16 reference's CPU GEMMs round
    otherwise on CPUs without AMX, by a few 1e-4 along the oracle at some seeds)."""
    seed = fresh_seed()
    T, H, I, E, k, t = 3, 4096, 32, 2, 1, 1  # a long row: the planted change is 4096 elements
    inp = make_moe(seed, T, H, I, E, k, device=device)
    x, idx, w, gu, dp, go = inp.flat()
    w = 0.3 + 0.7 * torch.rand(T, k, generator=torch.Generator().manual_seed(seed)).to(device)  # not 1 (k = 1)
    # The planted pair's weight far from short binary fractions: y is bf16 (256 mantissas), and near
    # 1/2 or 3/4 none of y * w * 1.001 rounded otherwise than y * w (about one seed in 40).
    w[t, 0] = 0.6180339887
    with torch.no_grad():
        ref = moe_reference(x, idx, w, gu, dp)
        got = swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton")
    o = moe_float64(x, idx, w, gu, dp)
    same = same_rounding(dataclasses.replace(inp, top_k_weights=w))[0]
    assert bound_failure("out", got, ref, o, same) is None, f"seed={seed}"
    assert bound_failure(f"out[{t}]", got[t], ref[t], o[t], same[t]) is None, f"seed={seed}"
    real = kmoe.moe_forward
    mask = torch.zeros(T, k, dtype=torch.bool, device=device)
    mask[t, 0] = True
    monkeypatch.setattr(kmoe, "moe_forward", lambda x, i, w, *a, **kw: real(x, i, _scaled_weights(w, mask, 1.001), *a, **kw))
    with torch.no_grad():
        bad = swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton")
    assert torch.equal(bad[0], got[0]) and not torch.equal(bad[t], got[t])
    assert bound_failure(f"out[{t}]", bad[t], ref[t], o[t], same[t]) is not None, (
        f"seed={seed}: a 0.1% error in one pair's output passed the check"
    )


# --------------------------------------------------------------------------- reuse_saved_buffers


@pytest.mark.parametrize("sizes", [(13, 64, 128, 4, 2), (13, 64, 96, 4, 2), (7, 48, 40, 3, 2), (40, 32, 48, 3, 2)])
def test_reuse_saved_buffers_gives_the_same_gradients(device, sizes):
    """``reuse_saved_buffers=True`` (the saved gate/up released after the dSwiGLU GEMM, the same
    kernels): bitwise the default's output and gradients, with every gradient and with x frozen."""
    seed = fresh_seed()
    inp = make_moe(seed, *sizes, kind="skewed", device=device)
    default = run(inp, "triton")
    reused = run(inp, "triton", reuse_saved_buffers=True)
    for name, a, b in zip(NAMES, default, reused):
        assert torch.equal(a, b), f"seed={seed}: {name}"
    x, idx, w, gu, dp, go = inp.flat()
    leaves = [t.clone().requires_grad_(True) for t in (w, gu, dp)]
    out = swiglu.swiglu_moe(x, idx, *leaves, impl="triton", reuse_saved_buffers=True)
    out.backward(go)
    for name, g, want in zip(NAMES[2:], (t.grad for t in leaves), reused[2:]):
        assert torch.equal(g.reshape(want.shape), want), f"seed={seed}: {name} with x frozen"


def test_reuse_saved_buffers_refuses_a_second_backward(device):
    """The first backward freed the saved gate/up: a second one through the same graph is a
    RuntimeError naming the option, never gradients from garbage; a non-bool is a TypeError."""
    inp = make_moe(fresh_seed(), 9, 32, 64, 4, 2, device=device)
    x, idx, w, gu, dp, go = inp.flat()
    leaves = [t.clone().requires_grad_(True) for t in (x, w, gu, dp)]
    out = swiglu.swiglu_moe(leaves[0], idx, *leaves[1:], impl="triton", reuse_saved_buffers=True)
    torch.autograd.grad(out, leaves, go, retain_graph=True)
    with pytest.raises(RuntimeError, match="reuse_saved_buffers"):
        torch.autograd.grad(out, leaves, go)
    with pytest.raises(TypeError, match="reuse_saved_buffers"):
        swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton", reuse_saved_buffers=1)


def test_reuse_saved_buffers_releases_gate_and_up_after_their_reader(device, monkeypatch):
    """With ``reuse``, the saved gate's and up's memory is released once the dSwiGLU GEMM (their
    one reader) is launched, so they are not alive at the later peaks: the backward's buffers
    plus gate/up peak at the default's terms less gate/up after dSwiGLU (many pairs, small
    weights: d_gate|d_up with the saved gate/up would set the peak)."""
    T, H, I, E, k = 64, 16, 64, 2, 2
    S, b = T * k, 2
    inp = make_moe(fresh_seed(), T, H, I, E, k, device=device)
    x, idx, w, gu, dp, go = inp.flat()
    peaks = []
    for reuse in (False, True):
        out, gate, up, routing = kmoe.moe_forward(x, idx, w, gu, dp)
        peaks.append(
            _backward_buffer_peak(monkeypatch, go, x, idx, w, gu, dp, gate, up, routing=routing, reuse=reuse, held=(gate, up))[1]
        )
        assert (gate.untyped_storage().nbytes() == 0) == reuse and (up.untyped_storage().nbytes() == 0) == reuse
    saved, dgu, hw, dx_pairs, g_gu, g_dp = S * 2 * I * b, S * 2 * I * b, S * I * b, S * H * b, gu.numel() * b, dp.numel() * b
    part = S * (-(-I // kmoe.moe_plan(S, E, H, I).dswiglu.BN)) * 4
    outs, copy = T * H * b + S * 4, S * H * b
    later = max(dgu + hw + part + dx_pairs + outs, dgu + hw + outs + g_gu + copy, hw + outs + g_gu + g_dp + copy)
    assert peaks == [saved + later, max(saved + dgu + hw + part, later)], peaks
    assert peaks[1] < peaks[0]


def test_reuse_saved_buffers_leaves_hooked_saved_tensors_alone(device):
    """Under a saved-tensor hook (here: pack a copy), the saved gate/up are not the forward's own:
    nothing is consumed, the gradients are the default's and the graph can be backpropagated
    again (as the dense op, which consumes only its own whole buffers)."""
    seed = fresh_seed()
    inp = make_moe(seed, 13, 64, 96, 4, 2, kind="skewed", device=device)
    x, idx, w, gu, dp, go = inp.flat()
    default = run(inp, "triton")
    leaves = [t.clone().requires_grad_(True) for t in (x, w, gu, dp)]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        out = swiglu.swiglu_moe(leaves[0], idx, *leaves[1:], impl="triton", reuse_saved_buffers=True)
    first = torch.autograd.grad(out, leaves, go, retain_graph=True)
    second = torch.autograd.grad(out, leaves, go)
    for name, a, b, want in zip(NAMES[1:], first, second, default[1:]):
        assert torch.equal(a.reshape(want.shape), want) and torch.equal(a, b), f"seed={seed}: {name}"


# --------------------------------------------------------------------------- swiglu_limit (clamped SwiGLU)


@pytest.mark.parametrize("sizes", [(13, 32, 48, 4, 2), (9, 64, 96, 3, 3)])
def test_swiglu_limit_against_the_oracle(device, sizes):
    """``swiglu_limit`` L (DeepSeek-V4's clamped SwiGLU): gate <= L and up in [-L, L] before the
    product, their gradients through where they were in range; with about a third of the values
    clamped, every output and gradient passes the oracle check (each expert's slice too)."""
    seed = fresh_seed()
    inp = make_moe(seed, *sizes, kind="skewed", device=device)
    limit = binding_limit(inp)
    got, _ = check_impl(inp, "triton", seed, swiglu_limit=limit)
    free = run(inp, "triton")
    assert not torch.equal(got[0], free[0]), f"seed={seed}: the limit {limit} clamped nothing"


def test_swiglu_limit_check_catches_a_backward_without_the_clamp(device):
    """The kernels' backward told no limit after a clamped forward (the clamp's gradient mask
    missing) fails the oracle check: the check sees the mask."""
    seed = fresh_seed()
    inp = make_moe(seed, 13, 32, 48, 4, 2, device=device)
    limit = binding_limit(inp)
    x, idx, w, gu, dp, go = inp.flat()
    out, gate, up, routing = kmoe.moe_forward(x, idx, w, gu, dp, swiglu_limit=limit)
    right = kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, routing=routing, swiglu_limit=limit)
    wrong = kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, routing=routing)
    ref, o, same = run(inp, "reference", swiglu_limit=limit), oracle(inp, limit), same_rounding(inp, limit)
    assert not failures((out, *right), ref, o, same), f"seed={seed}"
    assert failures((out, *wrong), ref, o, same), f"seed={seed}: a backward without the clamp passed"


@pytest.mark.parametrize("name", ["swiglu_limit", "swiglu_alpha"])
@pytest.mark.parametrize(
    "value, error, match",
    [(0.0, ValueError, "positive"), (-1.0, ValueError, "positive"), (float("inf"), ValueError, "finite"),
     (float("nan"), ValueError, "finite"), (1e300, ValueError, "finite in float32"), ("7", TypeError, "float or None"),
     (True, TypeError, "float or None")],
)  # fmt: skip
def test_swiglu_limit_and_alpha_bad_values(name, value, error, match):
    inp = make_moe(0, 4, 32, 48, 4, 2)
    with pytest.raises(error, match=f"{name}.*{match}"):
        swiglu.swiglu_moe(*inp.args(), impl="reference", **{name: value})


# --------------------------------------------------------------------------- swiglu_alpha (gpt-oss's form)


@pytest.mark.parametrize("sizes", [(13, 32, 48, 4, 2), (9, 64, 96, 3, 3)])
@pytest.mark.parametrize("limited", [False, True], ids=["alpha", "alpha_and_limit"])
def test_swiglu_alpha_against_the_oracle(device, sizes, limited):
    """``swiglu_alpha`` a (MiniMax-M3's and gpt-oss's activation, (up + 1) * gate * sigmoid(a *
    gate)), alone and with a binding ``swiglu_limit``: every output and gradient passes the oracle
    check (each expert's slice too); the result differs from the plain SwiGLU's."""
    seed = fresh_seed()
    inp = make_moe(seed, *sizes, kind="skewed", device=device)
    limit = binding_limit(inp) if limited else None
    got, _ = check_impl(inp, "triton", seed, swiglu_limit=limit, swiglu_alpha=1.702)
    plain = run(inp, "triton", swiglu_limit=limit)
    assert not torch.equal(got[0], plain[0]), f"seed={seed}: alpha changed nothing"


def test_swiglu_alpha_check_catches_a_backward_without_it(device):
    """The kernels' backward told no alpha after an alpha forward (plain SwiGLU's d_gate, d_up and
    h) fails the oracle check, and so does the reference told so: the check sees the form."""
    seed = fresh_seed()
    inp = make_moe(seed, 13, 32, 48, 4, 2, device=device)
    x, idx, w, gu, dp, go = inp.flat()
    out, gate, up, routing = kmoe.moe_forward(x, idx, w, gu, dp, swiglu_alpha=1.702)
    right = kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, routing=routing, swiglu_alpha=1.702)
    wrong = kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, routing=routing)
    ref, o, same = run(inp, "reference", swiglu_alpha=1.702), oracle(inp, None, 1.702), same_rounding(inp, None, 1.702)
    assert not failures((out, *right), ref, o, same), f"seed={seed}"
    assert failures((out, *wrong), ref, o, same), f"seed={seed}: a backward without alpha passed"
    assert failures(run(inp, "reference"), ref, o, same), f"seed={seed}: the plain reference passed"
