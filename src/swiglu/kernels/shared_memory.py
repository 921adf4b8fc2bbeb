"""Shared memory of a kernel launch, estimated before launching.

A ``KernelConfig`` whose tiles and stages do not fit in an SM's shared memory used to fail deep
inside Triton's launcher with ``OutOfResources``; ``check_shared_memory`` turns that into a
``ValueError`` naming the kernel, the config, the estimate and the device's limit, before anything
is compiled or launched.

The estimate (bytes, bf16 operands) models what Triton allocates for ``swiglu.kernels.tl_kernels``:

* mainloop: ``num_stages * (BM * BK + BK * BN) * 2`` (the A and B tiles of every pipeline stage);
  doubled for ``grad_x_kernel`` when warp specialization is on with 4 warps (its two K loops are
  then pipelined separately);
* epilogue: ``pieces * BM * (BN // EPI_SPLIT) * 2``, the TMA store staging of the output pieces:
  1 piece; 2 for ``dswiglu_gemm_kernel`` with a flattened tile loop or 4-warp warp specialization;
  two more with 64-row tiles, 8 warps, a flattened loop and EPI_SPLIT > 1 (layout-conversion
  scratch); one more for ``grad_weight_kernel`` with 4-warp warp specialization (since its
  one-problem form, 2026-11-30: 90208 bytes at 64x128x64, 3 stages, EPI_SPLIT 2); ``grad_weight_kernel`` with plain pointer stores (``tma_store=False``) needs instead
  a conversion scratch of at most ``min(BM * BN * 2, 32 KiB)``. ``dswiglu_gemm_kernel`` needs at
  least two pieces even when the mainloop buffers are reused;
* with one stage (no pipelining) the epilogue reuses the mainloop's buffers: the larger of the two;
* 1088 bytes of barriers and alignment.

Calibration: ``tests/test_triton_compile.py`` compiles every launch for sm_90 on the CPU and
reads Triton's own figure (``metadata.shared``); the test there checks, with Triton 3.6.0 and
3.7.1, that the estimate is at least that figure for every launch of the tuned table (and at most
1.1 KiB, 0.6%, above it) and for ~40 calibration configurations around it, that it rejects no
configuration that fits and every one that does not, and that the example below is rejected. In a
wider sweep of 508 compiled configurations (3 kernels x tiles 64-256, BK 32-128, 1-5 stages, 4/8
warps, every EPI_SPLIT, warp specialization, flattening, store kind; Triton 3.6.0, and 234 of them
with 3.7.1: same figures) the estimate was never below Triton's figure and rejected no
configuration that fits; with TMA stores and 2+ stages it is within 1% for three configurations in
four and at most 5% high; pointer stores and 1-stage configurations (no table uses them) can be
up to 1.7x high.

Example: ``dswiglu_gemm_kernel`` with 128x256x64 tiles, 3 stages, EPI_SPLIT=1 and a flattened
(or warp-specialized) loop needs 279576 bytes (estimate 279616) against the H200's 232448.
"""

from __future__ import annotations

from functools import lru_cache

import torch

#: Opt-in shared memory per block on sm_90 (H100/H200, ``cudaDevAttrMaxSharedMemoryPerBlockOptin``),
#: the limit used where no CUDA device can be queried (CPU, the interpreter, meta tensors).
SM90_SHARED_MEMORY_BYTES = 232448
#: Launcher kernel keys (``swiglu.kernels.backward.CONFIGS``) and the Triton kernels they launch.
KERNELS = {"dswiglu": "dswiglu_gemm_kernel", "grad_weights": "grad_weight_kernel", "grad_x": "grad_x_kernel"}
_OVERHEAD = 1088


def estimate_shared_memory(kernel: str, cfg) -> int:
    """Bytes of shared memory Triton allocates for ``kernel`` ("dswiglu", "grad_weights" or
    "grad_x", the keys of ``swiglu.kernels.backward.CONFIGS``) launched with the ``KernelConfig``
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
