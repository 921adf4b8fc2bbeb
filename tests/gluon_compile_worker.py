"""Compile Gluon kernels for sm_90 (the subprocess of ``compile_report`` in tests/gluon_workers.py; no GPU).

    gluon_compile_worker.py OUT.json [wgrad | dswiglu [INDEX ...] | grad_x | moe_wgrad | moe_up | moe_dswiglu | moe_pairs]

wgrad (the default): the weight-gradient kernel's table configs (``backward.GLUON_CONFIGS``), each
also with the other ``defer`` (epilogue after the next tile's first wgmma, or before), the
ping-pong kernel's candidates (``candidates.PINGPONG_CANDIDATES``, ``WIDE_CANDIDATES``), the
first table config and first wide candidate with PDL modes 1 and 2; then, by the lab's copy of the
kernel with the probes' and tests' switches (``swiglu_lab.experiments.gluon_wgrad_probe``), two
wide candidates with the tests' storer delay, the first cooperative table config with the probes'
ablations (ABLATE 1-6) and st.global stores (PLAIN_STORE), and each table config (PDL modes 0-2)
with every switch off, whose PTX (debug lines aside) must be the library kernel's
(``probe_ptx_same``). A config only the lab's copy runs (``GluonConfig.lab_only``: a cooperative
table config deferred, the wide cooperative candidates, the ping-pong ones with the storer warp) is
compiled by it.
grad_x: the lab kernel's grad_x orientation (``A_KMAJOR``), its candidates
(``candidates.GRAD_X_CANDIDATES``), the first also with PDL modes 1 and 2.
dswiglu: the experimental dSwiGLU kernel's candidates (``candidates.DSWIGLU_CANDIDATES``, all or the given
indices), each with and without RECOMPUTE_ACT, plus config 0 with T = 1 (the launch specializes an
int argument equal to 1 as a constexpr).
moe_wgrad: the library's MoE weight gradient over all experts (``swiglu.kernels.moe_gluon_wgrad_pingpong``)
at its config, with 32-deep k-steps and gathering either operand; the lab's cooperative one
(``swiglu_lab.experiments.moe_gluon_wgrad_cooperative``) at its config and at three stages with one output buffer.
moe_up: the library's MoE up projection with SwiGLU (``swiglu.kernels.moe_gluon_up``) at its config
and with N tiles in bands of 8 M tiles (GROUP_M 8); the lab's one gathering x's rows itself
(``swiglu_lab.experiments.moe_gluon_up_gather``) at its config.
moe_dswiglu: the library's MoE dSwiGLU GEMM (``swiglu.kernels.moe_gluon_dswiglu``) at its config,
with fp32 and bf16 routing weights; the lab's one gathering grad_out's rows itself
(``swiglu_lab.experiments.moe_gluon_dswiglu_gather``) at its config; the lab's ping-pong one
(``moe_gluon_dswiglu_pingpong``) at its config and its cooperative 256 x 128 form.
moe_pairs: the lab's MoE down-projection-shaped GEMM (``swiglu_lab.experiments.moe_gluon_pairs``), as the
forward's down projection (B transposed, the routing weight) and as grad_x's pieces, and at BN 256;
its ping-pong form (``moe_gluon_pairs_pingpong``) in both roles.

Run with a triton of ``devices.GLUON_TRITONS`` first on PYTHONPATH (make test-gpu-triton installs the GPU machine's
3.6.0 under .venv/triton-3.6.0) and src/ after it. Writes ``{"triton": version, "results": [...]}``
(one entry per compile: shared memory, registers, spills, key PTX instructions) to OUT.json.
``candidates``: ``swiglu_lab.experiments.candidates``, the lists the probes measure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from swiglu.kernels import (
    gluon_dswiglu,
    gluon_wgrad,
    moe_gluon_dswiglu,
    moe_gluon_up,
    moe_gluon_wgrad_pingpong,
)
from swiglu.kernels.backward import GLUON_CONFIGS
from swiglu_lab.experiments import (
    candidates,
    gluon_wgrad_probe,
    gluon_wgrad_resident,
    moe_gluon_dswiglu_gather,
    moe_gluon_pairs,
    moe_gluon_dswiglu_pingpong,
    moe_gluon_pairs_pingpong,
    moe_gluon_up_gather,
    moe_gluon_wgrad_cooperative,
)

from compile_worker import pdl_report  # noqa: E402 (this file's folder is on sys.path when run)


def desc(block):
    return f"tensordesc<bf16{list(block)},{gluon_wgrad._layout(tuple(block))!r}>"


# Triton runs ptxas -v for the cubin and prints its log when asked: ``compile_sm90`` keeps it, so
# registers and spills are those of the cubin Triton built, without running ptxas a second time.
triton.knobs.nvidia.dump_ptxas_log = True
#: Triton's ptxas log of each compile of this process, by PTX text.
PTXAS_LOGS: dict[str, str] = {}


def ptxas_info(ptx: str) -> tuple[int | None, int | None]:
    """(registers, spill-store bytes) from ptxas -v (the metadata has them only after loading on a GPU):
    Triton's log of the compile, or ptxas run on ``ptx`` where there is none (a cache hit)."""
    try:
        info = PTXAS_LOGS.get(ptx)
        if info is None:
            from triton.backends.nvidia.compiler import get_ptxas

            with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                f.write(ptx)
            info = subprocess.run(
                [get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True
            ).stderr
            os.unlink(f.name)
        return int(re.search(r"Used (\d+) registers", info).group(1)), int(re.search(r"(\d+) bytes spill stores", info).group(1))
    except Exception:
        return None, None


def strip_debug(ptx: str) -> str:
    """``ptx`` without its debug lines (.loc, .file, the debug sections, their labels): what two
    compiles of the same code from different source files or lines share."""
    lines = []
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section") and ".debug" in s:
            break  # the debug sections come last
        if not (s.startswith((".loc", ".file")) or re.fullmatch(r"\$L__tmp\d+:", s)):
            lines.append(line)
    return "\n".join(lines)


def compile_sm90(kernel, sig: dict, constexprs: dict, attrs, entry: dict, num_warps: int, maxnreg: int):
    """(the compiled kernel, None), or (None, ``entry`` with the error, which the test reports per
    config): ``kernel`` compiled for sm_90 with ``sig`` and ``constexprs``."""
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):  # Triton prints the ptxas log (dump_ptxas_log)
            k = triton.compile(
                GluonASTSource(kernel, sig, constexprs, attrs),
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": num_warps, "maxnreg": maxnreg},
            )
    except Exception as err:  # reported per config; the test fails on it with the message
        return None, {**entry, "error": f"{type(err).__name__}: {err}"[-4000:]}
    if "Used" in log.getvalue():
        PTXAS_LOGS[k.asm["ptx"]] = log.getvalue()
    return k, None


def aligned(kernel, names) -> dict:
    """Specialization attributes: the named arguments divisible by 16, as a launch at the model
    shapes has them (16-byte aligned pointers, sizes and strides multiples of 16)."""
    return {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}


def compile_one(
    cfg,
    pdl: int = 0,
    grad_x: bool = False,
    store_delay_ns: int = 0,
    ablate: int = 0,
    plain_store: int = 0,
    probe: bool = False,
    compare: bool = False,
) -> dict:
    """``cfg``'s compile by the library's kernel, or with a switch given (or ``probe``) by the lab's
    copy with the switches (``gluon_wgrad_probe``). ``compare``: also the other kernel with every
    switch off, whether the two PTX texts are the same (``probe_ptx_same``)."""
    plain_store = int(plain_store or cfg.plain_store)
    # The lab's copy too for what only it runs (GluonConfig.lab_only: a deferred or wide cooperative tile).
    probe = probe or cfg.lab_only or bool(grad_x or store_delay_ns or ablate or plain_store)
    kernel = (gluon_wgrad_probe if probe else gluon_wgrad).wgrad_kernel
    a_block = [cfg.BM, cfg.BK] if grad_x else [cfg.BK, cfg.BM]
    sig = {"a_desc": desc(a_block), "b_desc": desc([cfg.BK, cfg.BN]), "c_desc": desc([cfg.BM, cfg.BN])}
    constexprs = {
        "GROUP_M": cfg.GROUP_M,
        "STAGES": cfg.STAGES,
        "NC": cfg.NC,
        "LOAD_REGS": cfg.load_regs,
        "STORE_REGS": cfg.store_regs,
    }
    # Every constexpr given, defaults too: triton 3.7 binds a signature without them wrongly.
    constexprs.update(
        {
            "PINGPONG": cfg.pingpong,
            "MMA_REGS": (cfg.mma_regs or cfg.maxnreg) if cfg.pingpong else 0,
            "BN2": cfg.BN2,
        }
    )
    if cfg.BN2:
        sig.update({"b2_desc": desc([cfg.BK, cfg.BN2]), "c2_desc": desc([cfg.BM, cfg.BN2])})
    else:
        constexprs.update({"b2_desc": None, "c2_desc": None})
    if probe:  # the switches, off unless given
        constexprs["DEFER"] = False if cfg.pingpong else cfg.defer
        constexprs["A_KMAJOR"] = grad_x
        constexprs["STORE_DELAY_NS"] = store_delay_ns
        constexprs["ABLATE"] = ablate
        if grad_x:
            sig.update({"a2_desc": desc(a_block), "bk2_desc": desc([cfg.BK, cfg.BN])})
        else:
            constexprs.update({"a2_desc": None, "bk2_desc": None})
        constexprs["PLAIN_STORE"] = plain_store
        if not plain_store:
            constexprs["out_ptr"] = None
    constexprs["PDL"] = pdl  # 0: the default launch (launch.PDL)
    constexprs["WG_STORE"] = cfg.wg_store
    sig.update({k: "constexpr" for k in constexprs})
    if plain_store:
        sig["out_ptr"] = "*bf16"
    entry = {
        "config": cfg.__dict__,
        "pdl": pdl,
        "grad_x": grad_x,
        "store_delay_ns": store_delay_ns,
        "ablate": ablate,
        "plain_store": plain_store,
        "probe": probe,
    }
    # out_ptr as a launch specializes it: 16-byte aligned (every launcher's outputs are).
    attrs = aligned(kernel, ("out_ptr",)) if plain_store else None
    k, failed = compile_sm90(kernel, sig, constexprs, attrs, entry, 4 if cfg.pingpong else cfg.num_warps, cfg.maxnreg)
    if failed:
        return failed
    report = wgrad_report(k, entry)
    if compare:
        other = compile_one(cfg, pdl, probe=not probe)
        report["probe_ptx_same"] = other["error"] is None and other["ptx"] == report["ptx"]
    return report


def wgrad_report(k, entry: dict) -> dict:
    """A compiled weight-gradient kernel's entry: ``entry`` with shared memory, registers,
    spills and its key PTX instructions."""
    ptx = k.asm["ptx"]
    regs, spills = ptxas_info(ptx)
    return {
        **entry,
        "error": None,
        **pdl_report(ptx),
        "shared": k.metadata.shared,
        "regs": regs,
        "spills": spills,
        "wgmma": ptx.count("wgmma.mma_async"),
        "tma_store": ptx.count("cp.async.bulk.tensor.2d.global.shared"),
        "tma_load": ptx.count("cp.async.bulk.tensor.2d.shared"),
        "setmaxnreg": ptx.count("setmaxnreg"),
        "st_global": ptx.count("st.global"),
        # The gathering loaders' 16-byte copies, their barrier arrivals and the MMAs' proxy fences.
        "cp_async": ptx.count("cp.async.cg.shared.global") + ptx.count("cp.async.ca.shared.global"),
        "cp_async_arrive": ptx.count("cp.async.mbarrier.arrive"),
        "fence_proxy_async": ptx.count("fence.proxy.async"),
        "min_max": ptx.count("min.f32") + ptx.count("max.f32"),  # the swiglu_limit's clamp
        "ptx_sha": hashlib.sha256(strip_debug(ptx).encode()).hexdigest(),
        "ptx": strip_debug(ptx),
    }


def compile_resident(cfg, pdl: int = 0) -> dict:
    """``swiglu_lab.experiments.gluon_wgrad_resident``'s kernel at ``cfg``, reported as ``compile_one`` does."""
    sig = {"a_desc": desc([cfg.BK, cfg.BM]), "b_desc": desc([cfg.BK, cfg.BN]), "c_desc": desc([cfg.BM, cfg.BN])}
    constexprs = {
        "KT": cfg.resident_k // cfg.BK,
        "STAGES": cfg.STAGES,
        "NC": cfg.NC,
        "LOAD_REGS": cfg.load_regs,
        "STORE_REGS": cfg.store_regs,
        "GROUP": cfg.GROUP_M,
        "DEFER": cfg.defer,
        "PDL": pdl,
    }
    sig.update({k: "constexpr" for k in constexprs})
    entry = {"config": cfg.__dict__, "pdl": pdl, "grad_x": False, "store_delay_ns": 0, "ablate": 0, "probe": False}
    k, failed = compile_sm90(gluon_wgrad_resident.wgrad_resident_kernel, sig, constexprs, None, entry, cfg.num_warps, cfg.maxnreg)
    return failed or wgrad_report(k, entry)


def compile_moe_wgrad(cfg, gather: int = 0) -> dict:
    """The MoE weight-gradient kernel of ``cfg``: the library's ping-pong one at a ``pingpong`` cfg
    (``gather``: its GATHER; its operands through host descriptors), else the lab's cooperative one
    (descriptors made on the device). Pointers 16-byte aligned, M, N and the row strides multiples
    of 16, as at the model shapes; reported as ``compile_one`` does, with its global scratch and
    descriptor fences (the lab kernel's device-side descriptors; none in the ping-pong one)."""
    constexprs = {"GROUP_M": cfg.GROUP_M, "STAGES": cfg.STAGES, "LOAD_REGS": cfg.load_regs}
    if cfg.pingpong:
        kernel = moe_gluon_wgrad_pingpong.moe_wgrad_pingpong_kernel
        constexprs.update({"WG_STORE": cfg.wg_store, "MMA_REGS": cfg.mma_regs or cfg.maxnreg, "TOP_K": 8, "GATHER": gather})
        sig = {
            "a_desc": desc([cfg.BK, cfg.BM]),
            "b_desc": desc([cfg.BK, cfg.BN]),
            "b2_desc": desc([cfg.BK, cfg.BN2]),
            "start_ptr": "*i32",
            "c_desc": desc([cfg.BM, cfg.BN2]),
        }
        sig.update({n: "i32" for n in ("E", "M", "N")})
        sig.update({"src_ptr": "*bf16", "pair_order": "*i32", "stride_src": "i32"})
        aligned_args = ("start_ptr", "M", "N", "src_ptr", "pair_order", "stride_src")
    else:
        kernel = moe_gluon_wgrad_cooperative.moe_wgrad_gluon_kernel
        constexprs.update({"BK": cfg.BK, "NC": cfg.NC, "STORE_REGS": cfg.store_regs})
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "start_ptr": "*i32", "c_desc": desc([cfg.BM, cfg.BN])}
        sig.update({n: "i32" for n in ("E", "M", "N", "stride_a", "stride_b")})
        aligned_args = ("a_ptr", "b_ptr", "start_ptr", "M", "N", "stride_a", "stride_b")
    sig.update({k: "constexpr" for k in constexprs})
    attrs = aligned(kernel, aligned_args)
    entry = {"config": cfg.__dict__, "kind": "moe_wgrad", "gather": gather}
    k, failed = compile_sm90(kernel, sig, constexprs, attrs, entry, cfg.num_warps, cfg.maxnreg)
    if failed:
        return failed
    report = wgrad_report(k, entry)
    report["global_scratch"] = getattr(k.metadata, "global_scratch_size", None)
    report["tensormap_fence"] = report["ptx"].count("fence.proxy.tensormap")
    return report


def epilogue_constexprs(cfg) -> dict:
    """The constexprs the lab's MoE up, dSwiGLU and pairs kernels take from their configs."""
    return {
        "GROUP_M": cfg.GROUP_M,
        "STAGES": cfg.STAGES,
        "EPI_M": cfg.EPI_M,
        "EPI_WARPS": cfg.epi_warps,
        "LOAD_REGS": cfg.load_regs,
        "EPI_REGS": cfg.epi_regs,
    }


def compile_moe_up(cfg, limit: float | None = None, alpha: float | None = None) -> dict:
    """``swiglu.kernels.moe_gluon_up``'s kernel at ``cfg`` (pointers 16-byte aligned, I a
    multiple of 16, as at the model shapes; ``limit``, ``alpha``: its LIMIT, ALPHA), reported as
    ``compile_one`` does."""
    kernel = moe_gluon_up.moe_up_gluon_kernel
    sig = {"xs_desc": desc([cfg.BM, cfg.BK]), "w_desc": desc([cfg.BN, cfg.BK]), "table_ptr": "*i32"}
    sig.update({n: "*bf16" for n in ("gate_ptr", "up_ptr", "h_ptr")})
    sig.update({n: "i32" for n in ("E", "I", "MAX_M")})
    constexprs = {**epilogue_constexprs(cfg), "LIMIT": limit, "ALPHA": alpha}
    sig.update({k: "constexpr" for k in constexprs})
    attrs = aligned(kernel, ("table_ptr", "gate_ptr", "up_ptr", "h_ptr", "I"))
    entry = {"config": cfg.__dict__, "kind": "moe_up", "limit": limit, "alpha": alpha}
    k, failed = compile_sm90(kernel, sig, constexprs, attrs, entry, cfg.num_warps, cfg.maxnreg)
    return failed or wgrad_report(k, entry)


def compile_moe_up_gather(cfg) -> dict:
    """The lab's gathering MoE up projection (``swiglu_lab.experiments.moe_gluon_up_gather``) at
    ``cfg`` with top-k 8 (x's row stride a multiple of 16, as the launcher requires)."""
    kernel = moe_gluon_up_gather.moe_up_gather_kernel
    sig = {"xs_desc": desc([cfg.BM, cfg.BK]), "w_desc": desc([cfg.BN, cfg.BK]), "table_ptr": "*i32"}
    sig.update({n: "*bf16" for n in ("gate_ptr", "up_ptr", "h_ptr", "x_ptr")})
    sig.update({"order_ptr": "*i32"})
    sig.update({n: "i32" for n in ("E", "I", "MAX_M", "stride_x")})
    constexprs = {"TOP_K": 8, **epilogue_constexprs(cfg)}
    sig.update({k: "constexpr" for k in constexprs})
    attrs = aligned(kernel, ("table_ptr", "gate_ptr", "up_ptr", "h_ptr", "I", "x_ptr", "order_ptr", "stride_x"))
    entry = {"config": cfg.__dict__, "kind": "moe_up_gather"}
    k, failed = compile_sm90(kernel, sig, constexprs, attrs, entry, cfg.num_warps, cfg.maxnreg)
    return failed or wgrad_report(k, entry)


def compile_moe_dswiglu(cfg, weights: str, gather: bool = False, limit: float | None = None, alpha: float | None = None) -> dict:
    """``swiglu.kernels.moe_gluon_dswiglu``'s kernel at ``cfg`` with routing weights of
    ``weights`` ("fp32", "bf16"), ``limit`` and ``alpha`` (its LIMIT, ALPHA), or with ``gather`` the lab's one
    gathering grad_out's rows itself (``swiglu_lab.experiments.moe_gluon_dswiglu_gather``, top-k
    8), reported as ``compile_one`` does."""
    kernel = moe_gluon_dswiglu_gather.moe_dswiglu_gather_kernel if gather else moe_gluon_dswiglu.moe_dswiglu_gluon_kernel
    sig = {"gos_desc": desc([cfg.BM, cfg.BK]), "dp_desc": desc([cfg.BK, cfg.BN]), "table_ptr": "*i32", "order_ptr": "*i32"}
    sig["rw_ptr"] = "*" + weights
    sig.update({n: "*bf16" for n in ("gate_ptr", "up_ptr", "dgu_ptr", "hw_ptr")})
    sig["part_ptr"] = "*fp32"
    sig.update({n: "i32" for n in ("E", "H", "I", "MAX_M")})
    names = ("table_ptr", "order_ptr", "rw_ptr", "gate_ptr", "up_ptr", "dgu_ptr", "hw_ptr", "part_ptr", "H", "I")
    constexprs = epilogue_constexprs(cfg)
    if gather:
        sig.update({"go_ptr": "*bf16", "stride_go": "i32"})
        constexprs = {"TOP_K": 8, **constexprs}
        names += ("go_ptr", "stride_go")
    else:
        constexprs.update(LIMIT=limit, ALPHA=alpha)
    sig.update({k: "constexpr" for k in constexprs})
    attrs = aligned(kernel, names)
    kind = "moe_dswiglu_gather" if gather else "moe_dswiglu"
    entry = {"config": cfg.__dict__, "kind": kind, "weights": weights, "limit": limit, "alpha": alpha}
    k, failed = compile_sm90(kernel, sig, constexprs, attrs, entry, cfg.num_warps, cfg.maxnreg)
    return failed or wgrad_report(k, entry)


def compile_moe_pairs(cfg, transposed: bool) -> dict:
    """``swiglu_lab.experiments.moe_gluon_pairs``'s kernel at ``cfg``, as the down projection
    (``transposed``) or grad_x's pieces, reported as ``compile_one`` does."""
    kernel = moe_gluon_pairs.moe_pairs_gluon_kernel
    w_block = [cfg.BN, cfg.BK] if transposed else [cfg.BK, cfg.BN]
    sig = {"a_desc": desc([cfg.BM, cfg.BK]), "w_desc": desc(w_block), "table_ptr": "*i32", "order_ptr": "*i32"}
    sig.update({"rw_ptr": "*fp32", "y_ptr": "*bf16"})
    sig.update({n: "i32" for n in ("E", "N", "K", "MAX_M")})
    constexprs = {"B_TRANS": transposed, **epilogue_constexprs(cfg)}
    sig.update({k: "constexpr" for k in constexprs})
    attrs = aligned(kernel, ("table_ptr", "order_ptr", "rw_ptr", "y_ptr", "N", "K"))
    entry = {"config": cfg.__dict__, "kind": "moe_pairs", "transposed": transposed}
    k, failed = compile_sm90(kernel, sig, constexprs, attrs, entry, cfg.num_warps, cfg.maxnreg)
    return failed or wgrad_report(k, entry)


def compile_moe_pairs_pingpong(cfg, transposed: bool) -> dict:
    """``swiglu_lab.experiments.moe_gluon_pairs_pingpong``'s kernel at ``cfg`` (E_PAD 256: 128
    experts), as the down projection (``transposed``) or grad_x's pieces, reported as ``compile_one`` does."""
    kernel = moe_gluon_pairs_pingpong.moe_pairs_pingpong_kernel
    w_block = [cfg.BN, cfg.BK] if transposed else [cfg.BK, cfg.BN]
    sig = {"a_desc": desc([cfg.BM, cfg.BK]), "w_desc": desc(w_block), "start_ptr": "*i32", "table_ptr": "*i32"}
    sig.update({"order_ptr": "*i32", "rw_ptr": "*fp32", "y_ptr": "*bf16"})
    sig.update({n: "i32" for n in ("E", "N", "K", "MAX_M")})
    constexprs = {"B_TRANS": transposed, "GROUP_M": cfg.GROUP_M, "STAGES": cfg.STAGES, "E_PAD": 256}
    constexprs.update({"LOAD_REGS": cfg.load_regs, "MMA_REGS": cfg.mma_regs})
    sig.update({k: "constexpr" for k in constexprs})
    attrs = aligned(kernel, ("start_ptr", "table_ptr", "order_ptr", "rw_ptr", "y_ptr", "N", "K"))
    entry = {"config": cfg.__dict__, "kind": "moe_pairs_pingpong", "transposed": transposed}
    k, failed = compile_sm90(kernel, sig, constexprs, attrs, entry, 4, cfg.maxnreg)
    return failed or wgrad_report(k, entry)


def compile_moe_dswiglu_pingpong(cfg) -> dict:
    """``swiglu_lab.experiments.moe_gluon_dswiglu_pingpong``'s kernel at ``cfg`` (E_PAD 256: 128
    experts), fp32 routing weights, reported as ``compile_one`` does."""
    kernel = moe_gluon_dswiglu_pingpong.moe_dswiglu_pingpong_kernel
    if cfg.BM == 256:
        kernel = moe_gluon_dswiglu_pingpong.moe_dswiglu_coop_kernel
    sig = {"gos_desc": desc([cfg.BM, cfg.BK]), "dp_desc": desc([cfg.BK, cfg.BN])}
    sig.update({n: "*i32" for n in ("start_ptr", "table_ptr", "order_ptr")})
    sig.update({"rw_ptr": "*fp32", "gate_ptr": "*bf16", "up_ptr": "*bf16", "dgu_ptr": "*bf16", "hw_ptr": "*bf16"})
    sig.update({"part_ptr": "*fp32", **{n: "i32" for n in ("E", "H", "I", "MAX_M")}})
    constexprs = {"GROUP_M": cfg.GROUP_M, "STAGES": cfg.STAGES, "EPI_M": cfg.EPI_M, "E_PAD": 256}
    constexprs.update({"LOAD_REGS": cfg.load_regs, "MMA_REGS": cfg.mma_regs})
    sig.update({k: "constexpr" for k in constexprs})
    names = ("start_ptr", "table_ptr", "order_ptr", "rw_ptr", "gate_ptr", "up_ptr", "dgu_ptr", "hw_ptr", "part_ptr", "H", "I")
    attrs = aligned(kernel, names)
    entry = {"config": cfg.__dict__, "kind": "moe_dswiglu_pingpong", "weights": "fp32", "limit": None, "alpha": None}
    k, failed = compile_sm90(kernel, sig, constexprs, attrs, entry, 4, cfg.maxnreg)
    return failed or wgrad_report(k, entry)


def compile_dswiglu(index: int, recompute: bool, t_is_one: bool = False, pdl: int = 0) -> dict:
    cfg = candidates.DSWIGLU_CANDIDATES[index]
    sig = {"go_desc": desc([cfg.BM, cfg.BK]), "down_desc": desc([cfg.BK, cfg.BN])}
    sig.update({p: "*bf16" for p in ("gate_ptr", "up_ptr", "act_ptr", "dgate_ptr", "dup_ptr", "h_ptr")})
    sig.update({s: "i32" for s in ("T", "I", "stride_in", "stride_out")})
    constexprs = {
        "GROUP_M": cfg.GROUP_M,
        "STAGES": cfg.STAGES,
        "NG": cfg.NG,
        "EPI_M": cfg.EPI_M,
        "EPI_N": cfg.EPI_N,
        "RECOMPUTE_ACT": recompute,
        "EPI_WARPS": cfg.epi_warps,
        "LOAD_REGS": cfg.load_regs,
        "EPI_REGS": cfg.epi_regs,
        "PDL": pdl,
    }
    if t_is_one:
        constexprs["T"] = 1
    sig.update({k: "constexpr" for k in constexprs})
    # As the launch at the full shapes: 16-aligned pointers, I and strides multiples of 16 (T too, unless 1).
    args = [n for n in gluon_dswiglu.dswiglu_gluon_kernel.arg_names if sig[n] in ("*bf16", "i32")]
    attrs = aligned(gluon_dswiglu.dswiglu_gluon_kernel, args)
    entry = {"index": index, "config": cfg.__dict__, "recompute": recompute, "T_is_one": t_is_one, "pdl": pdl}
    k, failed = compile_sm90(gluon_dswiglu.dswiglu_gluon_kernel, sig, constexprs, attrs, entry, cfg.num_warps, cfg.maxnreg)
    if failed:
        return failed
    ptx = k.asm["ptx"]
    regs, spills = ptxas_info(ptx)
    return {
        **entry,
        "error": None,
        "shared": k.metadata.shared,
        "regs": regs,
        "spills": spills,
        "wgmma": ptx.count("wgmma.mma_async"),
        "tma_load": ptx.count("cp.async.bulk.tensor.2d.shared"),
        "tma_store": ptx.count("cp.async.bulk.tensor.2d.global.shared"),
        "setmaxnreg": ptx.count("setmaxnreg"),
        "ld_global_v4": len(re.findall(r"ld\.global[.\w]*\.v4", ptx)),
        "st_global_v4": len(re.findall(r"st\.global[.\w]*\.v4", ptx)),
        **pdl_report(ptx),
    }


def main(path: str, kind: str = "wgrad", indices: list[int] | None = None) -> None:
    if kind == "wgrad":
        # Each table config as it is and with the other epilogue placement (deferred or not).
        table = list(dict.fromkeys(c for c in GLUON_CONFIGS.values() if c is not None))
        configs = list(
            dict.fromkeys(
                table
                + [dataclasses.replace(c, defer=not c.defer) for c in table]
                + list(candidates.PINGPONG_CANDIDATES)
                + list(candidates.WIDE_CANDIDATES)
            )
        )
        results = [compile_one(c, compare=c in table) for c in configs] + [
            compile_one(c, pdl, compare=c in table) for c in (table[0], candidates.WIDE_CANDIDATES[0]) for pdl in (1, 2)
        ]
        # The table's other configs with PDL modes 1 and 2, beside the lab's copy of the kernel.
        results += [compile_one(c, pdl, compare=True) for c in table[1:] for pdl in (1, 2)]
        # The tests' storer delay (STORE_DELAY_NS) on the ping-pong kernels with one and two output buffers.
        results += [compile_one(c, store_delay_ns=20000) for c in (candidates.WIDE_CANDIDATES[0], candidates.WIDE_CANDIDATES[3])]
        # The probes' ablations (ABLATE 1-6) on the first cooperative table config.
        cooperative = next(c for c in table if not c.pingpong)
        results += [compile_one(cooperative, ablate=a) for a in (1, 2, 3, 4, 5, 6)]
        # The probes' st.global epilogue (PLAIN_STORE 1) on it with one output buffer (the layout
        # conversion takes shared memory of its own) and a deeper ring.
        results += [compile_one(dataclasses.replace(cooperative, NC=1, STAGES=s), plain_store=1) for s in (4, 5)]
        results.append(compile_one(dataclasses.replace(cooperative, NC=1), plain_store=1, ablate=6))
        # ... and by the storer warp from the output buffers (PLAIN_STORE 2), as the table has them.
        results.append(compile_one(cooperative, plain_store=2))
        # The ping-pong MMA warpgroups storing their own chunks (wg_store), 64- and 32-deep k-steps.
        results += [
            compile_one(dataclasses.replace(candidates.WIDE_CANDIDATES[0], wg_store=2)),
            compile_one(dataclasses.replace(candidates.WIDE_CANDIDATES[2], STAGES=8, wg_store=2)),
        ]
        # The resident-A kernel's candidates (swiglu_lab.experiments.gluon_wgrad_resident), the first also deferred and with
        # PDL modes 1 and 2.
        results += [compile_resident(c) for c in gluon_wgrad_resident.RESIDENT_CANDIDATES]
        results.append(compile_resident(dataclasses.replace(gluon_wgrad_resident.RESIDENT_CANDIDATES[0], defer=True)))
        results += [compile_resident(gluon_wgrad_resident.RESIDENT_CANDIDATES[0], pdl) for pdl in (1, 2)]
    elif kind == "grad_x":
        results = [compile_one(c, grad_x=True) for c in candidates.GRAD_X_CANDIDATES] + [
            compile_one(candidates.GRAD_X_CANDIDATES[0], pdl, grad_x=True) for pdl in (1, 2)
        ]
    elif kind == "dswiglu":
        indices = range(len(candidates.DSWIGLU_CANDIDATES)) if not indices else indices
        results = [compile_dswiglu(i, r) for i in indices for r in (False, True)]
        if 0 in indices:
            results.append(compile_dswiglu(0, False, t_is_one=True))
            results += [compile_dswiglu(0, False, pdl=pdl) for pdl in (1, 2)]
    elif kind == "moe_wgrad":
        cfg = moe_gluon_wgrad_cooperative.CONFIG
        pp = moe_gluon_wgrad_pingpong.CONFIG
        configs = (cfg, dataclasses.replace(cfg, STAGES=3, NC=1), pp, dataclasses.replace(pp, BK=32, STAGES=8))
        results = [compile_moe_wgrad(c) for c in configs]
        # The ping-pong tile gathering A's rows (grad_down_proj's grad_out) or B's (grad_gate_up_proj's x).
        results += [compile_moe_wgrad(moe_gluon_wgrad_pingpong.GATHER_CONFIG, g) for g in (1, 2)]
        # One chunk buffer per warpgroup (the plan's at hidden_size <= 2048 and Mixtral's size).
        results += [
            compile_moe_wgrad(moe_gluon_wgrad_pingpong.CONFIGS[1]),
            compile_moe_wgrad(moe_gluon_wgrad_pingpong.GATHER_CONFIGS[1], 2),
        ]
    elif kind == "moe_up":
        cfg = moe_gluon_up.CONFIG
        results = [compile_moe_up(c) for c in (cfg, dataclasses.replace(cfg, GROUP_M=8))]
        results.append(compile_moe_up(cfg, limit=10.0))  # DeepSeek-V4 config default swiglu_limit
        results.append(compile_moe_up(cfg, limit=7.0, alpha=1.702))  # MiniMax-M3's
        results.append(compile_moe_up_gather(moe_gluon_up_gather.CONFIG))
    elif kind == "moe_dswiglu":
        results = [compile_moe_dswiglu(moe_gluon_dswiglu.CONFIG, w) for w in ("fp32", "bf16")]
        results.append(compile_moe_dswiglu(moe_gluon_dswiglu.CONFIG, "fp32", limit=10.0))
        results.append(compile_moe_dswiglu(moe_gluon_dswiglu.CONFIG, "fp32", limit=7.0, alpha=1.702))
        results.append(compile_moe_dswiglu(moe_gluon_dswiglu_gather.CONFIG, "fp32", gather=True))
        results.append(compile_moe_dswiglu_pingpong(moe_gluon_dswiglu_pingpong.CONFIG))
        results.append(compile_moe_dswiglu_pingpong(moe_gluon_dswiglu_pingpong.COOP_CONFIG))
    elif kind == "moe_pairs":
        cfg = moe_gluon_pairs.CONFIG
        wide = dataclasses.replace(cfg, BN=256, STAGES=3)
        results = [compile_moe_pairs(c, t) for c in (cfg, wide) for t in (True, False)]
        results += [compile_moe_pairs_pingpong(moe_gluon_pairs_pingpong.CONFIG, t) for t in (True, False)]
    else:
        raise SystemExit(f"unknown kernel {kind!r} (wgrad, grad_x, dswiglu, moe_wgrad, moe_up, moe_dswiglu or moe_pairs)")
    for r in results:  # the PTX text only for the comparison above
        r.pop("ptx", None)
    with open(path, "w") as f:
        json.dump({"triton": triton.__version__, "results": results}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "wgrad", [int(i) for i in sys.argv[3:]])
