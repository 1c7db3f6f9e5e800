"""Check harness.cell.memory on real GPUs: a known allocation must show up in the NVML peak, and the
monitor's own CPU cost at its sampling interval. Not a pytest file; run it directly:

    python tests/benchmarks/bench_memory.py --json results/bench_memory.json [--gib 10] [--hold-s 1]

It prints a compact table and writes the numbers as JSON. On a host without NVML it says
"NVML unavailable: <reason>", writes that, and exits 0; without CUDA torch it measures CPU cost only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

# Integer CUDA_VISIBLE_DEVICES entries are NVML (PCI bus) indices only in this order.
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `harness`

from harness.cell import memory

MIB = 1024 * 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, type=Path, help="where to write the results")
    parser.add_argument("--gib", type=float, default=10.0, help="GiB to allocate on each GPU (default 10)")
    parser.add_argument("--hold-s", type=float, default=1.0, help="how long to hold it (default 1 s)")
    parser.add_argument("--cpu-s", type=float, default=10.0, help="CPU-cost window (default 10 s)")
    parser.add_argument("--interval-s", type=float, default=memory.DEFAULT_INTERVAL_S,
                        help=f"sampling interval (default {memory.DEFAULT_INTERVAL_S})")
    return parser.parse_args(argv)


def cpu_seconds() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.process_time(), usage.ru_utime + usage.ru_stime


def measure_cpu_cost(gpus: list[memory.GpuIdentity], window_s: float, interval_s: float) -> dict[str, Any]:
    """CPU this process spends while the main thread sleeps, without and then with the monitor."""
    idle_window_s = min(window_s, 3.0)
    idle_start, _ = cpu_seconds()
    time.sleep(idle_window_s)
    idle_per_s = (cpu_seconds()[0] - idle_start) / idle_window_s

    monitor = memory.MemoryMonitor(gpus, interval_s=interval_s)
    process_start, rusage_start = cpu_seconds()
    wall_start = time.monotonic()
    monitor.start()
    time.sleep(window_s)
    report = monitor.stop()
    wall_s = time.monotonic() - wall_start
    process_end, rusage_end = cpu_seconds()
    cpu_s = process_end - process_start - idle_per_s * wall_s
    passes = max(report.sample_count - 1, 0)  # the first is the "before" reading in start()
    return {
        "interval_s": interval_s,
        "window_s": round(wall_s, 3),
        "passes": passes,
        "expected_passes": int(wall_s / interval_s),
        "mean_interval_s": round(wall_s / passes, 5) if passes else None,
        "cpu_s": round(cpu_s, 4),
        "rusage_cpu_s": round(rusage_end - rusage_start, 4),
        "idle_cpu_s_per_s": round(idle_per_s, 5),
        "cpu_percent_of_one_core": round(100 * cpu_s / wall_s, 3),
        "cpu_us_per_pass": round(1e6 * cpu_s / passes, 1) if passes else None,
    }


def used_now_mib(gpus: list[memory.GpuIdentity]) -> list[float | None]:
    report = memory.MemoryMonitor(gpus).start().stop()
    return [gpu.used_before_mib for gpu in report.gpus]


def measure_allocation(gpus: list[memory.GpuIdentity], gib: float, hold_s: float, interval_s: float
                       ) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str | None]:
    """Allocate `gib` on every visible GPU, hold it, and compare the monitor's peak with torch's view."""
    try:
        import torch
    except ImportError as error:
        return [], None, f"torch not importable ({error})"
    if not torch.cuda.is_available():
        return [], None, "torch sees no CUDA device"
    if torch.cuda.device_count() != len(gpus):
        return [], None, f"torch sees {torch.cuda.device_count()} GPUs, resolve_gpus {len(gpus)}"
    devices = range(len(gpus))
    nbytes = int(gib * 1024**3)

    monitor = memory.MemoryMonitor(gpus, interval_s=interval_s).start()  # before any CUDA context
    for device in devices:
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
    with_context = used_now_mib(gpus)
    reserved_tiny = [torch.cuda.memory_reserved(device) / MIB for device in devices]
    for device in devices:
        torch.cuda.reset_peak_memory_stats(device)
    held = [torch.empty(nbytes, dtype=torch.uint8, device=device).zero_() for device in devices]
    for device in devices:
        torch.cuda.synchronize(device)
    time.sleep(hold_s)
    report = monitor.stop()
    max_reserved = [torch.cuda.max_memory_reserved(device) / MIB for device in devices]
    del held
    torch.cuda.empty_cache()

    rows = []
    measured = zip(devices, gpus, report.gpus, with_context, reserved_tiny, strict=True)
    for device, gpu, entry, context_used, tiny in measured:
        torch_uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
        row: dict[str, Any] = {
            "cuda_index": device,
            **gpu.to_json(),
            "torch_uuid_matches": bool(torch_uuid) and gpu.uuid.lower().endswith(torch_uuid.lower()),
            "used_before_mib": entry.used_before_mib,
            "peak_used_mib": entry.peak_used_mib,
            "sample_count": entry.sample_count,
            "allocated_mib": nbytes / MIB,
            "max_reserved_mib": max_reserved[device],
        }
        if None not in (entry.peak_used_mib, entry.used_before_mib, context_used):
            delta = entry.peak_used_mib - entry.used_before_mib
            context = context_used - entry.used_before_mib - tiny
            row.update(
                nvml_delta_mib=delta,
                context_mib=context,
                reserved_plus_context_mib=max_reserved[device] + context,
                delta_vs_allocation_pct=100 * (delta - nbytes / MIB) / (nbytes / MIB),
                delta_vs_reserved_plus_context_mib=delta - (max_reserved[device] + context),
            )
        rows.append(row)
    return rows, report.to_json(), None


def driver_version() -> str | None:
    try:
        with memory.nvml_session() as nvml:
            return nvml.nvmlSystemGetDriverVersion()
    except memory.NvmlUnavailable:
        return None


def number(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(result: dict[str, Any]) -> None:
    print(f"driver {result['driver']}  interval {result['interval_s']} s  host {result['host']}")
    if result["allocation_skipped"]:
        print(f"allocation skipped: {result['allocation_skipped']}")
    header = ("cuda", "nvml", "uuid", "before", "peak", "peak-before", "alloc", "reserved", "context",
              "vs alloc %", "vs res+ctx", "samples", "uuid ok")
    print("  ".join(f"{h:>11}" for h in header))
    for row in result["gpus"]:
        cells = (row["cuda_index"], row["index"], row["uuid"][:11], number(row["used_before_mib"]),
                 number(row["peak_used_mib"]), number(row.get("nvml_delta_mib")),
                 number(row["allocated_mib"]), number(row["max_reserved_mib"]),
                 number(row.get("context_mib")), number(row.get("delta_vs_allocation_pct"), 2),
                 number(row.get("delta_vs_reserved_plus_context_mib"), 1), row["sample_count"],
                 row["torch_uuid_matches"])
        print("  ".join(f"{c!s:>11}" for c in cells))
    cpu = result["cpu"]
    print(f"monitor CPU at {cpu['interval_s']} s over {cpu['window_s']} s: "
          f"{cpu['cpu_percent_of_one_core']}% of one core, {cpu['cpu_us_per_pass']} us per pass, "
          f"{cpu['passes']}/{cpu['expected_passes']} passes, "
          f"mean interval {cpu['mean_interval_s']} s (idle process {cpu['idle_cpu_s_per_s']} cpu-s/s)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {"host": platform.node(), "interval_s": args.interval_s,
                              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    availability = memory.probe()
    result.update(available=availability.available, reason=availability.reason)
    if not availability.available:
        print(f"NVML unavailable: {availability.reason}")
        write(args.json, result)
        return 0
    gpus = memory.resolve_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    result["driver"] = driver_version()
    result["preflight"] = memory.preflight(gpus)
    for message in result["preflight"]:
        print(f"warning: {message}")
    result["cpu"] = measure_cpu_cost(gpus, args.cpu_s, args.interval_s)
    rows, memory_json, skipped = measure_allocation(gpus, args.gib, args.hold_s, args.interval_s)
    result.update(gpus=rows, allocation_skipped=skipped, memory_json=memory_json)
    print_table(result)
    write(args.json, result)
    return 0


def write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
