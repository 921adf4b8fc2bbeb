"""A KernelConfig too big for shared memory is a ValueError before any launch.

The estimate itself is checked against Triton's figure for sm_90 in tests/kernels/test_triton_compile.py
(it compiles every launch); here: the table passes, an oversized config is rejected by
triton_swiglu_backward with a message naming the kernel, the config, the estimate and the limit,
and the limit comes from the CUDA device properties when there is a device.
"""

from types import SimpleNamespace

import pytest
import torch

from swiglu import make_inputs
from swiglu.kernels import tl_kernels as kernels
from swiglu.kernels import shared_memory
from swiglu.kernels.shared_memory import SM90_SHARED_MEMORY_BYTES, check_shared_memory, estimate_shared_memory
from swiglu.kernels.backward import CONFIGS, KernelConfig, triton_swiglu_backward

from triton_checks import SMALL, SMALL_CONFIGS

OVERSIZED_DSWIGLU = KernelConfig(
    BM=128, BN=256, BK=64, EPI_SPLIT=1, num_stages=3, num_warps=8, warp_specialize=True, flatten=True
)


@pytest.fixture
def no_kernel_launch(monkeypatch):
    class _NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched although its config was rejected")

    for name in ("dswiglu_gemm_kernel", "grad_weight_kernel", "grad_x_kernel"):
        monkeypatch.setattr(kernels, name, _NoLaunch())


@pytest.mark.parametrize("kernel", list(CONFIGS))
def test_every_table_config_fits(kernel):
    for bucket, cfg in CONFIGS[kernel].items():
        assert check_shared_memory(kernel, cfg, "cpu") <= SM90_SHARED_MEMORY_BYTES, (bucket, cfg)


#: 4 stages of 256x256x128 tiles: far too big for any kernel.
OVERSIZED = KernelConfig(BM=256, BN=256, BK=128, EPI_SPLIT=2, num_stages=4, num_warps=8)


@pytest.mark.parametrize(
    "kernel,cfg",
    [("dswiglu", OVERSIZED_DSWIGLU), ("grad_weights", OVERSIZED), ("grad_x", OVERSIZED)],
    ids=["dswiglu-oversized", "grad_weights-oversized", "grad_x-oversized"],
)
def test_oversized_config_rejected_before_launch(device, no_kernel_launch, kernel, cfg):
    inp = make_inputs(1, 8, 16, 24, seed=0, device=device)
    configs = {**SMALL_CONFIGS, kernel: cfg}
    name = shared_memory.KERNELS[kernel]
    est = estimate_shared_memory(kernel, cfg)
    limit = shared_memory.shared_memory_limit(device)
    assert est > limit
    with pytest.raises(
        ValueError,
        match=rf"^{name} \('{kernel}'\) with KernelConfig\(BM={cfg.BM}, BN={cfg.BN}, "
        rf"BK={cfg.BK}.* needs about {est} bytes .* {limit} bytes per block",
    ):
        triton_swiglu_backward(*inp.as_tuple(), configs=configs)


def test_only_launched_kernels_are_checked(device):
    """grad_x's config does not matter when grad_x is not requested (its kernel never runs)."""
    inp = make_inputs(1, 8, 16, 24, seed=0, device=device)
    configs = {**SMALL_CONFIGS, "grad_x": OVERSIZED_DSWIGLU}
    grads = triton_swiglu_backward(*inp.as_tuple(), configs=configs, need_grad_x=False)
    assert grads[0] is None and all(torch.isfinite(g).all() for g in grads[1:])


def test_limit_from_device_properties(monkeypatch):
    """A CUDA device's own opt-in limit is used (a smaller GPU rejects what fits on the H200)."""
    props = SimpleNamespace(shared_memory_per_block_optin=101376)  # sm_86
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    shared_memory._cuda_limit.cache_clear()
    try:
        assert shared_memory.shared_memory_limit("cuda:0") == 101376
        assert shared_memory.shared_memory_limit("cpu") == SM90_SHARED_MEMORY_BYTES
        big = CONFIGS["grad_x"][1 << 62]
        with pytest.raises(ValueError, match="101376 bytes per block"):
            check_shared_memory("grad_x", big, "cuda:0")
        assert check_shared_memory("grad_x", SMALL, "cuda:0") <= 101376
    finally:
        shared_memory._cuda_limit.cache_clear()


def test_unknown_kernel():
    with pytest.raises(ValueError, match="kernel must be one of"):
        estimate_shared_memory("grad_h", SMALL)


def test_estimate_grows_with_stages_and_tiles():
    """A sanity check of the model's direction (its values are checked against Triton elsewhere)."""
    for kernel in CONFIGS:
        base = estimate_shared_memory(kernel, SMALL)
        assert estimate_shared_memory(kernel, KernelConfig(BM=64, BN=64, BK=64, EPI_SPLIT=2, num_stages=4)) > base
        assert estimate_shared_memory(kernel, KernelConfig(BM=128, BN=64, BK=64, EPI_SPLIT=2)) > base
