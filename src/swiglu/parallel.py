"""Tensor parallelism for ``SwiGLUMLP``: PyTorch's own plan (DeviceMesh, DTensor, ``parallelize_module``).

Megatron-style sharding over a 1-D TP mesh of N ranks (torchtitan's plan): ``gate_proj`` and
``up_proj`` ``ColwiseParallel`` (weight [I, H] split along I: ``Shard(0)``), ``down_proj``
``RowwiseParallel`` (``Shard(1)``); each rank holds I/N and computes a partial sum of the output.
``SwiGLUMLP.forward`` is one custom op, so the Linear layers' hooks never fire: this module
registers DTensor sharding strategies for both custom ops (``register_sharding``) and the plan
prepares the MLP's input and output at the MLP level. The communication is then one all-reduce of
the output in the forward and one of grad_x in the backward (sequence parallel: all-gather of x,
reduce-scatter of the output; all-gather of grad_output, reduce-scatter of grad_x); weight
gradients stay local shards. Parameters stay ``DTensor``s, so optimizers, ``state_dict`` and
``clip_grad_norm_`` work as for any parallelized module. Sources: PyTorch's tensor-parallel
tutorial, torchtitan's Llama plan; details and measurements: docs/tensor-parallel.md.

Importing this module registers the sharding strategies (``swiglu.parallelize`` and
``swiglu.tensor_parallel_plan`` import it); a script that builds its own DTensor weights for
``swiglu_mlp`` must ``import swiglu.parallel`` first.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .module import SwiGLUMLP
from . import ops  # defines torch.ops.swiglu.mlp_forward / mlp_backward

AVAILABLE = dist.is_available()

if AVAILABLE:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        RowwiseParallel,
        parallelize_module,
    )

    # One entry per op argument (None for non-tensors), outputs first. Two choices each: the
    # tensor-parallel layout, and everything replicated (DTensors that are not sharded). DTensor
    # picks the one needing the least redistribution of the inputs it is given.
    @register_sharding(torch.ops.swiglu.mlp_forward.default)
    def _forward_sharding(x, gate_weight, up_weight, down_weight, impl, save_activated_gate=True):
        last = x.ndim - 1
        # Memory-lean mode: activated_gate comes back as an empty [0] tensor, replicated.
        act = Shard(last) if save_activated_gate else Replicate()
        tp = ([Partial(), Shard(last), Shard(last), act], [Replicate(), Shard(0), Shard(0), Shard(1), None, None])
        replicated = ([Replicate()] * 4, [Replicate()] * 4 + [None, None])
        return [tp, replicated]

    @register_sharding(torch.ops.swiglu.mlp_backward.default)
    def _backward_sharding(*args):
        (_, x, _, _, activated_gate, *_), _, _ = ops.split_backward_args(args)
        last = x.ndim - 1
        act = None if activated_gate is None else Shard(last)  # None: recomputed (memory-lean mode)
        tp = (
            [Partial(), Shard(0), Shard(0), Shard(1)],
            [Replicate(), Replicate(), Shard(last), Shard(last), act, Shard(0), Shard(0), Shard(1)] + [None] * 5,
        )
        replicated = (
            [Replicate()] * 4,
            [Replicate()] * 4 + [None if activated_gate is None else Replicate()] + [Replicate()] * 3 + [None] * 5,
        )
        return [tp, replicated]

    def _hash_flags(op, first_flag: int) -> None:
        # DTensor caches each op's output layout AND shape by its tensor arguments only (for
        # register_sharding ops, bool/str arguments are not hashed). The backward's output shapes
        # depend on the need_grad_* flags (an unneeded gradient is an empty [0] tensor), so a
        # cached call with a frozen weight would give a later call that needs it the wrong global
        # shape (seen: "got [0] but expected shape [48, 16]"). Hash the arguments from the first flag
        # on, as DTensor does for its own ops with shape-changing ints (RuntimeSchemaInfo.static_argnum).
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

        DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[op] = RuntimeSchemaInfo(
            static_argnum=first_flag, needs_pytree=True
        )

    _hash_flags(torch.ops.swiglu.mlp_backward.default, 8)  # need_grad_x, ..., impl
    _hash_flags(torch.ops.swiglu.mlp_forward.default, 4)  # impl (cheap, and exact)


def _check_sequence_dim(sequence_dim: int) -> None:
    if isinstance(sequence_dim, bool) or not isinstance(sequence_dim, int) or sequence_dim < 0:
        raise ValueError(
            f"sequence_dim must be a non-negative int (1 for [batch_size, seq_len, H], 0 for [tokens, H]), got {sequence_dim!r}"
        )


def _require_distributed() -> None:
    if not AVAILABLE:
        raise RuntimeError("this PyTorch build has no torch.distributed: tensor parallelism is unavailable")


def tensor_parallel_plan(
    prefix: str = "",
    *,
    fused: bool = True,
    sequence_parallel: bool = False,
    sequence_dim: int = 1,
) -> dict[str, "ParallelStyle"]:
    """The tensor-parallel plan of one SwiGLU MLP, for ``parallelize_module``.

    Args:
        prefix: the MLP's module path inside the model the plan is applied to, e.g.
            ``"layers.*.feed_forward"`` (``parallelize_module`` matches ``*`` with fnmatch);
            ``""`` when the plan is applied to the MLP itself (its input/output entry then has
            the key ``""``, which ``parallelize_module`` applies to the module itself in recent
            PyTorch; ``swiglu.parallelize`` does not rely on it).
        fused: True for ``swiglu.SwiGLUMLP`` (one custom op for the whole block: the input and
            output layouts are prepared at the MLP level, the Linear submodules only get their
            weights sharded); False for an MLP that calls its ``nn.Linear`` submodules
            (``PlainSwiGLUMLP``, Llama-style modules): torchtitan's plan.
        sequence_parallel: the MLP's input and output are sharded along ``sequence_dim``
            (Megatron sequence parallelism): x is all-gathered before the MLP and the output
            reduce-scattered; otherwise both are replicated and the output all-reduced.
        sequence_dim: the sequence dimension of x: 1 for [batch_size, seq_len, H], 0 for [tokens, H].

    Returns: ``{module path: ParallelStyle}``: ``prefix.gate_proj`` and ``prefix.up_proj``
    ``ColwiseParallel``, ``prefix.down_proj`` ``RowwiseParallel``, and ``prefix`` itself an input
    (and, fused, output) preparation. Weight layouts: gate/up ``Shard(0)`` of [I, H], down
    ``Shard(1)`` of [H, I].

    Raises: TypeError for a ``prefix`` that is not a str; ValueError for a bad ``sequence_dim``;
    RuntimeError without torch.distributed.
    """
    _require_distributed()
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str (a module path such as 'layers.*.mlp'), got {type(prefix).__name__}")
    _check_sequence_dim(sequence_dim)
    outer = Shard(sequence_dim) if sequence_parallel else Replicate()
    key = lambda name: f"{prefix}.{name}" if prefix else name
    plan: dict[str, ParallelStyle] = {}
    if fused:
        plan[prefix] = PrepareModuleInputOutput(
            input_layouts=(outer,),
            desired_input_layouts=(Replicate(),),
            use_local_input=False,
            output_layouts=(Partial(),),
            desired_output_layouts=(outer,),
            use_local_output=True,
        )
        plan[key("gate_proj")] = ColwiseParallel()
        plan[key("up_proj")] = ColwiseParallel()
        plan[key("down_proj")] = RowwiseParallel()
    else:
        if sequence_parallel:
            plan[prefix] = PrepareModuleInput(input_layouts=(outer,), desired_input_layouts=(Replicate(),))
        plan[key("gate_proj")] = ColwiseParallel()
        plan[key("up_proj")] = ColwiseParallel()
        plan[key("down_proj")] = RowwiseParallel(output_layouts=outer)
    return plan


def check_shardable(hidden_size: int, intermediate_size: int, tp: int, *, need_triton: bool = False) -> None:
    """Raise ``ValueError`` naming the sizes when intermediate_size cannot be split evenly over
    ``tp`` ranks, or (``need_triton``) when the local intermediate size is not a multiple of 8
    (the Triton kernels' TMA row alignment). hidden_size is never split; it is only named."""
    if intermediate_size % tp:
        raise ValueError(
            f"intermediate_size={intermediate_size} is not divisible by the tensor-parallel size {tp} "
            f"(hidden_size={hidden_size} is not split): uneven shards are not supported"
        )
    local = intermediate_size // tp
    if not need_triton:
        return
    from .kernels.tma import ALIGN_ELEMENTS  # imports Triton, which need_triton means will run

    if local % ALIGN_ELEMENTS:
        raise ValueError(
            f"local intermediate_size {intermediate_size} / {tp} = {local} is not a multiple of "
            f"{ALIGN_ELEMENTS}: the Triton backward needs 16-byte aligned rows (use an intermediate_size "
            f"divisible by {ALIGN_ELEMENTS * tp}, or impl='reference')"
        )


def parallelize(
    module: nn.Module,
    mesh: "DeviceMesh",
    *,
    sequence_parallel: bool = False,
    sequence_dim: int = 1,
) -> nn.Module:
    """Shard a SwiGLU MLP over the 1-D tensor-parallel ``mesh`` in place; returns the module.

    ``module`` is a ``swiglu.SwiGLUMLP`` (our fused backward runs on each rank's shard) or any MLP
    with ``gate_proj``/``up_proj``/``down_proj`` ``nn.Linear`` submodules that it calls itself
    (e.g. ``PlainSwiGLUMLP``: the baseline). The weights are taken from rank 0 (DTensor's
    ``distribute_tensor`` scatters them) and become ``DTensor`` parameters. Afterwards the module
    takes and returns plain local tensors: x [..., H] replicated on every rank (the same tensor
    everywhere), or with ``sequence_parallel`` this rank's shard of the sequence dimension
    ``sequence_dim``: equal shards, or uneven ones in ``torch.chunk``'s split (ceil(S / N) per
    rank, the last ranks fewer; each forward then all-gathers the ranks' lengths, one int64
    each, to learn the global length); the output has the same layout as x. Gradients of x come back
    summed over the ranks (all-reduce; reduce-scatter under sequence parallel). See the module
    docstring for the communication and ``tensor_parallel_plan`` for the layouts.

    Raises:
        TypeError: ``module`` lacks the three Linear submodules, or ``mesh`` is not a DeviceMesh.
        ValueError: a mesh that is not 1-D; intermediate_size not divisible by the mesh size; for
            ``SwiGLUMLP`` with the Triton backward (``impl="triton"``, or ``"auto"`` on a
            CUDA mesh) a local intermediate size that is not a multiple of 8; a bad sequence_dim.
            At forward, on every rank: sequence shards of plain tensors that are neither equal
            nor torch.chunk's split, naming the local and global lengths.
    """
    _require_distributed()
    names = ("gate_proj", "up_proj", "down_proj")
    if not all(isinstance(getattr(module, n, None), nn.Linear) for n in names):
        raise TypeError(f"module must have nn.Linear submodules {names} (a SwiGLU MLP), got {type(module).__name__}")
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"mesh must be a torch.distributed.device_mesh.DeviceMesh (e.g. mesh['tp']), got {type(mesh).__name__}")
    if mesh.ndim != 1:
        raise ValueError(f"mesh must be 1-D (the tensor-parallel dimension, e.g. mesh['tp']), got {mesh.ndim}-D")
    _check_sequence_dim(sequence_dim)
    inter, hidden = module.gate_proj.weight.shape
    fused = isinstance(module, SwiGLUMLP)
    need_triton = fused and (module.impl == "triton" or (module.impl == "auto" and mesh.device_type == "cuda"))
    check_shardable(hidden, inter, mesh.size(), need_triton=need_triton)
    plan = tensor_parallel_plan(fused=fused, sequence_parallel=sequence_parallel, sequence_dim=sequence_dim)
    root = plan.pop("", None)
    if root is not None:  # applied directly: older PyTorch has no "" key in plans
        parallelize_module(module, mesh, root)
    parallelize_module(module, mesh, plan)
    if sequence_parallel:
        # Before the plan's own input preparation (which assumes equal shards).
        module.register_forward_pre_hook(_SequenceShards(mesh, sequence_dim), prepend=True)
    return module


class _SequenceShards:
    """Forward pre-hook of a sequence-parallel MLP: learns every rank's local sequence length (one
    all-gather of a single int64 per forward) and, when they differ, hands the plan a DTensor that
    knows the global shape, so uneven shards work where they are DTensor's (``torch.chunk``'s)
    split: ``ceil(S / N)`` tokens per rank, the last ranks fewer. Any other split is a
    ValueError on every rank naming the local and global lengths, before the activations'
    collectives (which would otherwise abort inside the backend: gloo "data size doesn't match").
    DTensor inputs pass through (they carry their global shape)."""

    def __init__(self, mesh: "DeviceMesh", sequence_dim: int) -> None:
        self.mesh, self.sequence_dim = mesh, sequence_dim

    def __call__(self, module, args):
        from torch.distributed.tensor import DTensor

        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or isinstance(x, DTensor):
            return None
        dim, n = self.sequence_dim, self.mesh.size()
        if x.dim() <= dim:
            raise ValueError(f"x must have a sequence dimension {dim} (sequence_dim), got shape {list(x.shape)}")
        device = x.device if self.mesh.device_type != "cpu" else torch.device("cpu")
        mine = torch.tensor([x.shape[dim]], dtype=torch.int64, device=device)
        lengths = torch.empty(n, dtype=torch.int64, device=device)
        # all_gather_into_tensor is deprecated for all_gather_single in recent torch.
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(lengths, mine, group=self.mesh.get_group())
        lengths = lengths.tolist()
        if len(set(lengths)) == 1:
            return None  # equal shards: the plan's path as it is
        total = sum(lengths)
        chunk = -(-total // n)
        expected = [max(0, min(chunk, total - r * chunk)) for r in range(n)]
        if lengths != expected:
            raise ValueError(
                f"sequence-parallel shards of x along dim {dim} have local lengths {lengths} (this rank, "
                f"{self.mesh.get_local_rank()}: {x.shape[dim]}) for a global length {total}; uneven shards must "
                f"follow torch.chunk's split, {expected} (ceil({total} / {n}) = {chunk} per rank, the last ranks "
                f"fewer), or pass x as a DTensor"
            )
        shape = list(x.shape)
        shape[dim] = total
        stride = torch.empty(shape, device="meta").stride()
        return (DTensor.from_local(x, self.mesh, [Shard(dim)], run_check=False, shape=torch.Size(shape), stride=stride),) + tuple(
            args[1:]
        )
