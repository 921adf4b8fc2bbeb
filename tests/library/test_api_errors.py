"""Bad input through every public door gets a clear error naming the argument (without the
checks, each case below raised a raw torch/Triton error, an AssertionError from inside torch,
or, for the first, returned wrong gradients)."""

from __future__ import annotations

import random

import pytest
import torch

import swiglu
from swiglu import float64_backward, relative_error
from swiglu.kernels.backward import triton_swiglu_backward

H = I = 64  # H == I: gate_output can then be the same tensor as x or grad_output


def _inputs():
    g = torch.Generator().manual_seed(random.SystemRandom().randrange(1 << 31))
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).bfloat16()
    return dict(
        go=r(8, H), x=r(8, H), up=r(8, I), gw=r(I, H, scale=H**-0.5), uw=r(I, H, scale=H**-0.5), dw=r(H, I, scale=I**-0.5)
    )


@pytest.mark.parametrize("shared", ["x", "grad_output"])
def test_lean_op_refuses_gate_output_that_shares_memory_with_a_read_input(shared):
    """The lean backward writes d_gate over gate_output while it still reads x and grad_output:
    before, gate_output = x gave weight gradients with relative error ~1.2 and no error."""
    t = _inputs()
    go, x = t["go"].clone(), t["x"].clone()
    gate = x if shared == "x" else go
    with pytest.raises(ValueError, match=f"gate_output, which shares memory with {shared}"):
        triton_swiglu_backward(go, x, gate, t["up"].clone(), None, t["gw"], t["uw"], t["dw"], overwrite_activations=True)
    # The same values in memory of their own: right (the check blocks aliasing, not the values).
    gate = gate.clone()
    want = float64_backward(go, x, gate, t["up"], torch.nn.functional.silu(gate.float()).bfloat16(), t["gw"], t["uw"], t["dw"])
    got = triton_swiglu_backward(go, x, gate, t["up"].clone(), None, t["gw"], t["uw"], t["dw"], overwrite_activations=True)
    for g, w in zip(got, want):
        assert relative_error(g.reshape(w.shape), w) < 2e-2


@pytest.mark.parametrize("written", ["gate_output", "up_output"])
def test_overwriting_backward_refuses_activated_gate_that_overlaps_what_it_writes(written):
    """activated_gate is read while d_gate/d_up are written over gate_output/up_output: an
    activated_gate sharing their memory (here shifted by 3 rows) was read after other tiles
    overwrote it, and the gradients came back wrong without an error."""
    t = _inputs()
    T, s = t["go"].shape[0], 3
    buf = torch.randn((T + s) * I).bfloat16()
    act, shifted = buf[: T * I].view(T, I), buf[s * I :].view(T, I)
    gate, up = (shifted, t["up"].clone()) if written == "gate_output" else (t["up"].clone(), shifted)
    with pytest.raises(ValueError, match=f"{written}, which shares memory with activated_gate"):
        triton_swiglu_backward(t["go"], t["x"], gate, up, act, t["gw"], t["uw"], t["dw"], overwrite_activations=True)


def test_device_queries_on_a_machine_without_that_device():
    if torch.cuda.is_available():
        pytest.skip("checks a machine without CUDA")
    assert "no CUDA device" in swiglu.backend_reason("cuda")
    assert swiglu.available_impls("cuda") == ["reference"]
    with pytest.raises(TypeError, match="device must be a torch.device or a str"):
        swiglu.available_impls(3)
    with pytest.raises(ValueError, match="device must name a torch device"):
        swiglu.backend_reason("bogus")
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        swiglu.backend_reason("cpu", "bf16")


def test_raw_ops_check_their_arguments():
    t = _inputs()
    x, gw, uw, dw, up, go = t["x"], t["gw"], t["uw"], t["dw"], t["up"], t["go"]
    with pytest.raises(ValueError, match="gate_weight must have shape"):
        torch.ops.swiglu.mlp_forward(x, gw[:, :32], uw, dw, "reference", True)
    with pytest.raises(ValueError, match="impl must be one of"):
        torch.ops.swiglu.mlp_forward(x, gw, uw, dw, "bogus", True)
    with pytest.raises(ValueError, match="gate_output must have shape"):
        torch.ops.swiglu.mlp_backward(go, x, up[:4], up, up, gw, uw, dw, True, True, True, True, "reference")


def test_unsupported_tensors_and_arguments_get_type_errors():
    t = _inputs()
    args = [t["go"], t["x"], t["up"], t["up"], t["up"], t["gw"], t["uw"], t["dw"]]
    with pytest.raises(TypeError, match="grad_output must have a floating dtype"):
        swiglu.swiglu_mlp_backward(*[a.to(torch.float8_e4m3fn) for a in args], impl="reference")
    with pytest.raises(TypeError, match="impl must be a str"):
        swiglu.swiglu_mlp_backward(*args, impl=["triton"])
    with pytest.raises(TypeError, match="x must be a dense"):
        swiglu.swiglu_mlp_backward(args[0], args[1].to_sparse(), *args[2:], impl="reference")
    with pytest.raises(TypeError, match="x must be a dense"):
        swiglu.swiglu_mlp(t["x"].to_sparse(), t["gw"], t["uw"], t["dw"])


def test_nested_tensors_get_type_errors_naming_the_argument():
    # torch's older nested tensors report the strided layout but have no single shape.
    t = _inputs()
    hidden = t["x"].shape[-1]
    nested = torch.nested.nested_tensor([torch.randn(2, hidden, dtype=t["x"].dtype), torch.randn(3, hidden, dtype=t["x"].dtype)])
    assert nested.layout == torch.strided
    with pytest.raises(TypeError, match="x must be a dense .* nested tensor"):
        swiglu.swiglu_mlp(nested, t["gw"], t["uw"], t["dw"])
    with pytest.raises(TypeError, match="x must be a dense .* nested tensor"):
        swiglu.SwiGLUMLP(hidden, t["gw"].shape[0], dtype=t["x"].dtype)(nested)
    with pytest.raises(TypeError, match="down_weight must be a dense .* nested tensor"):
        swiglu.swiglu_mlp(t["x"], t["gw"], t["uw"], torch.nested.nested_tensor([t["dw"], t["dw"]]))
    from swiglu.kernels.forward import triton_swiglu_forward

    with pytest.raises(TypeError, match="x must be a dense .* nested tensor"):
        triton_swiglu_forward(nested, t["gw"], t["uw"], t["dw"])
    args = [t["go"], t["x"], t["up"], t["up"], t["up"], t["gw"], t["uw"], t["dw"]]
    for i, name in ((0, "grad_output"), (2, "gate_output")):
        bad = list(args)
        bad[i] = (
            torch.nested.nested_tensor([args[i][:2], args[i][:1]])
            if args[i].dim() == 2
            else torch.nested.nested_tensor([args[i][0], args[i][0]])
        )
        with pytest.raises(TypeError, match=f"{name} must be a dense .* nested tensor"):
            swiglu.swiglu_mlp_backward(*bad, impl="reference")


def test_meta_tensors_on_the_triton_path_say_so():
    t = _inputs()
    args = [a.to("meta") for a in (t["go"], t["x"], t["up"], t["up"], t["up"], t["gw"], t["uw"], t["dw"])]
    with pytest.raises(ValueError, match="meta tensors"):
        swiglu.swiglu_mlp_backward(*args, impl="triton")
    shapes = [g.shape for g in swiglu.swiglu_mlp_backward(*args, impl="reference")]
    assert shapes == [args[1].shape, args[5].shape, args[6].shape, args[7].shape]


def test_parallel_and_inputs_arguments():
    with pytest.raises(TypeError, match="mesh must be a torch.distributed.device_mesh.DeviceMesh"):
        swiglu.parallelize(swiglu.SwiGLUMLP(16, 48), "tp")
    with pytest.raises(TypeError, match="prefix must be a str"):
        swiglu.tensor_parallel_plan(3)
    with pytest.raises(ValueError, match="meta"):
        swiglu.make_inputs(1, 2, 16, 16, device="meta")
    for dtype in (torch.int32, "bf16"):
        with pytest.raises(TypeError, match="dtype must be one of"):
            swiglu.make_inputs(1, 2, 16, 16, dtype=dtype)
    with pytest.raises(ValueError, match="device must name"):
        swiglu.make_inputs(1, 2, 16, 16, device="gpu0")


def test_second_lean_backward_message_names_both_remedies():
    mlp = swiglu.SwiGLUMLP(H, I, dtype=torch.bfloat16, impl="triton", reuse_saved_buffers=True)
    out = mlp(_inputs()["x"].requires_grad_())
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="reuse_saved_buffers=False.*retain_graph=True"):
        out.sum().backward()


def test_the_reference_and_the_oracle_check_their_inputs():
    """The exported reference_backward and float64_backward name the argument at fault (before:
    a mixed dtype gave torch's matmul error, or float64_backward silently upcast it)."""
    t = _inputs()
    args = [t["go"], t["x"], t["up"].clone(), t["up"], t["up"].clone(), t["gw"], t["uw"], t["dw"]]
    for fn in (swiglu.reference_backward, swiglu.float64_backward):
        bad = list(args)
        bad[6] = bad[6].float()
        with pytest.raises(TypeError, match="up_weight has dtype torch.float32"):
            fn(*bad)
        bad = list(args)
        bad[2] = bad[2][:, :-8]
        with pytest.raises(ValueError, match="gate_output must have shape"):
            fn(*bad)
        assert all(g is not None for g in fn(*args))


def test_cuda_devices_on_a_machine_without_cuda_are_value_errors():
    if torch.cuda.is_available():
        pytest.skip("checks a machine without CUDA")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        swiglu.SwiGLUMLP(16, 32, device="cuda")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        swiglu.make_inputs(1, 2, 16, 16, device="cuda")


def test_interpreter_switched_on_after_triton_was_imported_is_named():
    """TRITON_INTERPRET=1 set after ``import triton``: Triton's own functions stay compiled, and
    the interpreted kernels used to fail with an opaque InterpreterError."""
    import subprocess
    import sys

    code = (
        "import os, triton; os.environ['TRITON_INTERPRET'] = '1'; import swiglu\n"
        "inp = swiglu.make_inputs(1, 4, 16, 48, seed=0)\n"
        "try:\n    swiglu.swiglu_mlp_backward(*inp.as_tuple(), impl='triton')\n"
        "except ValueError as e:\n    print(e)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert "set before triton is imported" in done.stdout, (done.stdout, done.stderr[-2000:])
