"""GPU memory of a cell through NVML: whether its GPUs are free, and their peak use (which GPUs a cell got
 is harness.cell.gpus).

One `MemoryMonitor` per cell (not per rank) samples the device-wide used memory of the cell's GPUs in
a background thread and writes `memory.json`. Every entry point takes and releases its own NVML
reference, so NVML's reference count stays balanced whatever fails; the `nvml` argument takes any
object shaped like the `pynvml` module (nvidia-ml-py), which is what the unit tests pass instead.
This module needs only the standard library: `pynvml` is imported on first use.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cell.gpus import (  # noqa: F401
    GpuIdentity,
    MigDevice,
    NvmlUnavailable,
    load_nvml,
    nvml_init,
    nvml_session,
    nvml_shutdown,
    resolve_gpus,
    select_visible,
)

# GPU selection lives in harness.cell.gpus; these names stay importable from here for existing callers.
from harness.contract import SCHEMA as CONTRACT_SCHEMA
from harness.contract import MemoryGpuRecord, MemoryRecord
from harness.results.files import write_json_whole

SCHEMA = CONTRACT_SCHEMA  # memory.json speaks the results contract's schema
DEFAULT_INTERVAL_S = 0.05
DEFAULT_BUSY_THRESHOLD_MIB = 1024.0
# What `used` (nvmlDeviceGetMemoryInfo v1) shows on an idle GPU: driver reservations, no process.
DEFAULT_IDLE_BASELINE_MIB = 1024.0
DEFAULT_JOIN_TIMEOUT_S = 10.0
MIB = 1024 * 1024

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class GpuSamples:
    """What the monitor measured on one GPU; None wherever NVML could not tell (never 0 instead). It is
    written as contract.MemoryGpuRecord and read back as harness.results.GpuMemory."""

    gpu: GpuIdentity
    total_mib: float | None
    used_before_mib: float | None
    peak_used_mib: float | None
    interval_s: float
    sample_count: int
    host: str | None = None  # in a cell across hosts

    def record(self) -> MemoryGpuRecord:
        return MemoryGpuRecord(index=self.gpu.index, name=self.gpu.name, uuid=self.gpu.uuid,
                               total_mib=self.total_mib, used_before_mib=self.used_before_mib,
                               peak_used_mib=self.peak_used_mib, interval_s=self.interval_s,
                               sample_count=self.sample_count, host=self.host)

    def to_json(self) -> dict[str, Any]:
        return self.record().to_json()


@dataclass(frozen=True, kw_only=True)
class MemoryReport:
    available: bool
    reason: str | None
    interval_s: float
    sample_count: int
    gpus: tuple[GpuSamples, ...] = ()

    @classmethod
    def unavailable(cls, reason: str, interval_s: float = DEFAULT_INTERVAL_S) -> MemoryReport:
        return cls(available=False, reason=reason, interval_s=interval_s, sample_count=0)

    def to_json(self) -> dict[str, Any]:
        return MemoryRecord(available=self.available, reason=self.reason, interval_s=self.interval_s,
                            sample_count=self.sample_count, gpus=[gpu.record() for gpu in self.gpus]).to_json()

    def summary_lines(self) -> list[str]:
        """One line per GPU for a terminal or log."""
        if not self.available:
            return [f"GPU memory: not measured ({self.reason})"]
        lines = []
        for entry in self.gpus:
            label = f"GPU {entry.gpu.index} {entry.gpu.name} {entry.gpu.uuid}"
            if entry.peak_used_mib is None:
                lines.append(f"{label}: memory not reported by NVML")
            else:
                lines.append(
                    f"{label}: peak {entry.peak_used_mib:.0f} MiB used of {_mib_text(entry.total_mib)}"
                    f" (before the cell {_mib_text(entry.used_before_mib)}, {entry.sample_count} samples"
                    f" every {entry.interval_s:g} s)"
                )
        return lines


def write_memory_json(path: str | os.PathLike[str], report: MemoryReport) -> Path:
    """Write memory.json atomically, so a reader never sees half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_whole(target, report.to_json())
    return target


def _read_memory_mib(lib: Any, handle: Any) -> tuple[float, float]:
    info = lib.nvmlDeviceGetMemoryInfo(handle)
    return info.used / MIB, info.total / MIB


def _is_not_supported(lib: Any, error: BaseException) -> bool:
    return getattr(error, "value", None) == lib.NVML_ERROR_NOT_SUPPORTED


def _mib_text(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0f} MiB"


def driver_version(nvml: Any = None) -> str | None:
    """The NVIDIA driver's version (for env.json), or None where NVML cannot tell."""
    try:
        with nvml_session(nvml) as lib:
            version = lib.nvmlSystemGetDriverVersion()
    except NvmlUnavailable:
        return None
    except Exception as error:  # the version is informative only; never fail a cell for it
        log.warning("nvmlSystemGetDriverVersion failed: %s", error)
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


# --- probe ---


def probe(nvml: Any = None) -> Availability:
    """Whether this host can report GPU memory: NVML initialises and some GPU answers memory info."""
    try:
        with nvml_session(nvml) as lib:
            return _probe_devices(lib)
    except NvmlUnavailable as error:
        return Availability(False, str(error))


def _probe_devices(lib: Any) -> Availability:
    try:
        count = lib.nvmlDeviceGetCount()
    except lib.NVMLError as error:
        return Availability(False, f"nvmlDeviceGetCount failed: {error}")
    if count == 0:
        return Availability(False, "NVML sees no GPUs")
    failures = []
    for index in range(count):
        try:
            _read_memory_mib(lib, lib.nvmlDeviceGetHandleByIndex(index))
        except lib.NVMLError as error:
            failures.append(f"GPU {index}: {error}")
        else:
            return Availability(True)
    return Availability(False, "no GPU reports memory use: " + "; ".join(failures))


# --- preflight ---


def preflight(
    gpus: Sequence[GpuIdentity],
    threshold_mib: float = DEFAULT_BUSY_THRESHOLD_MIB,
    *,
    idle_baseline_mib: float = DEFAULT_IDLE_BASELINE_MIB,
    nvml: Any = None,
) -> list[str]:
    """One message per GPU that other processes already use above threshold_mib; [] when all are free
    or NVML cannot tell."""
    if not gpus:
        return []
    try:
        with nvml_session(nvml) as lib:
            messages = [_busy_message(lib, gpu, threshold_mib, idle_baseline_mib) for gpu in gpus]
    except NvmlUnavailable as error:
        log.warning("GPU preflight skipped: %s", error)
        return []
    return [message for message in messages if message]


def _busy_message(lib: Any, gpu: GpuIdentity, threshold_mib: float, idle_baseline_mib: float) -> str | None:
    try:
        handle = lib.nvmlDeviceGetHandleByUUID(gpu.uuid)
    except lib.NVMLError as error:
        log.warning("GPU %d (%s) preflight skipped: %s", gpu.index, gpu.uuid, error)
        return None
    listed = _process_usage(lib, handle)
    try:
        used_mib, _total = _read_memory_mib(lib, handle)
    except lib.NVMLError:
        used_mib = None
    # The process list misses processes in other PID namespaces (containers), so device-wide used
    # memory bounds the answer from below as well.
    estimates = []
    own_mib = 0.0
    pids: list[int] = []
    if listed is not None:
        other_mib, own_mib, pids = listed
        estimates.append(other_mib)
    if used_mib is not None:
        estimates.append(used_mib - own_mib - idle_baseline_mib)
    if not estimates or max(estimates) <= threshold_mib:
        return None
    message = f"GPU {gpu.index} busy: {max(estimates):.0f} MiB used by other processes"
    return message + (f" (pids {', '.join(map(str, pids))})" if pids else "")


def _process_usage(lib: Any, handle: Any) -> tuple[float, float, list[int]] | None:
    """(MiB of other processes, MiB of this process, other pids), or None when NVML cannot list them."""
    mismatch = getattr(lib, "NVMLLibraryMismatchError", lib.NVMLError)
    try:
        processes = lib.nvmlDeviceGetComputeRunningProcesses(handle)
    except (lib.NVMLError, mismatch):
        return None
    if any(process.usedGpuMemory is None for process in processes):
        return None  # NVML lists the process but cannot say how much it holds
    own_pid = os.getpid()
    others = [process for process in processes if process.pid != own_pid]
    own_bytes = sum(process.usedGpuMemory for process in processes if process.pid == own_pid)
    other_bytes = sum(process.usedGpuMemory for process in others)
    return other_bytes / MIB, own_bytes / MIB, sorted({process.pid for process in others})


# --- the monitor ---


@dataclass(kw_only=True)
class _Track:
    """One GPU's running numbers; written by the sampling thread, read by stop() after the join."""

    gpu: GpuIdentity
    handle: Any = None
    total_mib: float | None = None
    used_before_mib: float | None = None
    peak_used_mib: float | None = None
    sample_count: int = 0

    def record(self, used_mib: float) -> None:
        self.peak_used_mib = used_mib if self.peak_used_mib is None else max(self.peak_used_mib, used_mib)
        self.sample_count += 1


class MemoryMonitor:
    """Samples device-wide used memory of `gpus` every `interval_s` in a daemon thread.

    start() takes one NVML reference; stop() joins the thread, releases that reference once, calls
    `on_stop(report)` once and returns the report; later calls (an explicit one and the one start()
    registers with atexit) return the same report and do nothing else. A GPU whose memory NVML does
    not report (NOT_SUPPORTED, lookup failure) keeps None; a host without NVML gives an unavailable report.
    """

    def __init__(
        self,
        gpus: Sequence[GpuIdentity],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        nvml: Any = None,
        on_stop: Callable[[MemoryReport], None] | None = None,
        join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"MemoryMonitor interval_s must be > 0, got {interval_s!r}")
        uuids = [gpu.uuid for gpu in gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"MemoryMonitor got the same GPU twice: {uuids}")
        self._gpus = tuple(gpus)
        self._interval_s = interval_s
        self._nvml = nvml
        self._on_stop = on_stop
        self._join_timeout_s = join_timeout_s
        self._state_lock = threading.Lock()  # start/stop against each other
        self._sample_lock = threading.Lock()  # numbers against a reader after a join that timed out
        self._stop_requested = threading.Event()
        self._tracks: list[_Track] = []
        self._passes = 0  # sampling passes, the "before" readings included
        self._lib: Any = None  # set while this monitor holds an NVML reference
        self._thread: threading.Thread | None = None
        self._unavailable_reason: str | None = None
        self._started = False
        self._report: MemoryReport | None = None

    @property
    def report(self) -> MemoryReport | None:
        """The report once stop() has run, else None."""
        return self._report

    def __enter__(self) -> MemoryMonitor:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> MemoryMonitor:
        with self._state_lock:
            if self._started:
                raise RuntimeError("MemoryMonitor.start() called twice")
            self._started = True
            self._begin()
            atexit.register(self.stop)
        return self

    def _begin(self) -> None:
        if not self._gpus:
            self._unavailable_reason = "no GPUs to monitor"
            return
        try:
            lib = load_nvml(self._nvml)
            nvml_init(lib)
        except NvmlUnavailable as error:
            self._unavailable_reason = str(error)
            return
        self._lib = lib
        try:
            tracks = [self._open(lib, gpu) for gpu in self._gpus]
            self._tracks = tracks
            if any(track.sample_count for track in tracks):
                self._passes = 1
            readable = [track for track in tracks if track.handle is not None]
            if not readable:
                self._release()
                return
            self._thread = threading.Thread(
                target=self._sample_until_stopped,
                args=(lib, readable),
                name="harness-memory-monitor",
                # A daemon thread, because the interpreter joins the others before it runs atexit.
                daemon=True,
            )
            self._thread.start()
        except BaseException:
            self._release()
            raise

    def _open(self, lib: Any, gpu: GpuIdentity) -> _Track:
        track = _Track(gpu=gpu)
        try:
            handle = lib.nvmlDeviceGetHandleByUUID(gpu.uuid)
            used_mib, total_mib = _read_memory_mib(lib, handle)
        except lib.NVMLError as error:
            log.warning("GPU %d (%s): memory not monitored: %s", gpu.index, gpu.uuid, error)
            return track
        track.handle, track.total_mib, track.used_before_mib = handle, total_mib, used_mib
        track.record(used_mib)
        return track

    def _sample_until_stopped(self, lib: Any, tracks: list[_Track]) -> None:
        next_at = time.monotonic()
        while True:
            next_at += self._interval_s
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow NVML call, a stalled host): restart the schedule
                next_at, delay = time.monotonic(), 0.0
            if self._stop_requested.wait(delay):
                return
            # A pass always finishes: stop() waits for it rather than reading half of it.
            for track in tracks:
                if track.handle is None:
                    continue
                try:
                    used_mib, _total = _read_memory_mib(lib, track.handle)
                except lib.NVMLError as error:
                    if _is_not_supported(lib, error):
                        track.handle = None
                    continue
                with self._sample_lock:
                    track.record(used_mib)
            with self._sample_lock:
                self._passes += 1

    def stop(self) -> MemoryReport:
        with self._state_lock:
            if self._report is not None:
                return self._report
            if not self._started:
                raise RuntimeError("MemoryMonitor.stop() called before start()")
            atexit.unregister(self.stop)
            self._stop_requested.set()
            if self._thread is not None:
                self._thread.join(self._join_timeout_s)
            if self._thread is not None and self._thread.is_alive():
                # Shutting NVML down under a call still in flight is unsafe; leave the reference.
                log.warning("GPU memory sampling did not stop within %.0f s", self._join_timeout_s)
            else:
                self._release()
            self._report = report = self._build_report()
        if self._on_stop is not None:
            self._on_stop(report)
        return report

    def _release(self) -> None:
        if self._lib is not None:
            lib, self._lib = self._lib, None
            nvml_shutdown(lib)

    def _build_report(self) -> MemoryReport:
        if self._unavailable_reason is not None:
            return MemoryReport.unavailable(self._unavailable_reason, self._interval_s)
        with self._sample_lock:
            gpus = tuple(
                GpuSamples(
                    gpu=track.gpu,
                    total_mib=track.total_mib,
                    used_before_mib=track.used_before_mib,
                    peak_used_mib=track.peak_used_mib,
                    interval_s=self._interval_s,
                    sample_count=track.sample_count,
                )
                for track in self._tracks
            )
            passes = self._passes
        return MemoryReport(
            available=True, reason=None, interval_s=self._interval_s, sample_count=passes, gpus=gpus
        )
