"""Which GPUs a cell gets, through NVML: the GPUs and MIG instances CUDA shows a process for a given
CUDA_VISIBLE_DEVICES, named by NVML index and UUID, and the NVML session every GPU module opens.

Every entry point takes and releases its own NVML reference, so NVML's reference count stays balanced
whatever fails; the `nvml` argument takes any object shaped like the `pynvml` module (nvidia-ml-py).
Standard library only: `pynvml` is imported on first use.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host; the message says why."""


@dataclass(frozen=True, kw_only=True)
class GpuIdentity:
    """A GPU as NVML names it. `index` is NVML's (nvidia-smi's) index, the parent's for a MIG device."""

    index: int
    uuid: str
    name: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "uuid": self.uuid}


# --- NVML access: every caller goes through a session, so each init has exactly one shutdown ---


def load_nvml(nvml: Any = None) -> Any:
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError as error:
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({error})") from None
    return pynvml


def nvml_init(lib: Any) -> None:
    try:
        lib.nvmlInit()
    except lib.NVMLError as error:
        raise NvmlUnavailable(f"nvmlInit failed: {error}") from None


def nvml_shutdown(lib: Any) -> None:
    # Called once per successful init; a failure here must not hide the caller's own result or error.
    try:
        lib.nvmlShutdown()
    except lib.NVMLError as error:
        log.warning("nvmlShutdown failed: %s", error)


@contextmanager
def nvml_session(nvml: Any = None) -> Iterator[Any]:
    """Yield an initialised NVML module and shut it down afterwards; raises NvmlUnavailable."""
    lib = load_nvml(nvml)
    nvml_init(lib)
    try:
        yield lib
    finally:
        nvml_shutdown(lib)


# --- which GPUs a cell gets ---


@dataclass(frozen=True, kw_only=True)
class MigDevice:
    """A MIG instance, with what the legacy `MIG-GPU-<uuid>/<gi>/<ci>` form names it by."""

    identity: GpuIdentity
    parent_uuid: str
    gpu_instance: int
    compute_instance: int


def resolve_gpus(cuda_visible_devices: str | None, nvml: Any = None) -> list[GpuIdentity]:
    """The GPUs CUDA will show a process with this CUDA_VISIBLE_DEVICES, in CUDA's order.

    None (unset) means every GPU. Integer entries are NVML indices, which are CUDA's only with
    CUDA_DEVICE_ORDER=PCI_BUS_ID (or on a host of identical GPUs). Raises NvmlUnavailable.
    """
    with nvml_session(nvml) as lib:
        try:
            devices = _list_devices(lib)
            if cuda_visible_devices is None:
                return [identity for identity, _ in devices]
            migs: list[MigDevice] = []
            if "MIG-" in cuda_visible_devices:
                migs = list(_list_mig_devices(lib, devices))
        except lib.NVMLError as error:
            raise NvmlUnavailable(f"NVML could not list the GPUs: {error}") from None
    return select_visible(cuda_visible_devices, [identity for identity, _ in devices], migs)


def select_visible(
    cuda_visible_devices: str, gpus: Sequence[GpuIdentity], migs: Sequence[MigDevice] = ()
) -> list[GpuIdentity]:
    """Apply CUDA's rules, as CUDA 13 (driver 580) showed them on two H200s: entries in order (spaces
    allowed around an index, not before a UUID); the list ends at the first entry that names no GPU,
    names one ambiguously, or switches between indices and UUIDs; a GPU named twice in what remains
    hides every GPU."""
    chosen: list[GpuIdentity] = []
    form = None
    for entry in cuda_visible_devices.split(","):
        entry_form = "index" if _INDEX.fullmatch(entry.strip()) else "uuid"
        match = _match_entry(entry, gpus, migs)
        if match is None or form not in (None, entry_form):
            break
        form = entry_form
        chosen.append(match)
    return chosen if len(set(chosen)) == len(chosen) else []


_INDEX = re.compile(r"[0-9]+")
_LEGACY_MIG = re.compile(r"MIG-(GPU-[0-9a-f-]+)/([0-9]+)/([0-9]+)")


def _match_entry(entry: str, gpus: Sequence[GpuIdentity], migs: Sequence[MigDevice]) -> GpuIdentity | None:
    # CUDA matches UUIDs case-sensitively and only with their "GPU-"/"MIG-" prefix; any unique prefix
    # of the UUID will do.
    if _INDEX.fullmatch(entry.strip()):
        index = int(entry)
        return gpus[index] if index < len(gpus) else None
    legacy = _LEGACY_MIG.fullmatch(entry)
    if legacy:
        parent, gpu_instance, compute_instance = legacy.group(1), int(legacy.group(2)), int(legacy.group(3))
        return _only(
            mig.identity
            for mig in migs
            if mig.parent_uuid == parent
            and (mig.gpu_instance, mig.compute_instance) == (gpu_instance, compute_instance)
        )
    if entry.startswith("MIG-"):
        return _only(mig.identity for mig in migs if _is_prefix(entry, mig.identity.uuid))
    if entry.startswith("GPU-"):
        return _only(gpu for gpu in gpus if _is_prefix(entry, gpu.uuid))
    return None


def _is_prefix(prefix: str, uuid: str) -> bool:
    return len(prefix) > len("GPU-") and uuid.startswith(prefix)


def _only(candidates: Iterable[GpuIdentity]) -> GpuIdentity | None:
    found = list(candidates)
    return found[0] if len(found) == 1 else None


def _list_devices(lib: Any) -> list[tuple[GpuIdentity, Any]]:
    devices = []
    for index in range(lib.nvmlDeviceGetCount()):
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        identity = GpuIdentity(index=index, uuid=lib.nvmlDeviceGetUUID(handle), name=lib.nvmlDeviceGetName(handle))
        devices.append((identity, handle))
    return devices


def _list_mig_devices(lib: Any, devices: Sequence[tuple[GpuIdentity, Any]]) -> Iterator[MigDevice]:
    for parent, handle in devices:
        try:
            current_mode, _pending = lib.nvmlDeviceGetMigMode(handle)
        except lib.NVMLError:
            continue  # NOT_SUPPORTED: a GPU without MIG
        if current_mode != lib.NVML_DEVICE_MIG_ENABLE:
            continue
        for slot in range(lib.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except lib.NVMLError:
                continue  # NOT_FOUND: an empty slot
            yield MigDevice(
                identity=GpuIdentity(
                    index=parent.index, uuid=lib.nvmlDeviceGetUUID(mig), name=lib.nvmlDeviceGetName(mig)
                ),
                parent_uuid=parent.uuid,
                gpu_instance=lib.nvmlDeviceGetGpuInstanceId(mig),
                compute_instance=lib.nvmlDeviceGetComputeInstanceId(mig),
            )
