"""swiglu_lab.research.gradient_validation: the float64 and benchmark checks accept the reference and catch wrong outputs."""

from __future__ import annotations

import pytest
import torch

from swiglu import make_inputs, reference_backward
from swiglu_lab.research.gradient_validation import OUTPUT_NAMES, parse_shapes, run_validation, validate_case

H, I = 64, 96


@pytest.fixture
def inputs():
    return make_inputs(2, 5, H, I, seed=None, generator=torch.Generator().manual_seed(1))


def _by(rows, impl):
    return {r["output"]: r for r in rows if r["impl"] == impl}


def test_reference_passes_with_bf16_level_error(inputs):
    samples = {}
    rows = validate_case(inputs, ["reference"], atol=0.13, case="c", samples=samples, sample_size=50)
    assert [r["output"] for r in rows] == list(OUTPUT_NAMES)
    for r in rows:
        assert r["status"] == "ok" and r["passed"] and r["criterion_pass"]
        assert r["ratio"] == 1.0 and r["match_fraction"] == 1.0
        assert 1e-4 < r["rel_err"] < 2e-2  # bf16 rounding, not exact and not garbage
        assert r["oracle_rms"] > 1e-3  # never validated on (near) zeros
        assert r["case"] == "c" and r["tokens"] == 10 and r["hidden_size"] == H
    # One sample per output for the bf16 reference; impl "reference" would duplicate it.
    assert set(samples) == {("bf16 reference", name) for name in OUTPUT_NAMES}
    assert all(s.numel() == 50 and (s >= 0).all() for s in samples.values())


def test_a_5_percent_error_fails_float64_check_though_the_benchmark_criterion_passes(inputs):
    def scaled(*args):
        gx, gg, gu, gd = reference_backward(*args)
        return gx * 1.05, gg, gu, gd

    rows = _by(validate_case(inputs, {"scaled": scaled}, atol=0.13), "scaled")
    assert rows["grad_x"]["ratio"] > 2 and not rows["grad_x"]["within_factor"] and not rows["grad_x"]["passed"]
    assert rows["grad_x"]["criterion_pass"]  # rtol 0.05 + atol lets it through: why both checks exist
    assert rows["grad_gate_weight"]["passed"]


def test_zero_nan_raising_and_mutating_impls_fail(inputs):
    def zeros(*args):
        return tuple(torch.zeros_like(t) for t in reference_backward(*args))

    def nan(*args):
        gx, gg, gu, gd = reference_backward(*args)
        gd = gd.clone()
        gd[0, 0] = float("nan")
        return gx, gg, gu, gd

    def raises(*args):
        raise RuntimeError("kernel exploded")

    def mutates(*args):
        out = reference_backward(*args)
        args[0].mul_(2)
        return out

    before = [t.clone() for t in inputs.as_tuple()]
    rows = validate_case(inputs, {"zeros": zeros, "nan": nan, "raises": raises}, atol=0.13)
    assert not any(r["passed"] for r in rows if r["impl"] in ("zeros", "raises"))
    assert all(r["ratio"] > 2 and not r["criterion_pass"] for r in rows if r["impl"] == "zeros")
    nan_rows = _by(rows, "nan")
    assert not nan_rows["grad_down_weight"]["passed"] and nan_rows["grad_down_weight"]["nonfinite"] == 1
    assert nan_rows["grad_x"]["passed"]
    assert all(r["status"] == "error: RuntimeError: kernel exploded" for r in rows if r["impl"] == "raises")
    assert all(torch.equal(a, b) for a, b in zip(before, inputs.as_tuple()))
    mutated = validate_case(inputs, {"mutates": mutates}, atol=0.13)
    assert all(r["status"] == "error: inputs were modified" and not r["passed"] for r in mutated)


def test_unknown_impl_name_is_reported_not_raised(inputs):
    rows = validate_case(inputs, "reference,nonexistent", atol=0.13)
    bad = [r for r in rows if r["impl"] == "nonexistent"]
    assert len(bad) == 4 and all(r["status"].startswith("error: ValueError") for r in bad)


def test_run_validation_draws_fresh_inputs_per_round():
    samples = {}
    df = run_validation(
        [("a", 1, 3, 0.13), ("b", 2, 2, 0.13)], ["reference"], H, I, rounds=2, samples=samples, sample_size=10, progress=False
    )
    assert len(df) == 2 * 2 * 4 and df["passed"].all()
    errs = df[df["output"] == "grad_x"].groupby("case")["rel_err"].apply(list)
    assert errs["a"][0] != errs["a"][1]  # a second round saw different inputs
    assert ("a", "bf16 reference", "grad_x") in samples and ("b", "bf16 reference", "grad_x") in samples


def test_parse_shapes():
    assert parse_shapes("1x7, 8x16") == [(1, 7), (8, 16)]
    for bad in ("7", "0x3", "1x2x3", "ax2", ""):
        with pytest.raises(ValueError):
            parse_shapes(bad)
