"""The full-size GPU validation of notebook 02 (all 18 cases, reference and Triton against float64,
the benchmark's criterion) without papermill: writes ``validation_cuda.csv`` in the notebook's
format plus the commit and UTC time it ran at, which the notebook's CPU run redraws as
``figures/02_validation_ratio_cuda.png``.

    SWIGLU_GIT_COMMIT=$(git rev-parse --short HEAD) python scripts/validate_gpu.py --out data/derived

GPU only; about three minutes on an H200.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "build" / "validation"), help="folder for validation_cuda.csv")
    p.add_argument("--cases", default="all")
    p.add_argument("--impls", default="reference,triton")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=200)
    args = p.parse_args(argv)

    import torch

    import swiglu
    from swiglu_lab.bench.environment import git_info
    from swiglu_lab.research import gradient_validation as validate

    if not torch.cuda.is_available():
        raise SystemExit("validate_gpu.py needs a CUDA GPU (notebook 02 runs the reduced sizes on a CPU)")
    shapes = [(c.name, c.batch_size, c.seq_len, c.atol) for c in swiglu.select_cases(args.cases)]
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    results = validate.run_validation(
        shapes,
        impls,
        swiglu.HIDDEN_SIZE,
        swiglu.INTERMEDIATE_SIZE,
        device="cuda",
        rounds=args.rounds,
        seed=args.seed,
        mode="benchmark",
    )
    results = results.drop(columns=["seconds"], errors="ignore")
    results.insert(0, "device", torch.cuda.get_device_name())
    results["commit"] = git_info(REPO)["commit"]
    results["utc"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results.to_csv(out / "validation_cuda.csv", index=False)
    ok = results["passed"].all()
    print(results.groupby("impl")[["passed"]].mean().to_string())
    print(f"wrote {out / 'validation_cuda.csv'}: {len(results)} rows, all passed: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
