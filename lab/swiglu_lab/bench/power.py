"""Board power, SM clock and energy beside each timed loop (GPU runs only).

Backends, tried in this order by ``open_monitor``:

* NVML through ``nvidia-ml-py`` (``import pynvml``): a sampler thread reads the board power
  (``NVML_FI_DEV_POWER_INSTANT`` where the driver has it, else ``nvmlDeviceGetPowerUsage``, which
  on Hopper is a trailing 1 s average) and the SM clock (``nvmlDeviceGetClockInfo(SM)``) every
  ``interval_s``; the energy counter ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver
  load, Volta and newer) is read when a window opens and when it closes.
* ``nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader,nounits -lms``
  in a child process when pynvml is missing or NVML does not start; energy is then the mean
  sampled power times the window's duration (no counter).

A *window* spans the timed loop of one case x implementation (``PowerMonitor.window``). The
energy counter moves in ~100 ms steps, so the runner extends a short window with further
untimed iterations of the same call (``min_window_s``); ``energy_iters`` counts them all.

What a window's energy contains: everything the board drew while the loop ran, including the L2
flush before every iteration, any idle gaps, and a ``prepare`` that runs before every call
(Liger's clones of gate/up; quack's layout is made once per input set, outside the window).
``measure_flush_energy`` measures the flush alone (a flush-only loop, same buffer) so the runner
can report it beside the total and subtract it (``energy_per_backward_j = energy_j - flush_energy_j``).

CPU runs have no monitor: their power columns stay NaN (empty in the CSV), never zero.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

import torch

#: Sampling period of the sampler thread (s): 40 Hz, about the board's own power refresh.
DEFAULT_INTERVAL_S = 0.025
#: Shortest energy window (s): several steps of the ~100 ms energy counter.
DEFAULT_MIN_WINDOW_S = 1.0
#: NVML field id of the instantaneous board power (mW), present in drivers >= 530.
NVML_FI_DEV_POWER_INSTANT = 186

#: The per-row columns this module fills (``schema.COLUMNS`` holds their dtypes).
POWER_COLUMNS = (
    "power_w",
    "sm_clock_mhz",
    "power_samples",
    "energy_j",
    "flush_energy_j",
    "energy_per_backward_j",
    "energy_iters",
    "energy_window_s",
)


def empty_power_columns() -> dict:
    """The power columns of a row without a measurement (CPU, no backend, failed impl): NaN."""
    return {name: math.nan for name in POWER_COLUMNS}


@dataclass
class Sample:
    """One reading: wall-clock time (s since the epoch), board power (W), SM clock (MHz)."""

    t: float
    power_w: float
    sm_clock_mhz: float


def window_columns(samples: list[Sample], t0: float, t1: float, energy_mj: float | None, iterations: int) -> dict:
    """The power columns of one window from its readings.

    Args:
        samples: readings; those with ``t0 <= t <= t1`` count.
        t0, t1: the window's wall-clock bounds (s).
        energy_mj: energy counter delta over the window (mJ), or None without a counter: then
            the energy is the mean sampled power times ``t1 - t0``.
        iterations: calls in the window (timed plus extension), > 0.

    Returns: ``power_w`` (mean sampled power, W), ``sm_clock_mhz`` (mean sampled SM clock,
    MHz), ``power_samples``, ``energy_j`` (J per iteration, flush included), ``energy_iters``,
    ``energy_window_s``; ``flush_energy_j`` and ``energy_per_backward_j`` NaN (the runner fills
    them). Means are NaN when no reading fell in the window.

    Raises: ``ValueError`` for ``iterations <= 0`` or ``t1 < t0``.
    """
    if iterations <= 0:
        raise ValueError(f"iterations must be positive, got {iterations}")
    if t1 < t0:
        raise ValueError(f"window ends before it starts: t0={t0}, t1={t1}")
    inside = [s for s in samples if t0 <= s.t <= t1]
    powers = [s.power_w for s in inside if math.isfinite(s.power_w)]
    clocks = [s.sm_clock_mhz for s in inside if math.isfinite(s.sm_clock_mhz)]
    power = sum(powers) / len(powers) if powers else math.nan
    if energy_mj is None:
        energy_j = power * (t1 - t0)
    else:
        energy_j = energy_mj / 1e3
    return {
        **empty_power_columns(),
        "power_w": power,
        "sm_clock_mhz": sum(clocks) / len(clocks) if clocks else math.nan,
        "power_samples": len(inside),
        "energy_j": energy_j / iterations,
        "energy_iters": iterations,
        "energy_window_s": t1 - t0,
    }


def with_flush_energy(columns: dict, flush_energy_j: float) -> dict:
    """``columns`` with ``flush_energy_j`` (J per L2 flush alone) and ``energy_per_backward_j``
    = ``energy_j - flush_energy_j`` (the flush precedes every iteration of the window)."""
    return {**columns, "flush_energy_j": flush_energy_j, "energy_per_backward_j": columns["energy_j"] - flush_energy_j}


# ----------------------------------------------------------------------------------- backends
class _NvmlBackend:
    """Readings through pynvml for one GPU handle."""

    name = "nvml"

    def __init__(self, pynvml, handle):
        self.nvml, self.handle = pynvml, handle
        self.field = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", NVML_FI_DEV_POWER_INSTANT)
        first = self._instant_mw()
        self.instant = first is not None and first > 0  # a board never draws 0 W: 0 means unsupported
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            self.has_counter = True
        except Exception:  # noqa: BLE001 - pre-Volta or not supported: integrate samples
            self.has_counter = False

    def _instant_mw(self) -> float | None:
        try:
            value = self.nvml.nvmlDeviceGetFieldValues(self.handle, [self.field])[0]
        except Exception:  # noqa: BLE001 - old driver or old pynvml
            return None
        if getattr(value, "nvmlReturn", 1) != 0:
            return None
        v = value.value
        kind = getattr(value, "valueType", 1)
        reading = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(kind, "uiVal")
        return float(getattr(v, reading))

    def read(self) -> Sample:
        power_mw = self._instant_mw() if self.instant else None
        if power_mw is None:
            power_mw = self.nvml.nvmlDeviceGetPowerUsage(self.handle)
        clock = self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)
        return Sample(time.time(), power_mw / 1e3, float(clock))

    def energy_mj(self) -> float | None:
        return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)) if self.has_counter else None

    def describe(self) -> dict:
        info = {
            "backend": "nvml (nvidia-ml-py)",
            "power_source": "NVML_FI_DEV_POWER_INSTANT (instantaneous board power)"
            if self.instant
            else "nvmlDeviceGetPowerUsage (board power; a trailing 1 s average on Hopper)",
            "clock_source": "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
            "energy_source": "nvmlDeviceGetTotalEnergyConsumption delta (mJ counter)"
            if self.has_counter
            else "mean sampled power x window duration (no energy counter)",
        }
        nvml, handle = self.nvml, self.handle
        for key, call in (
            ("max_sm_clock_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)),
            ("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3),  # mW -> W
        ):
            try:
                info[key] = float(call())
            except Exception:  # noqa: BLE001 - metadata detail only
                info[key] = None
        return info

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def parse_nvidia_smi_line(line: str) -> Sample | None:
    """A ``timestamp, power.draw, clocks.sm`` line of ``nvidia-smi --format=csv,noheader,nounits``
    (``2026/11/30 13:47:56.123, 512.34, 1980``; local time) as a ``Sample``, or None for a line
    that is not one (a header, ``[N/A]`` values)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        return Sample(t, float(parts[1]), float(parts[2]))
    except ValueError:
        return None


class _NvidiaSmiBackend:
    """Readings from a ``nvidia-smi -lms`` child process (no energy counter)."""

    name = "nvidia-smi"
    has_counter = False

    def __init__(self, target: str, interval_s: float):
        self.target, self.samples = target, []
        cmd = [
            "nvidia-smi",
            "--query-gpu=timestamp,power.draw,clocks.sm",
            "--format=csv,noheader,nounits",
            "-lms",
            str(max(1, round(interval_s * 1e3))),
            "-i",
            target,
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            sample = parse_nvidia_smi_line(line)
            if sample is not None:
                self.samples.append(sample)

    def energy_mj(self) -> None:
        return None

    def describe(self) -> dict:
        return {
            "backend": "nvidia-smi -lms (pynvml unavailable)",
            "power_source": "nvidia-smi power.draw",
            "clock_source": "nvidia-smi clocks.sm",
            "energy_source": "mean sampled power x window duration (no energy counter)",
            "max_sm_clock_mhz": None,
            "power_limit_w": None,
        }

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ------------------------------------------------------------------------------------ monitor
@dataclass
class Window:
    """An open window: its start time and energy reading; ``PowerMonitor.close_window`` ends it."""

    t0: float
    energy0_mj: float | None

    def elapsed_s(self) -> float:
        return time.time() - self.t0


class PowerMonitor:
    """Samples power and SM clock in a background thread while a window is open.

    Args:
        backend: an ``_NvmlBackend`` (sampled here) or ``_NvidiaSmiBackend`` (samples itself).
        interval_s: sampling period (s). min_window_s: shortest energy window the runner aims for.
    """

    def __init__(self, backend, interval_s: float = DEFAULT_INTERVAL_S, min_window_s: float = DEFAULT_MIN_WINDOW_S):
        if interval_s <= 0 or min_window_s < 0:
            raise ValueError(f"interval_s must be > 0 and min_window_s >= 0, got {interval_s}, {min_window_s}")
        self.backend, self.interval_s, self.min_window_s = backend, interval_s, min_window_s
        self._samples: list[Sample] = getattr(backend, "samples", [])
        self._active = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        if hasattr(backend, "read"):  # nvidia-smi's child process samples by itself
            self._thread = threading.Thread(target=self._sample, daemon=True, name="swiglu-power-sampler")
            self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            if not self._active.wait(timeout=0.1):
                continue
            try:
                self._samples.append(self.backend.read())
            except Exception:  # noqa: BLE001 - a failed reading is a missing sample, not a failed run
                pass
            self._stop.wait(self.interval_s)

    def open_window(self) -> Window:
        """Start a window now (the device should be idle: synchronize first)."""
        window = Window(time.time(), self.backend.energy_mj())
        self._active.set()
        return window

    def close_window(self, window: Window, iterations: int) -> dict:
        """End ``window`` (the device must have finished its work: synchronize first) and return
        its power columns (``window_columns``) for ``iterations`` calls."""
        energy1 = self.backend.energy_mj()
        t1 = time.time()
        self._active.clear()
        if isinstance(self.backend, _NvidiaSmiBackend):
            time.sleep(2 * self.interval_s)  # let the child's readings up to t1 arrive
        delta = None if window.energy0_mj is None or energy1 is None else energy1 - window.energy0_mj
        columns = window_columns(self._samples, window.t0, t1, delta, iterations)
        self._samples[:] = [s for s in self._samples if s.t > t1]
        return columns

    def cancel(self) -> None:
        """Stop sampling without a result (the loop of an open window raised)."""
        self._active.clear()

    def describe(self) -> dict:
        """The metadata record: backend, sources, sampling period, minimum window, max SM
        clock (MHz) and power limit (W) where the backend knows them, and what the energy holds."""
        return {
            **self.backend.describe(),
            "interval_s": self.interval_s,
            "min_window_s": self.min_window_s,
            "energy_definition": "energy_j: energy over the window / energy_iters (timed iterations plus "
            "untimed ones that stretch the window to min_window_s), L2 flush before every iteration included; "
            "untimed per-iteration preparation (liger's clones) included; flush_energy_j: a flush-only loop "
            "of the same buffer, per flush, measured per case; energy_per_backward_j = energy_j - flush_energy_j",
        }

    def close(self) -> None:
        """Stop the sampler and release the backend."""
        self._stop.set()
        self._active.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.backend.close()


def _nvml_handle(pynvml, device: torch.device):
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # noqa: BLE001 - fall back to the index
            pass
    index = torch.cuda.current_device() if device.index is None else device.index
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def open_monitor(
    device: torch.device, interval_s: float = DEFAULT_INTERVAL_S, min_window_s: float = DEFAULT_MIN_WINDOW_S
) -> tuple[PowerMonitor | None, str]:
    """A monitor for ``device`` and a line saying which backend, or ``(None, why)`` on CPU or
    when neither NVML nor nvidia-smi works (the run goes on without power columns)."""
    if device.type != "cuda":
        return None, "CPU run: no GPU power to sample"
    reasons = []
    try:
        import pynvml

        pynvml.nvmlInit()
        backend = _NvmlBackend(pynvml, _nvml_handle(pynvml, device))
        return PowerMonitor(backend, interval_s, min_window_s), "nvml"
    except Exception as exc:  # noqa: BLE001 - ImportError or NVML failing to start
        reasons.append(f"pynvml: {type(exc).__name__}: {exc}")
    if shutil.which("nvidia-smi"):
        index = torch.cuda.current_device() if device.index is None else device.index
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            target = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        except Exception:  # noqa: BLE001
            target = str(index)
        backend = _NvidiaSmiBackend(target, interval_s)
        return PowerMonitor(backend, interval_s, min_window_s), "nvidia-smi (" + "; ".join(reasons) + ")"
    reasons.append("nvidia-smi not found")
    return None, "no power backend: " + "; ".join(reasons)


def measure_flush_energy(monitor: PowerMonitor, flush: Callable[[], None], device: torch.device, block: int = 50) -> float:
    """Energy of one L2 flush alone (J): flushes in blocks of ``block`` (synchronized) until the
    window lasts ``monitor.min_window_s``, energy over the window / flushes."""
    for _ in range(3):  # warm the clocks up before the window
        flush()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    window = monitor.open_window()
    count = 0
    while True:
        for _ in range(block):
            flush()
        count += block
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if window.elapsed_s() >= monitor.min_window_s:
            break
    return monitor.close_window(window, count)["energy_j"]


def extension_iterations(elapsed_s: float, median_ms: float, min_window_s: float, cap: int = 100_000) -> int:
    """Untimed iterations that stretch a window of ``elapsed_s`` to ``min_window_s`` at
    ``median_ms`` per iteration (0 when it is long enough or the median is unknown; at most
    ``cap``)."""
    if elapsed_s >= min_window_s or not (median_ms > 0 and math.isfinite(median_ms)):
        return 0
    return min(cap, math.ceil((min_window_s - elapsed_s) / (median_ms * 1e-3)))
