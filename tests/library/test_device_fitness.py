"""Which GPUs ``impl="auto"`` trusts with the Triton kernels, on the CPU with
faked device properties (``torch.cuda.get_device_properties``, ``torch.version.hip``).

auto takes Triton only on an NVIDIA GPU whose architecture the tables were tuned for (sm_90) and
whose shared memory fits them, for bfloat16; otherwise the reference, with the reason from
``swiglu.backend_reason`` and a DEBUG log line. Explicit ``"triton"`` on a GPU it cannot run on
(ROCm, too little shared memory, pre-Hopper) is a ValueError naming the reason.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

import swiglu
from swiglu import ops
from swiglu.kernels import devices

H200 = dict(name="NVIDIA H200", major=9, minor=0, shared_memory_per_block_optin=232448)
B200 = dict(name="NVIDIA B200", major=10, minor=0, shared_memory_per_block_optin=232448)
RTX5090 = dict(name="NVIDIA GeForce RTX 5090", major=12, minor=0, shared_memory_per_block_optin=101376)  # 99 KiB
MI300 = dict(name="AMD Instinct MI300X", major=9, minor=4, shared_memory_per_block_optin=65536)
A100 = dict(name="NVIDIA A100", major=8, minor=0, shared_memory_per_block_optin=166912)
CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake_gpu(monkeypatch):
    def install(props, hip=None):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(**props))
        monkeypatch.setattr(torch.version, "hip", hip)

    return install


def _tensors(dtype=torch.bfloat16, inter=48, hidden=16):
    # Stand-ins for CUDA tensors (none can be made on the CPU): what the dispatch reads of them.
    x = SimpleNamespace(device=CUDA, dtype=dtype, shape=(4, hidden))
    return x, torch.empty(inter, hidden, dtype=dtype)


def test_the_h200_takes_triton(fake_gpu):
    fake_gpu(H200)
    assert devices.device_reason(CUDA) is None and devices.untuned_reason(CUDA) is None
    assert swiglu.backend_reason(CUDA) is None
    assert ops.resolve_impl("auto", *_tensors()) == "triton"
    assert "triton" in swiglu.available_impls(CUDA)


def test_consumer_blackwell_without_the_shared_memory_takes_the_reference(fake_gpu, caplog):
    """sm_120 with 99 KiB per block: the tables need ~193 KiB (sized for the H200's 227 KiB)."""
    fake_gpu(RTX5090)
    reason = devices.device_reason(CUDA)
    assert reason and "shared memory" in reason and "101376" in reason and "sm_120" in reason, reason
    with caplog.at_level(logging.DEBUG, logger="swiglu"):
        assert ops.resolve_impl("auto", *_tensors()) == "reference"
    assert any("101376" in r.getMessage() for r in caplog.records), caplog.records
    assert swiglu.backend_reason(CUDA) == reason
    assert swiglu.available_impls(CUDA) == ["reference"]
    with pytest.raises(ValueError, match="impl='triton' needs .* bytes of shared memory"):
        ops.resolve_impl("triton", *_tensors())  # where every entry decides: before any launch


def test_b200_is_untuned_auto_takes_the_reference_explicit_triton_runs(fake_gpu):
    fake_gpu(B200)
    assert devices.device_reason(CUDA) is None  # the sm_90 tables fit and the kernels run there
    assert "sm_100" in swiglu.backend_reason(CUDA) and "tuned" in swiglu.backend_reason(CUDA)
    assert ops.resolve_impl("auto", *_tensors()) == "reference"
    assert ops.resolve_impl("triton", *_tensors()) == "triton"
    assert "triton" in swiglu.available_impls(CUDA)


def test_rocm_reporting_capability_9_is_not_hopper(fake_gpu):
    fake_gpu(MI300, hip="6.2.41133")
    reason = devices.device_reason(CUDA)
    assert reason and "ROCm" in reason, reason
    assert ops.resolve_impl("auto", *_tensors()) == "reference"
    assert swiglu.available_impls(CUDA) == ["reference"]
    with pytest.raises(ValueError, match="ROCm"):
        ops.resolve_impl("triton", *_tensors())


def test_pre_hopper(fake_gpu):
    fake_gpu(A100)
    assert "sm_80" in devices.device_reason(CUDA)
    assert ops.resolve_impl("auto", *_tensors()) == "reference"


def test_fp16_says_why_it_takes_the_reference(fake_gpu, caplog):
    fake_gpu(H200)
    reason = swiglu.backend_reason(CUDA, torch.float16)
    assert reason and "bfloat16" in reason and "float16" in reason, reason
    with caplog.at_level(logging.DEBUG, logger="swiglu"):
        assert ops.resolve_impl("auto", *_tensors(torch.float16)) == "reference"
    assert any("bfloat16" in r.getMessage() for r in caplog.records)


def test_unaligned_sizes_on_the_h200_take_the_reference(fake_gpu):
    fake_gpu(H200)
    assert ops.resolve_impl("auto", *_tensors(inter=44)) == "reference"


def test_available_impls_on_this_cpu(monkeypatch):
    """Without the interpreter the CPU cannot run the kernels: "triton" is not listed;
    with TRITON_INTERPRET=1 (as these tests run) it is."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert swiglu.available_impls("cpu") == ["reference"]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert swiglu.available_impls("cpu") == (["reference", "triton"] if devices.INTERPRET else ["reference"])
    assert "CUDA" in swiglu.backend_reason("cpu")


@pytest.mark.parametrize(
    "props,hip", [(RTX5090, None), (B200, None), (MI300, "6.2.41133")], ids=["sm_120_99KiB", "sm_100", "rocm"]
)
def test_auto_takes_the_reference_on_unfit_gpus(fake_gpu, props, hip):
    """Unfit GPUs through the API (auto would take Triton on all three without the fitness check)."""
    fake_gpu(props, hip)
    assert ops.resolve_impl("auto", *_tensors()) == "reference"


def test_module_errors_name_impl():
    """SwiGLUMLP, swiglu_mlp and swiglu_mlp_backward take ``impl``; their errors say so."""
    mlp = swiglu.SwiGLUMLP(16, 44, impl="triton", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 8") as err:
        mlp(torch.randn(3, 16, dtype=torch.bfloat16))
    assert str(err.value).startswith("impl='triton'") and "use impl='reference'" in str(err.value), err.value
