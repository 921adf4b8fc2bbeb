"""Worker of tests/library/test_parallel.py: one process per rank (gloo on CPU), every scenario in turn.

Each scenario checks ``swiglu.parallelize`` against the unsharded MLP in float64 (the same formula
through plain ``nn.Linear`` autograd) and raises AssertionError on a mismatch; the worker records
each scenario's outcome per rank in ``<out_dir>/rank<r>.json`` for the test process to assert on.
"""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

H, I = 16, 48  # I / 4 = 12: even shards for TP = 2 and 4 (tiny: the reference backward runs)
F64 = torch.float64
TOL = 1e-12  # float64: only the order of summation differs from the unsharded oracle


def _close(name, got, want, tol=TOL):
    got, want = got.detach(), want.detach()
    assert got.shape == want.shape, f"{name}: shape {list(got.shape)} != {list(want.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    scale = want.abs().max().item()
    assert scale > 0, f"{name}: oracle is all zeros (test on zeros)"
    err = (got - want).abs().max().item() / scale
    assert err <= tol, f"{name}: max relative error {err:.3e} > {tol:.0e}"


class _Spy:
    """Records what reaches the backward on this rank (swiglu.ops.run_backward)."""

    def __init__(self):
        import swiglu.ops as ops

        self.ops, self.calls, self.original = ops, [], ops.run_backward

    def __enter__(self):
        def spy(tensors, needs, *args, **kw):
            self.calls.append(
                dict(
                    types={type(a).__name__ for a in tensors},
                    gate_weight=list(tensors[5].shape),
                    down_weight=list(tensors[7].shape),
                    x=list(tensors[1].shape),
                    needs=list(needs),
                )
            )
            return self.original(tensors, needs, *args, **kw)

        self.ops.run_backward = spy
        return self

    def __exit__(self, *exc):
        self.ops.run_backward = self.original


def _pair(mesh, seed=0, sequence_parallel=False, sequence_dim=1, inter=I):
    """(parallelized SwiGLUMLP, unsharded PlainSwiGLUMLP oracle) with the same float64 weights."""
    import swiglu
    from swiglu.module import PlainSwiGLUMLP

    torch.manual_seed(seed)
    oracle = PlainSwiGLUMLP(H, inter, dtype=F64)
    with torch.no_grad():  # weights of the benchmark's scale, not nn.Linear's tiny init
        for p in oracle.parameters():
            p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    tp = swiglu.SwiGLUMLP(H, inter, dtype=F64, impl="reference")
    tp.load_state_dict(oracle.state_dict())
    swiglu.parallelize(tp, mesh, sequence_parallel=sequence_parallel, sequence_dim=sequence_dim)
    return tp, oracle


def _draw(*shape, seed):
    g = torch.Generator().manual_seed(seed)  # same values on every rank
    return torch.randn(*shape, generator=g, dtype=F64)


def _check_weight_grads(tp, oracle, scale=1.0):
    from torch.distributed.tensor import DTensor

    for name in ("gate_proj", "up_proj", "down_proj"):
        p, q = getattr(tp, name).weight, getattr(oracle, name).weight
        if q.grad is None:
            assert p.grad is None, f"{name}: frozen weight got a gradient"
            continue
        assert isinstance(p.grad, DTensor) and p.grad.placements == p.placements, f"{name}.grad layout {p.grad}"
        _close(f"{name}.weight.grad", p.grad.full_tensor(), q.grad * scale)


def _step_against_oracle(module, oracle, x, go, mine=None, label=""):
    """One forward + backward of the parallelized ``module`` on this rank's input (all of x, or
    its sequence slice ``mine`` of dim 1 under sequence parallelism) and of the unsharded
    ``oracle`` on all of x; checks out, grad_x and the weight gradients against the oracle's.
    Returns (out, the rank's x leaf, the collectives CommDebugMode counted in ``module``'s step)."""
    from torch.distributed.tensor.debug import CommDebugMode

    part = slice(None) if mine is None else mine
    x_tp, x_or = x[:, part].clone().requires_grad_(), x.clone().requires_grad_()
    comm = CommDebugMode()
    with comm:
        out = module(x_tp)
        out.backward(go[:, part])
    counts = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
    ref = oracle(x_or)
    ref.backward(go)
    _close(f"{label}out", out, ref[:, part])
    _close(f"{label}grad_x", x_tp.grad, x_or.grad[:, part])
    _check_weight_grads(module, oracle)
    return out, x_tp, counts


def scenario_replicated(mesh):
    """No sequence parallel: every output, x's gradient and every weight gradient, plus the layouts,
    the shard shapes the backward saw and the collectives issued."""
    from torch.distributed.tensor import DTensor, Shard

    n = mesh.size()
    tp, oracle = _pair(mesh)
    assert tp.gate_proj.weight.placements == (Shard(0),) and tp.up_proj.weight.placements == (Shard(0),)
    assert tp.down_proj.weight.placements == (Shard(1),)
    assert list(tp.gate_proj.weight.to_local().shape) == [I // n, H]
    assert all(isinstance(p, DTensor) for p in tp.parameters())
    x, go = _draw(2, 5, H, seed=1), _draw(2, 5, H, seed=2)
    with _Spy() as spy:  # the oracle (nn.Linear autograd) never reaches swiglu's backward
        out, x_tp, counts = _step_against_oracle(tp, oracle, x, go)
    assert torch.equal(x_tp.detach(), x), "x was modified"
    assert type(out) is torch.Tensor and type(x_tp.grad) is torch.Tensor, "outputs must be local tensors"
    assert len(spy.calls) == 1, spy.calls
    call = spy.calls[0]
    # activated_gate is None in the memory-lean mode (the default): recomputed, not passed.
    assert call["types"] <= {"Tensor", "NoneType"} and "Tensor" in call["types"], (
        f"the backward saw {call['types']}, not local tensors"
    )
    assert call["gate_weight"] == [I // n, H] and call["down_weight"] == [H, I // n], call
    assert call["x"] == [2, 5, H] and call["needs"] == [True] * 4, call
    # forward: out all-reduced; backward: grad_x all-reduced; nothing else.
    assert counts == {"all_reduce": 2}, counts
    return {"comm_counts": counts}


def scenario_sequence_parallel(mesh):
    """x and out sharded along the sequence (dim 1 of [B, S, H]); grad_x reduce-scattered."""
    n, rank = mesh.size(), mesh.get_local_rank()
    tp, oracle = _pair(mesh, seed=3, sequence_parallel=True)
    seq = 3 * n
    x, go = _draw(2, seq, H, seed=4), _draw(2, seq, H, seed=5)
    with _Spy() as spy:
        out, _, counts = _step_against_oracle(tp, oracle, x, go, slice(rank * 3, rank * 3 + 3), "shard ")
    assert list(out.shape) == [2, 3, H]
    assert spy.calls[0]["x"] == [2, seq, H] and spy.calls[0]["gate_weight"] == [I // n, H], spy.calls
    # forward: all-gather x, reduce-scatter out; backward: all-gather grad_output, reduce-scatter grad_x.
    # Plus one all-gather of the ranks' sequence lengths (one int64 each; c10d's _allgather_base_):
    # swiglu.parallel._SequenceShards.
    assert counts == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2, "_allgather_base_": 1}, counts
    return {"comm_counts": counts}


def scenario_tokens_layout(mesh):
    """[tokens, H] inputs: T = 1 replicated, and sequence parallel along dim 0."""
    n, rank = mesh.size(), mesh.get_local_rank()
    tp, oracle = _pair(mesh, seed=6)
    x, go = _draw(1, H, seed=7), _draw(1, H, seed=8)
    x_tp, x_or = x.clone().requires_grad_(), x.clone().requires_grad_()
    tp(x_tp).backward(go)
    oracle(x_or).backward(go)
    _close("T=1 grad_x", x_tp.grad, x_or.grad)
    _check_weight_grads(tp, oracle)
    tp, oracle = _pair(mesh, seed=9, sequence_parallel=True, sequence_dim=0)
    x, go = _draw(2 * n, H, seed=10), _draw(2 * n, H, seed=11)
    mine = slice(2 * rank, 2 * rank + 2)
    x_tp, x_or = x[mine].clone().requires_grad_(), x.clone().requires_grad_()
    out = tp(x_tp)
    out.backward(go[mine])
    ref = oracle(x_or)
    ref.backward(go)
    _close("[T, H] SP out", out, ref[mine])
    _close("[T, H] SP grad_x", x_tp.grad, x_or.grad[mine])
    _check_weight_grads(tp, oracle)
    return {}


def scenario_accumulation(mesh):
    """Two backward passes without zeroing: the gradients are the sums; then one SGD step and
    clip_grad_norm_ on the DTensor parameters match the unsharded module."""
    tp, oracle = _pair(mesh, seed=12)
    for step in range(2):
        x, go = _draw(3, 2, H, seed=20 + step), _draw(3, 2, H, seed=30 + step)
        tp(x).backward(go)
        oracle(x).backward(go)
    _check_weight_grads(tp, oracle)
    norm_tp = torch.nn.utils.clip_grad_norm_(tp.parameters(), max_norm=0.5)
    norm_or = torch.nn.utils.clip_grad_norm_(oracle.parameters(), max_norm=0.5)
    norm_tp = norm_tp.full_tensor() if hasattr(norm_tp, "full_tensor") else norm_tp
    _close("clip_grad_norm_", norm_tp, norm_or)
    for module in (tp, oracle):
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        opt.step()
    for name, p in tp.state_dict().items():
        _close(f"state_dict {name} after a step", p.full_tensor(), oracle.state_dict()[name])
    return {}


def scenario_frozen(mesh):
    """gate_proj and down_proj frozen: their gradients stay None, their GEMMs are skipped."""
    tp, oracle = _pair(mesh, seed=13)
    for module in (tp, oracle):
        module.gate_proj.weight.requires_grad_(False)
        module.down_proj.weight.requires_grad_(False)
    x, go = _draw(2, 3, H, seed=14), _draw(2, 3, H, seed=15)
    x_tp, x_or = x.clone().requires_grad_(), x.clone().requires_grad_()
    with _Spy() as spy:
        tp(x_tp).backward(go)
    oracle(x_or).backward(go)
    _close("grad_x", x_tp.grad, x_or.grad)
    _check_weight_grads(tp, oracle)
    assert tp.gate_proj.weight.grad is None and tp.down_proj.weight.grad is None
    assert spy.calls[0]["needs"] == [True, False, True, False], spy.calls
    # Unfrozen again, same shapes: DTensor must not reuse the frozen call's output shapes.
    for module in (tp, oracle):
        module.gate_proj.weight.requires_grad_(True)
        module.down_proj.weight.requires_grad_(True)
        module.zero_grad(set_to_none=True)
    tp(x).backward(go)
    oracle(x).backward(go)
    _check_weight_grads(tp, oracle)
    assert tp.gate_proj.weight.grad is not None and tp.down_proj.weight.grad is not None
    return {}


def scenario_bf16_training(mesh):
    """bf16 weights and input (the training dtype): two SGD steps of the parallelized module track
    the unsharded module, within bf16 rounding."""
    import swiglu
    from swiglu.module import PlainSwiGLUMLP

    torch.manual_seed(16)
    oracle = PlainSwiGLUMLP(H, I, dtype=torch.bfloat16)
    tp = swiglu.SwiGLUMLP(H, I, dtype=torch.bfloat16, impl="reference")
    tp.load_state_dict(oracle.state_dict())
    swiglu.parallelize(tp, mesh)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (tp, oracle)]
    for step in range(2):
        x = _draw(2, 4, H, seed=40 + step).bfloat16()
        target = _draw(2, 4, H, seed=50 + step).bfloat16()
        for module, opt in zip((tp, oracle), opts):
            torch.nn.functional.mse_loss(module(x).float(), target.float()).backward()
            opt.step()
            opt.zero_grad()
    for name, p in tp.state_dict().items():
        _close(f"bf16 {name} after 2 steps", p.full_tensor().double(), oracle.state_dict()[name].double(), tol=2e-2)
    return {}


def scenario_plan_in_a_model(mesh):
    """``tensor_parallel_plan("mlp")`` applied by ``parallelize_module`` to a model holding the MLP."""
    import swiglu
    from torch.distributed.tensor.parallel import parallelize_module

    tp_mlp, oracle_mlp = _pair(mesh, seed=17)
    torch.manual_seed(17)
    fresh = swiglu.SwiGLUMLP(H, I, dtype=F64, impl="reference")
    fresh.load_state_dict(oracle_mlp.state_dict())
    model = torch.nn.Sequential()
    model.add_module("norm", torch.nn.LayerNorm(H, dtype=F64))
    model.add_module("mlp", fresh)
    oracle = torch.nn.Sequential()
    oracle.add_module("norm", torch.nn.LayerNorm(H, dtype=F64))
    oracle.add_module("mlp", oracle_mlp)
    oracle.norm.load_state_dict(model.norm.state_dict())
    plan = swiglu.tensor_parallel_plan("mlp")
    parallelize_module(model, mesh, plan)
    x, go = _draw(2, 3, H, seed=18), _draw(2, 3, H, seed=19)
    x_tp, x_or = x.clone().requires_grad_(), x.clone().requires_grad_()
    model(x_tp).backward(go)
    oracle(x_or).backward(go)
    _close("model grad_x", x_tp.grad, x_or.grad)
    _close("norm.weight.grad", model.norm.weight.grad, oracle.norm.weight.grad)
    _check_weight_grads(model.mlp, oracle.mlp)
    return {}


def scenario_plain_module(mesh):
    """The baseline: PlainSwiGLUMLP (nn.Linear autograd) through the same ``parallelize``
    (torchtitan's plan): correct, and grad_x is all-reduced twice (one per column-parallel layer)."""
    import swiglu
    from swiglu.module import PlainSwiGLUMLP

    n, rank = mesh.size(), mesh.get_local_rank()
    _, oracle = _pair(mesh, seed=21)
    plain = PlainSwiGLUMLP(H, I, dtype=F64)
    plain.load_state_dict(oracle.state_dict())
    swiglu.parallelize(plain, mesh)
    x, go = _draw(2, 3, H, seed=22), _draw(2, 3, H, seed=23)
    _, _, counts = _step_against_oracle(plain, oracle, x, go, label="plain ")
    assert counts == {"all_reduce": 3}, counts
    plain, oracle = PlainSwiGLUMLP(H, I, dtype=F64), oracle
    plain.load_state_dict(oracle.state_dict())
    oracle.zero_grad(set_to_none=True)
    swiglu.parallelize(plain, mesh, sequence_parallel=True)
    x, go = _draw(2, 2 * n, H, seed=24), _draw(2, 2 * n, H, seed=25)
    _step_against_oracle(plain, oracle, x, go, slice(2 * rank, 2 * rank + 2), "plain SP ")
    return {"comm_counts": counts}


def scenario_uneven(mesh):
    """Sizes that do not split raise ValueError naming them, before anything is sharded."""
    import swiglu

    n = mesh.size()
    bad = swiglu.SwiGLUMLP(H, 8 * n + 1, dtype=F64, impl="reference")
    try:
        swiglu.parallelize(bad, mesh)
    except ValueError as exc:
        assert f"intermediate_size={8 * n + 1}" in str(exc) and str(n) in str(exc), exc
    else:
        raise AssertionError("uneven intermediate_size did not raise")
    from torch.distributed.tensor import DTensor

    assert not isinstance(bad.gate_proj.weight, DTensor), "weights were sharded before the error"
    unaligned = swiglu.SwiGLUMLP(H, 12 * n, dtype=torch.bfloat16, impl="triton")  # local I = 12
    try:
        swiglu.parallelize(unaligned, mesh)
    except ValueError as exc:
        assert f"{12 * n} / {n} = 12" in str(exc) and "multiple of 8" in str(exc), exc
    else:
        raise AssertionError("local intermediate_size 12 with the Triton backward did not raise")
    return {}


def scenario_lean_triton(mesh):
    """bf16 on the Triton path (the interpreter on CPU) in the memory-lean mode: each rank's local
    backward passes the ulp oracle (tests/ulp_oracle.py) and never writes the saved gate/up shards
    (DTensors take the custom ops), so a second backward through the graph accumulates exactly
    twice the first."""
    import swiglu

    from ulp_oracle import BackwardSpy

    x = _draw(2, 4, H, seed=60).bfloat16()
    go = _draw(2, 4, H, seed=61).bfloat16()
    torch.manual_seed(17)
    tp = swiglu.SwiGLUMLP(H, I, dtype=torch.bfloat16, impl="triton", reuse_saved_buffers=True)
    swiglu.parallelize(tp, mesh)
    xr = x.clone().requires_grad_(True)
    out = tp(xr)
    with BackwardSpy() as spy:
        out.backward(go, retain_graph=True)
    # This rank's backward on its shard (before the all-reduce of grad_x) passes the ulp oracle
    # against the same-rounding reference on the same local inputs.
    spy.check_own(seed=f"rank {mesh.get_local_rank()}")
    assert [kw["overwrite_activations"] for _, kw, _ in spy.calls] == [False]
    first = [xr.grad.clone()] + [p.grad.full_tensor().clone() for p in tp.parameters()]
    out.backward(go)
    second = [xr.grad] + [p.grad.full_tensor() for p in tp.parameters()]
    for name, a, b in zip(("grad_x", "gate", "up", "down"), first, second):
        assert a.abs().max() > 0, name
        assert torch.equal(b, a + a), f"{name}: the second backward is not the first again"
    return {}


def scenario_uneven_sequence(mesh):
    """x [2, 5, H] as 3 + 2 tokens (torch.chunk's split, what DTensor shards
    unevenly) works against the oracle; 4 + 1 is a ValueError on every rank naming the lengths,
    and the next call still works (no abort, no hang)."""
    n, rank = mesh.size(), mesh.get_local_rank()
    tp, oracle = _pair(mesh, seed=70, sequence_parallel=True)
    seq = 2 * n + 1
    x, go = _draw(2, seq, H, seed=71), _draw(2, seq, H, seed=72)
    chunk = -(-seq // n)
    mine = slice(rank * chunk, min(seq, (rank + 1) * chunk))
    out, _, _ = _step_against_oracle(tp, oracle, x, go, mine, "uneven ")
    assert out.shape[1] == mine.stop - mine.start
    # Rank 0 all but n - 1 tokens, the others one each (4 + 1 at TP=2): not torch.chunk's split.
    bad = slice(0, seq - n + 1) if rank == 0 else slice(seq - n + rank, seq - n + rank + 1)
    try:
        tp(x[:, bad].clone())
    except ValueError as exc:
        assert "local lengths" in str(exc) and f"global length {seq}" in str(exc), exc
    else:
        raise AssertionError("a split that is not torch.chunk's did not raise")
    oracle.zero_grad(set_to_none=True)
    tp.zero_grad(set_to_none=True)
    _step_against_oracle(tp, oracle, x, go, mine, "after the error ")
    return {}


SCENARIOS = {name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def run(rank: int, world_size: int, port: int, out_dir: str, names: list[str]) -> None:
    """Entry point (torch.multiprocessing.start_processes): init gloo, run ``names``, write the
    outcomes to ``<out_dir>/rank<rank>.json``."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)  # 2-core CI machine, several ranks
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    results = {}
    try:
        for name in names:
            try:
                results[name] = {"ok": True, **SCENARIOS[name](mesh["tp"])}
            except Exception:  # noqa: BLE001 - reported per scenario to the test process
                results[name] = {"ok": False, "error": traceback.format_exc()}
            dist.barrier()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: gloo's threads have aborted it there now and then
    # under load ("terminate called without an active exception", SIGABRT after the results were
    # written; seen once in ~10 full-suite runs on the 2-core machine).
    os._exit(0)


def run_nccl_uneven(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """GPU entry point (tests/library/test_parallel_gpu.py): uneven shards on NCCL, one GPU per rank,
    bf16 with the default backward (Triton on the H200): 3 + 2 tokens of x [2, 5, 64] match the
    unsharded float64 MLP within bf16 rounding; 4 + 1 is a ValueError on every rank; the next
    call works."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world_size, timeout=timedelta(seconds=120), device_id=torch.device("cuda", rank)
    )
    from torch.distributed.device_mesh import init_device_mesh

    import swiglu
    from swiglu.module import PlainSwiGLUMLP

    mesh = init_device_mesh("cuda", (world_size,), mesh_dim_names=("tp",))["tp"]
    result = {}
    try:
        hidden, inter, seq = 64, 128, 2 * world_size + 1
        torch.manual_seed(80)
        oracle = PlainSwiGLUMLP(hidden, inter, dtype=F64, device="cuda")
        tp = swiglu.SwiGLUMLP(hidden, inter, dtype=torch.bfloat16, device="cuda")
        tp.load_state_dict({k: v.bfloat16() for k, v in oracle.state_dict().items()})
        swiglu.parallelize(tp, mesh, sequence_parallel=True)
        x = _draw(2, seq, hidden, seed=81).cuda()
        chunk = -(-seq // world_size)
        mine = slice(rank * chunk, min(seq, (rank + 1) * chunk))
        for attempt in ("first", "after the error"):
            out = tp(x[:, mine].bfloat16())
            _close(f"{attempt} out", out.double(), oracle(x)[:, mine], tol=3e-2)
            if attempt == "first":
                bad = slice(0, seq - world_size + 1) if rank == 0 else slice(seq - world_size + rank, seq - world_size + rank + 1)
                try:
                    tp(x[:, bad].bfloat16())
                except ValueError as exc:
                    assert "local lengths" in str(exc), exc
                else:
                    raise AssertionError("a split that is not torch.chunk's did not raise")
        result = {"ok": True}
    except Exception:  # noqa: BLE001
        result = {"ok": False, "error": traceback.format_exc()}
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"uneven_nccl": result}))
        dist.destroy_process_group()
    os._exit(0)
