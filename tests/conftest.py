"""Test set-up: run Triton kernels through the CPU interpreter when no GPU is present.

TRITON_INTERPRET is read when ``@triton.jit`` decorates a kernel, so it must be set before any
kernel module is imported (see docs/triton-on-cpu.md).
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: Device the small-shape tests run on: the GPU when there is one, else the CPU interpreter.
DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """With ``SWIGLU_FAILURES_AT_ONCE=1`` (``make test-gpu`` sets it) a failure's traceback is
    printed when it happens, not only in the summary, so a run cut short by a time limit (a
    lent GPU's) still shows why its first failures failed."""
    if report.failed and os.environ.get("SWIGLU_FAILURES_AT_ONCE") == "1":
        import sys

        print(f"\nFAILED {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n", file=sys.__stderr__,
              flush=True)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Each test starts from no cached backend decision or launch plan (tests fake device
    properties and switch kernel tables, which the caches would otherwise remember)."""
    import swiglu.ops

    swiglu.ops.clear_plans()
    yield
