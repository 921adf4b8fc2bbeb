"""A shape error names the argument that is actually inconsistent with x and the declared sizes.

gate_weight [128, 32] with x [..., 64] was reported as "up_weight must have
shape [128, 32] to match gate_weight" because gate_weight was taken as the source of the sizes.
Every argument of swiglu_mlp_backward, swiglu_mlp and SwiGLUMLP is made wrong in each of its
dimensions (and transposed, for the weights), and the error must start with that argument's name.
"""

import re
import zlib

import pytest
import torch
from torch import nn

import swiglu
from swiglu.checks import ARG_NAMES

B, S, H, I = 2, 3, 24, 40
WEIGHTS = ("gate_weight", "up_weight", "down_weight")


def _mutations(shape: tuple[int, ...], weight: bool) -> dict[str, tuple[int, ...]]:
    """Wrong shapes for a tensor of ``shape``: each dimension one too big or one too small, and
    the weights transposed."""
    out = {}
    for d in range(len(shape)):
        for delta in (1, -1):
            bad = list(shape)
            bad[d] += delta
            out[f"dim{d}{delta:+d}"] = tuple(bad)
    if weight:
        out["transposed"] = tuple(reversed(shape))
    return out


def _backward_args(request) -> list[torch.Tensor]:
    seed = zlib.crc32(request.node.nodeid.encode())
    return list(swiglu.make_inputs(B, S, H, I, seed=seed).as_tuple())


BACKWARD_CASES = [
    (index, label, bad)
    for index, (name, shape) in enumerate(zip(ARG_NAMES, [(B, S, H)] * 2 + [(B, S, I)] * 3 + [(I, H)] * 2 + [(H, I)]))
    if name != "x"
    for label, bad in _mutations(shape, name in WEIGHTS).items()
]


@pytest.mark.parametrize("index,label,bad", BACKWARD_CASES, ids=[f"{ARG_NAMES[c[0]]}-{c[1]}" for c in BACKWARD_CASES])
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_backward_blames_the_bad_argument(request, index, label, bad, impl):
    args = _backward_args(request)
    args[index] = torch.randn(bad, dtype=torch.bfloat16)
    name = ARG_NAMES[index]
    with pytest.raises(ValueError, match=rf"^{name} must have shape .*got {re.escape(str(list(bad)))}"):
        swiglu.swiglu_mlp_backward(*args, impl=impl)


@pytest.mark.parametrize("label", list(_mutations((B, S, H), False)))
def test_backward_bad_x_is_reported_against_x(request, label):
    """x fixes hidden_size and the leading dims: the first argument that disagrees is reported,
    saying that its expected shape comes from x."""
    args = _backward_args(request)
    args[1] = torch.randn(_mutations((B, S, H), False)[label], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"(shape of x|from x|leading dims of x)"):
        swiglu.swiglu_mlp_backward(*args, impl="reference")


def test_gate_weight_of_the_wrong_width_is_blamed():
    """gate_weight [128, 32] with x [..., 64]: the error names gate_weight, not a later operand."""
    x = torch.randn(3, 64)
    gate_weight, up_weight, down_weight = torch.randn(128, 32), torch.randn(128, 64), torch.randn(64, 128)
    with pytest.raises(
        ValueError,
        match=r"^gate_weight must have shape \[128, 64\] .*hidden_size 64 from x.*"
        r"got \[128, 32\]",
    ):
        swiglu.swiglu_mlp(x, gate_weight, up_weight, down_weight)
    with pytest.raises(ValueError, match=r"^gate_weight must have shape \[128, 64\]"):
        swiglu.swiglu_mlp_backward(
            torch.randn(3, 64),
            x,
            torch.randn(3, 128),
            torch.randn(3, 128),
            torch.randn(3, 128),
            gate_weight,
            up_weight,
            down_weight,
        )


FORWARD_CASES = [
    (name, label, bad)
    for name, shape in (("gate_weight", (I, H)), ("up_weight", (I, H)), ("down_weight", (H, I)))
    for label, bad in _mutations(shape, True).items()
]


def _weights(gen):
    return {
        n: torch.randn(s, generator=gen, dtype=torch.float64)
        for n, s in (("gate_weight", (I, H)), ("up_weight", (I, H)), ("down_weight", (H, I)))
    }


@pytest.mark.parametrize("name,label,bad", FORWARD_CASES, ids=[f"{c[0]}-{c[1]}" for c in FORWARD_CASES])
def test_forward_blames_the_bad_weight(name, label, bad):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}{label}".encode()))
    w = _weights(gen)
    w[name] = torch.randn(bad, generator=gen, dtype=torch.float64)
    x = torch.randn(B, S, H, generator=gen, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"^{name} must have shape .*got {re.escape(str(list(bad)))}"):
        swiglu.swiglu_mlp(x, **w)


@pytest.mark.parametrize("name,label,bad", FORWARD_CASES, ids=[f"{c[0]}-{c[1]}" for c in FORWARD_CASES])
def test_module_blames_the_bad_weight(name, label, bad):
    """A weight replaced by one of the wrong shape (e.g. a mismatched checkpoint loaded with
    assign=True) is blamed against the module's declared hidden_size and intermediate_size."""
    mlp = swiglu.SwiGLUMLP(H, I, dtype=torch.float64)
    module = {"gate_weight": mlp.gate_proj, "up_weight": mlp.up_proj, "down_weight": mlp.down_proj}[name]
    module.weight = nn.Parameter(torch.randn(bad, dtype=torch.float64))
    with pytest.raises(ValueError, match=rf"^{name} must have shape .*declared"):
        mlp(torch.randn(B, S, H, dtype=torch.float64))


@pytest.mark.parametrize("shape", [(B, S, H + 1), (B, H - 1), (I,)], ids=str)
def test_module_blames_x_against_declared_hidden_size(shape):
    mlp = swiglu.SwiGLUMLP(H, I, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"^x must have shape .*declared hidden_size {H}"):
        mlp(torch.randn(shape, dtype=torch.float64))


@pytest.mark.parametrize("shape", [(B, S, H + 1), (I,)], ids=str)
def test_functional_bad_x_mentions_x(shape):
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"hidden_size \d+ from x"):
        swiglu.swiglu_mlp(torch.randn(shape, dtype=torch.float64), **_weights(gen))
