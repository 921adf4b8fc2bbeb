"""Compile-only check: every Triton kernel launch the package makes builds for sm_90 (H200).

No GPU needed: ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` runs the
whole pipeline (TTIR, TTGIR, LLVM, PTX, then ptxas to a cubin) on the CPU
(docs/triton-on-cpu.md). It catches what the interpreter lets through: shared memory
beyond the H200's 227 KiB opt-in limit (the OutOfResources seen on the GPU), dot shapes the
Hopper tensor cores (wgmma) cannot take, layout and lowering errors.

What gets compiled is recorded, not rewritten by hand: ``triton_swiglu_backward`` (and, for the
memory-lean mode, ``triton_swiglu_forward`` and the backward with activated_gate recomputed) runs
on full-size meta tensors (no memory, no compute) with its kernels replaced by recorders,
for every token count in ``CASES`` and one per token bucket, so block shapes, constexprs,
num_warps/num_stages and Triton's integer specialization are exactly what the launchers pass.
The distinct specializations are compiled in one subprocess (tests/compile_worker.py) without
``TRITON_INTERPRET`` (conftest sets it on CPU, and ``@triton.jit`` then yields interpreter
functions), with a fresh Triton cache and one thread per core: once with the installed Triton and
once more with the GPU machine's release when ``SWIGLU_EXTRA_TRITON_DIR`` names it (``make test-gpu-triton``
does). ``python tests/kernels/test_triton_compile.py`` prints the table.

The same compiles calibrate ``swiglu.kernels.shared_memory``'s estimate, which ``triton_swiglu_backward``
checks before launching: it must be at least Triton's figure for every launch of the table and
for calibration configs around it (compiled here but never launched by the table), and reject
exactly the configs that do not fit, among them an oversized example (279576 bytes).
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import subprocess
import sys
import time

import pytest
import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from swiglu.kernels import forward
from swiglu.kernels import tl_kernels as kernels
from swiglu.kernels import backward as triton_backward
from swiglu.kernels import devices
from swiglu.kernels.shared_memory import SM90_SHARED_MEMORY_BYTES, estimate_shared_memory
from swiglu_lab.bench.tables import FUSED_CANDIDATES
from swiglu.kernels.backward import CONFIGS, TOKEN_BUCKETS, KernelConfig
from swiglu.workloads import CASES, HIDDEN_SIZE, INTERMEDIATE_SIZE

from compile_worker import pdl_problems, wait_for_worker  # tests/ is on sys.path, as for ulp_oracle

#: cudaDevAttrMaxSharedMemoryPerBlockOptin of the H200 (227 KiB): a kernel asking for more
#: fails to load with OutOfResources.
H200_SHARED_MEMORY_BYTES = 232448
H200_SMS = 132
KERNEL_NAMES = {"dswiglu": "dswiglu_gemm_kernel", "grad_weights": "grad_weight_kernel", "grad_x": "grad_x_kernel"}
#: grad_x's split-tail kernel (``KernelConfig.split_tail``): the table's grad_x where the last wave
#: of tiles would leave at least half the SMs idle (T = 3376, 6284, 8192 among the cases).
SPLIT_TAIL_KERNEL = "grad_x_split_tail_kernel"
#: The memory-lean mode's forward kernels (swiglu.kernels.forward), recorded from triton_swiglu_forward.
FORWARD_KERNELS = ("swiglu_forward_kernel", "swiglu_product_kernel")
#: Past the largest token bucket's bound, a token count for the unbounded bucket.
LAST_BUCKET_TOKENS = 2 * TOKEN_BUCKETS[-2]
SMALL_TOKENS = {1, 7}
#: Deliberately too big: 4 stages of a 256x128 A tile and a 128x256 B tile in bf16 = 512 KiB.
OVERSIZED = KernelConfig(BM=256, BN=256, BK=128, GROUP_M=8, EPI_SPLIT=2, num_stages=4, num_warps=8)
TORCH_TO_TRITON = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}


# ---------------------------------------------------------------- recording the launches


def _arg_spec(name: str, value, spec: dict) -> None:
    """Type one runtime argument as Triton's JIT does when it specializes a launch: an int equal
    to 1 becomes a constexpr, an int or pointer divisible by 16 gets tt.divisibility=16 (every
    buffer here is 16-byte aligned: TMA needs it), a host TensorDescriptor is typed by its
    element type and block shape."""
    if isinstance(value, TensorDescriptor):
        spec["signature"][name] = f"tensordesc<{TORCH_TO_TRITON[value.base.dtype]}{list(value.block_shape)}>"
    elif isinstance(value, torch.Tensor):
        spec["signature"][name] = "*" + TORCH_TO_TRITON[value.dtype]
        spec["divisible_by_16"].append(name)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"unexpected kernel argument {name}={value!r}: extend _arg_spec")
    elif value == 1:
        spec["signature"][name] = "constexpr"
        spec["constexprs"][name] = 1
    else:
        spec["signature"][name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        if value % 16 == 0:
            spec["divisible_by_16"].append(name)


def _launch_spec(kernel_name: str, fn, args, kwargs) -> dict:
    """The compile specification (signature, constexprs, attributes, options) of one launch."""
    kwargs = dict(kwargs)
    spec = {
        "kernel": kernel_name,
        "signature": {},
        "constexprs": {},
        "divisible_by_16": [],
        "options": {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs},
    }
    params = inspect.signature(fn).parameters
    for name, value in inspect.signature(fn).bind(*args, **kwargs).arguments.items():
        if "constexpr" in str(params[name].annotation):
            spec["signature"][name] = "constexpr"
            spec["constexprs"][name] = value
        else:
            _arg_spec(name, value, spec)
    if "UPCAST" in spec["constexprs"]:
        spec["constexprs"]["UPCAST"] = False  # the GPU path: bf16 operands into the tensor cores
    return spec


class _Recorder:
    """Stands in for a kernel: ``kernel[grid](*args, **kwargs)`` records the launch."""

    def __init__(self, name: str, fn, launches: list):
        self.name, self.fn, self.launches = name, fn, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(_launch_spec(self.name, self.fn, args, kwargs))


def _meta_inputs(tokens: int) -> list[torch.Tensor]:
    T, H, I = tokens, HIDDEN_SIZE, INTERMEDIATE_SIZE
    shapes = [(T, H), (T, H), (T, I), (T, I), (T, I), (I, H), (I, H), (H, I)]
    return [torch.empty(s, dtype=torch.bfloat16, device="meta") for s in shapes]


def record_launches(
    tokens: int,
    configs: dict | None = None,
    check_shared: bool = True,
    *,
    lean: bool = False,
    forward_config="no forward",
    **need,
) -> list[dict]:
    """The kernel launches of ``triton_swiglu_backward`` at ``tokens`` on the H200 (132 SMs), as
    compile specs, without running anything. ``lean``: activated_gate is recomputed (None);
    ``forward_config`` (``"auto"``, None or a KernelConfig): record ``triton_swiglu_forward``'s
    launches with it instead of the backward's. ``check_shared=False`` lets a config past the shared
    memory estimate through (to compile it anyway)."""
    launches: list[dict] = []
    with pytest.MonkeyPatch.context() as mp:
        if not check_shared:
            mp.setattr(triton_backward, "check_shared_memory", lambda kernel, cfg, device: None)
        for name in (*KERNEL_NAMES.values(), SPLIT_TAIL_KERNEL, *FORWARD_KERNELS):
            mp.setattr(kernels, name, _Recorder(name, getattr(kernels, name).fn, launches))
        # Meta tensors pass the device check only as "interpreted"; UPCAST is reset in _launch_spec.
        mp.setattr(devices, "INTERPRET", True)
        mp.setattr(devices, "TRITON_INTERPRETS", True)  # also in a GPU process, where triton is compiled
        devices.device_reason.cache_clear()
        mp.setattr(devices, "_num_sms", lambda index: H200_SMS)
        num_programs = devices.num_programs
        on_h200 = lambda device, tiles, persistent=True: num_programs(torch.device("cuda", 0), tiles, persistent)  # noqa: E731
        mp.setattr(devices, "num_programs", on_h200)  # every launcher's count goes through it (tile_programs)
        inputs = _meta_inputs(tokens)
        if not (isinstance(forward_config, str) and forward_config == "no forward"):
            x, weights = inputs[1], inputs[5:]
            forward.triton_swiglu_forward(x, *weights, config=forward_config)
        else:
            if lean:
                inputs[4] = None
            triton_backward.triton_swiglu_backward(*inputs, configs=configs, **need)
    devices.device_reason.cache_clear()  # answers given under the fake interpreter go with it
    return launches


def _spec_key(spec: dict) -> str:
    return json.dumps({k: v for k, v in spec.items() if k != "uses"}, sort_keys=True)


def _label(spec: dict) -> str:
    c, o = spec["constexprs"], spec["options"]
    flags = "".join(
        f"-{f}"
        for f, on in (("ws", c.get("WARP_SPECIALIZE")), ("flat", c.get("FLATTEN")), ("plainstore", c.get("TMA_STORE") is False))
        if on
    )
    extra = ""
    ints = [n for n in ("T", "K_PAD", "NUM_PROGRAMS", "numel") if n in spec["divisible_by_16"]]  # varies with T
    ints = f"-div16:{'+'.join(ints)}" if ints else ""
    if spec["kernel"] == "swiglu_product_kernel":
        return f"{spec['kernel']}-B{c['BLOCK']}-w{o['num_warps']}{ints}"
    extra += "-recompute" if c.get("RECOMPUTE_ACT") else ""
    return (
        f"{spec['kernel']}-{c['BM']}x{c['BN']}x{c['BK']}-s{o['num_stages']}w{o['num_warps']}"
        f"-G{c['GROUP_M']}-E{c['EPI_SPLIT']}{flags}{extra}{ints}"
    )


def launch_specs() -> list[dict]:
    """Every distinct compile spec the package launches: all three kernels at every token count of
    ``CASES``, of each token bucket (so every configuration in ``CONFIGS`` is reached) and 1 and 7, with all
    four gradients and with a weight gradient alone."""
    # Plus tiny token counts: an int argument equal to 1 is specialized as a constexpr, which
    # breaks Triton 3.6's pipeliner in some configs (T = 1; the tests run T = 1 and 7).
    token_counts = sorted({c.tokens for c in CASES} | set(TOKEN_BUCKETS[:-1]) | {LAST_BUCKET_TOKENS} | SMALL_TOKENS)
    unique: dict[str, dict] = {}
    # The memory-lean mode: the backward with RECOMPUTE_ACT (all gradients, and grad_down_weight
    # alone: the product kernel), the forward's table and every fused candidate.
    calls = [
        {},
        dict(need_grad_x=False, need_grad_up_weight=False, need_grad_down_weight=False),
        dict(lean=True),
        dict(lean=True, need_grad_x=False, need_grad_gate_weight=False, need_grad_up_weight=False),
        dict(forward_config="auto"),
        *(dict(forward_config=c) for c in FUSED_CANDIDATES.values()),
        *(dict(configs={"grad_x": c}) for c in triton_backward.GRAD_X_NARROW),
    ]  # planned where H is small
    for tokens in token_counts:
        for call in calls:
            for spec in record_launches(tokens, **call):
                uses = unique.setdefault(_spec_key(spec), {**spec, "uses": []})["uses"]
                uses += [] if tokens in uses else [tokens]
    return sorted(unique.values(), key=_label)


def oversized_spec() -> dict:
    """grad_x's launch with ``OVERSIZED``: must be reported as over the shared memory limit."""
    launches = record_launches(
        4096,
        configs={"grad_x": OVERSIZED},
        check_shared=False,
        need_grad_gate_weight=False,
        need_grad_up_weight=False,
        need_grad_down_weight=False,
    )
    (spec,) = [s for s in launches if s["kernel"] == KERNEL_NAMES["grad_x"]]
    return spec


#: An example that fails deep inside Triton without the check: 128x256x64 tiles, 3 stages, unsplit epilogue, flattened warp-specialized
#: loop: 279576 bytes of shared memory with triton 3.6-3.7, against the H200's 232448.
OVERSIZED_EXAMPLE = (
    "dswiglu",
    KernelConfig(BM=128, BN=256, BK=64, EPI_SPLIT=1, num_stages=3, num_warps=8, warp_specialize=True, flatten=True),
)


def _calibration_configs() -> list[tuple[str, KernelConfig]]:
    """Configurations around the tuned ones, compiled only to check ``swiglu.kernels.shared_memory``'s
    estimate (never launched by the table): every epilogue split, loop kind and store kind, the
    4-warp warp-specialized variants and 64-row tiles."""
    out = [OVERSIZED_EXAMPLE]
    for kernel in KERNEL_NAMES:
        for epi, ws, flat in itertools.product((1, 2, 4), (False, True), (False, True)):
            out.append((kernel, KernelConfig(EPI_SPLIT=epi, warp_specialize=ws, flatten=flat)))
        for epi, ws, flat in ((1, False, False), (4, False, True), (1, True, False), (4, True, True)):
            out.append(
                (kernel, KernelConfig(BM=64, BN=256, num_stages=4, num_warps=8, EPI_SPLIT=epi, warp_specialize=ws, flatten=flat))
            )
        for ws in (False, True):
            out.append((kernel, KernelConfig(BM=64, BN=128, num_stages=3, num_warps=4, EPI_SPLIT=2, warp_specialize=ws)))
    for flat in (False, True):
        out.append(("grad_weights", KernelConfig(BN=128, num_stages=4, tma_store=False, flatten=flat)))
    return out


def _config_of(spec: dict) -> tuple[str, KernelConfig]:
    """(launcher kernel key, KernelConfig) a compile spec was recorded with."""
    c, o = spec["constexprs"], spec["options"]
    kernel = {**{v: k for k, v in KERNEL_NAMES.items()}, SPLIT_TAIL_KERNEL: "grad_x"}[spec["kernel"]]
    return kernel, KernelConfig(
        BM=c["BM"],
        BN=c["BN"],
        BK=c["BK"],
        GROUP_M=c["GROUP_M"],
        EPI_SPLIT=c["EPI_SPLIT"],
        num_stages=o["num_stages"],
        num_warps=o["num_warps"],
        warp_specialize=c["WARP_SPECIALIZE"],
        flatten=c["FLATTEN"],
        tma_store=c.get("TMA_STORE", True),
        split_tail=spec["kernel"] == SPLIT_TAIL_KERNEL,
    )


def calibration_specs() -> list[dict]:
    """The launches of ``_calibration_configs`` (the kernel under test only); a spec the table also
    launches is compiled once (``compiled``)."""
    specs = []
    for kernel, cfg in _calibration_configs():
        for spec in record_launches(4096, configs={kernel: cfg}, check_shared=False):
            if spec["kernel"] == KERNEL_NAMES[kernel]:
                specs.append({**spec, "uses": ["calibration"]})
    return specs


# ---------------------------------------------------------------- compiling (subprocess side)

WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compile_worker.py")
#: A folder holding a second Triton release (``pip install --target``), compiled against as well:
#: ``make test-gpu-triton`` sets it to the GPU machine's release (Makefile GPU_TRITON_VERSION), because a
#: kernel that builds with the CPU wheel's Triton can still fail with the GPU's (a
#: pipeliner failure in 3.6.0 that 3.7.1 does not have).
EXTRA_TRITON_DIR = os.environ.get("SWIGLU_EXTRA_TRITON_DIR")


def start_compile(specs: list[dict], cache_dir, triton_dir: str | None = None):
    """Start compiling ``specs`` for sm_90 in a subprocess with TRITON_INTERPRET unset and a fresh
    cache, with this interpreter's Triton or the one installed in ``triton_dir``; ``finish_compile``
    waits for it. (Two Triton releases compile side by side: CI has two cores.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    if triton_dir:
        env["PYTHONPATH"] = os.pathsep.join([triton_dir, env.get("PYTHONPATH", "")])
    results_path = os.path.join(cache_dir, "results.json")
    # Output to files, not pipes: a pipe nobody reads yet could fill and stall the worker.
    logs = [open(os.path.join(cache_dir, name), "w+") for name in ("stdout.txt", "stderr.txt")]
    proc = subprocess.Popen(
        [sys.executable, WORKER, results_path], stdin=subprocess.PIPE, stdout=logs[0], stderr=logs[1], env=env, text=True
    )
    proc.stdin.write(json.dumps(specs))
    proc.stdin.close()
    return proc, results_path, logs


def finish_compile(started) -> tuple[str, list[dict]]:
    """(Triton version used, one result per spec) of a ``start_compile``."""
    proc, results_path, logs = started
    out, err = wait_for_worker(proc, logs)
    assert proc.returncode == 0, f"compile worker failed:\n{out[-3000:]}\n{err[-6000:]}"
    with open(results_path) as f:
        result = json.load(f)
    return result["triton"], result["results"]


def compile_specs(specs: list[dict], cache_dir, triton_dir: str | None = None) -> tuple[str, list[dict]]:
    """``start_compile`` and wait: (Triton version used, one result per spec)."""
    return finish_compile(start_compile(specs, cache_dir, triton_dir))


def problems(result: dict, dots: bool = True, pdl: int = 0) -> list[str]:
    """What stops this compiled kernel from running well on the H200 (empty: nothing). ``dots``
    False: an elementwise kernel (no wgmma expected); ``pdl``: its PDL mode (``pdl_problems``)."""
    if result["error"]:
        return [f"does not compile for sm_90: {result['error']}"]
    found = []
    if result["shared"] > H200_SHARED_MEMORY_BYTES:
        found.append(f"needs {result['shared']} bytes of shared memory, the H200 allows {H200_SHARED_MEMORY_BYTES}")
    if dots and not result["wgmma_mma_async"]:
        found.append("no wgmma.mma_async in the PTX: the dots do not use Hopper's tensor-core path")
    if not result["target"] or not result["cubin_bytes"]:
        found.append("no sm_90 cubin")
    found += pdl_problems(result, pdl)
    return found


# ---------------------------------------------------------------- tests


def pdl_specs(specs: list[dict]) -> list[dict]:
    """Each kernel's first table launch again in PDL modes 1 and 2 (the table's launches are the
    default, mode 0), for the ordering check."""
    first = {}
    for s in specs:
        if not {"oversized", "calibration"} & set(map(str, s["uses"])):
            first.setdefault(s["kernel"], s)
    return [{**s, "constexprs": {**s["constexprs"], "PDL": mode}, "uses": ["pdl"]} for s in first.values() for mode in (1, 2)]


_SPECS: list[dict] = []


def _specs() -> list[dict]:
    if not _SPECS:
        _SPECS.extend(launch_specs())
        _SPECS.append({**oversized_spec(), "uses": ["oversized"]})
        _SPECS.extend(calibration_specs())
        _SPECS.extend(pdl_specs(_SPECS))
    return _SPECS


TRITONS = ["installed"] + (["extra"] if EXTRA_TRITON_DIR else [])


_STARTED: dict[str, tuple] = {}


@pytest.fixture(scope="module", autouse=True)
def _stop_unused_compiles():
    """A compile started for a Triton release no selected test used is stopped with the module."""
    yield
    for proc, _, logs in _STARTED.values():
        proc.kill()
        proc.wait()
        for f in logs:
            f.close()
    _STARTED.clear()


def _triton_dir(name: str) -> str | None:
    return EXTRA_TRITON_DIR if name == "extra" else None


@pytest.fixture(scope="module", params=TRITONS)
def compiled(request, tmp_path_factory) -> dict[str, dict]:
    """Every spec compiled with the installed Triton, and again with SWIGLU_EXTRA_TRITON_DIR's
    (both started at the first use, so they run side by side)."""
    triton_dir = _triton_dir(request.param)
    if triton_dir and not os.path.isdir(os.path.join(triton_dir, "triton")):
        pytest.fail(f"SWIGLU_EXTRA_TRITON_DIR={triton_dir} holds no triton package (make test-gpu-triton installs it)")
    # Each distinct spec once: a calibration or PDL spec the table also launches has the table's
    # result (the same compile), and the two side-by-side workers compile less.
    specs = list({_spec_key(s): s for s in _specs()}.values())
    start = time.perf_counter()
    if not _STARTED:
        for name in TRITONS:
            if name == "installed" or os.path.isdir(os.path.join(_triton_dir(name), "triton")):
                _STARTED[name] = start_compile(specs, tmp_path_factory.mktemp("triton_cache"), _triton_dir(name))
    version, results = finish_compile(_STARTED.pop(request.param))
    if triton_dir:
        assert version != triton.__version__, f"{triton_dir} did not shadow the installed triton {version}"
    print(f"\ncompiled {len(specs)} kernels for sm_90 with triton {version} in {time.perf_counter() - start:.1f} s")
    return {_spec_key(s): {**r, "triton": version} for s, r in zip(specs, results)}


def test_every_config_is_launched():
    """The recorded launches reach every distinct KernelConfig of CONFIGS (else a config would go
    unchecked), and the recorder sees what the launchers pass."""
    specs = _table_specs()
    for kernel, table in CONFIGS.items():
        for cfg in set(table.values()):
            want = {
                "BM": cfg.BM,
                "BN": cfg.BN,
                "BK": cfg.BK,
                "GROUP_M": cfg.GROUP_M,
                "EPI_SPLIT": cfg.EPI_SPLIT,
                "WARP_SPECIALIZE": cfg.warp_specialize,
                "FLATTEN": cfg.flatten,
                "UPCAST": False,
            }
            if kernel == "grad_weights":
                want["TMA_STORE"] = cfg.tma_store
            hits = [
                s
                for s in specs
                if s["kernel"] == KERNEL_NAMES[kernel]
                and want.items() <= s["constexprs"].items()
                and s["options"] == {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
            ]
            assert hits, f"{kernel} config {cfg} is never launched by the recorded calls"
    # dswiglu's piece descriptors are [BM, BN // EPI_SPLIT]; grad_weight reads A transposed [BK, BM].
    for s in specs:
        c, sig = s["constexprs"], s["signature"]
        if s["kernel"] == "swiglu_product_kernel":  # elementwise, plain pointers
            continue
        piece = f"tensordesc<bf16{[c['BM'], c['BN'] // c['EPI_SPLIT']]}>"
        if s["kernel"] == "dswiglu_gemm_kernel":
            assert sig["go_desc"] == f"tensordesc<bf16{[c['BM'], c['BK']]}>" and sig["h_desc"] == piece
        elif s["kernel"] == "grad_weight_kernel":
            assert sig["a_desc"] == f"tensordesc<bf16{[c['BK'], c['BM']]}>" and sig["c_desc"] == piece
        elif s["kernel"] == "grad_x_kernel":
            assert sig["gw_desc"] == f"tensordesc<bf16{[c['BK'], c['BN']]}>" and sig["gx_desc"] == piece
        elif s["kernel"] == "swiglu_forward_kernel":  # weights read K-major: [BN, BK] boxes of [I, H]
            assert sig["gw_desc"] == f"tensordesc<bf16{[c['BN'], c['BK']]}>" and sig["h_desc"] == piece
    # The lean mode's kernels are among the compiled: the recompute epilogue, both forward paths,
    # and every fused candidate of the forward's table.
    kinds = {(s["kernel"], s["constexprs"].get("RECOMPUTE_ACT")) for s in specs}
    assert {
        ("dswiglu_gemm_kernel", True),
        ("dswiglu_gemm_kernel", False),
        ("swiglu_product_kernel", None),
        ("swiglu_forward_kernel", None),
    } <= kinds
    fused = [s for s in specs if s["kernel"] == "swiglu_forward_kernel"]
    for cfg in {*FUSED_CANDIDATES.values(), *(c for c in forward.FORWARD_CONFIGS.values() if c)}:
        assert any(
            s["constexprs"]["BM"] == cfg.BM
            and s["constexprs"]["BN"] == cfg.BN
            and s["options"] == {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
            for s in fused
        ), cfg


def _table_specs() -> list[dict]:
    """The launches the package makes with its own table (not the oversized or calibration ones)."""
    return [s for s in _specs() if not {"oversized", "calibration", "pdl"} & set(map(str, s["uses"]))]


@pytest.mark.parametrize("spec", _table_specs(), ids=_label)
def test_builds_for_sm90_within_h200_limits(spec, compiled):
    """Compiles to an sm_90 cubin using wgmma and fits the H200's shared memory."""
    result = compiled[_spec_key(spec)]
    found = problems(result, dots=spec["kernel"] != "swiglu_product_kernel", pdl=spec["constexprs"].get("PDL", 0))
    assert not found, f"{_label(spec)} (tokens {spec['uses']}, triton {result['triton']}): {found}"


def test_pdl_modes_wait_before_any_global_access(compiled):
    """In PDL modes 1 and 2 every kernel waits for its predecessor before its first global memory
    access (else it could read an unfinished input or write a buffer still being read)."""
    specs = [s for s in _specs() if "pdl" in s["uses"]]
    assert {s["kernel"] for s in specs} == {*KERNEL_NAMES.values(), SPLIT_TAIL_KERNEL, *FORWARD_KERNELS}
    for spec in specs:
        result = compiled[_spec_key(spec)]
        found = problems(result, spec["kernel"] != "swiglu_product_kernel", spec["constexprs"]["PDL"])
        assert not found, f"{_label(spec)} PDL {spec['constexprs']['PDL']} (triton {result['triton']}): {found}"


def test_pdl_check_can_fail():
    """The ordering check rejects a wait after the first access, a missing or doubled
    instruction, PDL code in a plain launch and a trigger on the wrong side of the access."""
    good = {
        1: dict(gdc_wait=1, gdc_trigger=1, wait_before_access=True, trigger_before_access=True),
        2: dict(gdc_wait=1, gdc_trigger=1, wait_before_access=True, trigger_before_access=False),
        0: dict(gdc_wait=0, gdc_trigger=0, wait_before_access=False, trigger_before_access=False),
    }
    for mode, r in good.items():
        assert pdl_problems(r, mode) == []
    bad = [
        (1, dict(good[1], wait_before_access=False)),
        (1, dict(good[1], gdc_wait=2)),
        (2, dict(good[2], gdc_trigger=0)),
        (0, dict(good[0], gdc_wait=1)),
        (1, dict(good[1], trigger_before_access=False)),
        (2, dict(good[2], trigger_before_access=True)),
    ]
    for mode, r in bad:
        assert pdl_problems(r, mode), (mode, r)


def test_oversized_config_is_reported(compiled):
    """The check can fail: 4 stages of 256x256x128 tiles need far more than 227 KiB."""
    (spec,) = [s for s in _specs() if "oversized" in s["uses"]]
    result = compiled[_spec_key(spec)]
    assert any("shared memory" in p for p in problems(result)), result
    assert result["shared"] > 2 * H200_SHARED_MEMORY_BYTES


def test_shared_memory_estimate_matches_triton(compiled):
    """swiglu.kernels.shared_memory's estimate is never below Triton's figure for sm_90, for every launch of
    the table and every calibration config; within 1.1 KiB of it for the table's; it rejects no
    config that fits (no false rejection) and rejects every config that does not."""
    assert SM90_SHARED_MEMORY_BYTES == H200_SHARED_MEMORY_BYTES
    checked = 0
    for spec in _specs():
        if spec["kernel"] not in (*KERNEL_NAMES.values(), SPLIT_TAIL_KERNEL):
            continue  # the forward's kernels: not launched through the backward's check
        result = compiled[_spec_key(spec)]
        if result["error"]:
            assert "calibration" in spec["uses"], f"{_label(spec)}: {result['error']}"
            continue  # a calibration config Triton cannot build at all (no figure to compare)
        kernel, cfg = _config_of(spec)
        est, real = estimate_shared_memory(kernel, cfg), result["shared"]
        where = f"{_label(spec)} {cfg} (triton {result['triton']}): estimate {est}, Triton {real}"
        assert est >= real, where
        if spec in _table_specs() and not spec["constexprs"].get("RECOMPUTE_ACT"):
            assert est - real <= 1100, where  # the lean epilogue loads one tile fewer: below the estimate
        assert (est > H200_SHARED_MEMORY_BYTES) == (real > H200_SHARED_MEMORY_BYTES), where
        checked += 1
    assert checked >= 60


def test_oversized_example_needs_more_than_the_h200_has(compiled):
    """That config is over the limit by Triton's own figure (279576 bytes with triton
    3.6-3.7; the exact number is the release's business, not pinned here), and so is its estimate."""
    kernel, cfg = OVERSIZED_EXAMPLE
    (spec,) = {_spec_key(s): s for s in _specs() if "calibration" in s["uses"] and _config_of(s) == OVERSIZED_EXAMPLE}.values()
    real = compiled[_spec_key(spec)]["shared"]
    assert estimate_shared_memory(kernel, cfg) >= real > H200_SHARED_MEMORY_BYTES, (real, compiled[_spec_key(spec)]["triton"])


if __name__ == "__main__":  # the table: python tests/kernels/test_triton_compile.py
    import tempfile

    specs = _specs()
    for triton_dir in [None] + ([EXTRA_TRITON_DIR] if EXTRA_TRITON_DIR else []):
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as cache:
            version, results = compile_specs(specs, cache, triton_dir)
        for spec, res in zip(specs, results):
            est = estimate_shared_memory(*_config_of(spec)) if spec["kernel"] in KERNEL_NAMES.values() else "-"
            print(
                f"{_label(spec):62s} shared {res.get('shared', '-'):>7} est {est:>7} "
                f"wgmma {res.get('wgmma_mma_async', '-'):>4} {res['seconds']:5.1f} s  tokens {spec['uses']}  "
                f"{'; '.join(problems(res, spec['kernel'] != 'swiglu_product_kernel')) or 'ok'}"
            )
        print(f"{len(specs)} kernels compiled with triton {version} in {time.perf_counter() - start:.1f} s")
