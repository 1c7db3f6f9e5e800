"""One-device tests sharing a GPU: a test marked `one_device(peak_mib=N)` runs one rank on one device, so on a
GPU host several such tests may run at once on the same GPU, each in a worker of its own (harness.ranks.packing),
as many as the GPU's free memory holds at N MiB plus a CUDA context each and the host's cores feed (a core per
rank: it launches the kernels), at most MAX_SHARE. A test's own peak memory is its process's allocator's, so
it reads the same shared or not; NVML's view of the GPU (the cell's memory.json) sums the tests that shared it.

Free memory is read through NVML (`pynvml`, imported on first use); where it cannot be read, tests do not share.
Needs the standard library and pytest.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest

MARKER = "one_device"
MARKER_HELP = (f"{MARKER}(peak_mib=N): the test runs one rank on one device, at most N MiB; with --pack-tests on a "
               "GPU host, such tests share a GPU where its free memory allows")
DEFAULT_PEAK_MIB = 4096  # a marker without peak_mib
CONTEXT_MIB = 1024  # a CUDA context and the allocator's slack, per process that shares the GPU
CPUS_PER_WORKER = 1  # a rank keeps a core busy launching kernels; its worker's pytest mostly waits
MAX_SHARE = 8  # beyond this the GPU's queue, not the host, is the limit for the suite's small models


def one_device_peak(item: pytest.Item) -> int | None:
    """The MiB a one-device test declares (None: not marked)."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    peak = marker.kwargs.get("peak_mib", DEFAULT_PEAK_MIB)
    if isinstance(peak, bool) or not isinstance(peak, int) or peak <= 0:
        raise pytest.UsageError(f"{item.nodeid}: {MARKER}(peak_mib={peak!r}): expected a whole number of MiB > 0")
    return peak


def shares(free_mib: int | None, peak_mib: int, cpus: int, gpus: int) -> int:
    """How many one-device tests of `peak_mib` may run at once on one GPU with `free_mib` free."""
    if free_mib is None or gpus <= 0:
        return 1
    by_memory = free_mib // (peak_mib + CONTEXT_MIB)
    by_cpus = cpus // (gpus * CPUS_PER_WORKER)
    return max(1, min(by_memory, by_cpus, MAX_SHARE))


def shared_slots(gpus: Sequence[str], peak_mib: int, cpus: int,
                 free_mib: Callable[[str], int | None] | None = None) -> tuple[str, ...]:
    """Each GPU as many times as tests may share it, GPU after GPU (a worker per slot spreads over the GPUs)."""
    read = free_mib or nvml_free_mib
    counts = {gpu: shares(read(gpu), peak_mib, cpus, len(gpus)) for gpu in gpus}
    return tuple(gpu for turn in range(max(counts.values(), default=0)) for gpu in gpus if counts[gpu] > turn)


def nvml_free_mib(entry: str, nvml: Any = None) -> int | None:
    """Free MiB of the GPU a CUDA_VISIBLE_DEVICES entry names (an index or a UUID); None where NVML cannot say."""
    try:
        lib = nvml if nvml is not None else __import__("pynvml")
        lib.nvmlInit()
    except Exception:
        return None
    try:
        by_index = entry.isdigit()
        handle = lib.nvmlDeviceGetHandleByIndex(int(entry)) if by_index else lib.nvmlDeviceGetHandleByUUID(entry)
        return int(lib.nvmlDeviceGetMemoryInfo(handle).free) // (1 << 20)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()


def host_cpus() -> int:
    return len(os.sched_getaffinity(0))
