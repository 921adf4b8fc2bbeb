"""The Triton backward: launchers for ``swiglu.kernels.tl_kernels`` and the Gluon kernels, the launch
plan (``backward_plan``, cached per tokens, sizes and device), ``launch_backward`` that runs it, and
``triton_swiglu_backward`` for direct callers. The library reaches it through
``swiglu.ops.run_backward`` (every entry: ``swiglu_mlp_backward``, the autograd carriers). Kernel configurations come from one table (``configs.CONFIGS``, backward_configs.json) keyed by
kernel and token bucket; no autotuning happens at call time, so the only slow call is the first one per
configuration (Triton's JIT compile, a few seconds per kernel), never one inside a timed loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ..checks import ARG_NAMES, spans_whole_storage, validate_backward_inputs
from . import devices
from . import tl_kernels as kernels
from .configs import TOKEN_BUCKETS, DswigluGluonConfig, GluonConfig, KernelConfig, bucket_for  # noqa: F401

# fmt: off
from .devices import (INTERPRET, cdiv, device_reason, gluon_unavailable_reason, num_programs, sizes_reason,  # noqa: F401
                      tile_programs, unsupported_reason, untuned_reason)
# fmt: on
from .launch import CONFIG_TOKENS, launch, launch_kwargs, piece_tmas
from .tma import Tma, tma_ready, tuple_new
from .forward import launch_swiglu_product

# fmt: off
from .configs import (CONFIGS, GLUON_CONFIGS, GLUON_DSWIGLU, GLUON_DSWIGLU_BY_SHAPE,  # noqa: F401 (the table)
                      GLUON_GRAD_X, TUNED_CONFIGS_PATH, shape_choice)
# fmt: on
from .shared_memory import check_shared_memory


def config_for(kernel: str, tokens: int) -> KernelConfig:
    """The configuration ``kernel`` ("dswiglu", "grad_weights", "grad_x") uses at ``tokens``: the
    table's entry for its bucket, ``KernelConfig()`` where the table has none."""
    return CONFIGS[kernel].get(bucket_for(tokens)) or KernelConfig()


#: Narrower grad_x tiles, widest first, for outputs the table's tiles leave the GPU half idle on:
#: the table was tuned at H = 16384, and at Llama-3-8B's H = 4096 its 128x256 tiles at T = 256
#: are 32 tiles for 132 SMs. Measured there (do_bench, L2 flushed, H200; cuBLAS in brackets):
#: T = 256 64x128 0.144 ms against 0.266 (0.101), T = 512 64x256 0.178 against 0.269 (0.173);
#: data/tuning/grad_x_tiles_llama8b_7570349_20261202.csv.
GRAD_X_NARROW = (KernelConfig(64, 256, 64, 8, 1, 4, 4), KernelConfig(64, 128, 64, 8, 1, 4, 4))
#: A grad_x launch fills the GPU when its output tiles number at least this fraction of the SMs
#: (128 tiles on the H200's 132 SMs do).
GRAD_X_FILL = 0.9


def grad_x_fills(T: int, H: int, cfg, sms: int) -> bool:
    """Whether ``cfg``'s BM x BN tiles of the [T, H] grad_x output fill ``sms`` SMs (``GRAD_X_FILL``)."""
    return cdiv(T, cfg.BM) * cdiv(H, cfg.BN) >= GRAD_X_FILL * sms


def grad_x_config_filling(T: int, H: int, cfg: KernelConfig, sms: int) -> KernelConfig:
    """``cfg`` if its tiles of the [T, H] output fill ``sms`` SMs (``grad_x_fills``), else the
    widest of ``GRAD_X_NARROW`` that does, else the narrowest (the most tiles)."""
    for c in (cfg, *GRAD_X_NARROW):
        if grad_x_fills(T, H, c, sms):
            return c
    return GRAD_X_NARROW[-1]


def launch_dswiglu(go, down_w, gate, up, act, d_gate, d_up, h, c: KernelConfig, nprog: int | None = None) -> None:
    """``g = go @ down_w`` [T, I] with the SwiGLU backward epilogue: writes d_gate, d_up, h [T, I].
    ``act`` None: activated_gate is recomputed from gate in the epilogue (memory-lean mode).
    ``nprog``: the persistent programs (default: one per SM, at most one per tile)."""
    T, H = go.shape
    I = down_w.shape[1]
    nprog = nprog or tile_programs(go.device, T, I, c)
    launch(
        kernels.dswiglu_gemm_kernel,
        (nprog,),
        ("dswiglu", go.device, T, H, I, nprog, act is None, c),
        Tma(go, [c.BM, c.BK]),
        Tma(down_w, [c.BK, c.BN]),
        *piece_tmas(c, gate, up, gate if act is None else act, d_gate, d_up, h),
        T,
        H,
        I,
        NUM_PROGRAMS=nprog,
        RECOMPUTE_ACT=act is None,
        **launch_kwargs(c),
    )


def padded_tokens(T: int, wgrad_cfg: KernelConfig) -> int:
    """T rounded up to the weight-gradient kernel's BK: the K extent of its launches."""
    return cdiv(T, wgrad_cfg.BK) * wgrad_cfg.BK


def launch_grad_weight(a, b, out, c: KernelConfig, nprog: int | None = None) -> None:
    """out = a.T @ b: a [T, M], b [T, N], out [M, N] (a weight gradient, K = tokens) by the tl kernel
    (``tl_kernels.grad_weight_kernel``), as ``launch_grad_x`` and ``launch_dswiglu`` launch theirs;
    ``launch_grad_weight_gluon_or_tl`` picks between it and the Gluon one."""
    T, M = a.shape
    N = b.shape[1]
    # K = T rounded up to BK, not T: the descriptors zero-fill rows >= T, and T = 1 would be
    # specialized as a constexpr, which Triton 3.6's pipeliner fails on (seen on the H200).
    nprog = nprog or tile_programs(a.device, M, N, c, c.persistent)
    K = padded_tokens(T, c)
    launch(
        kernels.grad_weight_kernel,
        (nprog,),
        ("grad_weight", a.device, M, N, K, nprog, c),
        Tma(a, [c.BK, c.BM]),
        Tma(b, [c.BK, c.BN]),
        Tma(out, [c.BM, c.BN // c.EPI_SPLIT]),
        out,
        M,
        N,
        K,
        nprog,
        TMA_STORE=c.tma_store,
        **launch_kwargs(c),
    )


def launch_grad_weight_gluon_or_tl(a, b, out, c: KernelConfig, g: GluonConfig | None, nprog: int | None = None) -> None:
    """out = a.T @ b with the Gluon kernel when ``g`` is given, else the tl kernel (``c``);
    ``nprog`` persistent programs (default: one per SM, at most one per tile)."""
    if g is None:
        launch_grad_weight(a, b, out, c, nprog)
        return
    if g.resident_k:
        if RESIDENT_LAUNCHER is None:
            raise ValueError(
                f"a config with resident_k runs swiglu_lab.experiments.gluon_wgrad_resident's kernel, "
                f"which sets backward.RESIDENT_LAUNCHER when imported (not imported), got {g}"
            )
        launcher = RESIDENT_LAUNCHER
    elif g.lab_only:
        if PLAIN_STORE_LAUNCHER is None:
            raise ValueError(
                f"a config with plain_store, a deferred cooperative epilogue, the wide cooperative tile or the "
                f"ping-pong tile with the storer warp runs "
                f"swiglu_lab.experiments.gluon_wgrad_probe's kernel, which sets backward.PLAIN_STORE_LAUNCHER "
                f"when imported (not imported), got {g}"
            )
        launcher = PLAIN_STORE_LAUNCHER
    else:
        launcher = (_GLUON_MODULES or _gluon_modules())[0].wgrad.launch_grad_weight_gluon
    launcher(a, b, out, g, nprog or tile_programs(a.device, a.shape[1], b.shape[1], g))


#: The launcher of a ``GluonConfig`` with ``resident_k`` (A held in shared memory): the library
#: ships none; the lab's ``swiglu_lab.experiments.gluon_wgrad_resident`` sets it when imported, so
#: a table entry with ``resident_k`` (the lab's A/B tables) runs that kernel. None: such an entry raises.
RESIDENT_LAUNCHER = None
#: The same for a ``GluonConfig.lab_only`` config (st.global instead of TMA stores, a deferred or
#: wide cooperative tile, the ping-pong tile with the storer warp) and for a ``gluon_grad_x`` table entry (the Gluon grad_x, ``GLUON_GRAD_X``): the lab's
#: ``swiglu_lab.experiments.gluon_wgrad_probe`` sets both when imported. None: such an entry raises.
PLAIN_STORE_LAUNCHER = None
GRAD_X_LAUNCHER = None

_GLUON_MODULES: list = []


def _gluon():
    """The Gluon launcher modules (``.wgrad``: ``gluon_wgrad``, ``.dswiglu``: ``gluon_dswiglu``),
    imported on first use: only where Gluon runs (``devices.GLUON_TRITONS``); an import statement
    per launch costs host time."""
    return (_GLUON_MODULES or _gluon_modules())[0]


def _gluon_modules() -> list:
    if not _GLUON_MODULES:
        from types import SimpleNamespace

        from . import gluon_dswiglu, gluon_wgrad

        _GLUON_MODULES.append(SimpleNamespace(wgrad=gluon_wgrad, dswiglu=gluon_dswiglu))
    return _GLUON_MODULES


@lru_cache(maxsize=256)
def _gluon_config_for_bucket(
    bucket: int, device: torch.device, kernel: str = "grad_weights", shape: tuple[int, int] | None = None
):
    if kernel == "grad_weights":
        g = GLUON_CONFIGS[bucket]
    elif kernel == "grad_x":
        g = GLUON_GRAD_X[bucket]
    else:
        g = shape_choice(GLUON_DSWIGLU, GLUON_DSWIGLU_BY_SHAPE, bucket, shape)
    if g is None or gluon_unavailable_reason(device) is not None:
        return None
    limit = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    return g if g.smem_bytes() <= limit else None


def gluon_config_for(tokens: int, device: torch.device) -> GluonConfig | None:
    """The Gluon weight-gradient config at ``tokens`` on ``device``, or None for the tl kernel: no
    table entry, Gluon unavailable here (``devices.gluon_unavailable_reason``), or a config larger
    than the device's shared memory."""
    return _gluon_config_for_bucket(bucket_for(tokens), device)


def gluon_dswiglu_config_for(
    tokens: int, device: torch.device, hidden_size: int | None = None, intermediate_size: int | None = None
) -> DswigluGluonConfig | None:
    """The Gluon dSwiGLU config at ``tokens`` on ``device``, or None for the tl kernel (the same
    conditions as ``gluon_config_for``); at a (hidden_size, intermediate_size) with its own
    measured entry for the bucket (``GLUON_DSWIGLU_BY_SHAPE``), that one."""
    shape = None if hidden_size is None else (hidden_size, intermediate_size)
    return _gluon_config_for_bucket(bucket_for(tokens), device, "dswiglu", shape)


def grad_x_tail_splits(T: int, H: int, I: int, c: KernelConfig, nprog: int) -> tuple[int, int]:
    """(tail, splits) of a split-tail grad_x launch: the tiles left after whole waves of ``nprog``,
    and the runs each is split into over its 2 * cdiv(I, BK) k-steps (at most nprog // tail, one
    per program); splits 1: nothing to split, the tiled kernel runs."""
    tail = cdiv(T, c.BM) * cdiv(H, c.BN) % nprog
    return tail, min(nprog // tail, 2 * cdiv(I, c.BK)) if tail else 1


def launch_grad_x(d_gate, d_up, gate_weight, up_weight, grad_x, c: KernelConfig, nprog: int | None = None) -> None:
    """grad_x = d_gate @ gate_weight + d_up @ up_weight [T, H], one fp32 accumulator;
    ``nprog`` persistent programs (default: one per SM, at most one per tile). With
    ``c.split_tail``, where the tiles leave a last wave of at most nprog / 2: the split-tail
    kernel, each last tile over nprog // tail programs (an fp32 workspace of up to nprog tiles)."""
    T, I = d_gate.shape
    H = gate_weight.shape[1]
    nprog = nprog or tile_programs(d_gate.device, T, H, c, c.persistent)
    tail, splits = grad_x_tail_splits(T, H, I, c, nprog) if c.split_tail else (0, 1)
    d_block, w_block, out_block, kwargs, token = _grad_x_constants(c, devices.INTERPRET)
    descs = (
        tuple_new(Tma, (d_gate, d_block, None)),
        tuple_new(Tma, (d_up, d_block, None)),
        tuple_new(Tma, (gate_weight, w_block, None)),
        tuple_new(Tma, (up_weight, w_block, None)),
        tuple_new(Tma, (grad_x, out_block, None)),
    )
    if splits > 1:
        # Each last tile's runs, and their arrival counts.
        ws = torch.empty((tail * splits, c.BM, c.BN), device=d_gate.device, dtype=torch.float32)
        count = torch.zeros((tail,), device=d_gate.device, dtype=torch.int32)
        key = ("grad_x_split_tail", d_gate.device, T, H, I, nprog, token)
        launch(kernels.grad_x_split_tail_kernel, (nprog,), key, *descs, ws, count, T, H, I, nprog, splits, **kwargs)
        return
    launch(kernels.grad_x_kernel, (nprog,), ("grad_x", d_gate.device, T, H, I, nprog, token), *descs, T, H, I, nprog, **kwargs)


@lru_cache(maxsize=None)
def _grad_x_constants(c: KernelConfig, interpret: bool) -> tuple:
    # The descriptors' blocks (d_gate/d_up, the weights, grad_x), the configuration keywords
    # (``launch_kwargs``, for this INTERPRET) and the config's token in launch keys, built once
    # per config (host time per launch).
    return [c.BM, c.BK], [c.BK, c.BN], [c.BM, c.BN // c.EPI_SPLIT], launch_kwargs(c), next(CONFIG_TOKENS)


@dataclass(frozen=True)
class BackwardPlan:
    """What one backward launches at a given (tokens, hidden_size, intermediate_size, device):
    the tl configurations per kernel, the Gluon weight-gradient, dSwiGLU and grad_x configurations
    (None: the tl kernel), with the shared-memory check already passed. Built once per key by
    ``backward_plan``; a call then only prepares its tensors and launches."""

    tokens: int
    hidden_size: int
    intermediate_size: int
    dswiglu: KernelConfig
    grad_weights: KernelConfig
    grad_x: KernelConfig
    gluon_grad_weights: GluonConfig | None
    gluon_dswiglu: DswigluGluonConfig | None = None
    gluon_grad_x: GluonConfig | None = None
    #: Persistent programs of each launch (0: none planned, the launcher decides), for
    #: ``devices.RESERVED_SMS`` as it was when planned (it is part of the plan's key).
    dswiglu_programs: int = 0
    gluon_dswiglu_programs: int = 0
    grad_weight_programs_hi: int = 0  # the [H, I] output (grad_down_weight)
    grad_weight_programs_ih: int = 0  # the [I, H] outputs (grad_gate_weight, grad_up_weight)
    grad_x_programs: int = 0
    gluon_grad_x_programs: int = 0


def _make_plan(T: int, H: int, I: int, device: torch.device, configs: dict[str, KernelConfig]) -> BackwardPlan:
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        raise ValueError(f"configs keys must be among {sorted(CONFIGS)}, got {sorted(unknown)}")
    dswiglu_cfg = configs.get("dswiglu") or config_for("dswiglu", T)
    wgrad_cfg = configs.get("grad_weights") or config_for("grad_weights", T)
    grad_x_cfg = configs.get("grad_x") or config_for("grad_x", T)
    if "grad_x" not in configs and device.type == "cuda" and T > 0:
        grad_x_cfg = grad_x_config_filling(T, H, grad_x_cfg, devices.device_sms(device))
    # The Gluon weight-gradient kernel where the table has one for this bucket (an explicit
    # configs["grad_weights"] means the tl kernel with that config).
    gluon_wgrad_cfg = None if "grad_weights" in configs or T == 0 else gluon_config_for(T, device)
    gluon_dswiglu_cfg = None if "dswiglu" in configs or T == 0 else gluon_dswiglu_config_for(T, device, H, I)
    gluon_grad_x_cfg = None if "grad_x" in configs or T == 0 else _gluon_config_for_bucket(bucket_for(T), device, "grad_x")
    if (
        gluon_grad_x_cfg is not None
        and device.type == "cuda"
        and not grad_x_fills(T, H, gluon_grad_x_cfg, devices.device_sms(device))
    ):
        # Its tiles, chosen at Hermes' hidden_size, would leave SMs idle here (a smaller H): the
        # tl kernel with the filling tile instead.
        gluon_grad_x_cfg = None
    # Before any launch: a config too big for shared memory is a ValueError naming it, not
    # Triton's OutOfResources from deep inside the launcher.
    if T > 0:
        for kernel, cfg in (("dswiglu", dswiglu_cfg), ("grad_weights", wgrad_cfg), ("grad_x", grad_x_cfg)):
            if not (kernel == "grad_weights" and gluon_wgrad_cfg is not None):
                check_shared_memory(kernel, cfg, device)
    # (The tl dSwiGLU config is checked even where Gluon's is planned: it runs when the strides
    # rule Gluon out, launch_backward.)
    return BackwardPlan(
        T,
        H,
        I,
        dswiglu_cfg,
        wgrad_cfg,
        grad_x_cfg,
        gluon_wgrad_cfg,
        gluon_dswiglu_cfg,
        gluon_grad_x_cfg,
        *_programs(T, H, I, device, dswiglu_cfg, wgrad_cfg, grad_x_cfg, gluon_wgrad_cfg, gluon_dswiglu_cfg, gluon_grad_x_cfg),
    )


def _programs(T, H, I, device, dswiglu_cfg, wgrad_cfg, grad_x_cfg, gluon_wgrad_cfg, gluon_dswiglu_cfg, gluon_grad_x_cfg) -> tuple:
    # BackwardPlan's *_programs fields, in their order.
    if T == 0:
        return ()
    w = gluon_wgrad_cfg or wgrad_cfg
    persistent = gluon_wgrad_cfg is not None or wgrad_cfg.persistent
    gd = gluon_dswiglu_cfg
    return (
        tile_programs(device, T, I, dswiglu_cfg),
        0 if gd is None else tile_programs(device, T, I, gd),
        tile_programs(device, H, I, w, persistent),
        tile_programs(device, I, H, w, persistent),
        tile_programs(device, T, H, grad_x_cfg, grad_x_cfg.persistent),
        0 if gluon_grad_x_cfg is None else tile_programs(device, T, H, gluon_grad_x_cfg),
    )


@lru_cache(maxsize=1024)
def _cached_plan(T: int, H: int, I: int, device: torch.device, reserved_sms: int) -> BackwardPlan:
    return _make_plan(T, H, I, device, {})


def backward_plan(
    tokens: int, hidden_size: int, intermediate_size: int, device: torch.device, configs: dict[str, KernelConfig] | None = None
) -> BackwardPlan:
    """The ``BackwardPlan`` for these sizes on ``device`` (a CUDA device with its index, or the
    CPU under the interpreter). Without ``configs`` it comes from a bounded cache keyed by the
    sizes, the device and ``devices.RESERVED_SMS`` (the tables, the triton release and ``SWIGLU_GLUON`` are fixed for the
    process; ``clear_plans`` empties it); ``configs`` overrides the table per kernel
    ("dswiglu", "grad_weights", "grad_x") and is planned afresh. Raises ValueError for an unknown
    ``configs`` key or a configuration larger than the device's shared memory."""
    if configs:
        return _make_plan(tokens, hidden_size, intermediate_size, device, configs)
    return _cached_plan(tokens, hidden_size, intermediate_size, device, devices.RESERVED_SMS)


def clear_plans() -> None:
    """Forget every cached plan and device answer (after changing ``CONFIGS``/``GLUON_CONFIGS``,
    the environment switches, or faked device properties in tests)."""
    _cached_plan.cache_clear()
    device_reason.cache_clear()
    untuned_reason.cache_clear()
    _gluon_config_for_bucket.cache_clear()


def triton_swiglu_backward(
    *inputs: torch.Tensor | None,
    need_grad_x: bool = True,
    need_grad_gate_weight: bool = True,
    need_grad_up_weight: bool = True,
    need_grad_down_weight: bool = True,
    configs: dict[str, KernelConfig] | None = None,
    out: tuple[torch.Tensor | None, ...] | None = None,
    overwrite_activations: bool = False,
    release_activations: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The backward through the three Triton kernels (module docstring of ``swiglu.kernels.tl_kernels``).

    ``inputs``: ``swiglu.swiglu_mlp_backward``'s eight tensors in its order (``checks.ARG_NAMES``),
    its shapes; all bfloat16 on one sm_90+ CUDA device (or any device under
    ``TRITON_INTERPRET=1``), hidden_size and intermediate_size multiples of 8.
    A gradient whose ``need_*`` flag is False is not computed (its GEMMs are skipped) and comes
    back as None. ``configs`` overrides the table's choice per kernel ("dswiglu",
    "grad_weights", "grad_x"). ``out`` gives preallocated outputs ``(grad_x [T, H],
    grad_gate_weight [I, H], grad_up_weight [I, H], grad_down_weight [H, I])``, contiguous bf16
    on the inputs' device (None entries are allocated); overwritten, never read, never
    overlapping an input.

    ``activated_gate`` None (memory-lean mode): recomputed as ``bf16(silu(gate_output))`` in the
    dSwiGLU epilogue with ``swiglu.kernels.forward``'s formula, bitwise what it produced.
    ``overwrite_activations=True``: d_gate and d_up are written over gate_output and up_output
    (one [T, I] buffer allocated instead of three; bitwise the same gradients: each epilogue
    piece reads its gate/up values before it stores there). ``release_activations=True`` besides:
    their storage is freed (resized to 0 bytes, where a tensor spans all of it) after its last
    reader is launched; afterwards they are unusable. The default never writes an input.

    Raises: TypeError for a non-bf16 input or other than eight; ValueError for bad shapes
    (``validate_backward_inputs``), an unsupported device or unaligned sizes, or a configuration
    larger than the device's shared memory (``swiglu.kernels.shared_memory``), before any launch.
    """
    if len(inputs) != len(ARG_NAMES):
        raise TypeError(f"the backward takes {len(ARG_NAMES)} tensors {ARG_NAMES}, got {len(inputs)}")
    grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight = inputs
    recompute = activated_gate is None
    problem = validate_backward_inputs(
        grad_output,
        x,
        gate_output,
        up_output,
        gate_output if recompute else activated_gate,
        gate_weight,
        up_weight,
        down_weight,
        dtypes=(torch.bfloat16,),
    )
    reason = unsupported_reason(x, gate_weight)
    if reason:
        raise ValueError(f"impl='triton' {reason}")
    if release_activations and not overwrite_activations:
        raise ValueError("release_activations=True needs overwrite_activations=True")
    plan = backward_plan(problem.tokens, problem.hidden_size, problem.intermediate_size, plan_device(x.device), configs)
    T, H, I = plan.tokens, plan.hidden_size, plan.intermediate_size
    outs = _check_out(out, [t for t in inputs if t is not None], [(T, H), (I, H), (I, H), (H, I)], x.device)
    flat = [None if t is None else t.reshape(-1, t.shape[-1]) for t in inputs[:5]]
    grad_x, *grad_weights = launch_backward(
        (*flat, gate_weight, up_weight, down_weight),
        plan=plan,
        needs=(need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight),
        overwrite_activations=overwrite_activations,
        release_activations=release_activations,
        out=outs,
    )
    return (None if grad_x is None else grad_x.reshape(x.shape), *grad_weights)


def plan_device(device: torch.device) -> torch.device:
    """``device`` with its index (``cuda`` -> ``cuda:<current>``): the plan cache's key."""
    if device.index is None and device.type == "cuda":  # a tensor's CUDA device has its index
        return torch.device("cuda", torch.cuda.current_device())
    return device


def launch_planned_dswiglu(plan: BackwardPlan, go, down_w, gate, up, act, d_gate, d_up, h) -> None:
    """``launch_dswiglu``'s contract with ``plan``'s kernel: the Gluon one where the plan has it
    and the strides allow (it addresses gate/up/act with one row stride and d_gate/d_up/h with
    another), else the tl one. TMA-ready 2-D tensors, [T, *] as the plan's T."""
    gd = plan.gluon_dswiglu
    if (
        gd is not None
        # stride()[0]: torch parses stride(0)'s argument slower than it builds the tuple.
        and gate.stride()[0] == up.stride()[0]
        and (act is None or act.stride()[0] == up.stride()[0])
        and d_gate.stride()[0] == d_up.stride()[0] == h.stride()[0]
    ):
        _gluon().dswiglu.launch_dswiglu_gluon_trusted(
            go,
            down_w,
            gate,
            up,
            act,
            d_gate,
            d_up,
            h,
            gd,
            plan.gluon_dswiglu_programs or tile_programs(go.device, plan.tokens, plan.intermediate_size, gd),
        )
    else:
        launch_dswiglu(go, down_w, gate, up, act, d_gate, d_up, h, plan.dswiglu, plan.dswiglu_programs)


def launch_planned_grad_x(plan: BackwardPlan, d_gate, d_up, gate_w, up_w, grad_x) -> None:
    """``launch_grad_x``'s contract with ``plan``'s kernel: the Gluon grad_x where the plan has one
    (``GRAD_X_LAUNCHER``, which the lab sets; ValueError where it is unset), else the tl one."""
    if plan.gluon_grad_x is None:
        launch_grad_x(d_gate, d_up, gate_w, up_w, grad_x, plan.grad_x, plan.grad_x_programs)
        return
    if GRAD_X_LAUNCHER is None:
        raise ValueError(
            f"a gluon_grad_x table entry runs swiglu_lab.experiments.gluon_wgrad_probe's kernel, which "
            f"sets backward.GRAD_X_LAUNCHER when imported (not imported), got {plan.gluon_grad_x}"
        )
    GRAD_X_LAUNCHER(d_gate, d_up, gate_w, up_w, grad_x, plan.gluon_grad_x, plan.gluon_grad_x_programs)


def launch_backward(
    tensors,
    *,
    plan: BackwardPlan,
    needs: tuple[bool, bool, bool, bool],
    overwrite_activations: bool = False,
    release_activations: bool = False,
    out: list | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``triton_swiglu_backward`` without its checks: the callers (``swiglu.ops``, the public
    function above) validated the inputs and made ``plan`` for them. ``tensors``: the eight
    inputs in ``swiglu.checks.ARG_NAMES`` order, activations [T, *], weights as given; ``needs``:
    which gradients (``GRAD_NAMES`` order). Returns grad_x [T, H] and the weight gradients (None
    where not needed)."""
    grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight = tensors
    need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight = needs
    T, H, I = plan.tokens, plan.hidden_size, plan.intermediate_size
    outs = out or (None, None, None, None)
    if T == 0:
        # No tokens (e.g. an MoE expert that got none this step): nothing to launch; the weight
        # gradients are sums over zero tokens, so zeros, and grad_x is empty, as nn.Linear gives.
        return tuple(
            _alloc(buf, shape, x).zero_() if need else None
            for buf, shape, need in zip(outs, [(T, H), (I, H), (I, H), (H, I)], needs)
        )
    wgrad_cfg, gluon_wgrad_cfg = plan.grad_weights, plan.gluon_grad_weights
    need_d = need_grad_x or need_grad_gate_weight or need_grad_up_weight  # dswiglu runs (d_gate, d_up)
    go, xf = tma_ready(grad_output), tma_ready(x)
    gate, up = tma_ready(gate_output), tma_ready(up_output)
    act = None if activated_gate is None else tma_ready(activated_gate)
    gate_w, up_w, down_w = tma_ready(gate_weight), tma_ready(up_weight), tma_ready(down_weight)
    d_gate = d_up = h = None
    if need_d:
        if overwrite_activations:
            if _overlap(gate, up):
                raise ValueError("overwrite_activations needs gate_output and up_output in separate memory")
            # They are written (d_gate, d_up) while the others are still read: no shared memory.
            for name, t in (("gate_output", gate), ("up_output", up)):
                for other, u in (
                    ("grad_output", go),
                    ("x", xf),
                    ("activated_gate", act),
                    ("gate_weight", gate_w),
                    ("up_weight", up_w),
                    ("down_weight", down_w),
                ):
                    if u is not None and _overlap(t, u):
                        raise ValueError(
                            f"overwrite_activations writes over {name}, which shares memory with "
                            f"{other}: pass a tensor of its own (e.g. {name}.clone())"
                        )
            d_gate, d_up = gate, up
        else:
            d_gate = _alloc(None, (T, I), go)
            d_up = _alloc(None, (T, I), go)
        h = _alloc(None, (T, I), go)  # written by the epilogue
        launch_planned_dswiglu(plan, go, down_w, gate, up, act, d_gate, d_up, h)
    elif need_grad_down_weight:
        h = _alloc(None, (T, I), go)
        if act is None:  # only grad_down_weight wanted: h alone, no g GEMM
            launch_swiglu_product(gate.contiguous(), up.contiguous(), h)  # it reads flat memory
        else:
            with torch.no_grad():  # inputs may require grad; this is a backward, never recorded
                torch.mul(act, up, out=h)
    # Storage freed after its last reader (release_activations): gate's, then up's.
    release_gate = release_activations and spans_whole_storage(gate_output)
    release_up = release_activations and spans_whole_storage(up_output)
    del gate, up, act

    # Order for memory, not speed (the launches are independent once d_gate, d_up and h exist):
    # grad_down_weight first, so h is released before anything else is allocated; grad_x (the
    # one reader of both d buffers); then each of gate/up, after which its d buffer is released.
    # Live [T, I] buffers: h + 2 d while grad_down_weight's output exists, then at most one d
    # beside all three weight gradients (with overwrite_activations: h alone, and none beside
    # them). Freeing is safe with launches still queued: the caching allocator reuses memory only
    # for later work on the same stream (and release_storage records the current stream for a block
    # another stream allocated).
    grad_x = grad_gate_weight = grad_up_weight = grad_down_weight = None
    if need_grad_down_weight:
        grad_down_weight = _alloc(outs[3], (H, I), go)
        launch_grad_weight_gluon_or_tl(go, h, grad_down_weight, wgrad_cfg, gluon_wgrad_cfg, plan.grad_weight_programs_hi)
    del h
    if need_grad_x:
        grad_x = _alloc(outs[0], (T, H), go)
        launch_planned_grad_x(plan, d_gate, d_up, gate_w, up_w, grad_x)
    if need_grad_gate_weight:
        grad_gate_weight = _alloc(outs[1], (I, H), go)
        launch_grad_weight_gluon_or_tl(d_gate, xf, grad_gate_weight, wgrad_cfg, gluon_wgrad_cfg, plan.grad_weight_programs_ih)
    del d_gate
    if release_gate:
        release_storage(gate_output)
    if need_grad_up_weight:
        grad_up_weight = _alloc(outs[2], (I, H), go)
        launch_grad_weight_gluon_or_tl(d_up, xf, grad_up_weight, wgrad_cfg, gluon_wgrad_cfg, plan.grad_weight_programs_ih)
    if release_up:
        release_storage(up_output)
    return grad_x, grad_gate_weight, grad_up_weight, grad_down_weight


def release_storage(t: torch.Tensor) -> None:
    """Gives ``t``'s memory back to the caching allocator now (its storage resized to 0, ``t``
    itself to no elements), as a deleted tensor's would be, for reuse only after the work queued
    so far on the current stream. The allocator reuses a block at once on the stream that
    allocated it; an activation offloader may have allocated gate/up on a side stream (torchtune's
    OffloadActivations), so the current stream, where the launches that read it are queued, is
    recorded first (without it the block was reused on the side stream under our kernels on the
    H200: NaN gradients,
    tests/kernels/test_triton_gpu.py::test_release_waits_for_the_queued_kernels_when_gate_up_come_from_another_stream)."""
    if t.is_cuda:
        t.record_stream(torch.cuda.current_stream(t.device))
    t.untyped_storage().resize_(0)
    # Whoever still holds ``t`` (grad_fn.saved_tensors after retain_graph, a saved-tensor hook)
    # sees an empty tensor, not its old sizes over no memory (a read of those crashed the process).
    t.resize_((0,) * t.dim())


def _alloc(buf: torch.Tensor | None, shape: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    # A bf16 buffer on ``like``'s device (every input is bf16 there). ``new_empty`` with the sizes
    # as separate ints: torch parses it faster than ``torch.empty`` with dtype and device, or a
    # tuple (host time per call).
    return like.new_empty(*shape) if buf is None else buf.view(shape)


def _check_out(out, inputs, shapes, dev) -> list:
    names = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")
    if out is None:
        return [None] * 4
    if len(out) != 4:
        raise ValueError(f"out must hold 4 tensors (or None) {names}, got {len(out)}")
    for name, buf, shape in zip(names, out, shapes):
        if buf is None:
            continue
        if not isinstance(buf, torch.Tensor):
            raise TypeError(f"out[{name}] must be a torch.Tensor or None, got {type(buf).__name__}")
        if buf.dtype != torch.bfloat16 or buf.device != dev:
            raise TypeError(f"out[{name}] must be bfloat16 on {dev}, got {buf.dtype} on {buf.device}")
        if buf.numel() != shape[0] * shape[1] or not buf.is_contiguous():
            raise ValueError(
                f"out[{name}] must be contiguous with {shape[0] * shape[1]} elements {list(shape)}, got shape {list(buf.shape)}"
            )
        if buf.data_ptr() % 16:
            raise ValueError(f"out[{name}] must start at a 16-byte aligned address (TMA), got {buf.data_ptr():#x}")
        if any(_overlap(buf, t) for t in inputs):
            raise ValueError(f"out[{name}] overlaps an input; outputs must not alias inputs")
    given = [(n, b) for n, b in zip(names, out) if b is not None]
    for i, (n1, b1) in enumerate(given):
        for n2, b2 in given[i + 1 :]:
            if _overlap(b1, b2):
                raise ValueError(f"out[{n1}] and out[{n2}] overlap; outputs must not alias each other")
    return list(out)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of a and b intersect (conservative for strided views)."""

    def span(t: torch.Tensor) -> tuple[int, int]:
        extent = t.numel() and sum((d - 1) * st for d, st in zip(t.shape, t.stride())) + 1
        return t.data_ptr(), t.data_ptr() + extent * t.element_size()

    (a_lo, a_hi), (b_lo, b_hi) = span(a), span(b)
    return a_lo < b_hi and b_lo < a_hi
