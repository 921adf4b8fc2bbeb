"""The one home of the kernels' configuration tables on the writing side: what a tuning run
measured, turned into the JSON the library reads (``swiglu.kernels.configs`` for the backward's
``backward_configs.json``, ``swiglu.kernels.forward`` for ``forward_configs.json``), each entry
with the time that chose it. ``scripts/tune_kernels.py --write-best`` writes the backward's tl
entries; ``scripts/train_step_gpu.py`` the forward's; the Gluon sections come from the probes
(``gluon_wgrad_table``: ``lab/probes/probe_wgrad_defer.py --write-table``)."""

from __future__ import annotations

import re
from dataclasses import asdict, replace

from swiglu.kernels.configs import KernelConfig, bucket_for, bucket_key

#: The fused forward kernel's candidates (``swiglu.kernels.forward``), which
#: ``swiglu_lab.research.train_step`` measures (``forward_table`` writes the fastest per bucket):
#: 128x128 tiles hold two fp32 accumulators (gate, up) in 8 warps' registers; 3 stages of
#: (x, gate_weight, up_weight) tiles = 144 KiB of shared memory.
FUSED_BIG = KernelConfig(BM=128, BN=128, BK=64, GROUP_M=8, EPI_SPLIT=2, num_stages=3, num_warps=8)
#: 64-row tiles: twice the tiles at small T, so more of the 132 SMs have work.
FUSED_SMALL = KernelConfig(BM=64, BN=128, BK=64, GROUP_M=8, EPI_SPLIT=2, num_stages=4, num_warps=4)
FUSED_CANDIDATES = {
    "fused_128": FUSED_BIG,
    "fused_128_s4": replace(FUSED_BIG, num_stages=4),
    # As the backward's tuned dSwiGLU GEMM at large T: a warp-specialized, flattened tile loop.
    "fused_128_ws": replace(FUSED_BIG, warp_specialize=True, flatten=True),
    "fused_64": FUSED_SMALL,
}


def backward_table(rows: list[dict], old: dict, meta: dict) -> dict:
    """``old`` (the backward table as loaded) with the fastest correct tl config per kernel and
    bucket of ``rows`` (tune_kernels rows: ``kernel``, ``tokens``, ``config``, ``config_dict``,
    ``ms``, ``tflops``, ``cublas_ms``, ``err``; correct: err < 1e-2 against cuBLAS) written in;
    buckets a run did not measure keep their entry, and every other section (the Gluon kernels')
    is kept as it is. ``meta`` (gpu, versions, utc, protocol) updates the table's."""
    best: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r["config"] == "cublas" or r["kernel"] == "ceiling" or not (r["err"] < 1e-2) or not (r["ms"] > 0):
            continue
        key = bucket_key(bucket_for(r["tokens"]))
        cur = best.setdefault(r["kernel"], {}).get(key)
        if cur is None or r["ms"] < cur["ms"]:
            best[r["kernel"]][key] = r
    configs = {
        kernel: {k: {"utc": old["meta"].get("utc"), **e} for k, e in entries.items()}
        for kernel, entries in old["configs"].items()
    }
    for kernel, entries in best.items():
        for key, r in entries.items():
            configs.setdefault(kernel, {})[key] = dict(
                config=r["config_dict"],
                measured_tokens=r["tokens"],
                ms=round(r["ms"], 4),
                tflops=round(r["tflops"], 1),
                cublas_ms=round(r["cublas_ms"], 4),
                utc=meta.get("utc"),
            )
    return {**old, "meta": {**old["meta"], **meta}, "configs": configs}


def forward_table(table: dict, meta: dict) -> dict:
    """The forward table in ``forward_configs.json``'s format from ``{bucket: (candidate name,
    KernelConfig or None for cuBLAS, ms, measured tokens)}``."""
    return {
        "note": "written by swiglu_lab.research.train_step (scripts/train_step_gpu.py); fastest forward per token bucket",
        "meta": meta,
        "configs": {
            bucket_key(b): {"candidate": name, "config": None if cfg is None else asdict(cfg), "ms": ms, "measured_tokens": T}
            for b, (name, cfg, ms, T) in sorted(table.items())
        },
    }


def shape_forward_table(doc: dict, hidden_size: int, intermediate_size: int, base: dict) -> dict:
    """``base`` (a ``forward_configs.json``, the package's) with ``doc``'s buckets (a
    ``forward_table`` measured at hidden_size x intermediate_size) as its ``configs_by_shape``
    entry for that shape: the file to put in the package's place, every other choice kept."""
    run = doc.get("meta", {}).get("run_id")
    entry = {b: {**e, "run_id": run} for b, e in doc["configs"].items()}
    by_shape = {**base.get("configs_by_shape", {}), f"{hidden_size}x{intermediate_size}": entry}
    return {**base, "configs_by_shape": by_shape}


def parse_tile(text: str, base):
    """``"BMxBNxBK Sn NCm"`` (or ``"BMxBN+BN2xBK ..."``, a wide tile) as ``base`` (a GluonConfig)
    with those fields: the weight-gradient probes' tile names (``--tiles``, ``--tile``)."""
    tile, stages, nc = text.split()
    bm, bn, bk = tile.split("x")
    bn, _, bn2 = bn.partition("+")
    return replace(base, BM=int(bm), BN=int(bn), BN2=int(bn2 or 0), BK=int(bk), STAGES=int(stages[1:]), NC=int(nc[2:]))


#: A Gluon variant's label in ``lab/probes/probe_wgrad_defer.py``'s rows:
#: "gluon [table ][ping-pong ]BMxBN[+BN2]xBK S<stages> NC<n>[ r<mma_regs>][ defer][ pingpong| twin]"
#: (``lab/probes/probe_wgrad_defer.py``'s ``gluon_label``; the "ping-pong " prefix: the ping-pong
#: kernel, the table's entry or a wide candidate; the " pingpong" suffix: a ping-pong candidate,
#: " twin": the cooperative kernel timed beside it).
_GLUON_LABEL = re.compile(
    r"gluon (table )?(ping-pong )?(\d+)x(\d+)(?:\+(\d+))?x(\d+) S(\d+) NC(\d+)(?: r(\d+))?"
    r"( defer)?( pingpong| twin)?$"
)


def gluon_wgrad_table(rows: list[dict], old: dict, base: dict, source: str, margin: float = 0.02) -> dict:
    """``old`` (the backward table) with its ``gluon_grad_weights`` section updated from a
    weight-gradient probe: per token count probed in both orientations, the Gluon variant with the
    least total time that is close to cuBLAS and, deferred, bitwise its undeferred twin, replaces
    the current choice (the table's Gluon entry, "gluon table ...", or the tl kernel where the
    bucket has none) only when faster by ``margin``; the tl kernel it beats that way loses the
    bucket to it. ``base``: the GluonConfig fields the labels do not carry (warps, registers,
    GROUP_M) as a dict. Returns the new table; other sections untouched."""
    by_t: dict[int, dict[str, list[dict]]] = {}
    for r in rows:
        by_t.setdefault(int(r["T"]), {}).setdefault(r["variant"], []).append(r)
    section = dict(old.get("gluon_grad_weights", {}))
    for T, variants in sorted(by_t.items()):
        shapes = {r["shape"] for rs in variants.values() for r in rs}

        def total(rs):
            ok = (
                len(rs) == len(shapes)
                and all(str(r["close_to_cublas"]) == "True" for r in rs)
                and all(str(r["bitwise_defer_off"]) in ("True", "None", "", "nan") for r in rs)
            )
            return sum(float(r["ms"]) for r in rs) if ok else float("inf")

        gluon = {v: total(rs) for v, rs in variants.items() if _GLUON_LABEL.match(v)}
        if not gluon:
            continue
        best = min(gluon, key=gluon.get)
        current = (
            next((v for v in variants if v.startswith("gluon table ") and not v.endswith(" defer")), None)
            if bucket_key(bucket_for(T)) in section
            else next((v for v in variants if v.startswith("tl ")), None)
        )
        if current is None or not gluon[best] < (1 - margin) * total(variants[current]):
            continue
        _, table_pingpong, bm, bn, bn2, bk, stages, nc, regs, defer, pingpong = _GLUON_LABEL.match(best).groups()
        config = {
            **base,
            "BM": int(bm),
            "BN": int(bn),
            "BK": int(bk),
            "STAGES": int(stages),
            "NC": int(nc),
            "defer": defer is not None,
            "pingpong": pingpong == " pingpong" or table_pingpong is not None,
            "BN2": int(bn2 or 0),
            "mma_regs": int(regs or 0),
        }
        times = {r["shape"]: float(r["ms"]) for r in variants[best]}
        section[bucket_key(bucket_for(T))] = {
            "config": config,
            "ms_" + "_".join(sorted(times)): [times[k] for k in sorted(times)],
            "replaced": f"{current}: {total(variants[current]):.4f} ms (both orientations)",
            "source": source,
        }
    return {**old, "gluon_grad_weights": section}
