"""Gradient validation: every implementation against the float64 oracle and the benchmark's check.

Two acceptance rules, both from ``docs/problem.md`` and ``docs/prior-art.md``:

* float64: ``relative_error(out, oracle) <= factor * relative_error(bf16 reference, oracle)``
  per output (``factor`` = 2, flash-attention's habit), with the Frobenius relative error of
  ``swiglu.accuracy.relative_error``;
* benchmark: ``swiglu.accuracy.benchmark_criterion(out, bf16 reference, atol, rtol)`` per output
  (>= 99% of elements within ``atol + rtol*|ref|``, no NaN/Inf).

Used by notebooks/02_validation.ipynb, the tests and the GPU scripts; needs only torch.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

import torch

from swiglu import api, ops
from swiglu.accuracy import benchmark_criterion, relative_error
from swiglu.api import swiglu_mlp_backward
from swiglu.inputs import BackwardInputs, make_inputs
from swiglu.reference import float64_backward, reference_backward
from swiglu.workloads import RTOL

if TYPE_CHECKING:
    import pandas as pd

OUTPUT_NAMES = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")

#: An implementation is accepted when its float64 error is at most this many times the bf16
#: reference's own.
ERROR_FACTOR = 2.0


def _as_callables(impls: Iterable[str] | Mapping[str, Callable]) -> dict[str, Callable]:
    if isinstance(impls, Mapping):
        return dict(impls)
    if isinstance(impls, str):
        impls = [s.strip() for s in impls.split(",") if s.strip()]

    def public(name: str) -> Callable:
        return lambda *args: swiglu_mlp_backward(*args, impl=name)

    return {name: public(name) for name in impls}


def _rms(t: torch.Tensor) -> float:
    # vector_norm avoids a full-size temporary (weight gradients are 872M elements at full size).
    return float(torch.linalg.vector_norm(t)) / t.numel() ** 0.5


def _error_sample(out: torch.Tensor, oracle: torch.Tensor, scale: float, n: int, generator: torch.Generator) -> torch.Tensor:
    """``|out - oracle| / scale`` at ``n`` random elements (all when fewer), float64 on the CPU."""
    o, r = out.reshape(-1), oracle.reshape(-1)
    if o.numel() > n:
        idx = torch.randint(0, o.numel(), (n,), generator=generator).to(o.device)
        o, r = o[idx], r[idx]
    return ((o.double() - r.double()).abs() / (scale or 1.0)).cpu()


def validate_case(
    inputs: BackwardInputs,
    impls: Iterable[str] | Mapping[str, Callable] = ("reference",),
    atol: float = 0.13,
    rtol: float = RTOL,
    *,
    case: str = "",
    factor: float = ERROR_FACTOR,
    samples: dict | None = None,
    sample_size: int = 200_000,
    seed: int = 0,
) -> list[dict]:
    """Check each implementation's four gradients on one set of inputs.

    Args:
        inputs: the eight backward inputs (``swiglu.make_inputs``), any device.
        impls: names for ``swiglu_mlp_backward(impl=...)`` (a list or a comma-separated string),
            or a mapping name -> function with ``reference_backward``'s signature.
        atol, rtol: the benchmark's tolerances for this case.
        case: a label copied into every row.
        factor: accepted float64 error ratio (impl error / bf16 reference error).
        samples: when a dict is given, it is filled with ``{(impl, output): tensor}`` of
            normalized errors ``|out - oracle| / rms(oracle)`` at ``sample_size`` random
            elements (float64, CPU), including ``("bf16 reference", output)``, for histograms.
        seed: seeds the element sampling.

    Returns:
        One dict per impl x output: ``case, tokens, hidden_size, intermediate_size, impl, output,
        status ("ok" or "error: ..."), seconds, rel_err, rel_err_bf16_ref, ratio, within_factor,
        criterion_pass, match_fraction, nonfinite, max_abs_err, oracle_rms, passed``.
        An implementation that raises gets one row per output with ``status`` naming the error
        and ``passed = False`` (it does not abort the other implementations).
    """
    tensors = inputs.as_tuple()
    before = [t.clone() for t in tensors]
    T = inputs.x.numel() // inputs.x.shape[-1]
    H, I = inputs.x.shape[-1], inputs.gate_output.shape[-1]
    oracle = float64_backward(*tensors)
    ref = reference_backward(*tensors)
    ref_err = [relative_error(r, o) for r, o in zip(ref, oracle)]
    oracle_rms = [_rms(o) for o in oracle]
    gen = torch.Generator().manual_seed(seed)
    if samples is not None:
        for name, r, o, rms in zip(OUTPUT_NAMES, ref, oracle, oracle_rms):
            samples[("bf16 reference", name)] = _error_sample(r, o, rms, sample_size, gen)
    rows: list[dict] = []
    base = {"case": case, "tokens": T, "hidden_size": H, "intermediate_size": I}
    for impl, fn in _as_callables(impls).items():
        start = time.perf_counter()
        try:
            outs = fn(*tensors)
            if inputs.x.is_cuda:
                torch.cuda.synchronize(inputs.x.device)
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - reported per impl, never fatal
            outs, status = None, f"error: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        seconds = time.perf_counter() - start
        if outs is not None and not all(torch.equal(a, b) for a, b in zip(before, tensors)):
            status = "error: inputs were modified"
        for k, name in enumerate(OUTPUT_NAMES):
            row = {
                **base,
                "impl": impl,
                "output": name,
                "status": status,
                "seconds": seconds,
                "rel_err_bf16_ref": ref_err[k],
                "oracle_rms": oracle_rms[k],
            }
            if outs is None:
                rows.append(
                    {
                        **row,
                        "rel_err": float("nan"),
                        "ratio": float("nan"),
                        "within_factor": False,
                        "criterion_pass": False,
                        "match_fraction": float("nan"),
                        "nonfinite": -1,
                        "max_abs_err": float("nan"),
                        "passed": False,
                    }
                )
                continue
            out = outs[k]
            if out.shape != oracle[k].shape:
                row["status"] = f"error: {name} has shape {tuple(out.shape)}, expected {tuple(oracle[k].shape)}"
                rows.append(
                    {
                        **row,
                        "rel_err": float("nan"),
                        "ratio": float("nan"),
                        "within_factor": False,
                        "criterion_pass": False,
                        "match_fraction": float("nan"),
                        "nonfinite": -1,
                        "max_abs_err": float("nan"),
                        "passed": False,
                    }
                )
                continue
            err = relative_error(out, oracle[k])
            # A zero reference error (exact) only happens for tiny sums; then demand exactness too.
            ratio = err / ref_err[k] if ref_err[k] > 0 else (1.0 if err == 0 else float("inf"))
            crit = benchmark_criterion(out, ref[k], atol, rtol)
            within = bool(ratio <= factor)
            rows.append(
                {
                    **row,
                    "rel_err": err,
                    "ratio": ratio,
                    "within_factor": within,
                    "criterion_pass": crit.passed,
                    "match_fraction": crit.match_fraction,
                    "nonfinite": crit.nonfinite,
                    "max_abs_err": crit.max_abs_error,
                    "passed": bool(row["status"] == "ok" and within and crit.passed),
                }
            )
            # impl "reference" is the bf16 reference itself: its sample would duplicate that one.
            if samples is not None and impl != "reference":
                samples[(impl, name)] = _error_sample(out, oracle[k], oracle_rms[k], sample_size, gen)
        del outs
    return rows


def impl_available(name: str) -> tuple[bool, str]:
    """Whether ``swiglu_mlp_backward(impl=name)`` can be resolved here: ``(True, "")`` or
    ``(False, reason)``. Imports the implementation's module (for "triton", set
    ``TRITON_INTERPRET=1`` first on a machine without a GPU)."""
    if name not in api.available_impls():
        if name == "triton":
            return False, ops.triton_reason(api._default_device(), 8, 8) or "Triton cannot run here"
        return False, f"unknown (have {api.available_impls()})"
    return True, ""


def parse_shapes(spec: str | Iterable[str]) -> list[tuple[int, int]]:
    """``"1x7,8x16"`` (batch_size x seq_len) -> ``[(1, 7), (8, 16)]``.

    Raises ``ValueError`` for an item that is not two positive integers joined by "x"."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    shapes = []
    for item in filter(None, items):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"shape {item!r} must be 'batch_size x seq_len', e.g. '8x16'")
        shapes.append((int(parts[0]), int(parts[1])))
    if not shapes:
        raise ValueError(f"no shapes in {spec!r}")
    return shapes


def run_validation(
    shapes: Iterable[tuple[str, int, int, float]],
    impls: Iterable[str] | Mapping[str, Callable],
    hidden_size: int,
    intermediate_size: int,
    *,
    device: str | torch.device = "cpu",
    rounds: int = 1,
    seed: int = 200,
    mode: str = "benchmark",
    samples: dict | None = None,
    sample_size: int = 200_000,
    progress: bool = True,
) -> "pd.DataFrame":
    """``validate_case`` over ``shapes`` = ``(label, batch_size, seq_len, atol)``, ``rounds``
    fresh input draws each (one generator seeded once with ``seed``, as the benchmark does),
    with a tqdm progress bar. Returns a DataFrame of all rows plus ``round``; ``samples`` (if
    given) collects the error samples of the first round of every shape, keyed
    ``(label, impl, output)``."""
    import pandas as pd
    from tqdm import tqdm  # text bar: tqdm.auto wants ipywidgets in notebooks

    shapes = list(shapes)
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    rows: list[dict] = []
    bar = tqdm(total=len(shapes) * rounds, desc="validate", disable=not progress)
    for label, batch_size, seq_len, atol in shapes:
        for r in range(rounds):
            bar.set_postfix_str(f"{label} round {r}")
            inputs = make_inputs(batch_size, seq_len, hidden_size, intermediate_size, mode=mode, generator=gen, device=device)
            case_samples = {} if (samples is not None and r == 0) else None
            for row in validate_case(
                inputs, impls, atol, case=label, samples=case_samples, sample_size=sample_size, seed=seed + r
            ):
                rows.append({**row, "batch_size": batch_size, "seq_len": seq_len, "atol": atol, "round": r})
            if case_samples:
                samples.update({(label, *key): v for key, v in case_samples.items()})
            del inputs
            if device.type == "cuda":
                torch.cuda.empty_cache()
            bar.update(1)
    bar.close()
    return pd.DataFrame(rows)


#: Error measures whose last digits depend on the machine: the interpreter's fp32 sums (numpy's
#: BLAS) run in a CPU-specific order, and two x86 machines gave relative errors 3e-5 apart.
#: ``stable_table`` rounds them to ``STABLE_DIGITS`` significant digits (a step of 1-10%, so a
#: value lands on the other side of a rounding boundary with odds of about 1e-3).
ROUNDED_COLUMNS = ("rel_err_bf16_ref", "oracle_rms", "rel_err", "ratio")
STABLE_DIGITS = 2
#: Columns no precision makes machine-independent: one element rounding to the neighbouring bf16
#: value turns a max_abs_err of 0 into 2.4e-4. ``stable_table`` drops them.
UNSTABLE_COLUMNS = ("max_abs_err",)


def significant(value: float, digits: int = STABLE_DIGITS) -> float:
    """``value`` rounded to ``digits`` significant digits (decimal, through its exact ``%e``
    text, so the same on every machine); NaN and infinities unchanged. Raises ``ValueError``
    for ``digits < 1``."""
    if digits < 1:
        raise ValueError(f"digits must be at least 1, got {digits}")
    value = float(value)
    return float(f"{value:.{digits - 1}e}") if math.isfinite(value) else value


def stable_table(results: "pd.DataFrame", digits: int = STABLE_DIGITS) -> "pd.DataFrame":
    """The validation table (``run_validation``) as ``make reproduce`` stores and plots it on a
    CPU, so that every machine writes the same bytes: ``ROUNDED_COLUMNS`` rounded to ``digits``
    significant digits, ``UNSTABLE_COLUMNS`` and ``seconds`` (wall clock) dropped; other columns
    (pass/fail, counts, match fractions, tolerances) as they are. Returns a new frame; the input
    is not modified."""
    out = results.drop(columns=[*UNSTABLE_COLUMNS, "seconds"], errors="ignore").copy()
    for column in ROUNDED_COLUMNS:
        if column in out:
            out[column] = [significant(v, digits) for v in out[column]]
    return out
