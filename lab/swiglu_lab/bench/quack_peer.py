"""quack-kernels (Tri Dao's CuTe-DSL kernels, PyPI ``quack-kernels``) as a benchmark peer.

What is timed is the backward that ``quack.mlp.mlp_func(x, W1, W2, activation="swiglu",
tuned=True)`` runs under autograd (quack 0.6.5, its default non-recompute, interleaved path):

1. fc2's ``DActLinearFunc.backward``: ``gemm_dgated(dout, W2, preact, activation="swiglu",
   dynamic_scheduler=True)`` gives ``dpreact`` [T, 2I] (dSwiGLU in the GEMM epilogue) and the
   recomputed ``postact = silu(gate) * up`` [T, I]; then ``dW2 = gemm(dout.T, postact)``.
2. fc1's ``LinearActFunc.backward``: ``dx = gemm(dpreact, W1)``, ``dW1 = gemm(dpreact.T, x)``.

All four GEMMs are quack's tuned ping-pong/cooperative Hopper GEMMs (``tuned=True``). The two
``backward`` staticmethods are called directly, with a context object holding what their
forwards would have saved, so the code that runs is quack's own backward, op for op.

Layouts. quack's gated MLP keeps ``W1 = fc1.weight`` [2I, H] with gate and up rows interleaved
(row 2i = gate_weight[i], row 2i+1 = up_weight[i]) and its forward saves ``preact`` [T, 2I] with
gate and up columns interleaved the same way. A quack user keeps both in that layout, so the
conversion from the benchmark's separate tensors (``to_quack_layout``) runs in the harness's
untimed ``prepare`` step, once per input set (``BenchImpl.prepare_every_call`` False: quack reads
them only), so its 2 x 3.5 GB copy is outside the timed loop and the power window. The returned
``grad_gate_weight`` and ``grad_up_weight`` are the even and odd rows of quack's dW1 (strided
views, no copy: a quack user's gradient is dW1 itself). ``down_weight`` [H, I] is fc2.weight as it is.

Like Liger, quack recomputes ``silu(gate_output)`` instead of reading ``activated_gate``, so on
the benchmark's independent inputs (activated_gate drawn independently of gate_output) its
grad_x, grad_up_weight and grad_down_weight differ from the reference by design (the criterion
fails); on forward-consistent inputs (``make_inputs(mode="forward")``) they agree.

Tuning. ``tuned=True`` autotunes each GEMM on its first call per shape (minutes per token count
with quack's full SM90 search). The search is restricted to a documented subset
(``SEARCH_SPACES``; ``SWIGLU_QUACK_SEARCH=full`` restores quack's) and the winners persist as
quack's own ``<fn>.autotune.json`` files under ``QUACK_CACHE_DIR``, which the bench points at the
committed ``data/tuning/quack_cache`` (``tuning_cache_dir``; ``scripts/tune_quack.py`` fills it).
quack's disk-cache key hashes the candidate list, so the bench must use the same search space as
the tuning run (both call ``configure``). The harness's first call (untimed, ``first_call_s``)
loads the winners (or tunes, when a shape has none) and compiles them; warm-ups and timed
iterations reuse quack's in-memory choice and never tune.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch

#: The versions the lab's ``quack`` extra pins (lab/pyproject.toml): quack-kernels 0.6.5 requires
#: nvidia-cutlass-dsl>=4.7 and was released when 4.7.1 was the newest CuTe-DSL; 4.8.x breaks
#: quack 0.6.5's kernel-cache key.
QUACK_VERSION = "0.6.5"
CUTLASS_DSL_VERSION = "4.7.1"

ACTIVATION = "swiglu"

#: SM90 candidate tiles kept by the "reduced" search: (tile_m, tile_n, pingpong). quack's full
#: SM90 list has 11 tiles x clusters {(1,2), (2,1)} x swap_ab {False, True} = 44 configs per plain
#: GEMM and 9 tiles x 2 clusters = 18 for the dgated epilogue; "reduced" keeps quack's default
#: (128x192 ping-pong), the square 128x128 ping-pong for skinny shapes, 128x208 ping-pong and the
#: large cooperative tiles: 6 tiles -> 24 plain configs, 5 gated tiles (208 is not a gated tile)
#: -> 10 dgated configs, with both clusters and both swap_ab values kept.
REDUCED_SM90_TILES = frozenset(
    {
        (128, 128, True),
        (128, 192, True),
        (128, 208, True),
        (256, 128, False),
        (256, 192, False),
        (128, 256, False),
    }
)
SEARCH_SPACES = ("reduced", "full")
SEARCH_ENV = "SWIGLU_QUACK_SEARCH"
CACHE_ENV = "SWIGLU_QUACK_CACHE_DIR"
KERNEL_CACHE_ENV = "SWIGLU_QUACK_KERNEL_CACHE_DIR"

_REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CACHE_DIR = _REPO_ROOT / "data" / "tuning" / "quack_cache"


def unavailable_reason(device: torch.device) -> str | None:
    """Why the quack peer cannot run on ``device``, or None."""
    if device.type != "cuda":
        return "quack runs on NVIDIA GPUs only (CuTe-DSL kernels, SM90 here); skipped"
    for module, dist in (("quack", "quack-kernels"), ("cutlass", "nvidia-cutlass-dsl")):
        if importlib.util.find_spec(module) is None:
            return (
                f"{dist} is not installed (the lab's [quack] extra: quack-kernels=={QUACK_VERSION}, "
                f"nvidia-cutlass-dsl[cu13]=={CUTLASS_DSL_VERSION}); skipped"
            )
    return None


def search_space() -> str:
    """The search space in force: ``$SWIGLU_QUACK_SEARCH`` or "reduced"."""
    name = os.environ.get(SEARCH_ENV, "reduced").strip() or "reduced"
    if name not in SEARCH_SPACES:
        raise ValueError(f"{SEARCH_ENV} must be one of {SEARCH_SPACES}, got {name!r}")
    return name


def tuning_cache_dir() -> Path:
    """Where quack's autotune results are read and written: ``$SWIGLU_QUACK_CACHE_DIR`` or the
    repository's ``data/tuning/quack_cache``."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR)


def kernel_cache_dir() -> Path:
    """Where quack's compiled-kernel ``.o`` cache goes (kept out of the committed tuning
    directory): ``$SWIGLU_QUACK_KERNEL_CACHE_DIR`` or ``<tmp>/swiglu_quack_kernels``."""
    return Path(os.environ.get(KERNEL_CACHE_ENV) or Path(tempfile.gettempdir()) / "swiglu_quack_kernels")


def keep_config(config, space: str) -> bool:
    """Whether a quack ``GemmConfig`` stays a tuning candidate in ``space`` (other architectures'
    configs are left alone: quack prunes them by device anyway)."""
    if space == "full" or config.device_capacity != 9:
        return True
    return (config.tile_m, config.tile_n, bool(config.pingpong)) in REDUCED_SM90_TILES


_configured: dict = {}


def configure(space: str | None = None, cache_dir: str | Path | None = None, kernel_dir: str | Path | None = None) -> dict:
    """Point quack at the tuning cache and restrict its search; idempotent, before any tuned
    call. Returns the settings (also recorded in the run metadata).

    Sets ``QUACK_CACHE_DIR`` (read by quack's autotune file cache at every lookup) and
    ``QUACK_CACHE_AUTOTUNING=1``, moves quack's kernel ``.o`` cache (``quack.cache.CACHE_DIR``,
    read at import) to ``kernel_dir``, and filters the candidate lists of the plain-GEMM tuner
    (``quack.gemm_interface.gemm_tuned.configs``) and of the epilogue-mod tuners
    (``quack.gemm_runtime.autotune._config_space``, which builds the dgated tuner's list).
    """
    if _configured and space is None and cache_dir is None and kernel_dir is None:
        return dict(_configured)  # build() after an explicit configure (scripts/tune_quack.py)
    space = space or search_space()
    if space not in SEARCH_SPACES:
        raise ValueError(f"space must be one of {SEARCH_SPACES}, got {space!r}")
    cache_dir = Path(cache_dir) if cache_dir is not None else tuning_cache_dir()
    kernel_dir = Path(kernel_dir) if kernel_dir is not None else kernel_cache_dir()
    if _configured and (_configured["search"], _configured["tuning_cache_dir"]) != (space, str(cache_dir)):
        raise RuntimeError(f"quack already configured with {_configured}; one configuration per process")
    os.environ["QUACK_CACHE_DIR"] = str(cache_dir)
    os.environ["QUACK_CACHE_AUTOTUNING"] = "1"
    cache_dir.mkdir(parents=True, exist_ok=True)
    if _configured:
        return dict(_configured)

    import quack.cache as quack_cache
    import quack.gemm_interface as gi
    import quack.gemm_runtime.autotune as rt

    kernel_dir.mkdir(parents=True, exist_ok=True)
    quack_cache.CACHE_DIR = str(kernel_dir)
    tuner = gi.gemm_tuned
    tuner.configs = [c for c in tuner.configs if keep_config(c.kwargs["config"], space)]
    if rt._MOD_TUNERS:
        raise RuntimeError("quack's epilogue tuners were created before configure(); call it first")
    original = rt._config_space

    def _config_space(mod, device):
        return [c for c in original(mod, device) if keep_config(c, space)]

    rt._config_space = _config_space
    n_sm90 = sum(1 for c in tuner.configs if c.kwargs["config"].device_capacity == 9)
    _configured.update(
        search=space, tuning_cache_dir=str(cache_dir), kernel_cache_dir=str(kernel_dir), sm90_gemm_candidates=n_sm90
    )
    return dict(_configured)


def settings() -> dict:
    """What ``configure`` set in this process ({} before it ran)."""
    return dict(_configured)


# ------------------------------------------------------------------------------------ layouts
def interleave(gate: torch.Tensor, up: torch.Tensor, dim: int) -> torch.Tensor:
    """``gate`` and ``up`` interleaved along ``dim`` (gate first), contiguous: quack's layout
    of fc1.weight (dim 0) and of the saved preact (dim -1)."""
    dim = dim % gate.dim()
    return torch.stack((gate, up), dim=dim + 1).flatten(dim, dim + 1)


def deinterleave(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (gate, up) halves of an interleaved tensor: strided views, no copy."""
    dim = dim % t.dim()
    index = [slice(None)] * t.dim()
    gate, up = list(index), list(index)
    gate[dim], up[dim] = slice(0, None, 2), slice(1, None, 2)
    return t[tuple(gate)], t[tuple(up)]


def to_quack_layout(args: tuple) -> tuple:
    """The benchmark's eight inputs -> quack's backward operands
    ``(grad_output, x, preact, W1, W2)`` (untimed ``prepare``). ``activated_gate`` is dropped:
    quack recomputes it."""
    grad_output, x, gate_output, up_output, _activated_gate, gate_weight, up_weight, down_weight = args
    preact = interleave(gate_output, up_output, dim=-1)
    w1 = interleave(gate_weight, up_weight, dim=0)
    return grad_output, x, preact, w1, down_weight


# ---------------------------------------------------------------------------------- backward
def make_quack_backward(dact_linear_backward: Callable, dgated_ops, linear_act_backward: Callable, gated_ops) -> Callable:
    """The backward ``mlp_func(..., activation="swiglu", tuned=True)`` runs, as a function of
    ``to_quack_layout``'s operands returning the benchmark's four gradients.

    ``dact_linear_backward`` / ``linear_act_backward`` are ``quack.linear.DActLinearFunc.backward``
    / ``LinearActFunc.backward`` (parameters so CPU tests can pass fakes); ``dgated_ops`` /
    ``gated_ops`` the ops bundles ``gated_linear_func`` / ``linear_gated_func`` pick with
    ``tuned=True`` (``_DGatedLinearOps`` / ``_LinearGatedOps``). The contexts hold exactly what
    the forwards save when x, W1 and W2 all need gradients and there is no bias.
    """

    def quack_backward(grad_output, x, preact, w1, w2):
        fc2 = SimpleNamespace(
            ops=dgated_ops,
            saved_tensors=(preact, w2, None),
            needs_input_grad=(True, True, False, False, False, False, False),
            activation=ACTIVATION,
            weight_dtype=w2.dtype,
            fuse_grad_accum=False,
            bias_dtype=None,
            compute_dbias=False,
        )
        dpreact, grad_w2 = dact_linear_backward(fc2, grad_output)[:2]
        fc1 = SimpleNamespace(
            ops=gated_ops,
            saved_tensors=(x.flatten(0, -2), w1, None),
            needs_input_grad=(True, True, False, False, False, False, False),
            weight_dtype=w1.dtype,
            fuse_grad_accum=False,
            bias_dtype=None,
            compute_dbias=False,
        )
        grad_x, grad_w1 = linear_act_backward(fc1, dpreact)[:2]
        grad_gate_weight, grad_up_weight = deinterleave(grad_w1, dim=0)
        return grad_x.reshape(x.shape), grad_gate_weight, grad_up_weight, grad_w2

    return quack_backward


def check_install_location() -> None:
    """Raise when CuTe-DSL is installed outside a ``site-packages``/``dist-packages`` folder.

    quack 0.6.5 fingerprints its epilogue functions for its caches
    (``quack.gemm_runtime.identity``) and treats functions from files outside such folders as
    its own: it recurses into CuTe-DSL's module globals and fails ("... has no fail-closed
    semantic key", on a Logger, ContextVar or method descriptor). A tree unpacked into a plain
    folder on PYTHONPATH hits this; ``scripts/install_quack.sh`` installs into ``/tmp/quack/site-packages``.
    """
    import cutlass.cute as cute
    from quack.gemm_runtime.identity import _is_extern_function

    if not _is_extern_function(cute.make_layout):
        raise RuntimeError(
            f"nvidia-cutlass-dsl is imported from {cute.__file__}, outside a site-packages/dist-packages "
            "folder: quack 0.6.5's epilogue fingerprint then recurses into CuTe-DSL's globals and fails; "
            "install it under a folder named site-packages"
        )


def refuse_tuning(autotuner_module) -> None:
    """Make a shape without a tuned choice in the cache an error instead of quack's sweep of
    several minutes (quack's ``Autotuner`` starts every sweep with ``_gpu_warmup``, which this
    replaces): the bench never tunes inside a run."""
    cache = tuning_cache_dir().resolve()
    root = _REPO_ROOT.resolve()
    # Repository-relative where it can be: the message lands in the run's committed notes.
    where = cache.relative_to(root) if cache.is_relative_to(root) else cache

    def _refuse(*args, **kwargs):
        raise RuntimeError(
            f"quack has no tuned choice for this shape in {where}: tune it first "
            "(scripts/tune_quack.py --tokens T); the bench does not tune"
        )

    autotuner_module._gpu_warmup = _refuse


def build(device: torch.device, allow_tuning: bool = False) -> Callable:
    """The bench impl's ``build``: configure quack (tuning cache, search space), return the
    backward over ``to_quack_layout``'s operands. Without ``allow_tuning`` (the bench), a shape
    the cache has no choice for raises RuntimeError at its first call (``refuse_tuning``);
    ``scripts/tune_quack.py`` passes True."""
    configure()
    check_install_location()
    if not allow_tuning:
        import quack.autotuner

        refuse_tuning(quack.autotuner)
    from quack.linear import DActLinearFunc, LinearActFunc, _DGatedLinearOps, _LinearGatedOps

    return make_quack_backward(DActLinearFunc.backward, _DGatedLinearOps, LinearActFunc.backward, _LinearGatedOps)


def versions() -> dict:
    """Installed quack-kernels / nvidia-cutlass-dsl versions (None when absent) and, once
    ``configure`` ran, its settings."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for key, dist in (("quack_kernels", "quack-kernels"), ("nvidia_cutlass_dsl", "nvidia-cutlass-dsl")):
        try:
            out[key] = version(dist)
        except PackageNotFoundError:
            out[key] = None
    out["quack_peer"] = settings() or None
    return out


NOTE = (
    f"quack-kernels mlp_func(activation='swiglu', tuned=True) backward (quack's gemm_dgated + 3 "
    f"GEMMs, CuTe-DSL); W1 [2I,H] and preact [T,2I] interleaved gate/up in the untimed prepare, "
    f"once per input set (a quack user keeps them so); dW1's even/odd rows returned as views; tuned configs from "
    f"data/tuning/quack_cache ({SEARCH_ENV}=reduced search unless set); recomputes "
    f"silu(gate_output) instead of reading activated_gate, so it fails the reference check on the "
    f"benchmark's independent inputs"
)
