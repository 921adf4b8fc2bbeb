"""Do the four lab Gluon MoE kernels (weight gradients, up projection, dSwiGLU, the down projection
and grad_x) run right on the GPU, and which are faster than the library's tl kernels? One device
call for their probes.

Each probe's ``--smoke`` runs first in its own process under a timeout (a barrier fault hangs);
only a kernel whose smoke finished with every output bitwise the library's then runs its full
probe (all four model shapes at 8192 tokens), while the deadline allows. Each probe's output goes
to ``<out>/<probe>_smoke.log`` and ``<out>/<probe>.log``; a summary table last.
Answer: all four smokes and full probes ran bitwise on an H200 in 165 s (data/tuning/moe_gluon_20261205.log);
the ping-pong and gathering kernels' ran bitwise on an H100 in 186 s (moe_gluon_pingpong_gather_20261205.log).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_gluon_run.py --out $OUT/moe_gluon [--deadline-s 560]
     [--probes moe_gluon_up,...] [--no-smoke]   (a second call: the full probes the first had no time for)
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

PROBES = ("moe_gluon_wgrad", "moe_gluon_up", "moe_gluon_dswiglu", "moe_gluon_pairs")
HERE = Path(__file__).resolve().parent


def run(name: str, args: list[str], log: Path, timeout: float) -> tuple[str, str]:
    """(status, output) of ``lab/probes/<name>.py args`` under ``timeout`` seconds."""
    cmd = [sys.executable, str(HERE / f"{name}.py"), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out, status = done.stdout + done.stderr, f"exit {done.returncode}"
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        status = f"timed out after {timeout:.0f} s (a hang?)"
    log.write_text(out)
    return status, out


def bitwise(out: str) -> bool:
    """Every compared line of a probe's output says bitwise=True, and there is at least one."""
    lines = [ln for ln in out.splitlines() if "bitwise=" in ln]
    return bool(lines) and all("bitwise=True" in ln for ln in lines) and " failed:" not in out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="build/moe_gluon")
    parser.add_argument("--deadline-s", type=float, default=560.0, help="no probe starts after this")
    parser.add_argument("--smoke-timeout-s", type=float, default=150.0)
    parser.add_argument("--probes", default=",".join(PROBES), help="comma-separated, of: " + ", ".join(PROBES))
    parser.add_argument("--no-smoke", action="store_true", help="full probes at once (their smokes passed in an earlier call)")
    args = parser.parse_args()
    probes = [n for n in args.probes.split(",") if n]
    if unknown := [n for n in probes if n not in PROBES]:
        parser.error(f"--probes: unknown {unknown}; choose from {', '.join(PROBES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + args.deadline_s
    summary = []
    passed = []
    for name in [] if args.no_smoke else probes:
        left = end - time.monotonic()
        if left < 30:
            summary.append((name, "smoke", "skipped: deadline"))
            continue
        status, text = run(name, ["--smoke"], out / f"{name}_smoke.log", min(args.smoke_timeout_s, left))
        ok = status == "exit 0" and bitwise(text)
        summary.append((name, "smoke", f"{status}, bitwise {'yes' if ok else 'NO'}"))
        print(f"{name} smoke: {status}, bitwise {'yes' if ok else 'NO'}", flush=True)
        if ok:
            passed.append(name)
    for name in probes if args.no_smoke else passed:
        left = end - time.monotonic()
        if left < 60:
            summary.append((name, "full", "skipped: deadline"))
            continue
        status, text = run(name, [], out / f"{name}.log", left)
        summary.append((name, "full", status))
        print(text[-2500:], flush=True)
    print("\nprobe               run    outcome")
    for name, kind, what in summary:
        print(f"{name:19s} {kind:6s} {what}")


if __name__ == "__main__":
    main()
