"""Where the kernels run: whether Triton interprets (``INTERPRET``), which devices, triton
releases and sizes the Triton and Gluon paths support (the ``*_reason`` predicates), and the
persistent grid's size on a device (``device_sms``, ``num_programs``, ``tile_programs``).
``INTERPRET``, ``RESERVED_SMS``, ``device_sms`` and ``num_programs`` live here alone, and are set
here (by tests, ``swiglu_lab.bench.tp``): ``launch`` reads ``INTERPRET`` from this module at each
call, ``tile_programs`` and the backward's plan read the others; the launchers that import
``INTERPRET`` by name (forward, backward, moe) keep its value at import.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

from ..checks import traceable_cache
from .configs import table_shared_memory
from .tma import ALIGN_ELEMENTS

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton_interprets() -> bool:
    # Triton decides when it is imported: its own @jit library functions are interpreted then or
    # never (TRITON_INTERPRET set later leaves them compiled, and our interpreted kernels fail
    # calling them with an opaque InterpreterError).
    import triton.language.standard as standard

    fn = getattr(standard, "sigmoid", None)
    return INTERPRET if fn is None else type(fn).__name__ == "InterpretedFunction"


#: Whether Triton itself runs in its interpreter (TRITON_INTERPRET=1 when triton was imported).
TRITON_INTERPRETS = _triton_interprets()


#: The triton minor releases the Gluon kernels are written and checked for: Gluon's API moves
#: between minor releases (warp_specialize's signature changed in 3.5 and 3.6, thread_barrier became
#: barrier in 3.7, the TMA calls are renamed in 3.9). With any other release the tl kernels run
#: instead. 3.6 is the GPU image's (the recorded results); 3.7 is what pip pairs with torch 2.13.
GLUON_TRITONS = ("3.6", "3.7")


def triton_minor(version: str) -> str:
    """ "3.6" of "3.6.0"."""
    return ".".join(version.split(".")[:2])


def gluon_unavailable_reason(device: torch.device) -> str | None:
    """Why the Gluon kernels cannot run on ``device`` in this process (None when they can): they
    need a CUDA sm_90 device, a triton of ``GLUON_TRITONS``, no interpreter, and SWIGLU_GLUON unset
    or not "0" (the switch that measures the tl kernels alone)."""
    import triton

    if os.environ.get("SWIGLU_GLUON", "1") == "0":
        return "SWIGLU_GLUON=0"
    if INTERPRET or device.type != "cuda":
        return "Gluon kernels run on CUDA devices only (not in the Triton interpreter)"
    if triton_minor(triton.__version__) not in GLUON_TRITONS:
        return (
            f"Gluon kernels are written for triton {' and '.join(v + '.x' for v in GLUON_TRITONS)}; "
            f"this is triton {triton.__version__}"
        )
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "Gluon kernels are written for sm_90 (Hopper)"
    return None


@lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


#: SMs the persistent kernels leave idle (CUDA only), e.g. for NCCL kernels running beside them
#: under tensor parallelism (swiglu_lab.bench.tp measures it). 0: one program per SM.
RESERVED_SMS = 0


def device_sms(device: torch.device) -> int:
    """The SMs of a CUDA ``device`` (its index, or the current device's), cached."""
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def num_programs(device: torch.device, tiles: int, persistent: bool = True) -> int:
    # The interpreter runs programs one after another: a few programs still exercise the
    # persistent loop (several tiles per program).
    if not persistent:
        return tiles
    if device.type != "cuda":
        return max(1, min(3, tiles))
    return max(1, min(device_sms(device) - RESERVED_SMS, tiles))


def tile_programs(device: torch.device, rows: int, cols: int, cfg, persistent: bool = True) -> int:
    """The programs of a launch over a rows x cols output in ``cfg.BM`` x ``cfg.BN`` tiles
    (``cfg.tile_n`` columns where the config has it: ``GluonConfig``), ``num_programs`` of its
    tile count: what the launchers default to and the plan records."""
    return num_programs(device, cdiv(rows, cfg.BM) * cdiv(cols, getattr(cfg, "tile_n", cfg.BN)), persistent)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints (``triton.cdiv`` is a constexpr function: microseconds per host call)."""
    return -(-a // b)


#: GPU architectures (compute capability) whose kernel configurations were chosen by measurement:
#: the tables (backward_configs.json, forward_configs.json) were tuned on the H200 (sm_90).
#: ``impl="auto"`` takes the Triton path only on these; ``impl="triton"`` runs the sm_90 tables on
#: any other CUDA sm_90+ device whose shared memory fits them.
TUNED_ARCHS = ((9, 0),)


def _cuda_properties(device: torch.device):
    """``torch.cuda.get_device_properties(device)``, or why there are none (a str): a torch built
    without CUDA, no GPU, or no device of that index (torch raises AssertionError/RuntimeError)."""
    try:
        return torch.cuda.get_device_properties(device)
    except (AssertionError, RuntimeError) as e:
        return f"no CUDA device {device} here ({' '.join(str(e).split())}): use impl='reference'"


@traceable_cache(64)
def device_reason(device: torch.device | str) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None when they can): a CUDA device that is
    NVIDIA (not ROCm: HIP reports capability 9.x but has no TMA descriptors or wgmma), sm_90 or
    newer (TMA), with enough opt-in shared memory per block for every configuration in the
    backward's table (``shared_memory_per_block_optin``; consumer Blackwell, sm_120, has ~99 KiB against
    the H200's 227 KiB; ``configs.table_shared_memory``); or any device under TRITON_INTERPRET=1 (set before this
    module was imported). Reads ``torch.cuda.get_device_properties`` once per device (cached:
    ``swiglu.kernels.backward.clear_plans`` forgets the answers)."""
    device = torch.device(device)
    if device.type != "cuda":
        if INTERPRET and not TRITON_INTERPRETS:
            return (
                "needs TRITON_INTERPRET=1 set before triton is imported (it was set later, so Triton's own "
                "functions are compiled for a GPU): set it in the environment or at the top of the script"
            )
        if INTERPRET:
            return None
        return (
            f"needs CUDA tensors (got device {device}); on a CPU use impl='reference', or set "
            "TRITON_INTERPRET=1 before importing swiglu to run the kernels in Triton's interpreter"
        )
    if torch.version.hip:
        return (
            f"needs an NVIDIA GPU (TMA descriptors, Hopper's wgmma); this is a ROCm build (HIP "
            f"{torch.version.hip}): use impl='reference'"
        )
    props = _cuda_properties(device)
    if isinstance(props, str):
        return props
    if props.major < 9:
        return f"needs an sm_90+ GPU (TMA descriptors); {props.name} is sm_{props.major}{props.minor}"
    limit = getattr(props, "shared_memory_per_block_optin", None)
    need = table_shared_memory()
    if limit is not None and need > limit:
        return (
            f"needs {need} bytes of shared memory per block for its kernel configurations (tuned for the "
            f"H200, sm_90); {props.name} (sm_{props.major}{props.minor}) allows {limit}: use impl='reference'"
        )
    return None


@traceable_cache(64)
def untuned_reason(device: torch.device | str) -> str | None:
    """Why ``impl="auto"`` does not pick the Triton path on a CUDA ``device`` the kernels can run
    on (None when it does): no configuration was tuned for its architecture (``TUNED_ARCHS``)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    props = _cuda_properties(device)
    if isinstance(props, str):
        return props
    if (props.major, props.minor) not in TUNED_ARCHS:
        tuned = ", ".join(f"sm_{a}{b}" for a, b in TUNED_ARCHS)
        return (
            f"no kernel configuration was tuned for {props.name} (sm_{props.major}{props.minor}; tables "
            f"exist for {tuned}); impl='triton' runs the sm_90 tables there anyway"
        )
    return None


def sizes_reason(hidden_size: int, intermediate_size: int) -> str | None:
    """Why the Triton kernels cannot take these sizes (None when they can): hidden_size and
    intermediate_size must be multiples of ``ALIGN_ELEMENTS`` (16-byte aligned rows for TMA)."""
    for label, size in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size)):
        if size % ALIGN_ELEMENTS:
            return (
                f"needs {label} to be a multiple of {ALIGN_ELEMENTS}, got {size} (hidden_size and "
                f"intermediate_size must be multiples of {ALIGN_ELEMENTS}: TMA needs 16-byte aligned rows); "
                "use impl='reference' for this shape"
            )
    return None


def unsupported_reason(x: torch.Tensor, gate_weight: torch.Tensor) -> str | None:
    """Why the Triton backward cannot run for these tensors (None when it can): the device
    (``device_reason``) and the sizes (``sizes_reason``). ``impl="triton"`` raises ValueError
    with it; ``impl="auto"`` also needs a tuned architecture (``untuned_reason``) and bfloat16."""
    inter, hidden = gate_weight.shape
    return device_reason(x.device) or sizes_reason(hidden, inter)
