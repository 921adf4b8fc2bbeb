"""conftest's SWIGLU_FAILURES_AT_ONCE: a failure's traceback on stderr when it happens."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, at_once: bool) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "fast_interpreter.py"):  # conftest imports the second
        shutil.copy(ROOT / "tests" / name, tmp_path / name)
    (tmp_path / "test_planted.py").write_text(
        'def test_fails():\n    assert 1 == 2, "planted failure"\n\ndef test_ok():\n    pass\n'
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    env.pop("SWIGLU_FAILURES_AT_ONCE", None)
    if at_once:
        env["SWIGLU_FAILURES_AT_ONCE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_failures_print_at_once_only_when_asked(tmp_path):
    asked = _run(tmp_path, True)
    assert asked.returncode == 1
    assert "FAILED test_planted.py::test_fails (call)" in asked.stderr and "planted failure" in asked.stderr
    quiet = _run(tmp_path, False)
    assert quiet.returncode == 1 and "planted failure" not in quiet.stderr
