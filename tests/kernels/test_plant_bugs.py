"""scripts/plant_bugs.py's recipes still apply: each bug's text occurs exactly once in its file and
its tests exist (a recipe that no longer matches would only show when someone reruns the script)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("plant_bugs", ROOT / "scripts" / "plant_bugs.py")
plant_bugs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plant_bugs)


@pytest.mark.parametrize("name", sorted(plant_bugs.BUGS))
def test_recipe_matches_the_code_once_and_names_existing_tests(name):
    file, old, new, tests, _ = plant_bugs.BUGS[name]
    text = (ROOT / file).read_text()
    assert text.count(old) == 1, f"{name}: {old!r} occurs {text.count(old)} times in {file}"
    assert old != new
    for test in tests:
        path, _, func = test.partition("::")
        source = (ROOT / path).read_text()
        assert not func or re.search(rf"^def {re.escape(func.split('[')[0])}\(", source, re.M), f"{name}: no test {test}"


def test_a_recipe_that_no_longer_matches_is_reported(tmp_path):
    (tmp_path / "f.py").write_text("a\na\n")
    with pytest.raises(SystemExit, match="2 times"):
        plant_bugs.plant(tmp_path, "f.py", "a", "b")
