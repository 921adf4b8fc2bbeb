"""Execute every notebook and regenerate figures/ and data/derived/: ``make reproduce``.

    python -m swiglu_lab.research.reproduce                 # CPU: recorded H200 data for latency, reduced sizes for validation
    python -m swiglu_lab.research.reproduce --smoke         # tiny sizes, outputs under build/smoke/ (CI)
    python -m swiglu_lab.research.reproduce --live          # on a CUDA GPU: re-measure latency, validate at full size
    python -m swiglu_lab.research.reproduce --only 02       # one notebook (name, number or part of the name)
    python -m swiglu_lab.research.reproduce --strip-outputs # notebooks saved from a Jupyter back to their committed form

Executed notebooks go to ``build/notebooks/`` (``build/smoke/notebooks/`` with ``--smoke``),
figures (PNG + SVG) to ``figures/``, derived tables (CSV) to ``data/derived/``, and the tables of
numbers in README.md and docs/ are regenerated from those (``swiglu_lab.research.docs_tables``);
figures whose pixels depend on the machine (CPU error histograms) go to ``build/figures/``, so
that a run on any machine leaves the committed files unchanged.

A run that picks a subset or other data (``--only``, ``--run-id``, ``--protocol``,
``--bench-dir``, ``--tp-dir``) writes its figures, tables and documents under
``build/reproduce/`` instead, unless ``--overwrite`` is given: the committed files always come
from one run over all notebooks and the recorded data. Before a notebook runs, the derived tables
it writes (``DERIVED``) are removed from the target folder, so tables of two runs never mix (a
run without power data leaves no stale ``power_per_case.csv`` of another).

Engines: papermill (a Jupyter kernel per notebook; the executed notebooks keep their outputs) or,
where papermill is not installed (the GPU machine), ``python``: the notebook's code cells run
in this process with the same parameters, their printed output stored in the written notebook.
papermill is imported lazily, so this module imports without it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..paths import repo_root

#: The notebooks, in execution order (file stems under notebooks/).
NOTEBOOKS = ("01_roofline", "02_validation", "03_latency", "04_history", "05_tensor_parallel", "06_training_memory", "07_moe")
#: Notebooks that wait for their first recorded GPU run: ``make reproduce`` leaves them out (so a
#: run writes no placeholder figure to commit), ``--only`` still runs them. With the run committed,
#: the notebook moves into ``NOTEBOOKS`` (and its figures, tables and outputs are committed).
PENDING_NOTEBOOKS: tuple[str, ...] = ()

#: The derived tables each notebook writes from the run it plots (removed before it runs).
#: 02_validation writes validation_<device>.csv for the device it runs on and reads the recorded
#: validation_cuda.csv on a CPU, so it removes nothing.
DERIVED = {
    "01_roofline": ("roofline_table.csv",),
    "02_validation": (),
    "03_latency": ("latency_per_case.csv", "latency_summary.csv", "power_per_case.csv"),
    "04_history": ("history.csv",),
    "05_tensor_parallel": ("tp_measured.csv", "tp_model.csv", "tp_overlap.csv"),
    "06_training_memory": ("train_step_summary.csv", "hf_step_runs.csv"),
    "07_moe": ("moe_roofline.csv", "moe_validation.csv", "moe_latency.csv"),
}
#: Where a subset run writes unless told to overwrite (see the module docstring).
SUBSET_DIR = Path("build/reproduce")

#: Parameters the ``--smoke`` configuration overrides, per notebook (tiny sizes, few samples).
SMOKE_PARAMETERS = {
    "02_validation": {
        "full_size": False,
        "cpu_hidden_size": 64,
        "cpu_intermediate_size": 128,
        "cpu_shapes": "1x1,1x7,2x19",
        "sample_size": 20000,
    },
}


@dataclass
class Result:
    """Outcome of one notebook: ``ok``, seconds, the executed notebook's path, and the error."""

    name: str
    ok: bool
    seconds: float
    output: Path
    error: str = ""


def parameter_names(notebook: str | Path) -> list[str]:
    """Names assigned in the notebook's cell tagged ``parameters`` (read with ``json`` + ``ast``,
    no Jupyter needed). Raises ``ValueError`` when the notebook has no such cell."""
    book = json.loads(Path(notebook).read_text())
    for cell in book["cells"]:
        if cell["cell_type"] == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse("".join(cell["source"]))
            return [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)]
    raise ValueError(f"{notebook} has no cell tagged 'parameters'")


def notebook_parameters(
    name: str,
    *,
    smoke: bool = False,
    live: bool = False,
    device: str = "auto",
    bench_dir: str | Path = "data/bench",
    run_id: str = "",
    protocol: str = "full",
    figures_dir: str | Path = "figures",
    derived_dir: str | Path = "data/derived",
    scratch_figures_dir: str | Path = "build/figures",
    declared: list[str] | None = None,
    tp_dir: str | Path = "data/tp",
    overwrite: bool = False,
) -> dict:
    """The papermill parameters for notebook ``name``, restricted to those it declares."""
    params = {
        "device": device,
        "bench_dir": str(bench_dir),
        "tp_dir": str(tp_dir),
        "run_id": run_id,
        "protocol": protocol,
        "figures_dir": str(figures_dir),
        "derived_dir": str(derived_dir),
        "scratch_figures_dir": str(scratch_figures_dir),
        "overwrite": bool(overwrite),
    }
    if name == "03_latency":
        params["live"] = bool(live)
    if smoke:
        params.update(SMOKE_PARAMETERS.get(name, {}))
    if declared is not None:
        params = {k: v for k, v in params.items() if k in declared}
    return params


def select_notebooks(only: str | None, notebooks_dir: Path) -> list[Path]:
    """Notebook paths in order; ``only`` is a comma-separated list of names, numbers ("02") or
    name parts ("latency"). Raises ``ValueError`` when an item matches no notebook."""
    paths = [notebooks_dir / f"{n}.ipynb" for n in NOTEBOOKS]
    if not only:
        return paths
    paths += [notebooks_dir / f"{n}.ipynb" for n in PENDING_NOTEBOOKS if n not in NOTEBOOKS]
    chosen: list[Path] = []
    for item in (s.strip() for s in only.split(",") if s.strip()):
        hits = [p for p in paths if p.stem == item or p.stem.startswith(item) or item in p.stem]
        if not hits:
            raise ValueError(f"--only {item!r} matches no notebook; have {list(NOTEBOOKS) + list(PENDING_NOTEBOOKS)}")
        chosen.extend(h for h in hits if h not in chosen)
    return [p for p in paths if p in chosen]


def strip_outputs(paths: list[Path]) -> list[Path]:
    """Rewrite notebooks saved from any Jupyter in their committed form, with the code of
    ``make lab``'s save hook (``notebook_save.strip_file``: no outputs, execution counts or
    volatile metadata), so they diff cleanly. Returns the paths that changed. Figures and tables
    a notebook run wrote are not touched: ``git checkout`` restores those."""
    from .notebook_save import strip_file

    return [path for path in paths if strip_file(path)]


def _papermill_available() -> bool:
    try:
        import papermill  # noqa: F401
    except ImportError:
        return False
    return True


def execute_papermill(src: Path, out: Path, params: dict, cwd: Path) -> None:
    """Run ``src`` with papermill in a fresh ``python3`` kernel (this environment's Python)."""
    import tempfile

    import papermill
    from jupyter_client.manager import AsyncKernelManager

    # The kernel talks to papermill over Unix sockets in a temporary folder, not TCP (over TCP
    # ipykernel warns, once per notebook, that the traffic is unencrypted).
    with tempfile.TemporaryDirectory(prefix="swiglu-kernel-") as sockets:

        class IPCKernelManager(AsyncKernelManager):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.transport = "ipc"
                self.ip = str(Path(sockets) / "kernel")

        papermill.execute_notebook(
            str(src),
            str(out),
            parameters=params,
            kernel_name="python3",
            cwd=str(cwd),
            progress_bar=False,
            log_output=False,
            kernel_manager_class=IPCKernelManager,
        )


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


def execute_python(src: Path, out: Path, params: dict, cwd: Path, echo: bool = False) -> None:
    """Run ``src``'s code cells in this process (no Jupyter): the parameters cell, then
    ``params`` assigned, then the rest. Writes ``out`` with each cell's printed output as a stream
    output. Raises the first cell's exception (``RuntimeError`` naming the cell)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    book = json.loads(src.read_text())
    namespace: dict = {"__name__": "__main__"}
    old_cwd = Path.cwd()
    os.chdir(cwd)
    try:
        count = 0
        for k, cell in enumerate(book["cells"]):
            if cell["cell_type"] != "code":
                continue
            count += 1
            code = "".join(cell["source"])
            if "parameters" in cell.get("metadata", {}).get("tags", []):
                code += "\n# injected parameters\n" + "".join(f"{n} = {v!r}\n" for n, v in params.items())
            buffer = io.StringIO()
            stream = _Tee(buffer, sys.stdout) if echo else buffer
            try:
                with contextlib.redirect_stdout(stream):
                    exec(compile(code, f"{src.name}[cell {k}]", "exec"), namespace)
            except Exception as exc:
                raise RuntimeError(f"{src.name} cell {k} failed: {type(exc).__name__}: {exc}") from exc
            finally:
                cell["execution_count"] = count
                cell["outputs"] = (
                    [{"name": "stdout", "output_type": "stream", "text": buffer.getvalue()}] if buffer.getvalue() else []
                )
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(book, indent=1))
    finally:
        os.chdir(old_cwd)
        import matplotlib.pyplot as plt

        plt.close("all")


def run(
    only: str | None = None,
    *,
    smoke: bool = False,
    live: bool = False,
    device: str = "auto",
    bench_dir: str | Path = "data/bench",
    run_id: str = "",
    protocol: str = "full",
    figures_dir: str | Path | None = None,
    derived_dir: str | Path | None = None,
    build_dir: str | Path | None = None,
    tp_dir: str | Path = "data/tp",
    engine: str = "auto",
    root: str | Path | None = None,
    progress: bool = True,
    verbose: bool = False,
    overwrite: bool = False,
    docs: bool | None = None,
) -> list[Result]:
    """Execute the selected notebooks; returns one ``Result`` each (failures do not stop the rest).

    Output folders default to ``figures/``, ``data/derived/``, ``build/notebooks/`` (and
    ``build/figures/`` for the machine-dependent CPU error histograms) and, with
    ``smoke``, to ``build/smoke/{figures,derived,notebooks}`` so a smoke run never overwrites the
    real figures. A subset run (``only``, ``run_id``, a ``protocol`` other than full, another
    ``bench_dir`` or ``tp_dir``) defaults to ``build/reproduce/{figures,derived,docs}`` unless
    ``overwrite``. ``docs`` (default: when every notebook ran into the committed folders, or
    ``overwrite``) regenerates the tables of numbers in README.md and docs/ from the derived
    tables (``docs_tables.update``); a subset run without ``overwrite`` writes its copies under
    ``build/reproduce/docs``. Relative paths are relative to the repository root. ``verbose``
    echoes the cells' printed output (python engine). Raises ``ValueError`` for
    an unknown engine or notebook and ``RuntimeError`` for ``live`` without a CUDA GPU or
    ``engine="papermill"`` without papermill installed."""
    from tqdm import tqdm

    root = Path(root) if root else repo_root()
    subset = bool(
        only or run_id or protocol != "full" or Path(bench_dir) != Path("data/bench") or Path(tp_dir) != Path("data/tp")
    )
    base = Path("build/smoke") if smoke else (SUBSET_DIR if subset and not overwrite else Path())
    figures_dir = Path(figures_dir) if figures_dir else base / "figures"
    derived_dir = Path(derived_dir) if derived_dir else base / ("data/derived" if base == Path() else "derived")
    # The committed folders: only then do the documents in the clone follow (else the docs folder under build).
    committed = all(
        (p if p.is_absolute() else root / p).resolve() == (root / q).resolve()
        for p, q in ((figures_dir, "figures"), (derived_dir, "data/derived"))
    )
    docs_target = root if committed else root / (base if base != Path() else SUBSET_DIR) / "docs"
    build_dir = Path(build_dir) if build_dir else (base / "notebooks" if smoke else Path("build/notebooks"))
    scratch_figures_dir = figures_dir if smoke else Path("build/figures")
    absolute = {
        k: (p if p.is_absolute() else root / p)
        for k, p in {
            "figures": figures_dir,
            "derived": derived_dir,
            "build": build_dir,
            "bench": Path(bench_dir),
            "scratch": scratch_figures_dir,
            "tp": Path(tp_dir),
        }.items()
    }
    if engine == "auto":
        engine = "papermill" if _papermill_available() else "python"
    if engine not in ("papermill", "python"):
        raise ValueError(f"engine must be 'auto', 'papermill' or 'python', got {engine!r}")
    if engine == "papermill" and not _papermill_available():
        raise RuntimeError("papermill is not installed: pip install -e . -e './lab[notebooks]' or use --engine python")
    if live:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("--live re-measures on the GPU, but torch sees no CUDA device here")
    notebooks = select_notebooks(only, root / "notebooks")
    absolute["build"].mkdir(parents=True, exist_ok=True)
    results = []
    bar = tqdm(notebooks, desc=f"notebooks ({engine})", unit="nb", disable=not progress)
    for src in bar:
        bar.set_postfix_str(src.stem)
        out = absolute["build"] / src.name
        params = notebook_parameters(
            src.stem,
            smoke=smoke,
            live=live,
            device=device,
            bench_dir=absolute["bench"],
            run_id=run_id,
            protocol=protocol,
            figures_dir=absolute["figures"],
            derived_dir=absolute["derived"],
            scratch_figures_dir=absolute["scratch"],
            declared=parameter_names(src),
            tp_dir=absolute["tp"],
            overwrite=overwrite,
        )
        for name in DERIVED.get(src.stem, ()):  # this notebook's tables of an earlier run
            (absolute["derived"] / name).unlink(missing_ok=True)
        start = time.perf_counter()
        try:
            if engine == "papermill":
                execute_papermill(src, out, params, root)
            else:
                execute_python(src, out, params, root, echo=verbose)
            results.append(Result(src.stem, True, time.perf_counter() - start, out))
        except Exception as exc:  # noqa: BLE001 - report and go on with the next notebook
            message = str(exc).strip().splitlines()
            results.append(
                Result(
                    src.stem, False, time.perf_counter() - start, out, f"{type(exc).__name__}: {message[-1] if message else ''}"
                )
            )
        r = results[-1]
        bar.write(
            f"{'ok  ' if r.ok else 'FAIL'} {r.name:15s} {r.seconds:7.1f} s  -> {_rel(out, root)}"
            + (f"\n     {r.error}" if r.error else "")
        )
    bar.close()
    if docs is None:
        docs = not smoke and committed and (overwrite or len(notebooks) == len(NOTEBOOKS))
    if docs and all(r.ok for r in results):
        from . import docs_tables

        changed = docs_tables.update(root, absolute["derived"], absolute["bench"], docs_target)
        print(
            f"docs: {len(changed)} file(s) updated from {_rel(absolute['derived'], root)}"
            + (f": {', '.join(_rel(p, root) for p in changed)}" if changed else "")
        )
    return results


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m swiglu_lab.research.reproduce",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--smoke", action="store_true", help="fast CI configuration (tiny sizes, outputs under build/smoke/)")
    parser.add_argument(
        "--live",
        action="store_true",
        help="re-measure latency on the GPU (python -m swiglu_lab.bench) instead of reading data/bench/",
    )
    parser.add_argument("--only", default=None, help=f"comma-separated notebooks by name, number or part: {', '.join(NOTEBOOKS)}")
    parser.add_argument("--device", default="auto", help="auto (cuda when present), cuda or cpu")
    parser.add_argument("--run-id", default="", help="recorded bench run to plot (default: the latest full-protocol run)")
    parser.add_argument(
        "--protocol", default="full", help="plot the latest run of this bench protocol: full (default), quick, cpu-smoke"
    )
    parser.add_argument("--bench-dir", default="data/bench", help="recorded bench runs (default: data/bench)")
    parser.add_argument("--tp-dir", default="data/tp", help="recorded tensor-parallel runs (default: data/tp)")
    parser.add_argument(
        "--figures-dir",
        default=None,
        help="default: figures/ (build/smoke/figures/ with --smoke, build/reproduce/figures/ for a subset)",
    )
    parser.add_argument(
        "--derived-dir",
        default=None,
        help="default: data/derived/ (build/smoke/derived/ with --smoke, build/reproduce/derived/ for a subset)",
    )
    parser.add_argument("--build-dir", default=None, help="executed notebooks; default: build/notebooks/")
    parser.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "papermill", "python"],
        help="papermill when installed, else python (cells run in this process)",
    )
    parser.add_argument("--verbose", action="store_true", help="python engine: also print each cell's output here")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="with --only/--run-id/--protocol/--bench-dir/--tp-dir: write into figures/, data/derived/ "
        "and the docs anyway (default: build/reproduce/)",
    )
    parser.add_argument(
        "--strip-outputs",
        action="store_true",
        help="rewrite notebooks/*.ipynb in their committed form (no outputs, no volatile metadata), run nothing",
    )
    parser.add_argument("--list", action="store_true", help="list the notebooks and their parameters, run nothing")
    args = parser.parse_args(argv)
    root = repo_root()
    if args.strip_outputs:
        changed = strip_outputs(select_notebooks(args.only, root / "notebooks"))
        print(f"stripped {len(changed)} notebook(s): {', '.join(p.name for p in changed) or 'none needed it'}")
        return 0
    if args.list:
        for path in select_notebooks(args.only, root / "notebooks"):
            print(f"{path.stem}: {', '.join(parameter_names(path))}")
        return 0
    start = time.perf_counter()
    try:
        results = run(
            args.only,
            smoke=args.smoke,
            live=args.live,
            device=args.device,
            bench_dir=args.bench_dir,
            run_id=args.run_id,
            protocol=args.protocol,
            figures_dir=args.figures_dir,
            derived_dir=args.derived_dir,
            build_dir=args.build_dir,
            tp_dir=args.tp_dir,
            engine=args.engine,
            root=root,
            verbose=args.verbose,
            overwrite=args.overwrite,
        )
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = [r for r in results if not r.ok]
    print(
        f"{len(results) - len(failed)}/{len(results)} notebooks ran in {time.perf_counter() - start:.1f} s"
        + (f"; FAILED: {', '.join(r.name for r in failed)} (see the executed notebooks)" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
