"""TMA descriptors on the host: ``tma_ready`` (a tensor a descriptor can take, copied once
where it cannot), ``Tma`` (a descriptor argument of ``launch.launch``), ``tma_descriptor`` and
``as_descriptors`` (Triton's ``TensorDescriptor`` for them, without its checks).
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from functools import lru_cache
from typing import NamedTuple

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

# TMA needs every row stride 16-byte aligned: a bf16 row of a multiple of 8 elements.
ALIGN_ELEMENTS = 8


@lru_cache(maxsize=None)
def _descriptor_defaults(cls: type) -> dict:
    # A descriptor class's optional fields with their defaults, read from the installed triton.
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def tma_descriptor(t: torch.Tensor, block: list[int], cls: type = TensorDescriptor, **extra):
    """``cls.from_tensor(t, block, **extra)`` (``extra``: Gluon's ``layout=``) without its
    checks, which ``tma_ready`` (base and row strides 16-byte aligned, unit last stride) and the
    configurations (power-of-two blocks) already guarantee for every launcher's tensors: a fifth
    of a launch's host time otherwise."""
    desc = object.__new__(cls)
    desc.__dict__.update(_descriptor_defaults(cls), base=t, shape=t.shape, strides=t.stride(), block_shape=block, **extra)
    return desc


class Tma(NamedTuple):
    """A host TMA descriptor argument of ``launch``: Triton's ``TensorDescriptor`` for ``tensor``
    and ``block`` (Gluon's, with ``layout``, when a layout is given) on the first launch per key,
    then the C launcher's CUtensorMap, filled once per address and geometry (``direct_runner``)."""

    tensor: torch.Tensor
    block: list
    layout: object = None


#: ``tuple_new(Tma, (tensor, block, layout))`` is ``Tma(tensor, block, layout)`` built by tuple's
#: own constructor, without NamedTuple's Python ``__new__``: the backward's launchers build about
#: 20 per call (host time, half of each).
tuple_new = tuple.__new__


def _as_descriptor(arg):
    if type(arg) is not Tma:
        return arg
    if arg.layout is None:
        return tma_descriptor(arg.tensor, arg.block)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

    return tma_descriptor(arg.tensor, arg.block, GluonTensorDescriptor, layout=arg.layout)


def as_descriptors(args) -> list:
    """``args`` with every ``Tma`` replaced by its Triton ``TensorDescriptor`` (Triton's own path)."""
    return [_as_descriptor(a) for a in args]


def tma_ready(t: torch.Tensor) -> torch.Tensor:
    """A 2-D view usable by a TMA descriptor: unit last stride, 16-byte aligned base and row
    stride. Anything else is copied once to a contiguous buffer (documented in swiglu.api)."""
    # On the hot path: one call per tensor and launch, so few tensor method calls (a 2-D tensor,
    # the common case, is not reshaped: a view costs more than all the checks).
    t2 = t if t.dim() == 2 else t.reshape(-1, t.shape[-1])
    s0, s1 = t2.stride()
    ok = (
        s1 == 1
        and s0 >= t2.shape[1]  # no overlapping rows (an expanded, zero-stride tensor is copied)
        and (s0 * t2.element_size()) % 16 == 0
        and t2.data_ptr() % 16 == 0
    )
    # A fresh allocation, not .contiguous(): that returns a contiguous but misaligned view as is.
    return t2 if ok else torch.empty(t2.shape, dtype=t2.dtype, device=t2.device).copy_(t2)
