"""The 18 workload cases against the benchmark's published table (in-repo copy, data/spec/)."""

from pathlib import Path

import pandas as pd
import pytest

from swiglu.workloads import (
    CASES,
    HIDDEN_SIZE,
    INTERMEDIATE_SIZE,
    MIN_MATCH_FRACTION,
    MODEL_SHAPES,
    RTOL,
    get_case,
    select_cases,
)

SPEC = Path(__file__).resolve().parents[2] / "data" / "spec"


@pytest.fixture(scope="module")
def published() -> pd.DataFrame:
    return pd.read_csv(SPEC / "published_b200.csv")


def test_model_constants():
    assert (HIDDEN_SIZE, INTERMEDIATE_SIZE) == (16384, 53248)
    assert RTOL == 0.05 and MIN_MATCH_FRACTION == 0.99
    assert (MODEL_SHAPES["hermes-4-405b"].hidden_size, MODEL_SHAPES["hermes-4-405b"].intermediate_size) == (
        HIDDEN_SIZE,
        INTERMEDIATE_SIZE,
    )
    assert (MODEL_SHAPES["llama-3-8b"].hidden_size, MODEL_SHAPES["llama-3-8b"].intermediate_size) == (4096, 14336)
    assert (MODEL_SHAPES["llama-3-70b"].hidden_size, MODEL_SHAPES["llama-3-70b"].intermediate_size) == (8192, 28672)


def test_cases_agree_with_published_table(published):
    assert len(CASES) == 18 == len(published)
    ours = pd.DataFrame(
        [(c.batch_size, c.seq_len, c.tokens, c.atol, c.rtol) for c in CASES],
        columns=["batch_size", "seq_len", "tokens", "atol", "rtol"],
    )
    # Same cases in the same (benchmark) order, same tolerances.
    pd.testing.assert_frame_equal(ours, published[ours.columns], check_dtype=False)
    assert (published.tokens == published.batch_size * published.seq_len).all()


def test_case_names_are_unique_and_resolvable():
    names = [c.name for c in CASES]
    assert len(set(names)) == 18
    assert names[1] == "s128_b8"
    for c in CASES:
        assert get_case(c.name) is c
        assert c.tokens == c.seq_len * c.batch_size
    with pytest.raises(ValueError, match="unknown case 's128_b2'"):
        get_case("s128_b2")


def test_select_all():
    assert select_cases() == list(CASES)
    assert select_cases(None) == list(CASES)
    assert select_cases("all") == list(CASES)
    assert select_cases([]) == list(CASES)


def test_select_by_name():
    assert select_cases("s128_b8") == [get_case("s128_b8")]
    assert select_cases("s4096_b1, s128_b1") == [get_case("s4096_b1"), get_case("s128_b1")]
    assert select_cases(["s211_b16", "s211_b16"]) == [get_case("s211_b16")]  # no duplicates


def test_select_by_token_count():
    chosen = select_cases(4096)
    assert [c.name for c in chosen] == ["s128_b32", "s256_b16", "s512_b8", "s1024_b4", "s2048_b2", "s4096_b1"]
    assert select_cases("1024") == [get_case("s128_b8"), get_case("s256_b4")]
    # names and token counts mix; a case picked twice appears once
    assert select_cases(["s128_b8", 1024, "3376"]) == [get_case("s128_b8"), get_case("s256_b4"), get_case("s211_b16")]


@pytest.mark.parametrize(
    "selection,message", [("s1_b1", "unknown case 's1_b1'"), (4097, "no case has 4097 tokens"), ("0", "no case has 0 tokens")]
)
def test_select_errors(selection, message):
    with pytest.raises(ValueError, match=message):
        select_cases(selection)
