"""What every launcher shares: the launch configuration, the token buckets,
TMA descriptors and layouts, the persistent grid size, and which devices and sizes the Triton
path supports. The forward (``forward.py``) and backward (``backward.py``) launchers and the
Gluon kernels import this module and nothing of each other's internals.
"""

from __future__ import annotations

import os
import threading
from contextlib import nullcontext
from dataclasses import MISSING, fields
from functools import lru_cache, wraps
from typing import NamedTuple

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .configs import (TOKEN_BUCKETS, DswigluGluonConfig, GluonConfig, KernelConfig, bucket_for,  # noqa: F401 (re-exported)
                      table_shared_memory)

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
# TMA needs every row stride 16-byte aligned: a bf16 row of a multiple of 8 elements.
ALIGN_ELEMENTS = 8


#: The triton minor releases the Gluon kernels are written and checked for: Gluon's API moves
#: between minor releases (warp_specialize's signature changed in 3.5 and 3.6, thread_barrier became
#: barrier in 3.7, the TMA calls are renamed in 3.9). With any other release the tl kernels run
#: instead. 3.6 is the GPU image's (the recorded results); 3.7 is what pip pairs with torch 2.13.
GLUON_TRITONS = ("3.6", "3.7")
#: The release whose C launcher ``direct_runner`` calls (its argument list is not an API).
DIRECT_LAUNCH_TRITON = "3.6"


def triton_minor(version: str) -> str:
    """"3.6" of "3.6.0"."""
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
        return (f"Gluon kernels are written for triton {' and '.join(v + '.x' for v in GLUON_TRITONS)}; "
                f"this is triton {triton.__version__}")
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


@lru_cache(maxsize=None)
def _descriptor_defaults(cls: type) -> dict:
    # A descriptor class's optional fields with their defaults, read from the installed triton.
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def tma_descriptor(t: torch.Tensor, block: list[int], cls: type = TensorDescriptor, **extra):
    """``cls.from_tensor(t, block, **extra)`` (``extra``: Gluon's ``layout=``) without its
    checks, which ``tma_ready`` (base and row strides 16-byte aligned, unit last stride) and the
    configurations (power-of-two blocks) already guarantee for every launcher's tensors: a fifth
    of a launch's host time otherwise."""
    desc = object.__new__(cls)
    desc.__dict__.update(_descriptor_defaults(cls), base=t, shape=t.shape, strides=t.stride(), block_shape=block,
                         **extra)
    return desc


class Tma(NamedTuple):
    """A host TMA descriptor argument of ``launch``: Triton's ``TensorDescriptor`` for ``tensor``
    and ``block`` (Gluon's, with ``layout``, when a layout is given) on the first launch per key,
    then the C launcher's CUtensorMap, filled once per address and geometry (``direct_runner``)."""

    tensor: torch.Tensor
    block: list
    layout: object = None


def _as_descriptor(arg):
    if type(arg) is not Tma:
        return arg
    if arg.layout is None:
        return tma_descriptor(arg.tensor, arg.block)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

    return tma_descriptor(arg.tensor, arg.block, GluonTensorDescriptor, layout=arg.layout)


def as_descriptors(args) -> list:
    """``args`` with every ``Tma`` replaced by its Triton ``TensorDescriptor`` (Triton's own path)."""
    return [_as_descriptor(a) for a in args]


def tma_ready(t: torch.Tensor) -> torch.Tensor:
    """A 2-D view usable by a TMA descriptor: unit last stride, 16-byte aligned base and row
    stride. Anything else is copied once to a contiguous buffer (documented in swiglu.api)."""
    # On the hot path: one call per tensor and launch, so few tensor method calls (a 2-D tensor,
    # the common case, is not reshaped: a view costs more than all the checks).
    t2 = t if t.dim() == 2 else t.reshape(-1, t.shape[-1])
    s0, s1 = t2.stride()
    ok = (
        s1 == 1
        and s0 >= t2.shape[1]  # no overlapping rows (an expanded, zero-stride tensor is copied)
        and (s0 * t2.element_size()) % 16 == 0
        and t2.data_ptr() % 16 == 0
    )
    # A fresh allocation, not .contiguous(): that returns a contiguous but misaligned view as is.
    return t2 if ok else torch.empty(t2.shape, dtype=t2.dtype, device=t2.device).copy_(t2)


#: Compiled kernels by launch key (``launch``), bounded: emptied when it outgrows this.
_LAUNCHES: dict = {}
_LAUNCHES_MAX = 1024
#: Whether ``launch`` calls triton 3.6's C launcher directly (``direct_runner``) after the first
#: launch per key; SWIGLU_DIRECT_LAUNCH=0 (or False here, then ``clear_launches()``) keeps
#: Triton's Python runner, e.g. to measure the difference.
DIRECT_LAUNCH = os.environ.get("SWIGLU_DIRECT_LAUNCH", "1") != "0"


#: Programmatic dependent launch (PDL, sm_90+) for every kernel ``launch`` launches: 0 off (the
#: default), 1 each program lets the next kernel launch as it starts, 2 as it finishes its tiles.
#: Either way every kernel waits for the previous one on the stream to finish before it touches
#: global memory (``tl_kernels._pdl_start``), so the bits and the stream's ordering for every
#: other reader and writer are those of a plain launch. Off by default: on the H200 it removed
#: the 6 us of launch gaps per backward, but the benchmark's timed loop ran longer (mode 1: 0.5% at
#: T = 128, 3.0% at T = 2048; mode 2: 0.7% and 0.9%; ``probe_idle_gaps.py --pdl all``,
#: docs/kernels.md).
#: SWIGLU_PDL sets it at import, ``set_pdl`` in a process. Never in the interpreter.
PDL_MODES = (0, 1, 2)


def _pdl_from_env() -> int:
    value = os.environ.get("SWIGLU_PDL", "0")
    if value not in {str(m) for m in PDL_MODES}:
        raise ValueError(f"SWIGLU_PDL must be one of {', '.join(map(str, PDL_MODES))} (off, trigger at start, "
                         f"trigger at end), got {value!r}")
    return 0 if INTERPRET else int(value)


PDL = _pdl_from_env()
_LAUNCHES_BY_PDL = {PDL: _LAUNCHES}


def clear_launches() -> None:
    """Forget every compiled launch of every PDL mode (after changing ``DIRECT_LAUNCH``, or to
    time first launches again)."""
    for cache in _LAUNCHES_BY_PDL.values():
        cache.clear()
    _LAUNCHES.clear()


def set_pdl(mode: int) -> None:
    """Launch with PDL mode ``mode`` (``PDL_MODES``; False/True are 0/1) from now on; ignored in
    the interpreter. Each mode keeps its own compiled launches (``_LAUNCHES`` is that mode's), so
    switching back and forth costs no recompiles: the first launch per key and mode takes Triton's
    path, later ones the cached one. Meant between runs: a launch on another thread while it
    switches may still take the previous mode. Raises ValueError for another mode."""
    global PDL, _LAUNCHES
    if type(mode) not in (int, bool) or mode not in PDL_MODES:
        raise ValueError(f"set_pdl: mode must be one of {PDL_MODES}, got {mode!r}")
    PDL = 0 if INTERPRET else int(mode)
    _LAUNCHES = _LAUNCHES_BY_PDL.setdefault(PDL, {})


#: Filled CUtensorMaps each direct runner keeps (``expand_descriptors``' ``maps``), bounded:
#: emptied when it outgrows this. Enough for a deep model's recurring addresses (layers x a
#: launch's descriptors: an 80-layer model's weights and activations), about 300 bytes each.
_MAPS_MAX = 4096


def expand_descriptors(args: tuple, descriptors: tuple, fill, maps: dict | None = None) -> list:
    """``args`` with each ``Tma`` at a position of ``descriptors`` (``(position, swizzle,
    elem_size, host dtype, block_size)``, ascending) replaced by what triton 3.6's
    ``make_tensordesc_arg`` passes the C launcher: ``fill(...)``'s CUtensorMap, then the shape and
    the strides. ``maps`` memoizes them by (position, address, shape, strides): a CUtensorMap holds
    nothing else that varies at a position (dtype, block and swizzle are the compiled kernel's), and
    the driver copies it at each launch, so one map serves every launch on that memory."""
    out = list(args)
    for position, swizzle, elem_size, dtype, block in reversed(descriptors):
        t = out[position].tensor
        ptr, shape, strides = t.data_ptr(), t.shape, t.stride()
        key = (position, ptr, shape, strides)
        piece = None if maps is None else maps.get(key)
        if piece is None:
            piece = (fill(ptr, swizzle, elem_size, dtype, block, shape, strides, 0), *shape, *strides)
            if maps is not None:
                if len(maps) >= _MAPS_MAX:
                    maps.clear()
                maps[key] = piece
        out[position:position + 1] = piece
    return out


def _has_hooks(chain) -> bool:
    return chain is not None and (not hasattr(chain, "calls") or bool(chain.calls))


def direct_runner(compiled, grid: tuple[int, int, int]):
    """What ``compiled[grid]`` runs, without triton 3.6's Python layers between it and the C
    launcher (runner, ``CudaLauncher.__call__``, the descriptor wrapper: about half a launch's
    host time): the same C call with the same arguments. None where this triton's launcher is not
    the one it was written for (another release, global or profile scratch, fp4 or pointer-lowered
    descriptors); where a launch hook is set (e.g. proton's) each call takes Triton's runner.
    Skipped besides: Triton's per-launch metadata dict, built only for those hooks."""
    import triton

    if not DIRECT_LAUNCH or triton_minor(triton.__version__) != DIRECT_LAUNCH_TRITON:
        return None
    try:
        from triton import knobs
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
        from triton.runtime import driver

        launcher = compiled.run
        if launcher.global_scratch_size or launcher.profile_scratch_size:
            return None
        wrapped = launcher.launch
        cells = dict(zip(wrapped.__code__.co_freevars, (c.cell_contents for c in wrapped.__closure__ or ()))) \
            if hasattr(wrapped, "__code__") else {}
        raw, metas = cells.get("launcher", wrapped), cells.get("tensordesc_meta", [])
        positions = sorted(cells.get("tensordesc_indices", ()))
        if len(positions) != len(metas) or any(m is None or m["fp4_padded"] for m in metas):
            return None
        descriptors = tuple((p, m["swizzle"], m["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]], m["block_size"])
                            for p, m in zip(positions, metas))
        fill, device, stream = driver.active.utils.fill_tma_descriptor, driver.active.get_current_device, \
            driver.active.get_current_stream
        head = (*grid, None, compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                compiled.packed_metadata, None, None, None)
        slow = compiled[grid]
    except (AttributeError, ImportError, KeyError, TypeError):
        return None
    runtime = knobs.runtime
    maps: dict = {}

    def run(*args):
        # Triton's hooks are chains (empty unless a tool such as proton added one); an empty
        # chain called around the launch does nothing, so the C launcher gets None instead.
        if _has_hooks(runtime.launch_enter_hook) or _has_hooks(runtime.launch_exit_hook):
            return slow(*as_descriptors(args))
        base = list(head)
        base[3] = stream(device())
        raw(*base, *expand_descriptors(args, descriptors, fill, maps))

    return run


def launch(kernel, grid: tuple[int, ...], key: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, the compiled binary looked up by ``key`` after the first
    launch. ``key`` must hold everything Triton specializes this launch on besides the tensors'
    dtype and 16-byte alignment (which every launcher here guarantees): the device, the ints,
    the constexprs and the configuration (whose blocks are the descriptors' block shapes). The
    first launch per key takes Triton's own path (binding, specialization, JIT cache: about half
    of a launch's host time, measured on the H200 machine); later ones call the compiled
    kernel's C launcher through ``direct_runner`` (or, where it does not apply, its runner
    ``CompiledKernel[grid]``) with the same arguments in signature order, the keyword arguments'
    values as the key's first launch gave them. TMA descriptor arguments are given as ``Tma``
    (positionally). In the interpreter every launch takes Triton's path, and launches from
    several threads run one at a time (its state is process-wide). Every kernel launched here
    takes a ``PDL`` constexpr, set by this function (``PDL``)."""
    cache, pdl = _LAUNCHES, PDL  # read once: the mode this launch is compiled and filed under
    entry = cache.get(key)
    if entry is None:
        if any(type(v) is Tma for v in kwargs.values()):
            raise TypeError("launch takes Tma arguments positionally (keyword values are kept per key)")
        # Every kernel launched here takes the PDL constexpr (tl_kernels._pdl_start); launch_pdl
        # is triton's compile option for the launch attribute.
        # (INTERPRET read here too: the compile tests' recorder patches it.)
        kwargs = dict(kwargs, PDL=pdl, launch_pdl=True) if pdl and not INTERPRET else dict(kwargs, PDL=0)
        compiled = kernel[grid](*as_descriptors(args), **kwargs)
        if INTERPRET or compiled is None or not hasattr(compiled, "packed_metadata"):
            return
        names = kernel.arg_names
        if len(cache) >= _LAUNCHES_MAX:
            cache.clear()
        grid3 = tuple(grid) + (1,) * (3 - len(grid))  # the runner takes 3-D
        # The keyword arguments' values in signature order, kept: the key determines them.
        rest = tuple(kwargs[name] for name in names[len(args):])
        cache[key] = (direct_runner(compiled, grid3) or _with_descriptors(compiled[grid3]), rest)
        return
    runner, rest = entry
    runner(*args, *rest)


#: Triton's interpreter keeps the running launch's grid and program ids in process-wide state: two
#: threads launching at once read each other's grid. Every interpreted launch (``launch`` here, the
#: MoE launchers) holds this one lock; compiled launches need none.
INTERPRETER_LOCK = threading.Lock() if INTERPRET else nullcontext()

if INTERPRET:
    # The compiled path keeps the plain function (decided here, once).
    _plain_launch = launch

    @wraps(_plain_launch)
    def launch(kernel, grid: tuple[int, ...], key: tuple, *args, **kwargs) -> None:
        with INTERPRETER_LOCK:
            _plain_launch(kernel, grid, key, *args, **kwargs)


def _with_descriptors(runner):
    def runner_with_descriptors(*args):
        return runner(*as_descriptors(args))

    return runner_with_descriptors


def launch_kwargs(cfg: KernelConfig) -> dict:
    """The tl kernels' configuration keywords for ``cfg`` (one shared dict per config and
    ``INTERPRET``: read only). ``INTERPRET`` is read at each call and is part of the cache's key: a
    dict cached while a test had patched it would otherwise set UPCAST (fp32 operands, TF32 dots)
    for every later GPU launch of that config in the process."""
    return _launch_kwargs(cfg, INTERPRET)


@lru_cache(maxsize=None)
def _launch_kwargs(cfg: KernelConfig, upcast: bool) -> dict:
    return dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages, WARP_SPECIALIZE=cfg.warp_specialize,
                FLATTEN=cfg.flatten, BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, GROUP_M=cfg.GROUP_M,
                EPI_SPLIT=cfg.EPI_SPLIT, UPCAST=upcast)


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


@lru_cache(maxsize=64)
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
            return ("needs TRITON_INTERPRET=1 set before triton is imported (it was set later, so Triton's own "
                    "functions are compiled for a GPU): set it in the environment or at the top of the script")
        if INTERPRET:
            return None
        return (f"needs CUDA tensors (got device {device}); on a CPU use impl='reference', or set "
                "TRITON_INTERPRET=1 before importing swiglu to run the kernels in Triton's interpreter")
    if torch.version.hip:
        return (f"needs an NVIDIA GPU (TMA descriptors, Hopper's wgmma); this is a ROCm build (HIP "
                f"{torch.version.hip}): use impl='reference'")
    props = _cuda_properties(device)
    if isinstance(props, str):
        return props
    if props.major < 9:
        return f"needs an sm_90+ GPU (TMA descriptors); {props.name} is sm_{props.major}{props.minor}"
    limit = getattr(props, "shared_memory_per_block_optin", None)
    need = table_shared_memory()
    if limit is not None and need > limit:
        return (f"needs {need} bytes of shared memory per block for its kernel configurations (tuned for the "
                f"H200, sm_90); {props.name} (sm_{props.major}{props.minor}) allows {limit}: use impl='reference'")
    return None


@lru_cache(maxsize=64)
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
        return (f"no kernel configuration was tuned for {props.name} (sm_{props.major}{props.minor}; tables "
                f"exist for {tuned}); impl='triton' runs the sm_90 tables there anyway")
    return None


def sizes_reason(hidden_size: int, intermediate_size: int) -> str | None:
    """Why the Triton kernels cannot take these sizes (None when they can): hidden_size and
    intermediate_size must be multiples of ``ALIGN_ELEMENTS`` (16-byte aligned rows for TMA)."""
    for label, size in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size)):
        if size % ALIGN_ELEMENTS:
            return (f"needs {label} to be a multiple of {ALIGN_ELEMENTS}, got {size} (hidden_size and "
                    f"intermediate_size must be multiples of {ALIGN_ELEMENTS}: TMA needs 16-byte aligned rows); "
                    "use impl='reference' for this shape")
    return None


def unsupported_reason(x: torch.Tensor, gate_weight: torch.Tensor) -> str | None:
    """Why the Triton backward cannot run for these tensors (None when it can): the device
    (``device_reason``) and the sizes (``sizes_reason``). ``impl="triton"`` raises ValueError
    with it; ``impl="auto"`` also needs a tuned architecture (``untuned_reason``) and bfloat16."""
    inter, hidden = gate_weight.shape
    return device_reason(x.device) or sizes_reason(hidden, inter)
