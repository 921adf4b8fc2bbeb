"""What a run ran on: GPU properties, nvidia-smi clocks and power limit, software versions, git
state, and the run id built from them."""

from __future__ import annotations

import csv
import io
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

from .quack_peer import versions as quack_versions

#: Fields asked of ``nvidia-smi --query-gpu`` (all standard fields; see ``nvidia-smi --help-query-gpu``).
NVIDIA_SMI_FIELDS = (
    "name",
    "driver_version",
    "memory.total",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.limit",
    "power.default_limit",
    "temperature.gpu",
    "pstate",
    "persistence_mode",
)


def _run(cmd: list[str], cwd: str | Path | None = None) -> str | None:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_info(repo_dir: str | Path | None = None) -> dict:
    """``{"commit", "dirty", "source"}`` of the source tree: from the env vars
    ``SWIGLU_GIT_COMMIT`` / ``SWIGLU_GIT_DIRTY`` ("1"/"true" means dirty) when the first is set,
    else from git when it works (dirty = a tracked file modified, or an untracked file under
    src/ or lab/, code that ran but is not committed), else ``"unknown"``. The env vars win because a copy
    of the tree on another machine can carry a stale .git (naming an older commit than its files)."""
    env_commit = os.environ.get("SWIGLU_GIT_COMMIT")
    if env_commit:
        dirty_env = os.environ.get("SWIGLU_GIT_DIRTY")
        dirty = "unknown" if dirty_env is None else dirty_env.strip().lower() in ("1", "true", "yes")
        return {"commit": env_commit.strip(), "dirty": dirty, "source": "env SWIGLU_GIT_COMMIT"}
    repo_dir = repo_dir or Path(__file__).resolve().parent
    top = _run(["git", "rev-parse", "--show-toplevel"], cwd=repo_dir)
    commit = _run(["git", "rev-parse", "--short=7", "HEAD"], cwd=repo_dir)
    status = _run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=top.strip()) if top else None
    if commit and status is not None:
        changed = [
            line
            for line in status.splitlines()
            if line.strip() and (not line.startswith("??") or line[3:].startswith(("src/", "lab/")))
        ]
        return {"commit": commit.strip(), "dirty": bool(changed), "source": "git"}
    return {"commit": "unknown", "dirty": "unknown", "source": "unknown"}


def nvidia_smi_info(device: torch.device) -> dict:
    """Clocks, power limit, driver etc. of ``device`` as nvidia-smi reports them (strings with
    units), or ``{"error": ...}`` when nvidia-smi is missing or fails. The GPU is picked by
    UUID (which survives CUDA_VISIBLE_DEVICES renumbering), else by torch's index."""
    targets = []
    try:
        targets.append(f"GPU-{torch.cuda.get_device_properties(device).uuid}")
    except Exception:  # noqa: BLE001 - older torch has no uuid
        pass
    targets.append(str(torch.cuda.current_device() if device.index is None else device.index))
    for target in targets:
        out = _run(["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader", "-i", target])
        if out and out.strip():
            values = next(csv.reader(io.StringIO(out.strip().splitlines()[0]), skipinitialspace=True))
            return dict(zip(NVIDIA_SMI_FIELDS, values), queried_as=target)
    return {"error": "nvidia-smi unavailable or failed", "query": list(NVIDIA_SMI_FIELDS)}


def gpu_info(device: torch.device) -> dict:
    """Name, SM count, L2 size, memory and compute capability from torch, plus nvidia-smi's
    record. On CPU: the processor as ``platform`` reports it."""
    if device.type != "cuda":
        return {"name": f"CPU ({platform.processor() or platform.machine()})", "cpu_count": os.cpu_count()}
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "sm_count": props.multi_processor_count,
        "l2_cache_bytes": props.L2_cache_size,
        "total_memory_bytes": props.total_memory,
        "compute_capability": f"{props.major}.{props.minor}",
        "nvidia_smi": nvidia_smi_info(device),
    }


def dist_version(*dists: str) -> str | None:
    """The installed version of the first of ``dists`` (distribution names) that is installed, else None."""
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return None


def software_info() -> dict:
    """Versions of torch, CUDA (torch's build), triton, Python, and the platform string."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception as exc:  # noqa: BLE001 - record why, never fail a run on it
        triton_version = f"unavailable ({type(exc).__name__})"
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": triton_version,
        "liger_kernel": dist_version("liger-kernel"),
        **quack_versions(),  # quack_kernels, nvidia_cutlass_dsl (CuTe-DSL) and the quack peer's tuning settings
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def utc_now() -> datetime:
    """The current time in UTC."""
    return datetime.now(timezone.utc)


#: How metadata records times (UTC, second resolution).
UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def make_run_id(when: datetime | str, commit: str) -> str:
    """``<UTC timestamp>-<short commit>``, e.g. ``20261129T171500Z-d946c89``; ``when`` is a
    datetime or a string in ``UTC_FORMAT``."""
    if isinstance(when, str):
        when = datetime.strptime(when, UTC_FORMAT).replace(tzinfo=timezone.utc)
    stamp = when.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{commit[:7] if commit != 'unknown' else 'unknown'}"


def nvml_info(device: torch.device) -> dict:
    """Driver, clocks, power, temperature and P-state of ``device`` through pynvml (nvidia-ml-py),
    or ``{"error": ...}`` when NVML cannot be used (metadata only: never raises)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - metadata only, never fail the run on it
        return {"error": f"{type(exc).__name__}: {exc}"}
    info: dict = {}
    try:
        index = torch.cuda.current_device() if device.index is None else device.index
        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # noqa: BLE001 - older torch has no uuid; CUDA_VISIBLE_DEVICES may renumber
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        queries = {
            "driver": lambda: pynvml.nvmlSystemGetDriverVersion(),
            "name": lambda: pynvml.nvmlDeviceGetName(handle),
            "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "power_limit_w": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
            "power_draw_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
            "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "pstate": lambda: pynvml.nvmlDeviceGetPerformanceState(handle),
        }
        for key, query in queries.items():
            try:
                value = query()
                info[key] = value.decode() if isinstance(value, bytes) else value
            except Exception as exc:  # noqa: BLE001
                info[key] = f"unavailable ({type(exc).__name__})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return info
