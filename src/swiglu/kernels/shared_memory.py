"""Shared memory of a tl kernel launch, estimated before launching: a configuration too big for the
device is a ``ValueError`` naming the kernel, the configuration, the estimate and the limit, not
Triton's ``OutOfResources`` from inside its launcher. The estimate is never below Triton's own
figure for the table and ~40 configurations around it (tests/kernels/test_triton_compile.py, triton 3.6.0
and 3.7.1) and at most 1.1 KiB above it for the table's launches; the model and its calibration
are in docs/kernels.md.
"""

from __future__ import annotations

from functools import lru_cache

import torch

#: Opt-in shared memory per block on sm_90 (H100/H200, ``cudaDevAttrMaxSharedMemoryPerBlockOptin``),
#: the limit used where no CUDA device can be queried (CPU, the interpreter, meta tensors).
SM90_SHARED_MEMORY_BYTES = 232448
#: Launcher kernel keys (``swiglu.kernels.configs.CONFIGS``) and the Triton kernels they launch.
KERNELS = {"dswiglu": "dswiglu_gemm_kernel", "grad_weights": "grad_weight_kernel", "grad_x": "grad_x_kernel"}
_OVERHEAD = 1088


def estimate_shared_memory(kernel: str, cfg) -> int:
    """Bytes of shared memory Triton allocates for ``kernel`` ("dswiglu", "grad_weights" or
    "grad_x", the keys of ``swiglu.kernels.configs.CONFIGS``) launched with the ``KernelConfig``
    ``cfg`` (model in the module docstring; an upper bound of the sm_90 compiler's figure).
    Raises ``ValueError`` for an unknown kernel."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    bm, bn, bk, stages, warps = cfg.BM, cfg.BN, cfg.BK, cfg.num_stages, cfg.num_warps
    ws4 = cfg.warp_specialize and warps == 4
    mainloop = stages * (bm * bk + bk * bn) * 2
    piece = bm * (bn // cfg.EPI_SPLIT) * 2
    pieces, floor = 1, 0
    narrow_flat = bm == 64 and warps == 8 and cfg.flatten and cfg.EPI_SPLIT > 1
    if kernel == "grad_x" and ws4:
        mainloop *= 2
        pieces = 2
    elif kernel == "dswiglu":
        pieces = (2 if cfg.flatten or ws4 else 1) + narrow_flat
        floor = 2 * piece
    elif kernel == "grad_weights":
        pieces += 2 * narrow_flat + ws4
    if kernel == "grad_weights" and not cfg.tma_store:
        epilogue = min(bm * bn * 2, 32768)
    else:
        epilogue = pieces * piece
    if stages == 1 and not ws4:
        return max(mainloop, epilogue) + _OVERHEAD
    return max(mainloop + epilogue, floor) + _OVERHEAD


@lru_cache(maxsize=None)
def _cuda_limit(index: int) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def shared_memory_limit(device: torch.device | str) -> int:
    """Opt-in shared memory per block of ``device``: ``shared_memory_per_block_optin`` from
    ``torch.cuda.get_device_properties`` for a CUDA device, else the sm_90 figure (232448 bytes)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return _cuda_limit(device.index if device.index is not None else torch.cuda.current_device())
    return SM90_SHARED_MEMORY_BYTES


def check_shared_memory(kernel: str, cfg, device: torch.device | str) -> int:
    """Raise ``ValueError`` when ``cfg`` cannot fit ``kernel`` in ``device``'s shared memory (see
    ``estimate_shared_memory``); return the estimate otherwise."""
    need = estimate_shared_memory(kernel, cfg)
    limit = shared_memory_limit(device)
    if need > limit:
        raise ValueError(
            f"{KERNELS[kernel]} ({kernel!r}) with {cfg} needs about {need} bytes of shared memory, more than the "
            f"{limit} bytes per block the device allows; use smaller tiles (BM, BN, BK), fewer num_stages, a "
            f"larger EPI_SPLIT or flatten=False"
        )
    return need
