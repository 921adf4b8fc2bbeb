"""swiglu: a fast, verified SwiGLU MLP backward for NVIDIA Hopper, in Triton.

Public API:
    swiglu_mlp_backward(grad_output, x, gate_output, up_output, activated_gate,
                        gate_weight, up_weight, down_weight, *, impl="auto")
    SwiGLUMLP(hidden_size, intermediate_size, *, impl="auto")  -- training-ready nn.Module with our backward
    swiglu_mlp(x, gate_weight, up_weight, down_weight, *, impl="auto")  -- its functional form
    swiglu_moe(x, top_k_index, top_k_weights, gate_up_proj, down_proj, *, impl="auto")
                                           -- the routed experts of a mixture-of-experts model
    SwiGLUExperts(num_experts, hidden_size, intermediate_size, *, impl="auto")  -- its nn.Module
    parallelize(module, mesh, *, sequence_parallel=False)  -- tensor parallelism (DTensor)
    tensor_parallel_plan(prefix, ...)      -- the same plan for parallelize_module on a whole model
    available_impls(device), backend_reason(device, dtype) -- impls usable here; why "auto" is not Triton
    reference_backward, float64_backward   -- the benchmark's bf16 reference and its fp64 oracle
    make_inputs, BackwardInputs            -- inputs as the benchmark draws them
    CASES, select_cases, HIDDEN_SIZE, INTERMEDIATE_SIZE, MODEL_SHAPES
    roofline (module)                      -- FLOPs, bytes, SOL, score
"""

from . import roofline
from .accuracy import benchmark_criterion, relative_error
from .api import available_impls, backend_reason, swiglu_mlp_backward
from .inputs import BackwardInputs, make_inputs
from .module import SwiGLUExperts, SwiGLUMLP
from .moe import swiglu_moe
from .ops import swiglu_mlp
from .reference import float64_backward, reference_backward
from .workloads import CASES, HIDDEN_SIZE, INTERMEDIATE_SIZE, MODEL_SHAPES, Case, select_cases

__version__ = "0.1.0"

# Imported on first use: torch.distributed.tensor adds ~1 s to `import swiglu`.
_LAZY = {"parallelize": "parallel", "tensor_parallel_plan": "parallel"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BackwardInputs",
    "CASES",
    "Case",
    "HIDDEN_SIZE",
    "INTERMEDIATE_SIZE",
    "MODEL_SHAPES",
    "SwiGLUExperts",
    "SwiGLUMLP",
    "available_impls",
    "backend_reason",
    "benchmark_criterion",
    "float64_backward",
    "make_inputs",
    "parallelize",
    "reference_backward",
    "relative_error",
    "roofline",
    "select_cases",
    "swiglu_mlp",
    "swiglu_mlp_backward",
    "swiglu_moe",
    "tensor_parallel_plan",
]
