"""impl="triton" at small shapes: under TRITON_INTERPRET=1 on a CPU (CI), on the GPU when present.

The kernels' error is bounded by the bf16 reference's own error against the float64 formula
(factor 2, as the full-size GPU tests), and by the benchmark's criterion against the reference.
Outputs are written into views of larger NaN-filled buffers: an unwritten tile stays NaN and an
out-of-bounds store would change the padding (the interpreter does not catch those itself).
Each configuration of the tuned table runs on its own, so one config's writes cannot hide
another's missing tiles.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from swiglu import make_inputs, reference_backward
from swiglu.kernels.backward import CONFIGS, triton_swiglu_backward

from triton_checks import (  # noqa: E402  (shared with test_triton_adversarial.py)
    NAMES,
    SMALL,
    SMALL_CONFIGS,
    assert_guards,
    check,
    fresh_seed as _seed,
    guarded_outputs as _guarded_outputs,
)


@pytest.mark.parametrize(
    "batch_size,seq_len,hidden_size,intermediate_size",
    [(1, 1, 64, 128), (1, 7, 200, 344), (1, 211, 64, 136), (3, 37, 72, 200), (2, 64, 128, 64)],
    ids=["T1", "T7_H200_I344", "T211", "b3_s37", "T128_tile_multiple"],
)
@pytest.mark.parametrize("mode", ["benchmark", "forward"])
def test_odd_shapes_against_float64(device, batch_size, seq_len, hidden_size, intermediate_size, mode):
    seed = _seed()
    inp = make_inputs(batch_size, seq_len, hidden_size, intermediate_size, mode=mode, seed=seed, device=device)
    before = [t.clone() for t in inp.as_tuple()]
    T = batch_size * seq_len
    outs, bufs = _guarded_outputs(T, hidden_size, intermediate_size, device)
    got = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS, out=outs)
    assert_guards(bufs, seed)
    for t, b in zip(inp.as_tuple(), before):
        assert torch.equal(t, b), "an input was modified"
    for g, o in zip(got, outs):
        assert g.data_ptr() == o.data_ptr(), "out= buffer was not used"
    assert got[0].shape == inp.x.shape
    check(inp, got, seed)


def _distinct_configs():
    """Every (kernel, config) the backward can plan: the table's, and grad_x's narrower tiles."""
    from swiglu.kernels.backward import GRAD_X_NARROW

    seen = []
    for kernel, cfg in [(k, c) for k, table in CONFIGS.items() for c in table.values()] + [("grad_x", c) for c in GRAD_X_NARROW]:
        if (kernel, cfg) not in seen:
            seen.append((kernel, cfg))
    return seen


@pytest.mark.parametrize(
    "kernel,cfg",
    _distinct_configs(),
    ids=lambda v: (
        v
        if isinstance(v, str)
        else f"{v.BM}x{v.BN}x{v.BK}_g{v.GROUP_M}_e{v.EPI_SPLIT}_s{v.num_stages}_w{v.num_warps}"
        f"{'_ws' if v.warp_specialize else ''}{'_fl' if v.flatten else ''}"
        f"{'' if v.persistent else '_np'}{'' if v.tma_store else '_st'}"
    ),
)
def test_each_tuned_config_on_its_own(device, kernel, cfg):
    """The tuned config runs alone for its kernel (the others use small tiles), at a token count
    that is not a multiple of its tile and sizes that leave partial tiles in every dimension."""
    seed = _seed()
    T, H, I = cfg.BM + 19, cfg.BN + 24, cfg.BN + 40
    inp = make_inputs(1, T, H, I, seed=seed, device=device)
    outs, bufs = _guarded_outputs(T, H, I, device)
    got = triton_swiglu_backward(*inp.as_tuple(), configs={**SMALL_CONFIGS, kernel: cfg}, out=outs)
    assert_guards(bufs, seed)
    check(inp, got, seed)


@pytest.mark.parametrize(
    "variant",
    [{"persistent": False}, {"tma_store": False}, {"flatten": True}, {"EPI_SPLIT": 4}, {"EPI_SPLIT": 1}],
    ids=lambda v: next(iter(v)) + "=" + str(next(iter(v.values()))),
)
def test_config_options(device, variant):
    seed = _seed()
    cfg = replace(SMALL, **variant)
    inp = make_inputs(1, 77, 128, 264, seed=seed, device=device)
    got = triton_swiglu_backward(*inp.as_tuple(), configs={"dswiglu": cfg, "grad_weights": cfg, "grad_x": cfg})
    check(inp, got, seed)


@pytest.mark.parametrize("flags", [(1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (0, 1, 1, 0), (1, 0, 0, 1)])
def test_skipped_gradients(device, flags):
    seed = _seed()
    inp = make_inputs(1, 37, 64, 136, seed=seed, device=device)
    need = dict(zip(("need_grad_x", "need_grad_gate_weight", "need_grad_up_weight", "need_grad_down_weight"), map(bool, flags)))
    got = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS, **need)
    full = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    for name, flag, g, f in zip(NAMES, flags, got, full):
        if flag:
            assert torch.equal(g, f), f"{name} differs when computed alone, seed={seed}"
        else:
            assert g is None, f"{name} was computed although not needed"


def test_fresh_outputs(device):
    """Each call returns new tensors, none aliasing an input or another output. (Run-to-run
    determinism cannot fail in the interpreter; the GPU test test_triton_gpu.py checks it.)"""
    inp = make_inputs(2, 29, 64, 136, seed=_seed(), device=device)
    a = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    b = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    storages = [t.untyped_storage().data_ptr() for t in (*a, *b)]
    assert len(set(storages)) == 8, "outputs share storage"
    ptrs = {t.untyped_storage().data_ptr() for t in inp.as_tuple()}
    assert not ptrs & set(storages), "an output aliases an input"


def test_saturated_gate_values(device):
    """|gate| up to 30: sigmoid saturates; the epilogue must stay finite and accurate."""
    seed = _seed()
    inp = make_inputs(1, 50, 64, 136, seed=seed, device=device)
    inp.gate_output = (inp.gate_output * 15).clamp(-30, 30)
    check(inp, triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS), seed)


def test_non_contiguous_inputs_match_contiguous(device):
    seed = _seed()
    inp = make_inputs(1, 45, 64, 136, seed=seed, device=device)
    ref = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    args = list(inp.as_tuple())
    args[5] = args[5].t().contiguous().t()  # gate_weight: column-major view
    args[1] = torch.cat([args[1], args[1]], dim=-1)[..., :64]  # x: row stride 128
    args[7] = args[7].t().contiguous().t()  # down_weight: column-major view
    assert not args[5].is_contiguous() and not args[1].is_contiguous()
    got = triton_swiglu_backward(*args, configs=SMALL_CONFIGS)
    for name, g, r in zip(NAMES, got, ref):
        assert torch.equal(g, r), f"{name}: strided inputs changed the result"


def test_errors(device):
    inp = make_inputs(1, 8, 64, 136, seed=1, device=device)
    args = list(inp.as_tuple())
    with pytest.raises(TypeError, match="bfloat16"):
        triton_swiglu_backward(*[a.float() for a in args])
    odd = make_inputs(1, 8, 60, 132, seed=1, device=device)
    with pytest.raises(ValueError, match="hidden_size.*multiple of 8"):
        triton_swiglu_backward(*make_inputs(1, 8, 60, 136, seed=1, device=device).as_tuple())
    with pytest.raises(ValueError, match="intermediate_size.*multiple of 8"):
        triton_swiglu_backward(*make_inputs(1, 8, 64, 132, seed=1, device=device).as_tuple())
    del odd
    with pytest.raises(ValueError, match="out\\[grad_x\\]"):
        triton_swiglu_backward(*args, out=(torch.empty(3, device=device, dtype=torch.bfloat16), None, None, None))
    with pytest.raises(ValueError, match="overlaps an input"):
        triton_swiglu_backward(*args, out=(args[1].view(8, 64), None, None, None))
    with pytest.raises(ValueError, match="gate_weight"):
        triton_swiglu_backward(*args[:5], args[5][:-1], *args[6:])
    for wrong in (args[:7], args + args[:1]):  # the eight inputs are positional: a missing or extra one
        with pytest.raises(TypeError, match="8 tensors .*grad_output.*down_weight.*got " + str(len(wrong))):
            triton_swiglu_backward(*wrong)


def test_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    import swiglu.kernels.backward as tb
    import swiglu.kernels.devices as devices

    monkeypatch.setattr(devices, "INTERPRET", False)
    inp = make_inputs(1, 4, 64, 136, seed=1)
    with pytest.raises(ValueError, match="needs CUDA tensors.*TRITON_INTERPRET"):
        tb.triton_swiglu_backward(*inp.as_tuple())


def test_auto_falls_back_to_reference_where_triton_cannot_run():
    """impl="auto" takes the reference for CPU tensors, non-bf16 dtypes and unaligned sizes."""
    from swiglu import swiglu_mlp_backward

    for inp in (make_inputs(1, 5, 64, 136, seed=2), make_inputs(1, 5, 60, 132, seed=2, dtype=torch.float32)):
        got = swiglu_mlp_backward(*inp.as_tuple(), impl="auto")
        for g, r in zip(got, reference_backward(*inp.as_tuple())):
            assert torch.equal(g, r)


def test_expanded_zero_stride_grad_output(device):
    """An upstream gradient broadcast over tokens (row stride 0) gives the same result as its copy."""
    seed = _seed()
    inp = make_inputs(1, 24, 64, 136, seed=seed, device=device)
    inp.grad_output = inp.grad_output[:, :1].expand(1, 24, 64)
    assert inp.grad_output.stride(1) == 0
    got = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    inp.grad_output = inp.grad_output.contiguous()
    want = triton_swiglu_backward(*inp.as_tuple(), configs=SMALL_CONFIGS)
    for name, g, w in zip(NAMES, got, want):
        assert torch.equal(g, w), f"{name} differs for an expanded grad_output, seed={seed}"


def test_unknown_config_key_is_an_error(device):
    inp = make_inputs(1, 4, 64, 136, seed=1, device=device)
    with pytest.raises(ValueError, match="configs keys"):
        triton_swiglu_backward(*inp.as_tuple(), configs={"gradx": SMALL})
