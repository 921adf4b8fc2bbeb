"""The one home of the kernels' configuration tables on the writing side: what a tuning run
measured, turned into the JSON the library reads (``swiglu.kernels.configs`` for the backward's
``backward_configs.json``, ``swiglu.kernels.forward`` for ``forward_configs.json``), each entry
with the time that chose it. ``scripts/tune_kernels.py --write-best`` writes the backward's tl
entries; ``scripts/train_step_gpu.py`` the forward's; the Gluon sections come from the probes."""

from __future__ import annotations

from dataclasses import asdict

from swiglu.kernels.configs import bucket_for, bucket_key


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
    configs = {kernel: {k: {"utc": old["meta"].get("utc"), **e} for k, e in entries.items()}
               for kernel, entries in old["configs"].items()}
    for kernel, entries in best.items():
        for key, r in entries.items():
            configs.setdefault(kernel, {})[key] = dict(
                config=r["config_dict"], measured_tokens=r["tokens"], ms=round(r["ms"], 4), tflops=round(r["tflops"], 1),
                cublas_ms=round(r["cublas_ms"], 4), utc=meta.get("utc"))
    return {**old, "meta": {**old["meta"], **meta}, "configs": configs}


def forward_table(table: dict, meta: dict) -> dict:
    """The forward table in ``forward_configs.json``'s format from ``{bucket: (candidate name,
    KernelConfig or None for cuBLAS, ms, measured tokens)}``."""
    return {"note": "written by swiglu_lab.research.train_step (scripts/train_step_gpu.py); fastest forward per token bucket",
            "meta": meta,
            "configs": {bucket_key(b): {"candidate": name, "config": None if cfg is None else asdict(cfg), "ms": ms,
                                        "measured_tokens": T} for b, (name, cfg, ms, T) in sorted(table.items())}}
