"""scripts/probe_multicast.py on the CPU: the 2-CTA cluster tile compiles for sm_90 under triton
>= 3.7 with the multicast TMA load and the cluster launch in its PTX, and the check names a
missing multicast (the same kernel with multicast off). Its GPU run: data/validation/."""

import importlib.util
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[1]
NEW_ENOUGH = tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 7)
pytestmark = pytest.mark.skipif(not NEW_ENOUGH, reason=f"needs triton >= 3.7, this is {triton.__version__}")


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("probe_multicast", ROOT / "scripts" / "probe_multicast.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cluster_tile_compiles_with_a_multicast_load(probe):
    assert probe.compile_check() == []


def test_the_check_names_a_missing_multicast(probe):
    assert probe.compile_check(multicast=False) == ["multicast::cluster"]
