"""The forward of the memory-lean training mode: ``triton_swiglu_forward``.

``out = down_proj(silu(gate_proj(x)) * up_proj(x))``, returning ``(out, gate_output, up_output)``:
the two [T, I] activations the memory-lean backward needs (it recomputes activated_gate from
gate_output with the same Triton formula, ``kernels._activated_gate``, so bitwise the same values).
Per token bucket (``FORWARD_CONFIGS``) the gate/up projections run either

* fused: ``kernels.swiglu_forward_kernel``, one persistent launch computing
  ``x @ [gate_weight; up_weight].T`` (two fp32 accumulators per output tile) whose epilogue writes
  gate_output, up_output and ``h = bf16(bf16(silu(gate)) * up)``; or
* cuBLAS: two ``F.linear`` GEMMs, then ``kernels.swiglu_product_kernel`` for h (one elementwise pass).

down_proj is always cuBLAS (``F.linear(h, down_weight)``). The table's default is cuBLAS
everywhere; ``scripts/train_step_gpu.py`` times both per bucket on the H200 and writes the
measured choice (``forward_configs.json``, loaded from next to this file when present).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from . import tl_kernels as kernels
from .configs import TOKEN_BUCKETS, KernelConfig, bucket_for, parse_bucket, parse_by_shape, shape_choice
from .devices import INTERPRET, cdiv, tile_programs, unsupported_reason
from .launch import launch, launch_kwargs, piece_tmas
from .tma import Tma, tma_ready
from ..checks import check_tensor

#: Per token bucket (``TOKEN_BUCKETS``, as the backward's table): a KernelConfig runs the fused
#: kernel, None the cuBLAS path. Overridden by ``forward_configs.json`` when present.
FORWARD_CONFIGS: dict[int, KernelConfig | None] = {b: None for b in TOKEN_BUCKETS}
#: Per (hidden_size, intermediate_size): buckets with their own measured choice at that shape
#: (``forward_configs.json``'s ``configs_by_shape``), which replaces FORWARD_CONFIGS' there.
FORWARD_CONFIGS_BY_SHAPE: dict[tuple[int, int], dict[int, KernelConfig | None]] = {}
FORWARD_CONFIGS_PATH = Path(__file__).with_name("forward_configs.json")
PRODUCT_BLOCK = 2048


def _load_forward_configs(path: Path) -> None:
    if not path.exists():
        return
    table = json.loads(path.read_text())
    for bucket, entry in table["configs"].items():
        FORWARD_CONFIGS[parse_bucket(bucket)] = _entry_config(entry)
    FORWARD_CONFIGS_BY_SHAPE.update(parse_by_shape(table.get("configs_by_shape", {}), _entry_config))


def _entry_config(entry: dict) -> KernelConfig | None:
    return None if entry["config"] is None else KernelConfig(**entry["config"])


_load_forward_configs(FORWARD_CONFIGS_PATH)


def forward_config_for(tokens: int, hidden_size: int | None = None, intermediate_size: int | None = None) -> KernelConfig | None:
    """The fused kernel's configuration at ``tokens``, or None where cuBLAS is chosen; at a
    (hidden_size, intermediate_size) with its own measured entry for the bucket
    (``FORWARD_CONFIGS_BY_SHAPE``), that one. Raises TypeError when only one of the two sizes
    is given."""
    if (hidden_size is None) != (intermediate_size is None):
        raise TypeError("forward_config_for: give both hidden_size and intermediate_size, or neither")
    shape = None if hidden_size is None else (hidden_size, intermediate_size)
    return shape_choice(FORWARD_CONFIGS, FORWARD_CONFIGS_BY_SHAPE, bucket_for(tokens), shape)


def _check_fused_config(c: KernelConfig) -> None:
    if c.EPI_SPLIT not in (1, 2):
        raise ValueError(f"the fused forward takes EPI_SPLIT 1 or 2, got {c.EPI_SPLIT}")


def launch_fused_forward(x, gate_weight, up_weight, gate, up, act, h, c: KernelConfig) -> None:
    """gate = x @ gate_weight.T, up = x @ up_weight.T and h (and act unless None) [T, I] in one
    persistent launch. All 2-D, TMA-ready bf16."""
    _check_fused_config(c)
    T, H = x.shape
    I = gate_weight.shape[0]
    nprog = tile_programs(x.device, T, I, c, c.persistent)
    launch(
        kernels.swiglu_forward_kernel,
        (nprog,),
        ("swiglu_forward", x.device, T, H, I, nprog, act is not None, c),
        Tma(x, [c.BM, c.BK]),
        Tma(gate_weight, [c.BN, c.BK]),
        Tma(up_weight, [c.BN, c.BK]),
        *piece_tmas(c, gate, up, h if act is None else act, h),
        T,
        H,
        I,
        nprog,
        STORE_ACT=act is not None,
        **launch_kwargs(c),
    )


def launch_swiglu_product(gate, up, h, act=None) -> None:
    """h = bf16(bf16(silu(gate)) * up) (and act = bf16(silu(gate)) unless None); contiguous bf16
    tensors of one shape."""
    n = gate.numel()
    grid = (cdiv(n, PRODUCT_BLOCK),)
    launch(
        kernels.swiglu_product_kernel,
        grid,
        ("swiglu_product", gate.device, n, act is not None),
        gate,
        up,
        h if act is None else act,
        h,
        n,
        BLOCK=PRODUCT_BLOCK,
        STORE_ACT=act is not None,
        UPCAST=INTERPRET,
        num_warps=4,
    )


def _empty(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    # Every kernel output is allocated here (tests fill them with NaN to catch unwritten tiles).
    return torch.empty(*shape, device=device, dtype=torch.bfloat16)  # sizes as ints: parsed faster than a tuple


def triton_swiglu_forward(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    *,
    config: KernelConfig | None | str = "auto",
    return_activated_gate: bool = False,
) -> tuple[torch.Tensor, ...]:
    """The SwiGLU MLP forward with the Triton silu formula (module docstring).

    Args:
        x: [..., H] bf16 (any strides; copied once when not TMA-usable).
        gate_weight, up_weight: [I, H]; down_weight: [H, I]; bf16, x's device (CUDA sm_90+, or any
            device under ``TRITON_INTERPRET=1``), hidden_size and intermediate_size multiples of 8.
        config: ``"auto"`` (``forward_config_for(T, H, I)``), None (cuBLAS + elementwise) or a
            ``KernelConfig`` for the fused kernel (EPI_SPLIT 1 or 2).
        return_activated_gate: also return ``activated_gate = bf16(silu(gate_output))`` (tests,
            and the saved mode's values from this formula).

    Returns:
        ``(out [..., H], gate_output [..., I], up_output [..., I])`` (plus activated_gate [..., I]
        when asked), fresh contiguous bf16 tensors (empty ones for T = 0). ``h`` is freed on return. The error against
        float64 is that of the nn.Linear module's bf16 forward (same roundings; the fused GEMM's
        summation order differs); activated_gate may differ from ``F.silu``'s by one bf16 ulp.

    Raises:
        TypeError: a non-bf16 tensor. ValueError: mismatched shapes, an empty size, an unsupported
        device or unaligned sizes, a bad ``config``.
    """
    tensors = {"x": x, "gate_weight": gate_weight, "up_weight": up_weight, "down_weight": down_weight}
    for name, t in tensors.items():
        check_tensor(name, t)
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be bfloat16 for the Triton forward, got {t.dtype}")
    inter, hidden = gate_weight.shape if gate_weight.dim() == 2 else (None, None)
    if gate_weight.dim() != 2 or tuple(up_weight.shape) != (inter, hidden) or tuple(down_weight.shape) != (hidden, inter):
        raise ValueError(
            f"gate_weight and up_weight must be [I, H] and down_weight [H, I], got "
            f"{list(gate_weight.shape)}, {list(up_weight.shape)}, {list(down_weight.shape)}"
        )
    if x.dim() < 1 or x.shape[-1] != hidden or 0 in (inter, hidden):
        raise ValueError(
            f"x must have shape [..., {hidden}] and the weights no empty size, got x {list(x.shape)}, "
            f"gate_weight {list(gate_weight.shape)}"
        )
    reason = unsupported_reason(x, gate_weight)
    if reason:
        raise ValueError(f"the Triton forward {reason}")
    if not (isinstance(config, str) and config == "auto") and config is not None and not isinstance(config, KernelConfig):
        raise ValueError(f"config must be 'auto', None or a KernelConfig, got {config!r}")
    return run_forward(x, gate_weight, up_weight, down_weight, config, return_activated_gate)


def run_forward(
    x, gate_weight, up_weight, down_weight, config: KernelConfig | None | str = "auto", return_activated_gate: bool = False
) -> tuple[torch.Tensor, ...]:
    """``triton_swiglu_forward`` without its checks, for ``swiglu.ops``, which validated the
    inputs and resolved the Triton path for their device and sizes."""
    inter, hidden = gate_weight.shape
    T = x.numel() // hidden
    cfg = forward_config_for(T, hidden, inter) if isinstance(config, str) else config
    dev = x.device
    if (
        cfg is None
        and T > 0
        and x.dim() != 2
        and x.is_contiguous()
        and x.data_ptr() % 16 == 0
        and (hidden * x.element_size()) % 16 == 0
    ):
        # The cuBLAS path for an x [..., H] whose [T, H] view tma_ready would take as it is: the
        # GEMMs on x itself (the same as on the view) and h with x's leading dimensions, so no
        # output needs a reshape.
        shape = (*x.shape[:-1], inter)
        act = _empty(shape, dev) if return_activated_gate else None
        h = _empty(shape, dev)
        gate = F.linear(x, gate_weight)
        up = F.linear(x, up_weight)
        launch_swiglu_product(gate, up, h, act)
        out = F.linear(h, down_weight)
        return (out, gate, up, act) if return_activated_gate else (out, gate, up)
    lead = x.shape[:-1]
    xf = tma_ready(x)
    act = _empty((T, inter), dev) if return_activated_gate else None
    h = _empty((T, inter), dev)
    if T == 0:  # no tokens: no launches (a zero-size grid is an error)
        gate, up = _empty((0, inter), dev), _empty((0, inter), dev)
        act = act if act is None else _empty((0, inter), dev)
    elif cfg is None:
        gate = F.linear(xf, gate_weight)
        up = F.linear(xf, up_weight)
        launch_swiglu_product(gate, up, h, act)
    else:
        gate, up = _empty((T, inter), dev), _empty((T, inter), dev)
        launch_fused_forward(xf, tma_ready(gate_weight), tma_ready(up_weight), gate, up, act, h, cfg)
    # out by F.linear on h in x's leading dimensions: a tensor of its own, not a view (FSDP2's
    # backward hook on a module's output is lost by an in-place op on a view of it).
    out = F.linear(h.view(*lead, inter), down_weight)
    result = (out, gate.reshape(*lead, inter), up.reshape(*lead, inter))
    return result + ((act.reshape(*lead, inter),) if return_activated_gate else ())
