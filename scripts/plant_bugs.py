"""Plant a known bug in a copy of the repository and run the CPU tests that should catch it.

"How we know the tests work" (tests/README.md): each bug below is one exact text replacement in
one file; the copy (tracked and untracked, not ignored, files) goes to build/plant/<bug>/, the
bug is applied there (the working tree is never touched), and pytest runs the bug's tests in the
copy with the copy's src/ first on the path. A bug is CAUGHT when at least one of those tests
fails; the script exits non-zero if any bug was missed, or if a replacement no longer matches
(the code moved: update the recipe).

    PYTHONPATH=src:lab python scripts/plant_bugs.py                  # every bug, its listed tests
    PYTHONPATH=src:lab python scripts/plant_bugs.py grad_x_scale     # one bug
    PYTHONPATH=src:lab python scripts/plant_bugs.py --list           # the bugs and their tests
    PYTHONPATH=src:lab python scripts/plant_bugs.py median_as_mean --tests tests/lab/test_bench.py

Takes about 3 minutes for all bugs on the 2-core CI machine (most of it the TP spawn).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: name -> (file, exact old text, new text, tests to run, what the bug is)
BUGS = {
    "grad_x_scale": (
        "src/swiglu/kernels/tl_kernels.py",
        "\n    _store_split(gx_desc, acc, off_m, off_n, BN, EPI_SPLIT, UPCAST)",
        "\n    _store_split(gx_desc, acc * 0.999, off_m, off_n, BN, EPI_SPLIT, UPCAST)",
        [
            "tests/kernels/test_triton_cpu.py::test_odd_shapes_against_float64",
            "tests/library/test_module.py::test_triton_path_bf16_grads",
            "tests/library/test_forward.py::test_lean_module_on_triton_is_the_backward_of_its_forward",
        ],
        "grad_x 0.1% too small (the fp32 result scaled by 0.999 before its rounding to bf16)",
    ),
    "grad_x_split_tail_run_lost": (
        "src/swiglu/kernels/tl_kernels.py",
        "            for r in tl.range(0, SPLITS):",
        "            for r in tl.range(1, SPLITS):",
        ["tests/kernels/test_grad_x_split_tail.py::test_split_tiles_against_float64"],
        "the split-tail grad_x's finisher leaves out a last tile's first run of k-steps",
    ),
    "grad_x_split_tail_early_finish": (
        "src/swiglu/kernels/tl_kernels.py",
        "        if arrived == SPLITS - 1:",
        "        if arrived == SPLITS - 2:",
        ["tests/kernels/test_grad_x_split_tail.py::test_split_tiles_against_float64"],
        "the split-tail grad_x's last tiles finished one arrival early, before every run is stored",
    ),
    "weight_grad_scale": (
        "src/swiglu/kernels/tl_kernels.py",
        "            _store_split(c_desc, acc, off_m, off_n, BN, EPI_SPLIT, UPCAST)",
        "            _store_split(c_desc, acc * 1.001, off_m, off_n, BN, EPI_SPLIT, UPCAST)",
        [
            "tests/kernels/test_triton_cpu.py::test_odd_shapes_against_float64",
            "tests/library/test_module.py::test_triton_path_frozen_weights",
        ],
        "every weight gradient 0.1% too large (TMA-store path of grad_weight_kernel)",
    ),
    "unrounded_g": (
        "src/swiglu/kernels/tl_kernels.py",
        "    g = _f32(_bf16(acc, UPCAST), UPCAST)",
        "    g = acc",
        ["tests/kernels/test_triton_cpu.py::test_odd_shapes_against_float64"],
        "the dSwiGLU epilogue skips the reference's bf16 rounding of g = grad_output @ down_weight",
    ),
    "backward_raises": (
        "src/swiglu/kernels/backward.py",
        "    recompute = activated_gate is None\n",
        "    raise RuntimeError('planted bug: the Triton backward fails')\n    recompute = activated_gate is None\n",
        [
            "tests/kernels/test_triton_cpu.py::test_odd_shapes_against_float64",
            "tests/library/test_module.py::test_triton_path_bf16_grads",
        ],
        "the Triton backward raises on every call",
    ),
    "median_as_mean": (
        "lab/swiglu_lab/bench/stats.py",
        '"median_ms": float(np.median(t)),',
        '"median_ms": float(t.mean()),',
        ["tests/lab/test_bench.py"],
        "the benchmark's median computed as the mean",
    ),
    "tp_rank_exits_nonzero": (
        "tests/tp_worker.py",
        "on the 2-core machine).\n    os._exit(0)",
        "on the 2-core machine).\n    os._exit(0 if rank else 3)",
        ["tests/library/test_parallel.py::test_scenario"],
        "rank 0 exits with status 3 after writing its results (a crash in teardown)",
    ),
}


def copy_repo(dest: Path) -> None:
    """Tracked and untracked (not ignored) files of the working tree, as they are now."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    if dest.exists():
        shutil.rmtree(dest)
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def plant(dest: Path, file: str, old: str, new: str) -> None:
    path = dest / file
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{file}: the text to replace occurs {text.count(old)} times, not once; update the recipe:\n{old}")
    path.write_text(text.replace(old, new))


def run_tests(dest: Path, tests: list[str]) -> tuple[int, str, list[str]]:
    """pytest in the copy; returns (exit status, summary line, failed test ids)."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(dest / "src"), str(dest / "lab")]),
        TRITON_INTERPRET="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *tests],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
    )
    lines = done.stdout.strip().splitlines()
    failed = [m.group(1) for line in lines if (m := re.match(r"FAILED (\S+)", line))]
    return done.returncode, (lines[-1] if lines else done.stderr.strip()[-300:]), failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bugs", nargs="*", help=f"bugs to plant (default: all of {', '.join(BUGS)})")
    parser.add_argument("--tests", nargs="+", help="pytest arguments to run instead of the bug's own list")
    parser.add_argument("--list", action="store_true", help="print the bugs and their tests, run nothing")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "plant", help="where the copies go")
    args = parser.parse_args(argv)
    names = args.bugs or list(BUGS)
    unknown = set(names) - set(BUGS)
    if unknown:
        parser.error(f"unknown bugs {sorted(unknown)}; known: {', '.join(BUGS)}")
    if args.list:
        for name in names:
            file, _, _, tests, what = BUGS[name]
            print(f"{name}: {what}\n  in {file}\n  tests: {' '.join(tests)}")
        return 0
    missed = []
    for name in names:
        file, old, new, tests, what = BUGS[name]
        dest = args.out / name
        start = time.perf_counter()
        copy_repo(dest)
        plant(dest, file, old, new)
        status, summary, failed = run_tests(dest, args.tests or tests)
        caught = status == 1 and failed  # 1: tests failed (not a collection or usage error)
        print(f"{'CAUGHT' if caught else 'MISSED'} {name} ({what}): {summary} [{time.perf_counter() - start:.0f} s]")
        for test in failed:
            print(f"    failed: {test}")
        if not caught:
            missed.append(name)
    if missed:
        print(f"missed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
