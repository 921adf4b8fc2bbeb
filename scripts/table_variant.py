"""A variant of the kernel table (``src/swiglu/kernels/backward_configs.json``) for
``lab/probes/probe_wgrad_table_ab.py --against-json``: the committed table with some entries changed.

    python scripts/table_variant.py --out build/ab/K.json --set gluon_grad_weights.256.GROUP_M=48
    python scripts/table_variant.py --out build/ab/A.json --gluon-dswiglu 128=0 512=2 2048=0
    python scripts/table_variant.py --out build/ab/F.json --set "gluon_dswiglu.*.GROUP_M=16" "configs.grad_x.*.GROUP_M=16"
    python scripts/table_variant.py --out build/ab/X.json --gluon-grad-x 128=1 256=0
    python scripts/table_variant.py --out build/ab/W.json --gluon-grad-weights 128=0 --set gluon_grad_weights.128.GROUP_M=48
    python scripts/table_variant.py --out build/ab/R.json --gluon-resident 128=1 256=3
    python scripts/table_variant.py --out build/ab/D.json --set gluon_grad_weights.128.defer=true

``--set PATH=VALUE``: PATH is ``SECTION.BUCKET.FIELD`` (FIELD one of the config class's, set in
the table or not; sections ``gluon_grad_weights``,
``gluon_dswiglu``, ``gluon_grad_x``) or ``configs.KERNEL.BUCKET.FIELD`` (the tl kernels); BUCKET
``*`` means every bucket the section has; VALUE is read as JSON (48, true, "x"). Each named
bucket must exist. ``--gluon-dswiglu BUCKET=INDEX``: that bucket takes ``swiglu_lab.experiments.candidates.DSWIGLU_CANDIDATES[INDEX]``;
``--gluon-grad-x BUCKET=INDEX``: ``candidates.GRAD_X_CANDIDATES[INDEX]``;
``--gluon-grad-weights BUCKET=INDEX``: ``candidates.WIDE_CANDIDATES[INDEX]`` (the wide tiles: ping-pong, then cooperative 256 x 192);
``--gluon-resident BUCKET=INDEX``: ``swiglu_lab.experiments.gluon_wgrad_resident.RESIDENT_CANDIDATES[INDEX]`` (A held in
shared memory; its ``resident_k`` must hold the bucket's tokens).
Candidates enter first, then ``--set`` changes fields (of a candidate too). Every changed entry
gets a ``"variant"`` note saying what changed. Prints the changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "src" / "swiglu" / "kernels" / "backward_configs.json"
GLUON_SECTIONS = ("gluon_grad_weights", "gluon_dswiglu", "gluon_grad_x")


def _config_fields(section: str) -> set[str]:
    # The fields a section's config class has, set in the table or left at their defaults.
    from swiglu.kernels.configs import DswigluGluonConfig, GluonConfig, KernelConfig

    cls = {"configs": KernelConfig, "gluon_dswiglu": DswigluGluonConfig}.get(section, GluonConfig)
    return {f.name for f in dataclasses.fields(cls)}


def apply_set(table: dict, path: str, value) -> list[str]:
    """Set one field; returns the changed entries' paths."""
    parts = path.split(".")
    if parts[0] == "configs" and len(parts) == 4:
        section, (bucket, field) = table["configs"][parts[1]], parts[2:]
        label = f"configs.{parts[1]}"
    elif parts[0] in GLUON_SECTIONS and len(parts) == 3:
        section, (bucket, field) = table.setdefault(parts[0], {}), parts[1:]
        label = parts[0]
    else:
        raise SystemExit(
            f"--set {path}: expected SECTION.BUCKET.FIELD (SECTION one of {', '.join(GLUON_SECTIONS)}) "
            "or configs.KERNEL.BUCKET.FIELD"
        )
    buckets = list(section) if bucket == "*" else [bucket]
    changed = []
    for b in buckets:
        if b not in section:
            raise SystemExit(f"--set {path}: {label} has no bucket {b!r} (it has {', '.join(section) or 'none'})")
        config = section[b]["config"]
        if field not in config and field not in _config_fields(parts[0]):
            raise SystemExit(f"--set {path}: {label}.{b} has no field {field!r}")
        config[field] = value
        section[b]["variant"] = f"{field} = {value!r} (scripts/table_variant.py)"
        changed.append(f"{label}.{b}.{field} = {value!r}")
    return changed


def apply_candidate(table: dict, section: str, spec: str, candidates) -> str:
    bucket, _, index = spec.partition("=")
    if not index.isdigit() or int(index) >= len(candidates):
        raise SystemExit(f"{section} {spec}: expected BUCKET=INDEX with INDEX in 0..{len(candidates) - 1}")
    config = candidates[int(index)]
    table.setdefault(section, {})[bucket] = {
        "config": dataclasses.asdict(config),
        "candidate": int(index),
        "variant": f"candidate {index} (scripts/table_variant.py)",
    }
    return f"{section}.{bucket} = candidate {index}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where to write the variant (e.g. build/ab/X.json)")
    p.add_argument("--set", nargs="*", default=[], metavar="PATH=VALUE")
    p.add_argument("--gluon-dswiglu", nargs="*", default=[], metavar="BUCKET=INDEX")
    p.add_argument("--gluon-grad-x", nargs="*", default=[], metavar="BUCKET=INDEX")
    p.add_argument("--gluon-grad-weights", nargs="*", default=[], metavar="BUCKET=INDEX")
    p.add_argument("--gluon-resident", nargs="*", default=[], metavar="BUCKET=INDEX")
    args = p.parse_args(argv)

    table = json.loads(TABLE.read_text())
    changes = []
    if args.gluon_grad_weights:
        from swiglu_lab.experiments.candidates import WIDE_CANDIDATES

        changes += [apply_candidate(table, "gluon_grad_weights", s, WIDE_CANDIDATES) for s in args.gluon_grad_weights]
    if args.gluon_resident:
        from swiglu_lab.experiments.gluon_wgrad_resident import RESIDENT_CANDIDATES

        for spec in args.gluon_resident:
            bucket, _, index = spec.partition("=")
            changes.append(apply_candidate(table, "gluon_grad_weights", spec, RESIDENT_CANDIDATES))
            if bucket.isdigit() and int(bucket) > RESIDENT_CANDIDATES[int(index)].resident_k:
                raise SystemExit(
                    f"--gluon-resident {spec}: the candidate holds {RESIDENT_CANDIDATES[int(index)].resident_k} "
                    f"tokens, fewer than bucket {bucket}'s"
                )
    if args.gluon_dswiglu:
        from swiglu_lab.experiments.candidates import DSWIGLU_CANDIDATES

        changes += [apply_candidate(table, "gluon_dswiglu", s, DSWIGLU_CANDIDATES) for s in args.gluon_dswiglu]
    if args.gluon_grad_x:
        from swiglu_lab.experiments.candidates import GRAD_X_CANDIDATES

        changes += [apply_candidate(table, "gluon_grad_x", s, GRAD_X_CANDIDATES) for s in args.gluon_grad_x]
    for item in args.set:
        path, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item}: expected PATH=VALUE")
        changes += apply_set(table, path, json.loads(raw))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    print("\n".join(changes) or "no change")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
