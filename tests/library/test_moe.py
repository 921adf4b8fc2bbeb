"""``swiglu.swiglu_moe``'s API on the CPU: argument checks (each wrong type, dtype, shape, device or
impl a TypeError/ValueError naming the argument), the reference (transformers' experts loop)
and the float64 oracle, shapes, dtypes, zero tokens, duplicates, out-of-range ids. The Triton
path at small shapes: tests/kernels/test_moe_kernels.py."""

from __future__ import annotations

import pytest
import torch

import swiglu
from swiglu.moe import moe_float64, moe_reference, validate_moe_inputs

from moe_checks import NAMES, assert_matches, fresh_seed, make_moe, oracle, run

T, H, I, E, K = 6, 32, 48, 4, 2


def _good(seed=0):
    return make_moe(seed, T, H, I, E, K)


def _args(**override):
    inp = _good()
    args = dict(
        x=inp.x,
        top_k_index=inp.top_k_index,
        top_k_weights=inp.top_k_weights,
        gate_up_proj=inp.gate_up_proj,
        down_proj=inp.down_proj,
    )
    args.update(override)
    return args


BF = torch.bfloat16
BAD = {
    # name: (overrides, error, argument named in the message)
    "x_list": (lambda a: dict(x=a["x"].tolist()), TypeError, "x"),
    "x_int": (lambda a: dict(x=a["x"].to(torch.int32)), TypeError, "x"),
    "x_0d": (lambda a: dict(x=torch.tensor(1.0, dtype=BF)), ValueError, "x"),
    "x_wrong_hidden": (lambda a: dict(x=a["x"][:, :-8].contiguous()), ValueError, "x"),
    "x_sparse": (lambda a: dict(x=a["x"].float().to_sparse().to(BF)), TypeError, "x"),
    "gate_up_dtype": (lambda a: dict(gate_up_proj=a["gate_up_proj"].float()), TypeError, "gate_up_proj"),
    "down_dtype": (lambda a: dict(down_proj=a["down_proj"].half()), TypeError, "down_proj"),
    "gate_up_2d": (lambda a: dict(gate_up_proj=a["gate_up_proj"][0]), ValueError, "gate_up_proj"),
    "gate_up_odd": (lambda a: dict(gate_up_proj=a["gate_up_proj"][:, :-1]), ValueError, "gate_up_proj"),
    "gate_up_no_experts": (
        lambda a: dict(gate_up_proj=a["gate_up_proj"][:0], down_proj=a["down_proj"][:0]),
        ValueError,
        "gate_up_proj",
    ),
    "down_shape": (lambda a: dict(down_proj=a["down_proj"].transpose(1, 2)), ValueError, "down_proj"),
    "down_experts": (lambda a: dict(down_proj=a["down_proj"][:-1]), ValueError, "down_proj"),
    "index_float": (lambda a: dict(top_k_index=a["top_k_index"].float()), TypeError, "top_k_index"),
    "index_int16": (lambda a: dict(top_k_index=a["top_k_index"].to(torch.int16)), TypeError, "top_k_index"),
    "index_rows": (
        lambda a: dict(top_k_index=a["top_k_index"][:-1], top_k_weights=a["top_k_weights"][:-1]),
        ValueError,
        "top_k_index",
    ),
    "index_k0": (
        lambda a: dict(top_k_index=a["top_k_index"][:, :0], top_k_weights=a["top_k_weights"][:, :0]),
        ValueError,
        "top_k_index",
    ),
    "index_1d": (lambda a: dict(top_k_index=a["top_k_index"][:, 0]), ValueError, "top_k_index"),
    "index_too_big": (lambda a: dict(top_k_index=a["top_k_index"].clone().fill_(E)), ValueError, "top_k_index"),
    "index_negative": (lambda a: dict(top_k_index=a["top_k_index"].clone().fill_(-1)), ValueError, "top_k_index"),
    "weights_int": (lambda a: dict(top_k_weights=a["top_k_weights"].to(torch.int64)), TypeError, "top_k_weights"),
    "weights_shape": (lambda a: dict(top_k_weights=a["top_k_weights"][:, :1]), ValueError, "top_k_weights"),
    "weights_router_logits": (lambda a: dict(top_k_weights=torch.rand(T, E)), ValueError, "top_k_weights"),
    "weights_none": (lambda a: dict(top_k_weights=None), TypeError, "top_k_weights"),
    "weights_meta": (lambda a: dict(top_k_weights=a["top_k_weights"].to("meta")), ValueError, "top_k_weights"),
    "down_meta": (lambda a: dict(down_proj=a["down_proj"].to("meta")), ValueError, "down_proj"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_bad_argument_names_it(case, impl):
    change, error, name = BAD[case]
    args = _args()
    args.update(change(args))
    with pytest.raises(error, match=rf"\b{name}\b"):
        swiglu.swiglu_moe(**args, impl=impl)


@pytest.mark.parametrize(
    "impl,error", [("cuda", ValueError), ("Triton", ValueError), ("", ValueError), (None, TypeError), (1, TypeError)]
)
def test_bad_impl_names_it(impl, error):
    with pytest.raises(error, match="impl"):
        swiglu.swiglu_moe(**_args(), impl=impl)


def test_triton_impl_needs_bfloat16(device):
    inp = make_moe(0, T, H, I, E, K, dtype=torch.float32, device=device)
    with pytest.raises(TypeError, match="bfloat16"):
        swiglu.swiglu_moe(*inp.args(), impl="triton")


def test_validate_returns_sizes():
    assert validate_moe_inputs(*_good().args()) == (T, H, I, E, K)
    inp = make_moe(0, 10, H, I, E, 3, lead=(2, 5))
    assert validate_moe_inputs(*inp.args()) == (10, H, I, E, 3)
    flat_idx = inp.top_k_index.reshape(10, 3)  # [T, k] routing with [B, S, H] x
    assert validate_moe_inputs(inp.x, flat_idx, flat_idx.float(), inp.gate_up_proj, inp.down_proj)[0] == 10


@pytest.mark.parametrize("kind", ["balanced", "skewed", "one", "dup"])
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_reference_against_float64(kind, impl):
    """bf16: the reference is what the bounds are made of; here it is held to the float64 oracle
    at bf16 accuracy (relative error < 2e-2), and in float64 it is the oracle to 1e-12."""
    seed = fresh_seed()
    inp = make_moe(seed, 9, H, I, E, 2, kind=kind)
    got, o = run(inp, impl), oracle(inp)
    for name, g, r in zip(NAMES, got, o):
        assert g.dtype == (inp.top_k_weights.dtype if name == "grad_top_k_weights" else torch.bfloat16)
        assert swiglu.relative_error(g, r) < 2e-2, f"seed={seed}: {name}"
    inp64 = make_moe(seed, 9, H, I, E, 2, kind=kind, dtype=torch.float64, weights_dtype=torch.float64)
    for name, g, r in zip(NAMES, run(inp64, impl), oracle(inp64)):
        assert torch.allclose(g, r, rtol=1e-12, atol=1e-12), f"seed={seed}: {name}"


def test_duplicate_expert_counts_twice():
    """A token naming an expert twice gets both contributions (the oracle's sum over pairs)."""
    seed = fresh_seed()
    inp = make_moe(seed, 5, H, I, E, 2, dtype=torch.float64, weights_dtype=torch.float64)
    inp.top_k_index[:, 1] = inp.top_k_index[:, 0]
    x, idx, w, gu, dp, _ = inp.flat()
    once = moe_reference(x, idx[:, :1], w[:, :1], gu, dp)
    both = moe_reference(x, idx, w, gu, dp)
    summed = moe_reference(x, idx[:, :1], w.sum(1, keepdim=True), gu, dp)
    assert torch.allclose(both, summed) and not torch.allclose(both, once)
    assert torch.allclose(run(inp, "reference")[0], moe_float64(x, idx, w, gu, dp))


@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)], ids=str)
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_zero_tokens(lead, impl):
    inp = make_moe(fresh_seed(), 0, H, I, E, K, lead=lead)
    got = run(inp, impl)
    assert got[0].shape == inp.x.shape
    assert got[2].shape == inp.top_k_weights.shape and got[2].dtype == inp.top_k_weights.dtype
    for g, w in zip(got[3:], (inp.gate_up_proj, inp.down_proj)):
        assert g.shape == w.shape and not g.count_nonzero()


@pytest.mark.parametrize("lead", [(0,), (2, 0)], ids=str)
def test_zero_tokens_grad_x(lead):
    inp = make_moe(fresh_seed(), 0, H, I, E, K, lead=lead)
    got = run(inp, "reference")
    assert got[1] is not None and got[1].shape == inp.x.shape


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("lead", [(12,), (3, 4)], ids=str)
def test_shapes_dtypes_and_no_mutation(weights_dtype, index_dtype, lead):
    seed = fresh_seed()
    inp = make_moe(seed, 12, H, I, E, K, lead=lead, weights_dtype=weights_dtype, index_dtype=index_dtype)
    before = [t.clone() for t in inp.tensors()]
    got = run(inp, "reference")
    for t, b in zip(inp.tensors(), before):
        assert torch.equal(t, b)
    assert got[0].shape == inp.x.shape and got[2].dtype == weights_dtype
    out = swiglu.swiglu_moe(*inp.args())
    assert all(out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() for t in inp.tensors())
    # [T, k] routing for [B, S, H] x: the same result.
    flat = swiglu.swiglu_moe(
        inp.x, inp.top_k_index.reshape(12, K), inp.top_k_weights.reshape(12, K), inp.gate_up_proj, inp.down_proj
    )
    assert torch.equal(out, flat)


def test_reference_skips_out_of_range_ids():
    """moe_reference (called directly: the public op refuses such ids on the CPU) skips ids outside
    [0, E) as transformers' expert-parallel sentinels: as if their weights were zero."""
    inp = make_moe(fresh_seed(), 8, H, I, E, 3, dtype=torch.float64, weights_dtype=torch.float64)
    x, idx, w, gu, dp, _ = inp.flat()
    bad = torch.zeros_like(idx, dtype=torch.bool)
    bad[::2, 1] = True
    bad[3, 0] = True
    sentinel = idx.masked_fill(bad, E).masked_fill(bad & (torch.arange(8)[:, None] % 4 == 0), -1)
    got = moe_reference(x, sentinel, w, gu, dp)
    assert torch.allclose(got, moe_reference(x, idx, w.masked_fill(bad, 0), gu, dp))
    assert torch.allclose(got, moe_float64(x, sentinel, w, gu, dp))


def test_float64_oracle_matches_autograd_of_reference():
    seed = fresh_seed()
    inp = make_moe(seed, 7, H, I, E, 3, kind="dup", dtype=torch.float64, weights_dtype=torch.float64)
    for name, a, b in zip(NAMES, run(inp, "reference"), oracle(inp)):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), f"seed={seed}: {name}"


@pytest.mark.parametrize("case", ["T0", "all_out_of_range"])
def test_float64_oracle_gradients_without_valid_pairs(case):
    inp = make_moe(fresh_seed(), 0 if case == "T0" else 4, H, I, E, K)
    x, idx, w, gu, dp, go = inp.flat()
    if case != "T0":
        idx = torch.full_like(idx, E)
    res = moe_float64(x, idx, w, gu, dp, go)
    assert all(not r.count_nonzero() for r in res)


def test_checker_passes_the_reference_against_itself_and_rejects_a_scaled_gradient():
    """moe_checks' bound: the reference passes against itself; a gradient 1% off does not."""
    seed = fresh_seed()
    inp = make_moe(seed, 16, 64, 64, E, K)
    ref, o = run(inp, "reference"), oracle(inp)
    assert_matches(ref, ref, o, seed)
    scaled = list(ref)
    scaled[1] = (ref[1].double() * 1.01).to(ref[1].dtype)
    with pytest.raises(AssertionError, match="grad_x"):
        assert_matches(scaled, ref, o, seed)
