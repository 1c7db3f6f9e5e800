"""GPU memory of a cell across hosts: each host's `harness host` samples its own GPUs (NVML) into
memory.hostI.json in the cell's folder; the engine merges them into the one memory.json, every GPU with
its host. What a host wrote is untrusted: bounded, regular files only, field by field."""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness.cell.gpus import GpuIdentity
from harness.cell.memory import DEFAULT_INTERVAL_S, GpuSamples, MemoryReport
from harness.contract import HOST_MEMORY_JSON
from harness.plan.cells import Cell

MAX_BYTES = 1024 * 1024
MAX_GPUS_PER_HOST = 64


def of_cell(cell: Cell, folder: Path, hosts: list[str]) -> MemoryReport | None:
    """What an engine's hosts sampled, merged; None for a cpu cell (no host samples GPUs for it)."""
    return None if cell.is_cpu else merge(folder, hosts)


def merge(folder: Path, hosts: list[str]) -> MemoryReport:
    gpus: list[GpuSamples] = []
    missing: list[str] = []
    interval_s, samples = DEFAULT_INTERVAL_S, []
    for index, host in enumerate(hosts):
        document = _read(folder / HOST_MEMORY_JSON.format(index=index))
        if not isinstance(document, dict) or document.get("available") is not True:
            reason = document.get("reason") if isinstance(document, dict) else None
            missing.append(f"{host}: {str(reason)[:120]}" if reason else host)
            continue
        interval_s = _number(document.get("interval_s")) or interval_s
        samples.append(int(_number(document.get("sample_count")) or 0))
        for entry in (document.get("gpus") or [])[:MAX_GPUS_PER_HOST]:
            if isinstance(entry, dict) and isinstance(entry.get("uuid"), str) and isinstance(entry.get("name"), str):
                gpus.append(GpuSamples(
                    gpu=GpuIdentity(index=int(_number(entry.get("index")) or 0), uuid=entry["uuid"][:96],
                                    name=entry["name"][:96]),
                    total_mib=_number(entry.get("total_mib")), used_before_mib=_number(entry.get("used_before_mib")),
                    peak_used_mib=_number(entry.get("peak_used_mib")), interval_s=interval_s,
                    sample_count=int(_number(entry.get("sample_count")) or 0), host=host))
    if not gpus:
        why = f" ({'; '.join(missing)})" if missing else ""
        return MemoryReport.unavailable(f"no host reported GPU memory{why}")
    reason = f"not reported by {', '.join(missing)}" if missing else None
    return MemoryReport(available=True, reason=reason, interval_s=interval_s, sample_count=min(samples),
                        gpus=tuple(gpus))


def _read(path: Path) -> object:
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
