"""How every kernel is launched: ``launch`` (the compiled kernel cached per key, then called
through triton 3.6's C launcher, ``direct_runner``), programmatic dependent launch (``PDL``,
``set_pdl``), the interpreter's lock and the tl kernels' configuration keywords
(``launch_kwargs``). The launch cache (``_LAUNCHES``), ``DIRECT_LAUNCH`` and ``PDL`` live here
alone; ``INTERPRET`` is ``devices.INTERPRET``, read there at each call.
"""

from __future__ import annotations

import itertools
import os
import threading
from contextlib import nullcontext
from functools import lru_cache, wraps

from . import devices
from .configs import KernelConfig
from .devices import triton_minor
from .tma import Tma, as_descriptors

#: The release whose C launcher ``direct_runner`` calls (its argument list is not an API).
DIRECT_LAUNCH_TRITON = "3.6"
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
        raise ValueError(
            f"SWIGLU_PDL must be one of {', '.join(map(str, PDL_MODES))} (off, trigger at start, trigger at end), got {value!r}"
        )
    return 0 if devices.INTERPRET else int(value)


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
    PDL = 0 if devices.INTERPRET else int(mode)
    _LAUNCHES = _LAUNCHES_BY_PDL.setdefault(PDL, {})


#: Ints that stand for a configuration in launch keys, drawn once per configuration by a
#: launcher's per-config cache: an int hashes in a fraction of a config dataclass's time (a key
#: is hashed at every launch). Never reused, so a token names one configuration.
CONFIG_TOKENS = itertools.count()


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
            try:
                tensor_map = fill(ptr, swizzle, elem_size, dtype, block, shape, strides, 0)
            except RuntimeError:
                # No CUDA context current on this thread yet (see ensure_cuda_context): bind it, retry.
                if not ensure_cuda_context(t.device.index):
                    raise
                tensor_map = fill(ptr, swizzle, elem_size, dtype, block, shape, strides, 0)
            piece = (tensor_map, *shape, *strides)
            if maps is not None:
                if len(maps) >= _MAPS_MAX:
                    maps.clear()
                maps[key] = piece
        out[position : position + 1] = piece
    return out


def ensure_cuda_context(device_index: int) -> bool:
    """Make the device's primary CUDA context current on this thread if none is; True if it bound
    one. Filling a TMA descriptor (``cuTensorMapEncodeTiled``) needs a current context, and a
    thread can reach a launch without one: autograd's device thread runs a backward whose tensors
    all come from the caching allocator (no CUDA runtime call binds the context there first).
    Triton's kernel launcher binds the context the same way, but only after the descriptors."""
    import ctypes

    cuda = _libcuda()
    ctx = ctypes.c_void_p()
    if cuda is None or cuda.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or ctx.value:
        return False
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device_index) != 0:
        return False
    return cuda.cuCtxSetCurrent(ctx) == 0


@lru_cache(maxsize=None)
def _libcuda():
    import ctypes

    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def direct_runner(compiled, grid: tuple[int, int, int], rest: tuple = ()):
    """What ``compiled[grid]`` runs, without triton 3.6's Python layers between it and the C
    launcher (runner, ``CudaLauncher.__call__``, the descriptor wrapper: about half a launch's
    host time): the same C call with the same arguments, as ``direct_run``'s ``run(args)`` (the
    arguments before ``rest``, which it appends). None where this triton's launcher is not
    the one it was written for (another release, global or profile scratch, fp4 or pointer-lowered
    descriptors); where a launch hook is set (e.g. proton's) each call takes Triton's runner.
    Skipped besides: Triton's per-launch metadata dict, built only for those hooks."""
    import triton

    if not DIRECT_LAUNCH or triton_minor(triton.__version__) != DIRECT_LAUNCH_TRITON:
        return None
    try:
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
        from triton.runtime import driver

        launcher = compiled.run
        if launcher.global_scratch_size or launcher.profile_scratch_size:
            return None
        wrapped = launcher.launch
        cells = (
            dict(zip(wrapped.__code__.co_freevars, (c.cell_contents for c in wrapped.__closure__ or ())))
            if hasattr(wrapped, "__code__")
            else {}
        )
        raw, metas = cells.get("launcher", wrapped), cells.get("tensordesc_meta", [])
        positions = sorted(cells.get("tensordesc_indices", ()))
        if len(positions) != len(metas) or any(m is None or m["fp4_padded"] for m in metas):
            return None
        descriptors = tuple(
            (p, m["swizzle"], m["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]], m["block_size"])
            for p, m in zip(positions, metas)
        )
        fill, device, stream = (
            driver.active.utils.fill_tma_descriptor,
            driver.active.get_current_device,
            driver.active.get_current_stream,
        )
        head = (
            *grid,
            None,
            compiled.function,
            launcher.launch_cooperative_grid,
            launcher.launch_pdl,
            None,
            None,
            compiled.packed_metadata,
            None,
            None,
            None,
        )
        slow = compiled[grid]
    except (AttributeError, ImportError, KeyError, TypeError):
        return None
    return direct_run(raw, head, descriptors, fill, device, stream, slow, rest)


def direct_run(raw, head: tuple, descriptors: tuple, fill, device, stream, slow, rest: tuple = ()):
    """``direct_runner``'s per-launch closure ``run(args)``: ``raw`` (the C launcher) called with
    ``head`` (grid, stream slot, function, launch options, metadata: triton 3.6's order) with the
    slot at index 3 set to ``stream(device())``, then ``args`` with its ``Tma`` arguments expanded
    at ``descriptors`` (``expand_descriptors``, memoized per runner), then ``rest``; ``slow``
    (``compiled[grid]``) takes the call, with Triton descriptors, while a launch hook is set."""
    from triton import knobs

    runtime = knobs.runtime
    maps: dict = {}
    grid, tail = head[:3], head[4:]

    def run(args):
        # Triton's hooks are chains (empty unless a tool such as proton added one) or plain
        # callables; an empty chain called around the launch does nothing.
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        if (enter is not None and getattr(enter, "calls", True)) or (leave is not None and getattr(leave, "calls", True)):
            return slow(*as_descriptors(args), *rest)
        raw(*grid, stream(device()), *tail, *expand_descriptors(args, descriptors, fill, maps), *rest)

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
    cache = _LAUNCHES  # read once: the mode this launch is compiled and filed under
    runner = cache.get(key)
    if runner is not None:
        runner(args)  # the keyword arguments' values are the runner's (the key's first launch's)
        return
    if any(type(v) is Tma for v in kwargs.values()):
        raise TypeError("launch takes Tma arguments positionally (keyword values are kept per key)")
    # Every argument after the positional ones by keyword, defaults included: the cached runner
    # replays them in signature order (checked here so that the interpreter sees it too).
    names = getattr(kernel, "arg_names", ())  # (the tests' recording wrappers have none)
    missing = [n for n in names[len(args) :] if n not in kwargs and n != "PDL"]
    if missing:
        raise TypeError(f"launch of {getattr(kernel, '__name__', kernel)} needs {missing} by keyword (their defaults too)")
    # Every kernel launched here takes the PDL constexpr (tl_kernels._pdl_start); launch_pdl
    # is triton's compile option for the launch attribute.
    # (INTERPRET read here too: the compile tests' recorder patches it.)
    pdl = PDL
    kwargs = dict(kwargs, PDL=pdl, launch_pdl=True) if pdl and not devices.INTERPRET else dict(kwargs, PDL=0)
    if not devices.INTERPRET and any(type(a) is Tma for a in args):
        ensure_cuda_context(next(a.tensor.device.index for a in args if type(a) is Tma))  # as expand_descriptors
    compiled = kernel[grid](*as_descriptors(args), **kwargs)
    if devices.INTERPRET or compiled is None or not hasattr(compiled, "packed_metadata"):
        return
    if len(cache) >= _LAUNCHES_MAX:
        cache.clear()
    grid3 = tuple(grid) + (1,) * (3 - len(grid))  # the runner takes 3-D
    # The keyword arguments' values in signature order, kept: the key determines them.
    rest = tuple(kwargs[name] for name in names[len(args) :])
    cache[key] = direct_runner(compiled, grid3, rest) or _with_descriptors(compiled[grid3], rest)


#: Triton's interpreter keeps the running launch's grid and program ids in process-wide state: two
#: threads launching at once read each other's grid. Every interpreted launch (``launch`` here, the
#: MoE launchers) holds this one lock; compiled launches need none.
INTERPRETER_LOCK = threading.Lock() if devices.INTERPRET else nullcontext()

if devices.INTERPRET:
    # The compiled path keeps the plain function (decided here, once).
    _plain_launch = launch

    @wraps(_plain_launch)
    def launch(kernel, grid: tuple[int, ...], key: tuple, *args, **kwargs) -> None:
        with INTERPRETER_LOCK:
            _plain_launch(kernel, grid, key, *args, **kwargs)


def _with_descriptors(runner, rest: tuple):
    def runner_with_descriptors(args):
        return runner(*as_descriptors(args), *rest)

    return runner_with_descriptors


def piece_tmas(cfg: KernelConfig, *tensors) -> tuple[Tma, ...]:
    """TMA descriptors of [T, I] epilogue tensors in ``cfg``'s epilogue pieces ([BM, BN //
    EPI_SPLIT] blocks): the dSwiGLU and fused forward kernels' gate/up/act/h operands."""
    piece = [cfg.BM, cfg.BN // cfg.EPI_SPLIT]
    return tuple(Tma(t, piece) for t in tensors)


def launch_kwargs(cfg: KernelConfig) -> dict:
    """The tl kernels' configuration keywords for ``cfg`` (one shared dict per config and
    ``INTERPRET``: read only). ``INTERPRET`` is read at each call and is part of the cache's key: a
    dict cached while a test had patched it would otherwise set UPCAST (fp32 operands, TF32 dots)
    for every later GPU launch of that config in the process."""
    return _launch_kwargs(cfg, devices.INTERPRET)


@lru_cache(maxsize=None)
def _launch_kwargs(cfg: KernelConfig, upcast: bool) -> dict:
    return dict(
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        WARP_SPECIALIZE=cfg.warp_specialize,
        FLATTEN=cfg.flatten,
        BM=cfg.BM,
        BN=cfg.BN,
        BK=cfg.BK,
        GROUP_M=cfg.GROUP_M,
        EPI_SPLIT=cfg.EPI_SPLIT,
        UPCAST=upcast,
    )
