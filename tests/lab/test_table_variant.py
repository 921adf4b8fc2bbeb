"""scripts/table_variant.py: the committed kernel table with named entries changed, as the
whole-backward A/B probe reads it, and clear errors for paths the table does not have."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("table_variant", ROOT / "scripts" / "table_variant.py")
tv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tv)
TABLE = json.loads(tv.TABLE.read_text())


def _variant(tmp_path, *argv) -> dict:
    out = tmp_path / "v.json"
    assert tv.main(["--out", str(out), *argv]) == 0
    return json.loads(out.read_text())


def test_set_changes_the_named_fields_and_nothing_else(tmp_path):
    got = _variant(tmp_path, "--set", "gluon_grad_weights.256.GROUP_M=47", "configs.grad_x.*.GROUP_M=5")
    assert got["gluon_grad_weights"]["256"]["config"]["GROUP_M"] == 47
    assert "GROUP_M = 47" in got["gluon_grad_weights"]["256"]["variant"]
    assert {b: e["config"]["GROUP_M"] for b, e in got["configs"]["grad_x"].items()} == {b: 5 for b in TABLE["configs"]["grad_x"]}
    for section in ("gluon_grad_weights", "gluon_dswiglu"):
        for bucket, entry in TABLE[section].items():
            if (section, bucket) != ("gluon_grad_weights", "256"):
                assert got[section][bucket]["config"] == entry["config"]
    assert got["configs"]["dswiglu"] == TABLE["configs"]["dswiglu"]


def test_candidates_enter_their_buckets_as_the_loader_reads_them(tmp_path):
    from swiglu.kernels.configs import DswigluGluonConfig, GluonConfig
    from swiglu_lab.experiments.candidates import DSWIGLU_CANDIDATES, GRAD_X_CANDIDATES

    got = _variant(tmp_path, "--gluon-dswiglu", "128=3", "--gluon-grad-x", "512=1")
    assert DswigluGluonConfig(**got["gluon_dswiglu"]["128"]["config"]) == DSWIGLU_CANDIDATES[3]
    assert GluonConfig(**got["gluon_grad_x"]["512"]["config"]) == GRAD_X_CANDIDATES[1]


def test_a_candidate_enters_before_set_changes_it(tmp_path):
    from dataclasses import replace

    from swiglu.kernels.configs import GluonConfig
    from swiglu_lab.experiments.candidates import WIDE_CANDIDATES

    got = _variant(tmp_path, "--gluon-grad-weights", "128=1", "--set", "gluon_grad_weights.128.GROUP_M=48")
    assert GluonConfig(**got["gluon_grad_weights"]["128"]["config"]) == replace(WIDE_CANDIDATES[1], GROUP_M=48)
    assert got["gluon_grad_weights"]["256"] == TABLE["gluon_grad_weights"]["256"]


@pytest.mark.parametrize(
    "path, message",
    [
        ("gluon_grad_weights.999.GROUP_M=8", "no bucket '999'"),
        ("gluon_grad_weights.256.NOPE=8", "no field 'NOPE'"),
        ("grad_x.128.GROUP_M=8", "expected SECTION.BUCKET.FIELD"),
    ],
)
def test_paths_the_table_does_not_have_are_refused(tmp_path, path, message):
    with pytest.raises(SystemExit, match=message):
        tv.main(["--out", str(tmp_path / "v.json"), "--set", path])


@pytest.mark.parametrize("spec", ["128=99", "128", "128=x"])
def test_a_candidate_index_out_of_range_is_refused(tmp_path, spec):
    with pytest.raises(SystemExit, match="INDEX in 0.."):
        tv.main(["--out", str(tmp_path / "v.json"), "--gluon-grad-weights", spec])


def test_resident_candidates_enter_buckets_whose_tokens_they_hold(tmp_path):
    from swiglu.kernels.configs import GluonConfig
    from swiglu_lab.experiments.gluon_wgrad_resident import RESIDENT_CANDIDATES

    got = _variant(tmp_path, "--gluon-resident", "128=1")
    assert GluonConfig(**got["gluon_grad_weights"]["128"]["config"]) == RESIDENT_CANDIDATES[1]
    small = next(i for i, c in enumerate(RESIDENT_CANDIDATES) if c.resident_k < 256)
    with pytest.raises(SystemExit, match="fewer than bucket 256's"):
        tv.main(["--out", str(tmp_path / "w.json"), "--gluon-resident", f"256={small}"])


def test_set_takes_a_field_the_table_leaves_at_its_default(tmp_path):
    from swiglu.kernels.configs import GluonConfig

    assert "defer" not in TABLE["gluon_grad_weights"]["128"]["config"]
    got = _variant(tmp_path, "--set", "gluon_grad_weights.128.defer=true")
    assert GluonConfig(**got["gluon_grad_weights"]["128"]["config"]).defer is True
