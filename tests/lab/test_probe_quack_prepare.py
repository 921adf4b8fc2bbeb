"""lab/probes/probe_quack_prepare.py's variants: quack's layout made before every call, and ours
after the same copy (its result dropped, the arguments passed on unchanged)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("probe_quack_prepare", ROOT / "lab" / "probes" / "probe_quack_prepare.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def test_the_copy_variants():
    from swiglu_lab.bench.impls import IMPLS

    seen = []
    impls = probe.impls_with_copies(IMPLS, lambda args: seen.append(args) or ("laid", "out"))
    assert impls["quack"].prepare_every_call is False
    copy = impls["quack-copy-each-call"]
    assert copy.prepare_every_call is True and copy.prepare is IMPLS["quack"].prepare and copy.build is IMPLS["quack"].build
    ours = impls["triton-after-copy"]
    args = (1, 2, 3)
    assert ours.prepare_every_call is True and ours.build is IMPLS["triton"].build
    assert ours.prepare(args) is args and seen == [args]
    assert set(probe.IMPL_NAMES) <= set(impls)
