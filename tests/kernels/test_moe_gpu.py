"""``swiglu_moe``'s Triton path at full model size on the GPU (skipped without one): Qwen3-30B-A3B's
experts (H 2048, I 768, E 128, k 8) at T = 8192 and a Mixtral-like small case, balanced and skewed
routing. Every output and gradient, and each expert's slice of the weight gradients, against the
float64 oracle within 2x the bf16 reference's own error (``moe_checks.failures``, with the
same-rounding formula for the scale check); bitwise repeatable; inputs unchanged; NaN in the
inputs' neighbourhood and in never-written rows not leaking; ids out of range skipped. Fresh
inputs every run, the seed printed on a failure; ``SWIGLU_TEST_SEED`` replays one."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

import swiglu
import swiglu.kernels.moe as kmoe
from swiglu.kernels import launch
from swiglu.moe import moe_float64, moe_reference

from gpu_load import matmuls_in_another_process
from moe_checks import NAMES, assert_matches, binding_limit, fresh_seed, make_moe, oracle, run, same_rounding

pytestmark = pytest.mark.gpu

# name: (T, H, I, E, k)
SHAPES = {
    "qwen3_30b_a3b_T8192": (8192, 2048, 768, 128, 8),
    "mixtral_like_small": (1000, 1024, 1792, 8, 2),
    # 2048 rows per expert: the weight gradients read copies (above GATHER_MAX_ROWS), not gathers
    "few_large_experts": (4096, 1024, 1536, 4, 2),
    # hidden_size 4096: the plan's Gluon dSwiGLU and weight gradients run too (sm_90); 64 of the
    # 128 experts, so the float64 oracle's weights and gradients (~30 GB) fit an 80 GB H100
    "qwen3_235b_a22b_E64_T2048": (2048, 4096, 1536, 64, 8),
    # sizes off the Gluon tiles: the up and dSwiGLU GEMMs (I % 128) and grad_down_proj (H % 128)
    # take the tl kernels, grad_gate_up_proj the Gluon one, in one backward
    "gluon_and_tl_mixed": (333, 4160, 832, 16, 4),
}


@pytest.mark.parametrize("alpha", [None, 1.702], ids=["limit", "limit_alpha"])
@pytest.mark.parametrize("shape", ["qwen3_30b_a3b_T8192", "qwen3_235b_a22b_E64_T2048"])
def test_swiglu_limit_full_size_against_float64(shape, alpha):
    """``swiglu_limit`` (DeepSeek-V4's clamp) at full size, the plan's kernels (Gluon up and, at
    hidden_size 4096, Gluon dSwiGLU with the clamp), a limit clamping about a third of the values;
    with ``swiglu_alpha`` (MiniMax-M3's form) too."""
    T, H, I, E, k = SHAPES[shape]
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, device="cuda")
    limit = binding_limit(inp)
    got = run(inp, "triton", swiglu_limit=limit, swiglu_alpha=alpha)
    ref = run(inp, "reference", swiglu_limit=limit, swiglu_alpha=alpha)
    assert not torch.equal(got[0], run(inp, "triton")[0]), f"seed={seed}: the limit clamped nothing"
    assert_matches(got, ref, oracle(inp, limit, alpha), seed, same_rounding(inp, limit, alpha))


@pytest.mark.parametrize("shape", ["qwen3_30b_a3b_T8192", "qwen3_235b_a22b_E64_T2048"])
def test_transposed_weights_full_size_against_float64(shape):
    """Aria's layout (gate_up_proj stored [E, H, 2I], down_proj [E, I, H], passed as their ``mT``):
    the up and dSwiGLU GEMMs on the strided weights (tl kernels), the down projection, grad_x and
    the weight gradients on that memory in its own order; every output and gradient against
    float64, the weight gradients in the weights' strides."""
    T, H, I, E, k = SHAPES[shape]
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, device="cuda")
    inp.gate_up_proj = inp.gate_up_proj.mT.contiguous().mT
    inp.down_proj = inp.down_proj.mT.contiguous().mT
    got = run(inp, "triton")
    assert got[3].stride() == inp.gate_up_proj.stride() and got[4].stride() == inp.down_proj.stride()
    ref = run(inp, "reference")
    assert_matches(got, ref, oracle(inp), seed, same_rounding(inp))


@pytest.mark.parametrize("kind", ["balanced", "skewed"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_full_size_against_float64(shape, kind):
    T, H, I, E, k = SHAPES[shape]
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, kind=kind, device="cuda")
    before = [t.clone() for t in inp.tensors()]
    got = run(inp, "triton")
    again = run(inp, "triton")
    torch.cuda.synchronize()
    for name, a, b in zip(NAMES, got, again):
        assert torch.equal(a, b), f"seed={seed}: {name} not bitwise repeatable"
    del again
    for t, b in zip(inp.tensors(), before):
        assert torch.equal(t, b), f"seed={seed}: an input was modified"
    del before
    ref = run(inp, "reference")
    assert_matches(got, ref, oracle(inp), seed, same_rounding(inp))
    for e in sorted(set(range(E)) - set(inp.top_k_index.unique().tolist())):
        assert not got[3][e].count_nonzero() and not got[4][e].count_nonzero(), f"seed={seed}: empty expert {e}"


@pytest.mark.parametrize("shape", ["few_large_experts", "qwen3_235b_a22b_E64_T2048"])
def test_reuse_saved_buffers_is_bitwise_and_lowers_the_peak(shape):
    """With the kernels the plan picks on this GPU: ``reuse_saved_buffers=True`` gives the
    default's bits, and releasing the saved gate/up ([S, 2I]) after the dSwiGLU GEMM takes at
    least half their bytes off the forward+backward's peak (by the sizes: the default's peak has
    them beside d_gate|d_up at grad_gate_up_proj or grad_down_proj)."""
    T, H, I, E, k = SHAPES[shape]
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, device="cuda")
    peaks, grads = [], []
    for reuse in (False, True):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        grads.append(run(inp, "triton", reuse_saved_buffers=reuse))
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    for name, a, b in zip(NAMES, *grads):
        assert torch.equal(a, b), f"seed={seed}: {name}"
    saved = T * k * 2 * I * 2
    assert peaks[1] <= peaks[0] - saved // 2, (peaks, saved)


def test_reuse_waits_for_the_queued_kernels_when_gate_up_come_from_another_stream():
    """As the dense op's release: gate/up brought back on a side stream (an activation offloader)
    and released by ``reuse`` must not be reused by that stream while the backward's kernels,
    queued on the current stream behind a 2 s sleep, still read them (without the recorded stream
    the side stream's NaN fill lands in them)."""
    T, H, I, E, k = 4096, 2048, 768, 128, 8
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, device="cuda")
    x, idx, w, gu, dp, go = inp.flat()
    _, g0, u0, routing = kmoe.moe_forward(x, idx, w, gu, dp)
    want = kmoe.moe_backward(go, x, idx, w, gu, dp, g0, u0, routing=routing)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        gate, up = g0.clone(), u0.clone()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # hold the current stream's queue back
    got = kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, routing=routing, reuse=True)
    del gate, up
    with torch.cuda.stream(side):  # the offloader's next allocations, filled at once
        junk = [torch.full(g0.shape, float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    torch.cuda.synchronize()
    del junk
    for name, g, ref in zip(NAMES[1:], got, want):
        assert torch.equal(g, ref), f"seed={seed}: {name}"


def _nan_padded(t):
    buf = torch.full((t.shape[0] + 2, *t.shape[1:]), float("nan"), dtype=t.dtype, device=t.device)
    buf[1:-1] = t
    return buf[1:-1]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_out_of_range_ids_and_nan_neighbours(shape):
    """The kernel functions directly (no range check): a third of the ids outside [0, E) (-1, E,
    2**20); inputs between NaN rows / experts. Results finite, the skipped pairs' routing-weight
    gradients exactly zero, the rest against the oracle (which skips them too)."""
    T, H, I, E, k = SHAPES[shape]
    T = min(T, 2048)
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, device="cuda")
    x, idx, w, gu, dp, go = inp.flat()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    bad = torch.rand(T, k, device="cuda", generator=gen) < 0.33
    sentinels = torch.tensor([-1, E, 1 << 20], device="cuda")
    idx = torch.where(bad, sentinels[torch.randint(3, (T, k), device="cuda", generator=gen)], idx)
    args = (_nan_padded(x), idx, _nan_padded(w), _nan_padded(gu), _nan_padded(dp))
    out, gate, up, routing = kmoe.moe_forward(*args)
    grads = kmoe.moe_backward(_nan_padded(go), *args, gate, up)
    got = (out, *grads)
    torch.cuda.synchronize()
    for name, g in zip(NAMES, got):
        assert torch.isfinite(g).all(), f"seed={seed}: NaN in {name}"
    assert not got[2][bad].count_nonzero(), f"seed={seed}: gradient of a skipped pair"
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, gu, dp)]
    r = moe_reference(leaves[0], idx, leaves[1], leaves[2], leaves[3])
    r.backward(go)
    ref = (r.detach(), *(t.grad for t in leaves))
    same = same_rounding(dataclasses.replace(inp, top_k_index=idx))
    assert_matches(got, ref, moe_float64(x, idx, w, gu, dp, go), seed, same)


def test_cuda_graph_replay_is_bitwise_eager():
    """Forward + backward captured in one CUDA graph (no host synchronization on the path),
    replayed on new routing and activations copied into the static inputs: bitwise the eager
    results of the same inputs."""
    T, H, I, E, k = 512, 4096, 512, 16, 4  # every Gluon kernel of the plan on sm_90
    seed = fresh_seed()
    first, second = (make_moe(seed + i, T, H, I, E, k, kind=kind, device="cuda") for i, kind in enumerate(("balanced", "skewed")))
    static = [t.detach().clone() for t in first.flat()]
    x, idx, w, gu, dp, go = static
    leaves = [t.requires_grad_(True) for t in (x, w, gu, dp)]

    def step():
        out = swiglu.swiglu_moe(leaves[0], idx, leaves[1], leaves[2], leaves[3], impl="triton")
        return (out, *torch.autograd.grad(out, leaves, go))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: first launches take Triton's path
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for t, new in zip(static, second.flat()):
        t.detach().copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    want = run(second, "triton")
    for name, a, b in zip(NAMES, captured, want):
        assert torch.equal(a.reshape(b.shape), b), f"seed={seed}: {name} differs after graph replay"


def test_forward_and_backward_keep_their_bits_while_another_process_time_slices_the_gpu():
    """Qwen3-235B-A22B's experts at 32768 tokens (weight gradients of several ms, preempted
    mid-launch), forward and backward three times beside a process running matmuls: bitwise the
    run on the idle GPU. The weight gradients store through the MMA warpgroups' chunked epilogue,
    which in the dense kernel lost 16 columns of a preempted tile (it kept its bits here on an H100:
    data/tuning/wgrad_time_slicing_h100_20261207/)."""
    T, H, I, E, k = 32768, 4096, 1536, 128, 8
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, device="cuda")
    want = run(inp, "triton")
    with matmuls_in_another_process():
        differ = [[n for n, a, b in zip(NAMES, run(inp, "triton"), want) if not torch.equal(a, b)] for _ in range(3)]
    assert not any(differ), f"seed={seed}: outputs with other bits per run beside the load: {differ}"


def _in_fresh_thread(fn):
    """fn() run in a new thread (no CUDA context current there until something binds one)."""
    box = {}

    def work():
        try:
            box["out"] = fn()
        except BaseException as err:  # re-raised in the caller
            box["err"] = err

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


def test_launches_from_a_thread_without_a_cuda_context():
    """A thread whose first CUDA work is our launches (autograd's device thread can be one: its
    backward's buffers come from the caching allocator, so nothing binds the context before the
    first TMA descriptor is filled): first launches (Triton's path, launches cleared) and cached
    launches on new addresses both work there, bitwise the main thread's results; MoE and dense."""
    seed = fresh_seed()
    inp = make_moe(seed, 512, 4096, 512, 16, 4, kind="balanced", device="cuda")  # the Gluon kernels too
    want = run(inp, "triton")
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(*s, device="cuda", dtype=torch.bfloat16) / 32 for s in ((512, 1024), (512, 1024), (1024, 512))]

    def dense():
        leaves = [t.clone().requires_grad_() for t in (x, *ws)]
        out = swiglu.swiglu_mlp(*leaves, impl="triton")
        return (out, *torch.autograd.grad(out, leaves, torch.ones_like(out)))

    dense_want = dense()
    torch.cuda.synchronize()
    for cleared in (True, False):
        if cleared:
            launch.clear_launches()
        got = _in_fresh_thread(lambda: run(inp, "triton"))
        dense_got = _in_fresh_thread(dense)
        torch.cuda.synchronize()
        for name, a, b in zip(NAMES, got, want):
            assert torch.equal(a, b), f"seed={seed}: {name} (launches cleared: {cleared})"
        for a, b in zip(dense_got, dense_want):
            assert torch.equal(a, b), f"dense (launches cleared: {cleared})"


@pytest.mark.parametrize("kind", ["balanced", "skewed", "limited", "limited_alpha"])
def test_gluon_kernels_match_the_tl_kernels(monkeypatch, kind):
    """Where the plan runs the Gluon up projection, dSwiGLU and weight gradients (sm_90, hidden_size
    4096): the output and every gradient bitwise the tl kernels' (``SWIGLU_GLUON=0``) but the
    routing-weight gradient, whose partial sums add in another order (fp32: within 1e-5 of its
    largest value); "limited": balanced with a ``swiglu_limit`` clamping about a third of the values,
    "limited_alpha" with MiniMax-M3's ``swiglu_alpha`` too."""
    from swiglu.kernels.devices import gluon_unavailable_reason

    if (why := gluon_unavailable_reason(torch.device("cuda"))) is not None:
        pytest.skip(why)
    T, H, I, E, k = 1000, 4096, 1536, 32, 4
    plan = kmoe.moe_plan(T * k, E, H, I, True)
    assert plan.up.GLUON and plan.dswiglu.GLUON and plan.wgrad_gu.GLUON and plan.wgrad_dp.GLUON
    seed = fresh_seed()
    inp = make_moe(seed, T, H, I, E, k, kind="balanced" if kind.startswith("limited") else kind, device="cuda")
    limit = binding_limit(inp) if kind.startswith("limited") else None
    act = {"swiglu_limit": limit, "swiglu_alpha": 1.702 if kind == "limited_alpha" else None}
    got = run(inp, "triton", **act)
    if limit is not None:
        assert not torch.equal(got[0], run(inp, "triton")[0]), f"seed={seed}: the limit clamped nothing"
    monkeypatch.setenv("SWIGLU_GLUON", "0")
    swiglu.ops.clear_plans()  # the Gluon decision is cached per device
    try:
        want = run(inp, "triton", **act)
    finally:
        monkeypatch.undo()
        swiglu.ops.clear_plans()
    for name, a, b in zip(NAMES, got, want):
        if name == "grad_top_k_weights":  # fp32 sums of I products: an ulp-level difference, far below a 0.1% bug
            worst = ((a - b).abs().max() / b.abs().max()).item()
            assert worst <= 1e-5, f"seed={seed}: {name} differs by {worst:.2e} of its largest value"
        else:
            assert torch.equal(a, b), f"seed={seed}: {name} differs between the Gluon and tl kernels"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_second_gpu_while_the_first_is_current():
    """Tensors on cuda:1 while cuda:0 is current (a model spread over GPUs by device_map): the MoE
    op and the dense op's lean Triton path give each output and gradient bitwise as with cuda:1
    current (Triton launches on the current device: the ops switch to their tensors')."""
    dev = torch.device("cuda", 1)
    inp = make_moe(fresh_seed(), 300, 1024, 512, 8, 2, device=dev)
    t = swiglu.make_inputs(batch_size=1, seq_len=300, hidden_size=1024, intermediate_size=512, device=dev, seed=fresh_seed())

    def dense():
        x = t.x.clone().requires_grad_()
        ws = [w.clone().requires_grad_() for w in (t.gate_weight, t.up_weight, t.down_weight)]
        out = swiglu.swiglu_mlp(x, *ws, impl="triton", save_activated_gate=False)
        out.backward(t.grad_output)
        return [out, x.grad, *(w.grad for w in ws)]

    with torch.cuda.device(dev):
        want = run(inp, "triton") + tuple(dense())
    with torch.cuda.device(0):
        got = run(inp, "triton") + tuple(dense())
        torch.cuda.synchronize(dev)
    assert all(a.device == dev and torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("form", ["copy", "gather_a", "gather_b"])
def test_weight_gradients_stop_at_each_experts_last_row(form):
    """The ping-pong weight gradients read all S rows through one descriptor per operand and zero
    the rows past each expert's end in its last K step: experts of 0, 1, 15, 16, 17, ..., 130 rows (every kind
    of last step: none, inside a 16-row piece, on a piece's end, a whole step), the odd experts'
    first rows infinite in one operand (a's and b's in turn), so an even expert's finite gradient
    turns inf or NaN if its last box lets the next expert's row in, whichever operand's rows a
    kernel forgot to zero. Bitwise the tl kernel (``SWIGLU_GLUON``'s fallback, whose loads
    mask rows past the expert), inf and NaN where it has them; the lab's kernel on host descriptors
    without the zeroing (``HOST`` 1: an expert's last box takes the next expert's rows) must fail
    the same comparison."""
    from swiglu.kernels.devices import gluon_unavailable_reason
    from swiglu_lab.experiments import moe_wgrad_hostdesc

    if (why := gluon_unavailable_reason(torch.device("cuda"))) is not None:
        pytest.skip(why)
    counts = [0, 1, 15, 16, 17, 31, 32, 48, 63, 64, 65, 127, 128, 130, 0, 47]
    E, M, N, k = len(counts), 256, 256, 1  # N: a 192-column tile and one past N's end; k = 1: a token in one expert
    seed = fresh_seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    idx = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)]).cuda()
    idx = idx[torch.randperm(len(idx), device="cuda", generator=gen)].reshape(-1, k)
    r = kmoe.Routing(idx.contiguous(), E)
    S, T = idx.numel(), idx.shape[0]
    src = {n: torch.randn(T, w, device="cuda", generator=gen).bfloat16() for n, w in (("a", M), ("b", N))}
    start = r.expert_start.tolist()
    for e in range(1, E, 2):  # odd experts' first rows' tokens infinite in one source, a's and b's in turn
        src["ab"[e // 2 % 2]][r.order[start[e]] // k] = float("inf")
    rows = {n: kmoe.gather_rows(t, r, k) for n, t in src.items()}
    a = kmoe.TokenRows(src["a"], k) if form == "gather_a" else rows["a"]
    b = kmoe.TokenRows(src["b"], k) if form == "gather_b" else rows["b"]
    gl_tile = kmoe.moe_plan(S, E, N, M // 2, True).wgrad_gu
    tl_tile = kmoe.moe_plan(S, E, N, M // 2, False).wgrad_gu
    assert not tl_tile.GLUON
    got, want = (torch.full((E, M, N), float("nan"), device="cuda").bfloat16() for _ in range(2))
    kmoe.launch_wgrad(want, rows["a"], rows["b"], r, tl_tile)
    wg = kmoe._gluon().wgrad

    def same(x, y):
        return torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(0), y.nan_to_num(0))

    assert torch.isinf(want[1::2]).any() and torch.isfinite(want[::2]).all(), f"seed={seed}: the test's own setup"
    assert gl_tile.GLUON and (wg.supports(got, rows["a"], rows["b"]) if form == "copy" else wg.supports_gather(got, a, b))
    # One program per SM (64 tiles: one each), and three programs walking ~21 tiles each through
    # both warpgroups and a ring that wraps onto zeroed stages; one and two chunk buffers.
    for programs, chunks in ((None, 2), (3, 2), (3, 1)):
        got.fill_(float("nan"))
        if form == "copy":
            wg.launch_moe_wgrad_pingpong(got, a, b, r.expert_start, wg.CONFIGS[chunks], num_programs=programs)
        else:
            wg.launch_moe_wgrad_gather(got, a, b, r, wg.GATHER_CONFIGS[chunks], num_programs=programs)
        assert same(got, want), f"seed={seed}: {form}, {programs or 'one per SM'} programs, {chunks} chunk buffers"
    uncut = torch.full_like(got, float("nan"))
    moe_wgrad_hostdesc.launch(uncut, a, b, r, host=1, store=True)
    assert not same(uncut, want), f"seed={seed}: the uncut loader passed the check"
