"""The Gluon MoE kernels (``swiglu.kernels.moe_gluon_wgrad``, ``moe_gluon_wgrad_pingpong``,
``moe_gluon_up``, ``moe_gluon_dswiglu``, and the lab's ``swiglu_lab.experiments.moe_gluon_pairs``,
``moe_gluon_up_gather``, ``moe_gluon_dswiglu_gather`` and the ping-pong forms
``moe_gluon_pairs_pingpong``, ``moe_gluon_dswiglu_pingpong``): each
compiled for sm_90 with every Triton the Gluon kernels are written for (warp-specialized, its wgmma and TMA operations, no spills, shared
memory within the H200's block); the up projection's tile table (a tl kernel: run here under the
interpreter) against the grouped GEMM's tiles computed in Python; the plan's choice of them; the
library's launchers and the lab's ``install`` (the MoE bench's ``--lab-moe-gluon``) falling
back to the tl kernels where a Gluon kernel does not take the operands. A Gluon kernel does not run
under the interpreter: its values are checked on the GPU (tests/kernels/test_moe_gpu.py against
float64 and the tl kernels; ``lab/probes/moe_gluon_run.py`` kernel by kernel)."""

import dataclasses

import pytest
import torch

from gluon_workers import WHICH_TRITONS, _stop_unused_workers, compile_report  # noqa: F401 (an autouse fixture)
from moe_checks import make_moe, run

SM90_SHARED = 232448


def _tiles(expert_start, BM):
    """(expert, first row, end row) of each M tile: each expert's cdiv(count, BM) tiles in order."""
    out = []
    for e in range(len(expert_start) - 1):
        lo, hi = expert_start[e], expert_start[e + 1]
        out += [(e, r, hi) for r in range(lo, hi, BM)]
    return out


@pytest.mark.parametrize(
    "counts",
    [[5, 0, 17, 3], [0, 0, 0, 40], [1] * 9, [0, 33, 0, 0, 31, 0, 32, 1], [64, 64], [300, 0, 129, 47, 500, 1, 0, 64]],
    ids=["mixed", "one_expert", "ones", "gaps", "exact", "programs"],  # programs: 74 tiles, two programs of 64
)
def test_tile_table_lists_every_experts_m_tiles(counts):
    from swiglu.kernels import moe
    from swiglu.kernels import moe_gluon_up

    E, k, BM = len(counts), 1, 16
    idx = torch.cat([torch.full((c,), e) for e, c in enumerate(counts)])
    idx = idx[torch.randperm(len(idx), generator=torch.Generator().manual_seed(0))].reshape(-1, k)
    r = moe.Routing(idx, E)
    start = r.expert_start.tolist()
    assert start == [0] + torch.tensor(counts).cumsum(0).tolist()
    table = moe_gluon_up.tile_table(r, BM)
    max_m = -(-len(idx) // BM) + E
    assert table.shape == (3, max_m)
    want = _tiles(start, BM)
    got = [tuple(c) for c in table.T.tolist()]
    assert got[: len(want)] == want
    assert all(e >= E for e, _, _ in got[len(want) :])  # idle tiles


def _wgrad(r):
    assert r["wgmma"] > 0 and r["tma_load"] > 0 and r["tma_store"] > 0, r
    gather = r["gather"]
    if r["config"]["pingpong"]:
        # Host descriptors: no global scratch, no descriptor fence. The gathering forms copy the
        # gathered operand's [BK, 64] pieces by 16-byte cp.async (4 warps: 4 a piece per thread;
        # A 2 pieces, B 3), one arrival; TMA loads for the rest (as compiled by triton 3.6).
        assert not r["global_scratch"] and r["tensormap_fence"] == 0, r
        assert r["cp_async"] == (0, 8, 12)[gather] and r["cp_async_arrive"] == (0, 1, 1)[gather], r
        assert r["tma_load"] == (5, 2, 1)[gather], r
        return
    # The lab's cooperative kernel: its loader's descriptors in two slots of two (a, b), each 128
    # bytes, each with its fence.
    assert r["global_scratch"] >= 4 * 128 and r["tensormap_fence"] >= 4, r
    assert r["cp_async"] == 0 and r["cp_async_arrive"] == 0, r


def _up(r):
    # Two m64n128k16 wgmma chains (gate, up) of BK / 16 steps; three TMA loads (x, gate rows, up
    # rows), or (the lab's gathering kernel) two and x's rows by 16-byte cp.async (one warp: BM * BK
    # * 2 / 16 / 32 per thread) tracked by the stage's barrier, fenced before the wgmma.
    assert r["wgmma"] == 8, r
    if r["kind"] == "moe_up_gather":
        assert r["tma_load"] == 2 and r["cp_async"] == 32 and r["cp_async_arrive"] == 1, r
        assert r["fence_proxy_async"] >= 1, r
    else:
        assert r["tma_load"] == 3, r
    assert r["st_global"] > 0 and r["tma_store"] == 0, r  # masked pointer stores: rows past an expert's end stay unwritten


def _dswiglu(r):
    # One m64n128k16 wgmma chain (the lab's ping-pong and cooperative kernels: in each of two MMA
    # warpgroups, two m64 rows of its 128 rows); the B box split in two at the 128-byte swizzle, with A's; or (the
    # lab's gathering kernel) B's alone and A's rows by 16-byte cp.async (four warps: BM * BK * 2 /
    # 16 / 128 per thread), tracked by the stage's barrier, fenced before the wgmma.
    assert r["wgmma"] == (16 if r["kind"] == "moe_dswiglu_pingpong" else 4), r
    if r["kind"] == "moe_dswiglu_gather":
        assert r["tma_load"] == 1 and r["cp_async"] == 8 and r["cp_async_arrive"] == 1 and r["fence_proxy_async"] >= 1, r
    else:
        assert r["tma_load"] == 3, r
    assert r["st_global"] > 0 and r["tma_store"] == 0, r


def _pairs(r):
    # One m64nBNk16 wgmma chain (the forward's down projection and grad_x's pieces, BN 128 and 256);
    # the ping-pong form's in each of its two MMA warpgroups, two m64 rows of a 128-row tile each.
    assert r["wgmma"] == (16 if r["kind"] == "moe_pairs_pingpong" else 4) and r["tma_load"] >= 2, r
    assert r["st_global"] > 0 and r["tma_store"] == 0, r  # scattered rows: pointer stores


@pytest.mark.parametrize(
    "kind, compiles, check",
    [("moe_wgrad", 8, _wgrad), ("moe_up", 5, _up), ("moe_dswiglu", 7, _dswiglu), ("moe_pairs", 6, _pairs)],
    ids=["wgrad", "up", "dswiglu", "pairs"],
)
@pytest.mark.parametrize("which", WHICH_TRITONS)
def test_moe_gluon_kernels_compile_for_sm90(tmp_path_factory, which, kind, compiles, check):
    report = compile_report(tmp_path_factory, which, kind)
    assert len(report["results"]) == compiles
    for r in report["results"]:
        assert r["error"] is None, r["error"]
        assert r["setmaxnreg"] > 0, r
        check(r)
        assert r["spills"] in (0, None), r
        assert r["shared"] <= SM90_SHARED, r
    # With a swiglu_limit the epilogue clamps (min/max), beyond what the same kernel has without;
    # swiglu_alpha changes the epilogue's PTX beyond the limit's.
    plain = {r["kind"]: r["min_max"] for r in report["results"] if r.get("limit") is None}
    for r in report["results"]:
        if r.get("limit") is not None:
            assert r["min_max"] > plain[r["kind"]], (r["min_max"], plain)
    for r in report["results"]:
        if r.get("alpha") is not None:
            limited = [o for o in report["results"] if o["kind"] == r["kind"] and o.get("limit") and not o.get("alpha")]
            assert limited and all(o["ptx_sha"] != r["ptx_sha"] for o in limited), r["kind"]


def test_plan_takes_the_gluon_kernels_where_they_were_measured_faster(monkeypatch):
    """Gluon where it runs: the up projection and the (ping-pong) weight gradients at every shape,
    dSwiGLU at hidden_size >= 4096 (data/tuning/moe_gluon_20261205.log,
    moe_gluon_pingpong_gather_20261205.log); never the down projections; none where Gluon does not
    run (``moe_plan``'s ``gluon`` False, the default)."""
    from swiglu.kernels import moe

    monkeypatch.setattr(moe, "INTERPRET", False)  # the GPU's plan
    roles = ("up", "down", "dswiglu", "grad_x", "wgrad_gu", "wgrad_dp")
    gluon = {"up", "dswiglu", "wgrad_gu", "wgrad_dp"}
    # (roles on Gluon, grad_out's copy shared: only where it leaves the backward's peak as it was)
    for (H, I, E, k), (want, share) in {
        (2048, 768, 128, 8): ({"up", "wgrad_gu", "wgrad_dp"}, False),
        (4096, 1536, 128, 8): (gluon, True),
        (7168, 2048, 256, 8): (gluon, True),
        (4096, 14336, 8, 2): (gluon, False),
    }.items():
        plan = moe.moe_plan.__wrapped__(8192 * k, E, H, I, True)
        assert {r for r in roles if getattr(plan, r).GLUON} == want, (H, I)
        assert plan.share_grad_out_copy == share, (H, I)
        assert not any(getattr(moe.moe_plan.__wrapped__(8192 * k, E, H, I), r).GLUON for r in roles)


@pytest.mark.parametrize("needs", [(True, True, True, True), (True, True, True, False)], ids=["all", "no_grad_down_proj"])
def test_shared_grad_out_copy_gives_the_same_bits(needs):
    """A plan that shares grad_out's expert-order copy between dSwiGLU and grad_down_proj (here the
    tl kernels: dSwiGLU ignores the copy) gives every gradient bitwise as the plan's own."""
    from swiglu.kernels import moe

    inp = make_moe(0, 24, 128, 128, 4, 2)
    x, idx, w, gu, dp, go = inp.flat()
    out, gate, up, r = moe.moe_forward(x, idx, w, gu, dp)
    plan = moe.moe_plan(24 * 2, 4, 128, 128)
    assert not plan.share_grad_out_copy
    want = moe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan, r, needs)
    shared = dataclasses.replace(plan, share_grad_out_copy=True)
    got = moe.moe_backward(go, x, idx, w, gu, dp, gate, up, shared, r, needs)
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.equal(a, b)


def test_library_launchers_with_gluon_tiles_fall_back_bitwise(monkeypatch):
    """A plan whose every tile says Gluon, on operands the Gluon kernels do not take (here: CPU
    tensors at sizes they would take on a GPU): the tl kernels, the output and every gradient
    bitwise as with the plan's own tiles."""
    from swiglu.kernels import moe

    inp = make_moe(0, 24, 128, 128, 4, 2)
    want = run(inp, "triton")
    plain = moe.moe_plan
    monkeypatch.setattr(moe, "moe_plan", lambda *args: plain(*args[:4]).replace_tiles(GLUON=True))
    got = run(inp, "triton")
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "name, launcher",
    [
        ("pairs", "launch_pairs"),
        ("up_gather", "launch_up"),
        ("dswiglu_gather", "launch_dswiglu"),
    ],
)
def test_lab_install_routes_only_what_the_kernel_takes_and_undoes(name, launcher):
    """The lab's ``install`` (the bench's ``--lab-moe-gluon``) replaces the library's launcher (and
    for dswiglu_gather the plan, without a shared grad_out copy); operands the Gluon kernel does not
    take (here: CPU tensors, at sizes it would take on a GPU) go to the library's kernel: the output
    and every gradient bitwise as without it, ``swiglu.ops.clear_plans`` still works; the returned
    function restores what it replaced."""
    import importlib

    import swiglu
    from swiglu.kernels import moe

    lab = importlib.import_module(f"swiglu_lab.experiments.moe_gluon_{name}")
    inp = make_moe(0, 24, 128, 128, 4, 2)
    want = run(inp, "triton")
    library, plan = getattr(moe, launcher), moe.moe_plan
    undo = lab.install()
    try:
        assert getattr(moe, launcher) is not library
        swiglu.ops.clear_plans()  # works with what the install replaced
        got = run(inp, "triton")
    finally:
        undo()
    assert getattr(moe, launcher) is library
    assert moe.moe_plan is plan  # what an install replaced beside its launcher is restored too
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_gluon_decision_is_made_once_per_device_until_clear_plans(monkeypatch):
    """``moe._gluon_here`` asks ``gluon_unavailable_reason`` once per device (the hot path decides
    once); ``swiglu.ops.clear_plans`` forgets it (after changing ``SWIGLU_GLUON`` in-process)."""
    import swiglu
    from swiglu.kernels import moe

    calls = []
    monkeypatch.setattr(moe, "gluon_unavailable_reason", lambda device: calls.append(device) or "not here")
    swiglu.ops.clear_plans()
    inp = make_moe(0, 6, 32, 32, 4, 2)  # the decision does not depend on the shape: the smallest the kernels take
    run(inp, "triton")
    run(inp, "triton")
    assert len(calls) == 1, calls
    swiglu.ops.clear_plans()
    run(inp, "triton")
    assert len(calls) == 2, calls
    swiglu.ops.clear_plans()


@pytest.mark.parametrize("max_rows, gathers", [(3, False), (4, True)])
def test_wgrad_gathers_rows_only_up_to_its_rows_per_expert(monkeypatch, max_rows, gathers):
    """With the plan's Gluon weight gradients, ``launch_wgrad`` hands a ``TokenRows`` operand to the
    gathering ping-pong kernel only where the mean rows per expert (S / E, here 24 * 2 / 12 = 4) are
    at most ``GATHER_MAX_ROWS``; above, it copies the rows and runs the ping-pong kernel on the copy
    (CPU tensors here, the kernels replaced by recorders)."""
    from swiglu.kernels import moe
    from swiglu.kernels import moe_gluon_wgrad_pingpong as pp

    calls = []
    monkeypatch.setattr(pp, "GATHER_MAX_ROWS", max_rows)
    monkeypatch.setattr(pp, "supports_gather", lambda c, a, b: True)
    monkeypatch.setattr(pp, "supports", lambda c, a, b: True)
    monkeypatch.setattr(
        pp, "launch_moe_wgrad_gather", lambda c, a, b, r, cfg: calls.append(("gather", cfg.wg_store)) or c.zero_()
    )
    monkeypatch.setattr(
        pp,
        "launch_moe_wgrad_pingpong",
        lambda c, a, b, start, cfg: calls.append(("copy", type(a), type(b), cfg.wg_store)) or c.zero_(),
    )
    inp = make_moe(0, 24, 128, 128, 12, 2)
    r = moe.Routing(inp.top_k_index, 12)
    c = torch.empty(12, 128, 128, dtype=torch.bfloat16)
    for chunks in (1, 2):  # the plan's chunk buffers reach the kernel's config
        calls.clear()
        tile = moe.Tile(GLUON=True, CHUNKS=chunks)
        moe.launch_wgrad(c, moe.TokenRows(inp.x, 2), inp.x.new_empty(48, 128), r, tile)
        assert calls == ([("gather", chunks)] if gathers else [("copy", torch.Tensor, torch.Tensor, chunks)]), calls


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the recorders leave gate, up, h unwritten
@pytest.mark.parametrize("alpha", [None, 1.702])
def test_a_limited_call_hands_its_limit_to_the_gluon_kernels(monkeypatch, alpha):
    """With ``swiglu_limit`` (and ``swiglu_alpha``) the plan's Gluon up and dSwiGLU launchers are
    still taken, and get the limit rounded to bf16 (``bf16_limit``) and the alpha; here the
    launchers are recorded, not run (CPU)."""
    from types import SimpleNamespace

    from swiglu.kernels import moe

    seen = {}

    def recorder(name):
        return lambda *args, limit=None, alpha=None, **kwargs: seen.setdefault(name, (limit, alpha))

    fake = SimpleNamespace(
        up=SimpleNamespace(supports=lambda *a: True, CONFIG=moe._gluon().up.CONFIG, launch_moe_up_gluon=recorder("up")),
        dswiglu=SimpleNamespace(
            supports=lambda *a: True, CONFIG=moe._gluon().dswiglu.CONFIG, launch_moe_dswiglu_gluon=recorder("dswiglu")
        ),
        wgrad=moe._gluon().wgrad,
    )
    monkeypatch.setattr(moe, "_gluon", lambda: fake)
    inp = make_moe(0, 24, 128, 128, 4, 2)
    x, idx, w, gu, dp, go = inp.flat()
    plan = moe.moe_plan(24 * 2, 4, 128, 128)
    plan = dataclasses.replace(
        plan, up=dataclasses.replace(plan.up, GLUON=True), dswiglu=dataclasses.replace(plan.dswiglu, GLUON=True)
    )
    out, gate, up, r = moe.moe_forward(x, idx, w, gu, dp, plan, swiglu_limit=2.01, swiglu_alpha=alpha)
    moe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan, r, swiglu_limit=2.01, swiglu_alpha=alpha)
    assert seen == {"up": (2.015625, alpha), "dswiglu": (2.015625, alpha)}  # 2.01 rounded to bf16
