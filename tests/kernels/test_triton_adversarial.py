"""Adversarial cases for the Triton backward (impl="triton"), beyond tests/kernels/test_triton_cpu.py.

Runs under TRITON_INTERPRET=1 on a CPU (CI) or on the GPU when present (``device`` fixture).
Covered here: token counts and sizes around and below the tile sizes (tuned table and small
tiles, including T and intermediate_size below BK, the zero-padded stacked d_gate/d_up buffer),
every need_* combination with guarded outputs, strided / transposed / sliced layouts of all
eight inputs, 2-D against 3-D inputs, aliased inputs, saturated and non-finite values, exact
power-of-two scaling, bit-exact epilogue rounding at T = 1, unusual KernelConfig values, and
out= buffers packed into one allocation.

Accuracy is judged as in test_triton_cpu.py (tests/triton_checks.py): the benchmark criterion
against the bf16 reference, the ulp oracle against the same-rounding reference, and the float64
error at most the reference's plus one bf16 ulp per element in norm. Outputs are
written into views of larger NaN-filled buffers (the interpreter does not catch out-of-bounds
stores). The last group pins bugs this file found (misaligned inputs, aliased or misaligned out=
buffers, grad_down_weight alone under autograd, unvalidated KernelConfig), all fixed.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from swiglu import (
    benchmark_criterion,
    float64_backward,
    make_inputs,
    reference_backward,
    relative_error,
    swiglu_mlp_backward,
)
from swiglu.kernels.backward import KernelConfig, config_for, triton_swiglu_backward

from triton_checks import (  # noqa: E402  (shared with test_triton_cpu.py)
    NAMES,
    NEEDS,
    PAD,
    SMALL,
    SMALL_CONFIGS,
    check as _check,
    check_ulps,
    fresh_seed as _seed,
    run_guarded as _run_guarded,
    same_rounding_fp32,
    ulp_norm,
)


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "tokens,hidden_size,intermediate_size",
    [(1, 8, 8), (2, 16, 24), (15, 40, 72), (17, 72, 136), (63, 8, 24), (65, 24, 16), (127, 40, 8), (129, 136, 72)],
)
def test_sizes_around_small_tiles(device, tokens, hidden_size, intermediate_size):
    """64-wide tiles against sizes below one tile (8..40), just above (72, 136) and token counts
    on both sides of BM/BK: partial tiles in every dimension, T < BK and I < BK."""
    seed = _seed()
    inp = make_inputs(1, tokens, hidden_size, intermediate_size, seed=seed, device=device)
    got, _ = _run_guarded(inp, SMALL_CONFIGS, seed)
    _check(inp, got, seed)


@pytest.mark.parametrize(
    "tokens,hidden_size,intermediate_size",
    [(1, 8, 16), (128, 8, 16), (129, 264, 136), (256, 16, 8), (257, 8, 24)],
)
def test_tuned_table_at_bucket_boundaries(device, tokens, hidden_size, intermediate_size):
    """configs=None: the table's choice at and just past token-bucket bounds, with hidden and
    intermediate sizes far below the tuned 128x256 tiles (or just past BN = 256)."""
    seed = _seed()
    inp = make_inputs(1, tokens, hidden_size, intermediate_size, seed=seed, device=device)
    got, _ = _run_guarded(inp, None, seed)
    _check(inp, got, seed)


def test_bucket_bounds_pick_different_configs():
    """The boundary cases above are worth running only while the buckets differ there."""
    for bound in (128, 256):
        assert any(config_for(k, bound) != config_for(k, bound + 1) for k in ("dswiglu", "grad_weights", "grad_x"))


@pytest.mark.parametrize("configs", [None, "small"])
def test_every_need_combination_with_guarded_outputs(device, configs):
    """All 16 need_* combinations at an odd size: unneeded outputs are None and their out=
    buffers stay untouched (NaN), needed ones match the reference computed with the same flags."""
    configs = SMALL_CONFIGS if configs == "small" else None
    T, H, I = 65, 8, 24  # T < the padded 128 rows of the stacked d_gate/d_up buffer
    for flags in itertools.product((False, True), repeat=4):
        seed = _seed()
        needs = dict(zip(NEEDS, flags))
        inp = make_inputs(1, T, H, I, seed=seed, device=device)
        got, outs = _run_guarded(inp, configs, seed, **needs)
        for name, flag, o in zip(NAMES, flags, outs):
            if not flag:
                assert torch.isnan(o).all(), f"{name} written although not needed, flags={flags}"
        _check(inp, got, seed, **needs)


# --------------------------------------------------------------------------- layouts


def _row_padded(t, pad):
    """Same values in a view whose rows are `pad` elements longer (and start `pad` in)."""
    big = torch.full((*t.shape[:-1], t.shape[-1] + pad), float("nan"), device=t.device, dtype=t.dtype)
    view = big[..., pad:]
    view.copy_(t)
    return view


def _column_major(t):
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _seq_major(t):
    # [B, S, *] stored as [S, B, *]: leading dims cannot be merged into one stride.
    return t.transpose(0, 1).contiguous().transpose(0, 1) if t.dim() == 3 else _column_major(t)


LAYOUTS = {
    "row_padded_aligned": lambda t: _row_padded(t, 8),  # TMA-usable as is (no copy)
    "odd_row_stride": lambda t: _row_padded(t, 1),  # unaligned rows: copied
    "column_major": _column_major,  # weights as transposed views, activations too
    "seq_major": _seq_major,
}


@pytest.mark.parametrize("layout", list(LAYOUTS) + ["mixed"])
def test_strided_layouts_of_all_inputs(device, layout):
    """All eight inputs as non-contiguous views give bitwise the contiguous result; no input is
    modified."""
    seed = _seed()
    inp = make_inputs(2, 19, 72, 136, seed=seed, device=device)
    want = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    fns = list(LAYOUTS.values())
    args = [(fns[i % len(fns)] if layout == "mixed" else LAYOUTS[layout])(t) for i, t in enumerate(inp.as_tuple())]
    assert not any(a.is_contiguous() for a in args)
    before = [a.clone() for a in args]
    got = triton_swiglu_backward(*args, configs=SMALL_CONFIGS)
    for a, b in zip(args, before):
        assert torch.equal(a, b), "an input was modified"
    for name, g, w in zip(NAMES, got, want):
        assert torch.equal(g, w), f"{name}: layout {layout} changed the result, seed={seed}"


def test_flat_and_batched_inputs_agree_and_public_entry_point(device):
    """[T, *] and [B, S, *] inputs give the same bits; grad_x takes x's shape; the public
    swiglu_mlp_backward(impl="triton") returns exactly what the launcher returns."""
    seed = _seed()
    inp = make_inputs(3, 11, 40, 72, seed=seed, device=device)
    batched = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    flat_args = [t.reshape(-1, t.shape[-1]) for t in inp.as_tuple()]
    flat = triton_swiglu_backward(*flat_args, configs=SMALL_CONFIGS)
    assert batched[0].shape == inp.x.shape and flat[0].shape == (33, 40)
    for name, b, f in zip(NAMES, batched, flat):
        assert torch.equal(b.reshape(f.shape), f), f"{name}: flat and batched inputs differ, seed={seed}"
    public = swiglu_mlp_backward(*inp.as_tuple(), impl="triton")
    default = triton_swiglu_backward(*inp.as_tuple())
    for name, p, d in zip(NAMES, public, default):
        assert torch.equal(p, d), f"{name}: impl='triton' differs from triton_swiglu_backward"
    _check(inp, public, seed)


def test_aliased_inputs(device):
    """One tensor passed as gate_weight and up_weight, another as all three activations:
    inputs may alias each other (they are only read)."""
    seed = _seed()
    inp = make_inputs(1, 45, 40, 136, seed=seed, device=device)
    inp.up_weight = inp.gate_weight
    inp.up_output = inp.activated_gate = inp.gate_output
    before = [t.clone() for t in inp.as_tuple()]
    got, _ = _run_guarded(inp, SMALL_CONFIGS, seed)
    for t, b in zip(inp.as_tuple(), before):
        assert torch.equal(t, b), "an input was modified"
    _check(inp, got, seed)


def test_outputs_packed_in_one_buffer(device):
    """out= tensors that are adjacent (non-overlapping, 16-byte aligned) slices of one buffer are
    accepted and each is written exactly."""
    seed = _seed()
    T, H, I = 21, 40, 72
    inp = make_inputs(1, T, H, I, seed=seed, device=device)
    sizes = [T * H, I * H, I * H, H * I]
    buf = torch.full((sum(sizes) + PAD,), float("nan"), device=device, dtype=torch.bfloat16)
    outs = tuple(torch.split(buf[: sum(sizes)], sizes))
    got = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS, out=outs)
    assert torch.isnan(buf[sum(sizes) :]).all(), "store past the last output"
    _check(inp, got, seed)


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize("scale", [80.0, 100.0])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy exp in the interpreter
def test_gate_far_in_sigmoid_saturation(device, scale):
    """|gate_output| up to 80-100: exp(-gate) overflows fp32 in the sigmoid; d_gate must stay
    finite and accurate (test_triton_cpu covers |gate| <= 30)."""
    seed = _seed()
    inp = make_inputs(1, 40, 64, 136, seed=seed, device=device)
    inp.gate_output = (inp.gate_output * scale).clamp(-scale, scale)
    _check(inp, triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS), seed)


@pytest.mark.parametrize(
    "input_name,row,col,value",
    [
        ("gate_output", 3, 0, float("inf")),
        ("gate_output", 3, 1, float("-inf")),
        ("gate_output", 5, 2, float("nan")),
        ("x", 7, 5, float("nan")),
        ("grad_output", 2, 9, float("inf")),
        ("down_weight", 4, 11, float("nan")),
        ("gate_weight", 6, 3, float("-inf")),
    ],
)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_non_finite_input_propagates_like_reference(device, input_name, row, col, value):
    """One non-finite input element: the NaN and Inf positions (and Inf signs) of every output are
    those the reference's formula defines (the float64 oracle's), and the rest meets the benchmark
    criterion against the bf16 reference where that is finite. On AMX CPUs the bf16 reference
    itself also has NaN in the row above a non-finite d_gate/d_up row (the CPU GEMM's over-read,
    docs/usage.md, "bf16 matmul on CPUs with AMX"); on a GPU its positions must be the oracle's."""
    seed = _seed()
    inp = make_inputs(1, 40, 64, 136, seed=seed, device=device)
    t = getattr(inp, input_name)
    (t[0] if t.dim() == 3 else t)[row, col] = value
    got = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    ref = reference_backward(*inp.as_tuple())
    oracle = float64_backward(*inp.as_tuple())
    any_nonfinite = False
    for name, g, r, o in zip(NAMES, got, ref, oracle):
        g, r = g.float(), r.float()
        assert torch.equal(torch.isnan(g), torch.isnan(o)), f"{name}: NaN positions differ, seed={seed}"
        assert torch.equal(torch.isinf(g), torch.isinf(o)), f"{name}: Inf positions differ, seed={seed}"
        assert torch.equal(g[torch.isinf(g)], o[torch.isinf(o)].float()), f"{name}: Inf signs differ, seed={seed}"
        extra = torch.isfinite(o) & ~torch.isfinite(r)  # the AMX CPU GEMM's over-read only
        assert device == "cpu" or not extra.any(), f"{name}: reference non-finite where float64 is not, seed={seed}"
        finite = torch.isfinite(o) & ~extra
        any_nonfinite |= not bool(torch.isfinite(o).all())
        if finite.any():
            assert benchmark_criterion(g[finite], r[finite], 0.13).passed, f"{name}: finite part differs, seed={seed}"
    assert any_nonfinite, "the non-finite input reached no output: the case tests nothing"


@pytest.mark.parametrize("k", [100, -100])
def test_power_of_two_scaling_is_exact(device, k):
    """Scaling grad_output by 2^k scales all four gradients by exactly 2^k; x by 2^k scales only
    the gate/up weight gradients; activated_gate and up_output by 2^(k/2) each scale h (so
    grad_down_weight) by 2^k and d_gate, d_up by 2^(k/2). Holds bit for bit away from overflow and
    subnormals, as in the reference: pins that no step depends on magnitude."""
    seed = _seed()
    inp = make_inputs(1, 33, 40, 72, seed=seed, device=device)
    base = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)

    def scaled(t, e):
        return (t.double() * 2.0**e).to(torch.bfloat16)

    def run(**changes):
        args = dict(zip(("grad_output", "x", "gate_output", "up_output", "activated_gate"), inp.as_tuple()[:5]))
        args.update(changes)
        return triton_swiglu_backward(*args.values(), *inp.as_tuple()[5:], configs=SMALL_CONFIGS)

    cases = {
        "grad_output": (run(grad_output=scaled(inp.grad_output, k)), (k, k, k, k)),
        "x": (run(x=scaled(inp.x, k)), (0, k, k, 0)),
        "activated_gate*up_output": (
            run(activated_gate=scaled(inp.activated_gate, k // 2), up_output=scaled(inp.up_output, k // 2)),
            (k // 2, k // 2, k // 2, k),
        ),
    }
    for what, (got, exps) in cases.items():
        for name, g, b, e in zip(NAMES, got, base, exps):
            assert torch.equal(g, scaled(b, e)), f"{name}: scaling {what} by 2^{k} is not exact, seed={seed}"


def test_epilogue_rounding_matches_reference_bitwise(device):
    """T = 1 with integer grad_output and down_weight: g = grad_output @ down_weight is exact in
    fp32 but not in bf16, and each weight gradient is one product per element. So d_up, h and
    hence grad_up_weight and grad_down_weight must equal the reference bit for bit (g, d_up and h
    rounded to bf16 where the reference rounds them); grad_gate_weight nearly so (the sigmoid may
    differ by an fp32 ulp between libraries)."""
    seed = _seed()
    gen = torch.Generator(device=device).manual_seed(seed)
    T, H, I = 1, 64, 72
    inp = make_inputs(1, T, H, I, seed=seed, device=device)
    inp.grad_output = torch.randint(-16, 17, (1, T, H), generator=gen, device=device).to(torch.bfloat16)
    inp.down_weight = torch.randint(-16, 17, (H, I), generator=gen, device=device).to(torch.bfloat16)
    g = inp.grad_output.double().reshape(T, H) @ inp.down_weight.double()
    act = inp.activated_gate.double().reshape(T, I)
    # The inputs discriminate: skipping the bf16 rounding of g would change d_up.
    assert (g.to(torch.bfloat16).double() != g).any()
    assert ((g * act).to(torch.bfloat16) != (g.to(torch.bfloat16).double() * act).to(torch.bfloat16)).any()
    got = triton_swiglu_backward(*inp.as_tuple())
    ref = reference_backward(*inp.as_tuple())
    assert torch.equal(got[2], ref[2]), f"grad_up_weight not bitwise equal to the reference, seed={seed}"
    assert torch.equal(got[3], ref[3]), f"grad_down_weight not bitwise equal to the reference, seed={seed}"
    # The interpreter's sigmoid (numpy) matches torch's to an fp32 ulp, and 2^-7 relative still
    # catches an unrounded d_act; the GPU's exp is an approximation: allow 2 bf16 ulps there.
    tol = 2.0**-7 if device == "cpu" else 2.0**-6
    diff = (got[1].float() - ref[1].float()).abs()
    assert (diff <= ref[1].float().abs() * tol).all(), f"grad_gate_weight beyond {tol} relative, seed={seed}"
    # grad_x (|values| ~ 1e3 here, so atol means nothing): the ulp oracle against the
    # same-rounding reference (one fp32 accumulator, as the kernel) and the float64 rule. The
    # benchmark's reference rounds its two GEMMs to bf16 before adding them; with 64 elements one
    # cancellation can fail the benchmark criterion against it although the kernel is closer to float64.
    sums, allowance = same_rounding_fp32(
        inp.as_tuple(), need_grad_gate_weight=False, need_grad_up_weight=False, need_grad_down_weight=False
    )
    check_ulps("grad_x", got[0], sums[0].to(torch.bfloat16), seed, allowance[0], sum32=sums[0])
    oracle = float64_backward(*inp.as_tuple())[0]
    e_t, e_r = relative_error(got[0], oracle), relative_error(ref[0], oracle)
    assert e_t <= e_r + ulp_norm(oracle), f"grad_x: rel error {e_t:.3e} > reference {e_r:.3e} + one ulp, seed={seed}"


# --------------------------------------------------------------------------- configurations


@pytest.mark.parametrize(
    "cfg",
    [
        KernelConfig(BM=32, BN=32, BK=32, GROUP_M=3, EPI_SPLIT=4),  # odd GROUP_M, 8-column epilogue pieces
        KernelConfig(BM=32, BN=64, BK=16, GROUP_M=1, EPI_SPLIT=2, persistent=False, tma_store=False),
        KernelConfig(BM=64, BN=32, BK=128, GROUP_M=64, EPI_SPLIT=1, flatten=True, warp_specialize=True),
        KernelConfig(BM=16, BN=128, BK=32, GROUP_M=2, EPI_SPLIT=4, tma_store=False),
    ],
    ids=["g3_e4_bn32", "bk16_g1_np_plainstore", "bk128_gm64_fl_ws", "bm16_bn128_plainstore"],
)
def test_unusual_configs(device, cfg):
    """Tile shapes and options the tuned table does not use, on all three kernels at once, with
    several tiles per dimension, partial edge tiles and K both below and above BK."""
    seed = _seed()
    inp = make_inputs(1, 100, 72, 136, seed=seed, device=device)
    got, _ = _run_guarded(inp, {"dswiglu": cfg, "grad_weights": cfg, "grad_x": cfg}, seed)
    _check(inp, got, seed)


# --------------------------------------------------------------------------- regressions: bugs found by this file, fixed


def _misaligned(t):
    """A contiguous copy of t whose data starts 2 bytes past a 16-byte boundary."""
    raw = torch.empty(t.numel() + 8, device=t.device, dtype=t.dtype)
    view = raw[1 : 1 + t.numel()].view(t.shape)
    view.copy_(t)
    assert view.is_contiguous() and view.data_ptr() % 16 != 0
    return view


@pytest.mark.parametrize(
    "index",
    range(8),
    ids=["grad_output", "x", "gate_output", "up_output", "activated_gate", "gate_weight", "up_weight", "down_weight"],
)
def test_misaligned_contiguous_input(device, index):
    seed = _seed()
    inp = make_inputs(1, 9, 16, 24, seed=seed, device=device)
    want = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    args = list(inp.as_tuple())
    args[index] = _misaligned(args[index])
    got = triton_swiglu_backward(*args, configs=SMALL_CONFIGS)
    for name, g, w in zip(NAMES, got, want):
        assert torch.equal(g, w), f"{name}: a misaligned input changed the result"


def test_misaligned_input_public_entry_point(device):
    inp = make_inputs(1, 9, 16, 24, seed=_seed(), device=device)
    args = list(inp.as_tuple())
    args[1] = _misaligned(args[1])
    got = swiglu_mlp_backward(*args, impl="triton")
    for g, r in zip(got, swiglu_mlp_backward(*inp.as_tuple(), impl="triton")):
        assert torch.equal(g, r)


@pytest.mark.parametrize("pair", [(1, 2), (1, 3), (0, 1)], ids=["gate_up", "gate_down", "x_gate"])
def test_out_buffers_aliasing_each_other_are_rejected(device, pair):
    T = H = I = 64  # all four outputs have the same size, so any two can share one buffer
    inp = make_inputs(1, T, H, I, seed=_seed(), device=device)
    buf = torch.full((T * H,), float("nan"), device=device, dtype=torch.bfloat16)
    out = [None] * 4
    out[pair[0]] = out[pair[1]] = buf
    with pytest.raises(ValueError, match="out"):
        triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS, out=tuple(out))


def test_misaligned_out_buffer_is_a_clear_error(device):
    """An out= buffer not 16-byte aligned (TMA stores need it) is a ValueError naming it, before any
    launch; the buffer is left as it was."""
    inp = make_inputs(1, 9, 16, 24, seed=_seed(), device=device)
    raw = torch.full((9 * 16 + 8,), float("nan"), device=device, dtype=torch.bfloat16)
    out = raw[1 : 1 + 9 * 16]
    with pytest.raises(ValueError, match=r"out\[grad_x\] must start at a 16-byte aligned address"):
        triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS, out=(out, None, None, None))
    assert torch.isnan(raw).all()


def test_down_weight_only_with_inputs_requiring_grad(device):
    seed = _seed()
    inp = make_inputs(1, 9, 16, 24, seed=seed, device=device)
    args = [t.clone().requires_grad_(True) for t in inp.as_tuple()]
    needs = dict(need_grad_x=False, need_grad_gate_weight=False, need_grad_up_weight=False)
    got = triton_swiglu_backward(*args, configs=SMALL_CONFIGS, **needs)
    _check(inp, got, seed, **needs)


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
def test_invalid_group_m_is_rejected(device):
    inp = make_inputs(1, 40, 64, 136, seed=_seed(), device=device)
    with pytest.raises(ValueError, match="GROUP_M"):
        cfg = replace(SMALL, GROUP_M=0)
        triton_swiglu_backward(*inp.as_tuple(), configs={**SMALL_CONFIGS, "grad_weights": cfg})


def test_lean_down_weight_only_with_row_strided_gate_and_up(device):
    """Memory-lean (activated_gate None), grad_down_weight alone: h comes from the elementwise
    product kernel, which reads flat memory; gate/up as column halves of one [T, 2I] buffer
    (row stride 2I) were read as if contiguous (wrong grad_down_weight, no error)."""
    T, I = 9, 24
    inp = make_inputs(1, T, 16, I, seed=_seed(), device=device)
    both = torch.cat([inp.gate_output.reshape(T, I), inp.up_output.reshape(T, I)], dim=1)
    gate, up = both[:, :I], both[:, I:]
    assert not gate.is_contiguous() and gate.stride(0) == 2 * I
    needs = dict(need_grad_x=False, need_grad_gate_weight=False, need_grad_up_weight=False)
    w = (inp.gate_weight, inp.up_weight, inp.down_weight)
    x, go = inp.x.reshape(T, -1), inp.grad_output.reshape(T, -1)
    want = triton_swiglu_backward(go, x, gate.contiguous(), up.contiguous(), None, *w, configs=SMALL_CONFIGS, **needs)[3]
    got = triton_swiglu_backward(go, x, gate, up, None, *w, configs=SMALL_CONFIGS, **needs)[3]
    assert torch.equal(got, want)
