"""Every bad input to the public entry point gets a TypeError/ValueError naming the argument."""

import re
import zlib

import numpy as np
import pytest
import torch

import swiglu
from swiglu.checks import ARG_NAMES, validate_backward_inputs

B, S, H, I = 2, 5, 24, 40


@pytest.fixture
def args(request):
    seed = zlib.crc32(request.node.nodeid.encode())
    return list(swiglu.make_inputs(B, S, H, I, seed=seed).as_tuple())


def call(args, impl="reference"):
    return swiglu.swiglu_mlp_backward(*args, impl=impl)


def name_re(name: str) -> str:
    """Matches ``name`` as a whole word (so "x" does not match inside "max")."""
    return rf"(?<![\w]){re.escape(name)}(?![\w])"


def test_valid_inputs_pass(args):
    problem = validate_backward_inputs(*args)
    assert (problem.tokens, problem.hidden_size, problem.intermediate_size) == (B * S, H, I)
    assert problem.leading_shape == (B, S)
    flat = [t.reshape(-1, t.shape[-1]) for t in args[:5]] + args[5:]
    assert validate_backward_inputs(*flat).leading_shape == (B * S,)
    assert all(torch.isfinite(o).all() for o in call(args))


@pytest.mark.parametrize("index", range(8), ids=ARG_NAMES)
@pytest.mark.parametrize("bad", [None, 1.0, "tensor", np.zeros((2, 2))], ids=["None", "float", "str", "ndarray"])
def test_non_tensor(args, index, bad):
    args[index] = bad
    with pytest.raises(TypeError, match=name_re(ARG_NAMES[index]) + r" must be a torch\.Tensor"):
        call(args)


@pytest.mark.parametrize("index", range(8), ids=ARG_NAMES)
def test_dtype_mismatch(args, index):
    args[index] = args[index].float()
    with pytest.raises(TypeError, match=name_re(ARG_NAMES[index]) + r".*dtype"):
        call(args)


@pytest.mark.parametrize("index", range(8), ids=ARG_NAMES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.bool, torch.complex64])
def test_non_floating_dtype(args, index, dtype):
    args[index] = args[index].to(dtype)
    with pytest.raises(TypeError, match=name_re(ARG_NAMES[index]) + r" must have a floating dtype"):
        call(args)


def test_all_integer_inputs(args):
    args = [t.to(torch.int32) for t in args]
    with pytest.raises(TypeError, match="floating dtype"):
        call(args)


def test_allowed_dtypes(args):
    validate_backward_inputs(*args, dtypes=(torch.bfloat16,))
    f32 = [t.float() for t in args]
    with pytest.raises(TypeError, match=r"grad_output must have dtype in \[torch\.bfloat16\]"):
        validate_backward_inputs(*f32, dtypes=(torch.bfloat16,))


@pytest.mark.parametrize("index", range(8), ids=ARG_NAMES)
def test_wrong_rank(args, index):
    t = args[index]
    args[index] = t.unsqueeze(0)  # one dimension too many (4-D activations, 3-D weights)
    with pytest.raises(ValueError, match=name_re(ARG_NAMES[index])):
        call(args)


def test_one_dimensional_inputs(args):
    flat = [t.reshape(-1) for t in args[:5]] + args[5:]
    with pytest.raises(ValueError, match=r"x must be \[tokens, hidden_size\]"):
        call(flat)


def test_activations_with_mixed_ranks(args):
    args[2] = args[2].reshape(-1, I)  # gate_output flattened while x is [B, S, H]
    with pytest.raises(ValueError, match=rf"gate_output must have shape \[{B}, {S}, {I}\]"):
        call(args)


# For each argument, a shape that differs from what x and the others imply, on the last or first dim.
@pytest.mark.parametrize("index", range(8), ids=ARG_NAMES)
@pytest.mark.parametrize("dim", [0, -1])
def test_mismatched_shape(args, index, dim):
    t = args[index]
    shape = list(t.shape)
    shape[dim] += 1
    args[index] = torch.randn(shape, dtype=t.dtype)
    name = ARG_NAMES[index]
    # x fixes hidden_size and the leading dims, so a bad x is reported against x (in the message
    # of the first argument that disagrees with it); any other argument is blamed itself.
    pattern = name_re(name) if name == "x" else "^" + re.escape(name) + " must have shape"
    with pytest.raises(ValueError, match=pattern):
        call(args)


def test_mismatched_shape_message_says_what_was_expected(args):
    args[3] = args[3][:, :-1]  # up_output with seq_len - 1
    with pytest.raises(ValueError, match=rf"up_output must have shape \[{B}, {S}, {I}\] .*got \[{B}, {S - 1}, {I}\]"):
        call(args)
    args[3] = torch.randn(B, S, I, dtype=torch.bfloat16)  # a valid up_output; now down_weight transposed
    args[7] = args[7].t()
    with pytest.raises(ValueError, match=rf"down_weight must have shape \[{H}, {I}\]"):
        call(args)


@pytest.mark.parametrize("index", [i for i in range(8) if ARG_NAMES[i] != "x"], ids=[n for n in ARG_NAMES if n != "x"])
def test_different_devices(args, index):
    # The meta device has no storage: validation must reject it before any compute.
    args[index] = args[index].to("meta")
    with pytest.raises(ValueError, match=name_re(ARG_NAMES[index]) + r" is on meta but x is on cpu"):
        call(args)


def test_x_on_another_device(args):
    args[1] = args[1].to("meta")
    with pytest.raises(ValueError, match="grad_output is on cpu but x is on meta"):
        call(args)


@pytest.mark.parametrize(
    "batch_size,seq_len,hidden_size,intermediate_size,label",
    [
        (2, 5, 0, I, "hidden_size"),
        (2, 5, H, 0, "intermediate_size"),
    ],
)
def test_empty_dimension(batch_size, seq_len, hidden_size, intermediate_size, label):
    lead = (batch_size, seq_len)
    bf = dict(dtype=torch.bfloat16)
    args = [
        torch.randn(*lead, hidden_size, **bf),
        torch.randn(*lead, hidden_size, **bf),
        torch.randn(*lead, intermediate_size, **bf),
        torch.randn(*lead, intermediate_size, **bf),
        torch.randn(*lead, intermediate_size, **bf),
        torch.randn(intermediate_size, hidden_size, **bf),
        torch.randn(intermediate_size, hidden_size, **bf),
        torch.randn(hidden_size, intermediate_size, **bf),
    ]
    with pytest.raises(ValueError, match=rf"{label}.* must be positive, got 0"):
        call(args)


@pytest.mark.parametrize("impl", ["cuda", "", "Reference", "cublas"])
def test_unknown_impl(args, impl):
    with pytest.raises(ValueError, match=r"impl must be one of .*'reference'.*got " + re.escape(repr(impl))):
        call(args, impl=impl)


def test_validation_comes_before_the_impl(args):
    """A bad input is reported as such even with an unknown impl (nothing is imported or run)."""
    args[0] = args[0][:, :1]
    with pytest.raises(ValueError, match="grad_output must have shape"):
        call(args, impl="no-such-impl")


def test_auto_on_cpu_is_the_reference(args):
    auto = call(args, impl="auto")
    ref = swiglu.reference_backward(*args)
    for a, r in zip(auto, ref):
        assert torch.equal(a, r)
    assert {"reference", "triton"} <= set(swiglu.available_impls())
