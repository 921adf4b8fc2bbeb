"""Worker of tests/library/test_fsdp.py: FSDP2 (``torch.distributed.fsdp.fully_shard``) on 2 gloo ranks.

Every scenario trains a 2-block residual stack of ``swiglu.SwiGLUMLP`` a few SGD steps under FSDP2
(data parallel: each rank its own half of the global batch) and the same stack unsharded on the
global batch, and compares the gradients of the first step and the parameter updates after the
last (``p_after - p_before``: a comparison of the parameters themselves would hide a wrong gradient
behind lr). Outcomes go to ``<out_dir>/rank<r>.json`` per scenario, as tests/tp_worker.py does.
"""

from __future__ import annotations

import copy
import json
import os
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

H, I = 16, 48  # multiples of 8 (Triton's TMA rows), I / 2 = 24 for TP = 2
TOKENS = 6  # per rank and sequence; global batch [2 * 2, TOKENS, H]
STEPS, LR = 3, 0.2
DEVICE = torch.device("cpu")  # run() sets cuda:<rank> for the NCCL runs (tests/library/test_fsdp.py, gpu)


class Stack(nn.Module):
    """x + mlp0(x), then + mlp1(.): two SwiGLU MLP blocks (FSDP units) with residuals."""

    def __init__(self, make_mlp):
        super().__init__()
        self.layers = nn.ModuleList([make_mlp() for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def _stacks(dtype, impl="reference", save_activated_gate=False, seed=0, reuse_saved_buffers=False):
    """(ours: SwiGLUMLP blocks, oracle: PlainSwiGLUMLP blocks in float64), same weights."""
    import swiglu
    from swiglu.module import PlainSwiGLUMLP

    torch.manual_seed(seed)
    oracle = Stack(lambda: PlainSwiGLUMLP(H, I, dtype=torch.float64))
    with torch.no_grad():
        for p in oracle.parameters():
            p.copy_((torch.randn_like(p) / p.shape[1] ** 0.5).to(dtype))  # values exact in dtype
    ours = Stack(
        lambda: swiglu.SwiGLUMLP(
            H, I, dtype=dtype, impl=impl, save_activated_gate=save_activated_gate, reuse_saved_buffers=reuse_saved_buffers
        )
    )
    ours.load_state_dict(oracle.state_dict())
    return ours.to(DEVICE), oracle.to(DEVICE)


def _batch(step, dtype):
    g = torch.Generator().manual_seed(100 + step)  # the same global batch on every rank
    x = torch.randn(4, TOKENS, H, generator=g, dtype=torch.float64)
    target = torch.randn(4, TOKENS, H, generator=g, dtype=torch.float64)
    return x.to(DEVICE, dtype), target.to(DEVICE, dtype)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _rel(got, want):
    got, want = got.detach().double(), want.detach().double()
    assert torch.isfinite(got).all(), "non-finite values"
    scale = want.abs().max().item()
    assert scale > 0, "oracle is all zeros (test on zeros)"
    return (got - want).abs().max().item() / scale


def _train(model, params, xs, compute_dtype, loss_dtype=torch.float32):
    """STEPS SGD steps of mse(model(x), target); returns (first step's gradients, final params)."""
    opt = torch.optim.SGD(params, lr=LR)
    first = None
    for x, target in xs:
        out = model(x.to(compute_dtype))
        nn.functional.mse_loss(out.to(loss_dtype), target.to(loss_dtype)).backward()
        if first is None:
            first = {n: _full(p.grad).detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
    return first, {n: _full(p).detach().clone() for n, p in model.named_parameters()}


def _compare(ours, oracle, dp_rank, dp_size, dtype, compute_dtype=None):
    """Train ``ours`` (sharded; this rank's slice of the batch) and ``oracle`` (unsharded float64
    of the same weights; the whole batch, weights and inputs rounded to ``compute_dtype`` when given:
    what mixed precision computes with). Returns {"grad <param>" / "update <param>": max relative
    error} (see ``_rel``)."""
    before = {n: _full(p).detach().double().clone() for n, p in ours.named_parameters()}
    per = 4 // dp_size
    mine = slice(dp_rank * per, (dp_rank + 1) * per)
    batches = [_batch(s, torch.float64) for s in range(STEPS)]
    got_grads, got_params = _train(
        ours, ours.parameters(), [(x[mine].to(dtype), t[mine]) for x, t in batches], compute_dtype or dtype
    )
    rounded = copy.deepcopy(oracle)
    want_grads = {}
    for step, (x, target) in enumerate(batches):
        if compute_dtype is not None:  # compute with the master weights rounded as FSDP casts them
            with torch.no_grad():
                for q, p in zip(rounded.parameters(), oracle.parameters()):
                    q.copy_(p.to(compute_dtype))
            rounded.zero_grad(set_to_none=True)
            out = rounded(x.to(compute_dtype).double())
            nn.functional.mse_loss(out, target).backward()
            grads = [q.grad for q in rounded.parameters()]
        else:
            oracle.zero_grad(set_to_none=True)
            nn.functional.mse_loss(oracle(x.to(dtype).double()), target).backward()
            grads = [p.grad for p in oracle.parameters()]
        if step == 0:
            want_grads = {n: g.clone() for (n, _), g in zip(oracle.named_parameters(), grads)}
        with torch.no_grad():
            for p, g in zip(oracle.parameters(), grads):
                p.sub_(LR * g)
                p.copy_(p.to(dtype))  # the master weights' dtype
    report = {}
    for n, p in oracle.named_parameters():
        report[f"grad {n}"] = _rel(got_grads[n], want_grads[n])
        report[f"update {n}"] = _rel(got_params[n].double() - before[n], p.detach() - before[n])
    return report


def _check(report, tol):
    bad = {k: v for k, v in report.items() if not v <= tol}
    assert not bad, f"relative errors above {tol}: {bad}"
    return {"worst": max(report.values())}


def _within_plain(report, mesh, rank, world, dtype, compute_dtype=None, **fsdp_kw):
    """bf16 bound: each error of ``report`` at most twice that of the same FSDP run with
    ``PlainSwiGLUMLP`` blocks (nn.Linear autograd) plus 1e-3."""
    from swiglu.module import PlainSwiGLUMLP

    _, oracle = _stacks(dtype)  # fresh: the same weights
    plain = Stack(lambda: PlainSwiGLUMLP(H, I, dtype=dtype))
    plain.load_state_dict(oracle.state_dict())
    plain.to(DEVICE)
    baseline = _compare(_fsdp(plain, mesh, **fsdp_kw), oracle, rank, world, dtype, compute_dtype)
    bad = {k: (v, baseline[k]) for k, v in report.items() if not v <= 2 * baseline[k] + 1e-3}
    assert not bad, f"errors above 2 x nn.Linear's + 1e-3 (ours, nn.Linear's): {bad}"
    return {"worst": max(report.values()), "worst_plain": max(baseline.values())}


def _fsdp(model, mesh, **kw):
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


def scenario_fsdp_float32(rank, world):
    """FSDP2 alone, float32, reference backward: gradients and updates to float32 rounding."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    ours, oracle = _stacks(torch.float32)
    _fsdp(ours, init_device_mesh(DEVICE.type, (world,)))
    assert isinstance(ours.layers[0].gate_proj.weight, DTensor)
    assert ours.layers[0].gate_proj.weight.to_local().shape[0] == I // world  # really sharded
    return _check(_compare(ours, oracle, rank, world, torch.float32), 1e-5)


def scenario_fsdp_bf16_fp32_reduce(rank, world):
    """MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32) over float32 master weights:
    the oracle computes in float64 with the same bf16-rounded weights and inputs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mesh = init_device_mesh(DEVICE.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    ours, oracle = _stacks(torch.float32)
    _fsdp(ours, mesh, mp_policy=mp)
    assert ours.layers[0].gate_proj.weight.dtype == torch.float32  # the master weights
    report = _compare(ours, oracle, rank, world, torch.float32, compute_dtype=torch.bfloat16)
    return _within_plain(report, mesh, rank, world, torch.float32, compute_dtype=torch.bfloat16, mp_policy=mp)


def scenario_fsdp_lean_triton(rank, world):
    """bf16 parameters, impl="triton" in the memory-lean mode with reuse_saved_buffers (the
    Triton forward, then the backward writing d_gate/d_up over the saved activations), under
    FSDP2's unsharding and resharding after forward (TRITON_INTERPRET=1 on CPU)."""
    import swiglu.kernels.backward as backward
    from torch.distributed.device_mesh import init_device_mesh

    calls = []
    real = backward.launch_backward
    backward.launch_backward = lambda *a, **kw: calls.append(kw["overwrite_activations"]) or real(*a, **kw)
    try:
        mesh = init_device_mesh(DEVICE.type, (world,))
        ours, oracle = _stacks(torch.bfloat16, impl="triton", reuse_saved_buffers=True)
        _fsdp(ours, mesh, reshard_after_forward=True)
        report = _compare(ours, oracle, rank, world, torch.bfloat16)
    finally:
        backward.launch_backward = real
    assert calls == [True] * (2 * STEPS), calls  # every backward consumed its saved gate/up
    return _within_plain(report, mesh, rank, world, torch.bfloat16)


def _scenario_2d(rank, world, dp, tp):
    """torchtitan's arrangement: tensor parallel inside (``swiglu.tensor_parallel_plan`` on the tp
    mesh), FSDP2 outside on the dp mesh; float32, reference backward."""
    import swiglu
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(DEVICE.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    ours, oracle = _stacks(torch.float32)
    parallelize_module(ours, mesh["tp"], swiglu.tensor_parallel_plan("layers.*"))
    _fsdp(ours, mesh["dp"])
    weight = ours.layers[0].gate_proj.weight
    assert weight.device_mesh.ndim == 2 and weight.to_local().shape[0] == I // world, weight
    return _check(_compare(ours, oracle, mesh["dp"].get_local_rank(), dp, torch.float32), 1e-5)


def scenario_fsdp_tp_1x2(rank, world):
    return _scenario_2d(rank, world, 1, world)


def scenario_fsdp_tp_2x1(rank, world):
    return _scenario_2d(rank, world, world, 1)


def scenario_fsdp_hf_llama(rank, world):
    """A tiny Hugging Face Llama patched by ``swiglu.integrations.transformers.apply``, one FSDP
    unit per decoder layer (float32): the first step's gradients match the unsharded unpatched
    model's on the whole batch, and the op ran in every layer."""
    try:
        import transformers
    except ImportError:
        return {"skipped": "transformers is not installed"}
    from torch.distributed.device_mesh import init_device_mesh

    from swiglu.integrations import transformers as swiglu_hf

    config = transformers.LlamaConfig(
        hidden_size=H,
        intermediate_size=I,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        vocab_size=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    oracle = transformers.LlamaForCausalLM(config).to(DEVICE)
    with torch.no_grad():
        for p in oracle.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    model = copy.deepcopy(oracle)
    assert swiglu_hf.apply(model) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(DEVICE.type, (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    calls = []
    real = swiglu_hf._swiglu_mlp
    swiglu_hf._swiglu_mlp = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        ids = torch.randint(3, 64, (2 * world, 8), generator=torch.Generator().manual_seed(5)).to(DEVICE)
        mine = ids[2 * rank : 2 * rank + 2]  # equal token counts: the mean of rank means is the global mean
        model(mine, labels=mine).loss.backward()
    finally:
        swiglu_hf._swiglu_mlp = real
    assert len(calls) == 2, calls
    oracle(ids, labels=ids).loss.backward()
    want = dict(oracle.named_parameters())
    return _check({n: _rel(_full(p.grad), want[n].grad) for n, p in model.named_parameters()}, 1e-5)


class MoEBlock(nn.Module):
    """A router, ``swiglu.SwiGLUExperts`` (its own FSDP unit) and a shared linear added in place to
    the experts' output, as a shared expert or a residual is (FSDP2 hooks the unit's output for
    its backward: an in-place op on a view of it would lose the hook)."""

    def __init__(self, dtype, impl, num_experts=4, top_k=2):
        import swiglu

        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(H, num_experts, bias=False, dtype=dtype)
        self.shared = nn.Linear(H, H, bias=False, dtype=dtype)
        self.experts = swiglu.SwiGLUExperts(num_experts, H, I, impl=impl, dtype=dtype)

    def forward(self, x):
        w, i = torch.softmax(self.router(x).float(), dim=-1).topk(self.top_k)
        out = self.experts(x, i, w)
        out += self.shared(x)
        return out


def _scenario_moe_inplace(rank, world, dtype, impl, flat, tol):
    """FSDP2 over ``MoEBlock`` (experts sharded): the first step's gradients against the same
    block unsharded on the whole batch ([batch, seq, H] inputs, or flattened to [T, H] with ``flat``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    plain = MoEBlock(dtype, impl).to(DEVICE)
    with torch.no_grad():
        for q in plain.parameters():
            q.copy_(torch.randn_like(q, dtype=torch.float32).to(dtype) / q.shape[-1] ** 0.5)
    ours = copy.deepcopy(plain)
    mesh = init_device_mesh(DEVICE.type, (world,))
    fully_shard(ours.experts, mesh=mesh)
    fully_shard(ours, mesh=mesh)
    x, target = _batch(0, dtype)
    per = 4 // world
    mine = slice(rank * per, (rank + 1) * per)

    def loss(model, x, target):
        if flat:
            x, target = x.reshape(-1, H), target.reshape(-1, H)
        return nn.functional.mse_loss(model(x).float(), target.float())

    loss(ours, x[mine], target[mine]).backward()
    loss(plain, x, target).backward()  # the mean over the batch: FSDP2 averages the ranks' gradients
    want = dict(plain.named_parameters())
    return _check({n: _rel(_full(q.grad), want[n].grad) for n, q in ours.named_parameters()}, tol)


def scenario_fsdp_moe_inplace_reference(rank, world):
    """float32, the reference experts, [batch, seq, H] inputs."""
    return _scenario_moe_inplace(rank, world, torch.float32, "reference", flat=False, tol=1e-5)


def scenario_fsdp_moe_inplace_reference_flat(rank, world):
    """float32, the reference experts, [T, H] inputs (transformers' experts get those)."""
    return _scenario_moe_inplace(rank, world, torch.float32, "reference", flat=True, tol=1e-5)


def scenario_fsdp_moe_inplace_triton(rank, world):
    """bf16, the Triton experts (interpreter on CPU), [T, H] inputs: within bf16 rounding of the
    unsharded run (the failure this guards against read the released weights: NaN or garbage)."""
    return _scenario_moe_inplace(rank, world, torch.bfloat16, "triton", flat=True, tol=3e-2)


SCENARIOS = {name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def run(rank: int, world_size: int, port: int, out_dir: str, names: list[str], device_type: str = "cpu") -> None:
    """Entry point (torch.multiprocessing.start_processes): init gloo (``device_type`` "cpu") or
    NCCL ("cuda", one GPU per rank), run ``names``, write the outcomes to ``<out_dir>/rank<rank>.json``."""
    global DEVICE
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    if device_type == "cuda":
        DEVICE = torch.device("cuda", rank)
        torch.cuda.set_device(DEVICE)
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
        device_id=DEVICE if device_type == "cuda" else None,
    )
    results = {}
    try:
        for name in names:
            try:
                results[name] = {"ok": True, **SCENARIOS[name](rank, world_size)}
            except Exception:  # noqa: BLE001 - reported per scenario to the test process
                results[name] = {"ok": False, "error": traceback.format_exc()}
            dist.barrier()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()
    os._exit(0)  # skip the interpreter's teardown (gloo threads; see tests/tp_worker.py)
