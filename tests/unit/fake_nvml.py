"""A fake of the `pynvml` module with NVML's reference counting, for tests without a GPU.

Like the real library, every device call before nvmlInit (or after the last nvmlShutdown) raises
NVML_ERROR_UNINITIALIZED, and a shutdown without a matching init raises it too. Only names that
`pynvml` itself has are public, so code that passes the fake cannot call a function the real one lacks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

MIB = 1024 * 1024

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

_ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None  # bytes, or None where NVML cannot tell (as pynvml gives it)


@dataclass(eq=False)
class FakeGpu:
    """A GPU (or a MIG instance in another GPU's `migs`); the object itself is its NVML handle."""

    uuid: str
    name: str = "NVIDIA H200"
    total_mib: float = 143771.0
    used_mib: float = 600.0
    memory_error: int | None = None  # raised by every memory read (e.g. NOT_SUPPORTED)
    handle_error: int | None = None  # raised when the GPU is looked up by UUID
    processes: list[FakeProcess] | None = field(default_factory=list)  # None: listing not supported
    migs: list[FakeGpu] = field(default_factory=list)  # non-empty: MIG mode enabled
    mig_capable: bool = False  # a MIG-capable GPU with MIG off answers the mode query
    gpu_instance: int = 0
    compute_instance: int = 0
    # Called with the number of this GPU's memory read (1 = first); a number it returns is the used MiB.
    on_memory_read: Callable[[int], float | None] | None = None
    memory_reads: int = 0


class FakeNvml:
    """Stands in for the `pynvml` module. `fail` maps a function name to an NVML error code (raised as
    NVMLError) or to any exception instance, raised on every call of that function."""

    NVMLError = NVMLError
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_DEVICE_MIG_DISABLE = NVML_DEVICE_MIG_DISABLE
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE

    def __init__(self, gpus: list[FakeGpu], fail: dict[str, int | BaseException] | None = None) -> None:
        self.gpus = gpus
        self.fail = dict(fail or {})
        self.refcount = 0
        self.init_calls = 0
        self.shutdown_calls = 0  # successful ones
        self.shutdown_attempts = 0
        self._lock = threading.Lock()

    # -- lifetime --

    def nvmlInit(self) -> None:
        self._maybe_fail("nvmlInit")
        with self._lock:
            self.refcount += 1
            self.init_calls += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            self.shutdown_attempts += 1
            if self.refcount == 0:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            self._maybe_fail("nvmlShutdown")
            self.refcount -= 1
            self.shutdown_calls += 1

    # -- devices --

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByUUID")
        for gpu in self._all_devices():
            if gpu.uuid == uuid:
                if gpu.handle_error is not None:
                    raise NVMLError(gpu.handle_error)
                return gpu
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        self._enter("nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._enter("nvmlDeviceGetName")
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo")
        if handle.memory_error is not None:
            raise NVMLError(handle.memory_error)
        handle.memory_reads += 1
        used_mib = handle.used_mib
        if handle.on_memory_read is not None:
            override = handle.on_memory_read(handle.memory_reads)
            used_mib = used_mib if override is None else override
            if self.refcount == 0:  # shut down while this call was in flight
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
        used, total = int(used_mib * MIB), int(handle.total_mib * MIB)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[FakeProcess]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        if handle.processes is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return list(handle.processes)

    # -- MIG --

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        if handle.migs:
            return [NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE]
        if handle.mig_capable:
            return [NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_DISABLE]
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        return len(handle.migs) + 1  # one empty slot, as real GPUs have

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, slot: int) -> FakeGpu:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        if slot >= len(handle.migs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return handle.migs[slot]

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        return handle.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeGpu) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId")
        return handle.compute_instance

    # -- helpers --

    def _all_devices(self) -> list[FakeGpu]:
        return [device for gpu in self.gpus for device in (gpu, *gpu.migs)]

    def _enter(self, name: str) -> None:
        if self.refcount == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self._maybe_fail(name)

    def _maybe_fail(self, name: str) -> None:
        failure = self.fail.get(name)
        if failure is None:
            return
        raise NVMLError(failure) if isinstance(failure, int) else failure


def module_for_children(folder: Path, gpus: list[str], name: str = "NVIDIA H200") -> Path:
    """A `pynvml.py` in `folder` that is a FakeNvml of GPUs with these UUIDs, for the processes a test starts (a
    harness run of its own): put `folder` first on their PYTHONPATH. Returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pynvml.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "from fake_nvml import FakeGpu, FakeNvml\n"
        f"sys.modules[__name__] = FakeNvml([FakeGpu(uuid=uuid, name={name!r}) for uuid in {gpus!r}])\n")
    return folder
