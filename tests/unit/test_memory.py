"""harness.cell.memory against a fake, reference-counted NVML (tests/unit/fake_nvml.py); no GPU needed."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNKNOWN,
    FakeGpu,
    FakeNvml,
    FakeProcess,
    NVMLError,
)

from harness.cell.memory import (
    GpuIdentity,
    MemoryMonitor,
    MemoryReport,
    MigDevice,
    NvmlUnavailable,
    preflight,
    probe,
    resolve_gpus,
    select_visible,
    write_memory_json,
)

MIB = 1024 * 1024
UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
UUID_B = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
UUID_C = "GPU-8932aaaa-d72c-4106-c12f-20bd9faed9f6"
MIG_UUID = "MIG-5c3f7a1e-9b2d-5e8f-a1c4-d6e7f8a9b0c1"
FAST_INTERVAL_S = 0.001


def three_gpus() -> list[FakeGpu]:
    return [FakeGpu(uuid=UUID_A), FakeGpu(uuid=UUID_B), FakeGpu(uuid=UUID_C)]


def identity(fake: FakeNvml, index: int) -> GpuIdentity:
    gpu = fake.gpus[index]
    return GpuIdentity(index=index, uuid=gpu.uuid, name=gpu.name)


def assert_balanced(fake: FakeNvml) -> None:
    assert fake.refcount == 0
    assert fake.shutdown_calls == fake.init_calls


def monitor_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "harness-memory-monitor"]


def reads_reached(count: int) -> tuple[threading.Event, object]:
    """An on_memory_read hook that sets the event once the GPU has been read `count` times."""
    reached = threading.Event()

    def hook(read_number: int) -> None:
        if read_number >= count:
            reached.set()

    return reached, hook


def test_fake_only_has_names_that_pynvml_has():
    pynvml = pytest.importorskip("pynvml")
    fake_names = {name for name in dir(FakeNvml) if name.startswith(("nvml", "NVML"))}
    assert fake_names - set(dir(pynvml)) == set()


# --- probe ---


def test_probe_initialises_nvml_itself_and_releases_it():
    fake = FakeNvml(three_gpus())
    assert probe(fake).available is True
    assert fake.init_calls == 1
    assert_balanced(fake)


@pytest.mark.parametrize(
    ("gpus", "fail", "reason"),
    [
        (three_gpus(), {"nvmlInit": NVML_ERROR_DRIVER_NOT_LOADED}, "nvmlInit failed: Driver Not Loaded"),
        (three_gpus(), {"nvmlDeviceGetCount": NVML_ERROR_UNKNOWN},
         "nvmlDeviceGetCount failed: Unknown Error"),
        ([], {}, "NVML sees no GPUs"),
        (three_gpus(), {"nvmlDeviceGetHandleByIndex": NVML_ERROR_GPU_IS_LOST},
         "no GPU reports memory use: GPU 0: GPU is lost; GPU 1: GPU is lost; GPU 2: GPU is lost"),
        (
            [FakeGpu(uuid=UUID_A, memory_error=NVML_ERROR_NOT_SUPPORTED)],
            {},
            "no GPU reports memory use: GPU 0: Not Supported",
        ),
    ],
    ids=["init-fails", "count-fails", "no-gpus", "handle-fails", "memory-not-supported"],
)
def test_probe_unavailable_says_why_and_leaves_nvml_shut_down(gpus, fail, reason):
    fake = FakeNvml(gpus, fail=fail)
    availability = probe(fake)
    assert availability.available is False
    assert availability.reason == reason
    assert_balanced(fake)


def test_probe_without_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    availability = probe()
    assert availability.available is False
    assert availability.reason.startswith("nvidia-ml-py is not installed")


def test_probe_with_real_pynvml_where_there_is_no_driver():
    pynvml = pytest.importorskip("pynvml")
    availability = probe()
    if availability.available:
        pytest.skip("this host has a working NVML")
    assert availability.reason.startswith("nvmlInit failed: ")
    assert pynvml._nvmlLib_refcount == 0


# --- the monitor: starting, skipping, stopping ---


def test_monitor_starts_and_measures_when_memory_info_is_available():
    fake = FakeNvml(three_gpus())
    reached, hook = reads_reached(4)
    fake.gpus[1].on_memory_read = hook
    fake.gpus[1].used_mib = 2048.0
    monitor = MemoryMonitor([identity(fake, 1)], interval_s=FAST_INTERVAL_S, nvml=fake).start()
    assert fake.refcount == 1
    assert reached.wait(5)
    report = monitor.stop()
    assert report.available is True
    assert report.reason is None
    (gpu,) = report.gpus
    assert (gpu.gpu.uuid, gpu.used_before_mib, gpu.peak_used_mib, gpu.total_mib) == (
        UUID_B,
        2048.0,
        2048.0,
        143771.0,
    )
    assert gpu.sample_count >= 4
    assert report.sample_count == gpu.sample_count
    assert_balanced(fake)
    assert monitor_threads() == []


def test_monitor_keeps_the_highest_reading_and_the_one_before():
    fake = FakeNvml([FakeGpu(uuid=UUID_A, used_mib=600.0)])
    readings = {1: 600.0, 2: 5000.0, 3: 3000.0}
    reached = threading.Event()

    def hook(read_number: int) -> float:
        if read_number >= 6:
            reached.set()
        return readings.get(read_number, 1000.0)

    fake.gpus[0].on_memory_read = hook
    with MemoryMonitor([identity(fake, 0)], interval_s=FAST_INTERVAL_S, nvml=fake) as monitor:
        assert reached.wait(5)
    (gpu,) = monitor.report.gpus
    assert (gpu.used_before_mib, gpu.peak_used_mib) == (600.0, 5000.0)


def test_monitor_without_nvml_reports_unavailable_and_starts_nothing():
    fake = FakeNvml(three_gpus(), fail={"nvmlInit": NVML_ERROR_DRIVER_NOT_LOADED})
    monitor = MemoryMonitor([identity(fake, 0)], nvml=fake).start()
    assert monitor_threads() == []
    report = monitor.stop()
    assert report == MemoryReport.unavailable("nvmlInit failed: Driver Not Loaded")
    assert_balanced(fake)


def test_monitor_with_no_gpus_is_unavailable_without_touching_nvml():
    fake = FakeNvml(three_gpus())
    report = MemoryMonitor([], nvml=fake).start().stop()
    assert (report.available, report.reason) == (False, "no GPUs to monitor")
    assert fake.init_calls == 0


def test_not_supported_gives_null_and_the_other_gpu_still_runs():
    fake = FakeNvml([FakeGpu(uuid=UUID_A, memory_error=NVML_ERROR_NOT_SUPPORTED), FakeGpu(uuid=UUID_B)])
    reached, hook = reads_reached(3)
    fake.gpus[1].on_memory_read = hook
    with MemoryMonitor([identity(fake, 0), identity(fake, 1)], interval_s=FAST_INTERVAL_S, nvml=fake) as m:
        assert reached.wait(5)
    unsupported, supported = m.report.to_json()["gpus"]
    assert unsupported["total_mib"] is None
    assert unsupported["used_before_mib"] is None
    assert unsupported["peak_used_mib"] is None
    assert unsupported["sample_count"] == 0
    assert supported["peak_used_mib"] == 600.0
    assert supported["sample_count"] >= 3
    assert m.report.available is True
    assert_balanced(fake)


def test_a_gpu_that_stops_answering_does_not_stop_the_others():
    fake = FakeNvml([FakeGpu(uuid=UUID_A), FakeGpu(uuid=UUID_B)])

    def unsupported_after_first_read(read_number: int) -> None:
        if read_number >= 2:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    fake.gpus[0].on_memory_read = unsupported_after_first_read
    reached, hook = reads_reached(5)
    fake.gpus[1].on_memory_read = hook
    with MemoryMonitor([identity(fake, 0), identity(fake, 1)], interval_s=FAST_INTERVAL_S, nvml=fake) as m:
        assert reached.wait(5)
    first, second = m.report.gpus
    assert (first.peak_used_mib, first.sample_count) == (600.0, 1)
    assert fake.gpus[0].memory_reads == 2  # NOT_SUPPORTED once: not asked again
    assert second.sample_count >= 5


def test_nothing_readable_releases_nvml_at_start():
    fake = FakeNvml([FakeGpu(uuid=UUID_A, memory_error=NVML_ERROR_NOT_SUPPORTED)])
    monitor = MemoryMonitor([identity(fake, 0)], nvml=fake).start()
    assert fake.refcount == 0
    assert monitor_threads() == []
    report = monitor.stop()
    assert report.available is True
    assert report.gpus[0].peak_used_mib is None
    assert_balanced(fake)


def test_monitor_never_reads_a_gpu_it_was_not_given():
    fake = FakeNvml(three_gpus())
    reached, hook = reads_reached(3)
    fake.gpus[2].on_memory_read = hook
    with MemoryMonitor([identity(fake, 2)], interval_s=FAST_INTERVAL_S, nvml=fake) as monitor:
        assert reached.wait(5)
    assert [gpu.gpu.uuid for gpu in monitor.report.gpus] == [UUID_C]
    assert fake.gpus[0].memory_reads == fake.gpus[1].memory_reads == 0


def test_stop_twice_reports_and_shuts_down_once(capsys):
    fake = FakeNvml(three_gpus())

    def print_report(report: MemoryReport) -> None:
        print("\n".join(report.summary_lines()))

    monitor = MemoryMonitor([identity(fake, 0)], interval_s=FAST_INTERVAL_S, nvml=fake, on_stop=print_report)
    monitor.start()
    first = monitor.stop()
    second = monitor.stop()
    assert second is first
    assert fake.shutdown_calls == 1
    assert_balanced(fake)
    printed = capsys.readouterr().out
    assert printed.count(UUID_A) == 1
    assert "peak 600 MiB used of 143771 MiB" in printed


@pytest.mark.parametrize(
    "explicit_first", [True, False], ids=["explicit-then-atexit", "atexit-then-explicit"]
)
def test_stop_from_atexit_and_explicitly_reports_once(monkeypatch, explicit_first):
    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", lambda func: None)  # as if exit already took it off
    fake = FakeNvml(three_gpus())
    reports = []
    monitor = MemoryMonitor(
        [identity(fake, 0)], interval_s=FAST_INTERVAL_S, nvml=fake, on_stop=reports.append
    )
    monitor.start()
    (at_exit,) = registered
    calls = [monitor.stop, at_exit] if explicit_first else [at_exit, monitor.stop]
    results = [call() for call in calls]
    assert results[0] is results[1]
    assert reports == [results[0]]
    assert fake.shutdown_calls == 1
    assert_balanced(fake)


EXITING_CELL = """
import sys
from fake_nvml import FakeGpu, FakeNvml
from harness.cell.memory import GpuIdentity, MemoryMonitor

fake = FakeNvml([FakeGpu(uuid="GPU-1")])
def report_at_stop(report):
    print("stopped", report.available, "refcount after shutdown", fake.refcount, flush=True)
monitor = MemoryMonitor([GpuIdentity(index=0, uuid="GPU-1", name="x")], interval_s=0.001, nvml=fake,
                        on_stop=report_at_stop)
monitor.start()
if sys.argv[1] == "explicit":
    monitor.stop()
"""


@pytest.mark.parametrize("how", ["explicit", "only-at-exit"])
def test_a_real_interpreter_exit_stops_the_monitor_once(how):
    done = subprocess.run(
        [sys.executable, "-c", EXITING_CELL, how],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stopped True refcount after shutdown 0\n"
    assert done.stderr == ""


def test_stop_unregisters_its_atexit_hook(monkeypatch):
    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", registered.remove)
    fake = FakeNvml(three_gpus())
    monitor = MemoryMonitor([identity(fake, 0)], nvml=fake).start()
    assert len(registered) == 1
    monitor.stop()
    assert registered == []


def test_stop_during_a_sampling_pass_waits_for_the_second_gpu():
    fake = FakeNvml([FakeGpu(uuid=UUID_A, used_mib=600.0), FakeGpu(uuid=UUID_B, used_mib=600.0)])
    in_second_read = threading.Event()
    release = threading.Event()

    def pause_first_sample(read_number: int) -> float | None:
        if read_number == 2:  # read 1 is the "before" reading start() takes
            in_second_read.set()
            assert release.wait(5)
            return 9000.0
        return None

    fake.gpus[1].on_memory_read = pause_first_sample
    monitor = MemoryMonitor([identity(fake, 0), identity(fake, 1)], interval_s=FAST_INTERVAL_S, nvml=fake)
    monitor.start()
    assert in_second_read.wait(5)  # the pass has read GPU 0 and is inside GPU 1's read
    reports = []
    stopper = threading.Thread(target=lambda: reports.append(monitor.stop()))
    stopper.start()
    time.sleep(0.1)  # let stop() get as far as it goes while the pass is still held
    release.set()
    stopper.join(5)
    (report,) = reports
    assert report.gpus[1].peak_used_mib == 9000.0
    assert report.gpus[1].sample_count == 2
    assert report.gpus[0].sample_count == 2
    assert_balanced(fake)


def test_context_manager_stops_on_error():
    fake = FakeNvml(three_gpus())
    monitor = MemoryMonitor([identity(fake, 0)], nvml=fake)
    with pytest.raises(KeyError), monitor:
        raise KeyError("the cell crashed")
    assert monitor.report is not None
    assert_balanced(fake)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda fake: MemoryMonitor([identity(fake, 0)], interval_s=0, nvml=fake), "interval_s must be > 0"),
        (lambda fake: MemoryMonitor([identity(fake, 0)] * 2, nvml=fake), "the same GPU twice"),
        (lambda fake: MemoryMonitor([identity(fake, 0)], nvml=fake).stop(), "stop() called before start()"),
        (lambda fake: MemoryMonitor([], nvml=fake).start().start(), "start() called twice"),
    ],
    ids=["zero-interval", "duplicate-gpu", "stop-before-start", "start-twice"],
)
def test_monitor_misuse_is_a_clear_error(make, message):
    with pytest.raises((ValueError, RuntimeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        make(FakeNvml(three_gpus()))


# --- CUDA_VISIBLE_DEVICES ---

GPUS = [
    GpuIdentity(index=0, uuid=UUID_A, name="NVIDIA H200"),
    GpuIdentity(index=1, uuid=UUID_B, name="NVIDIA H200"),
    GpuIdentity(index=2, uuid=UUID_C, name="NVIDIA H200"),
]
MIG = MigDevice(
    identity=GpuIdentity(index=0, uuid=MIG_UUID, name="NVIDIA H200 MIG 1g.18gb"),
    parent_uuid=UUID_A,
    gpu_instance=7,
    compute_instance=0,
)


# Each rule below was checked against what torch (CUDA 13, driver 580) showed on two H200s.
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("0,1,2", [0, 1, 2]),
        ("2,0", [2, 0]),
        (" 1 , 0 ", [1, 0]),
        ("", []),
        ("0,2,-1,1", [0, 2]),  # the list ends at the first entry that names no GPU
        ("0,7,1", [0]),
        ("0,,1", [0]),
        ("0,x,0", [0]),
        ("1,1", []),  # a GPU named twice: no GPU at all
        ("0,1,0", []),
        (f"{UUID_A},{UUID_A[:12]}", []),
        (UUID_C, [2]),
        (f"{UUID_B},{UUID_A}", [1, 0]),
        (f"{UUID_B}, {UUID_A}", [1]),  # a space before a UUID makes it name nothing
        (f"{UUID_B},0", [1]),  # switching between UUIDs and indices ends the list
        (f"1,0,{UUID_B}", [1, 0]),
        (f"0,{UUID_A}", [0]),
        ("GPU-8932f937", [1]),  # a unique prefix
        ("GPU-8932", []),  # an ambiguous one
        ("GPU-", []),
        ("GPU-ffff", []),
        ("8932f937", []),  # without "GPU-"
        (UUID_C.upper(), []),  # case matters
        ("gpu-8932f937", []),
        (f"{UUID_A},{MIG_UUID}", [0, "mig"]),
        ("MIG-5c3f", ["mig"]),
        (f"MIG-{UUID_A}/7/0", ["mig"]),
        (f"MIG-{UUID_A}/7/1", []),
        ("MIG-ffff", []),
    ],
)
def test_cuda_visible_devices_selects_what_cuda_shows(spec, expected):
    selected = select_visible(spec, GPUS, [MIG])
    assert selected == [MIG.identity if entry == "mig" else GPUS[entry] for entry in expected]


def test_resolve_gpus_maps_through_nvml_and_releases_it():
    mig = FakeGpu(uuid=MIG_UUID, name="NVIDIA H200 MIG 1g.18gb", gpu_instance=7, compute_instance=0)
    gpus = three_gpus()
    gpus[0].migs = [mig]
    gpus[2].mig_capable = True
    fake = FakeNvml(gpus)
    assert resolve_gpus(None, nvml=fake) == GPUS
    assert resolve_gpus(f"{UUID_C},GPU-8932f937", nvml=fake) == [GPUS[2], GPUS[1]]
    assert resolve_gpus(f"MIG-{UUID_A}/7/0", nvml=fake) == [MIG.identity]
    assert fake.init_calls == 3
    assert_balanced(fake)


def test_resolve_gpus_without_nvml_raises_the_reason():
    fake = FakeNvml(three_gpus(), fail={"nvmlDeviceGetUUID": NVML_ERROR_GPU_IS_LOST})
    with pytest.raises(NvmlUnavailable, match="NVML could not list the GPUs: GPU is lost"):
        resolve_gpus("0", nvml=fake)
    assert_balanced(fake)


# --- preflight ---


def busy_host(**gpu1) -> FakeNvml:
    return FakeNvml([FakeGpu(uuid=UUID_A), FakeGpu(uuid=UUID_B, **gpu1)])


@pytest.mark.parametrize(
    ("gpu1", "expected"),
    [
        (
            {"used_mib": 600.0 + 5123, "processes": [FakeProcess(pid=4242, usedGpuMemory=5123 * MIB)]},
            ["GPU 1 busy: 5123 MiB used by other processes (pids 4242)"],
        ),
        (  # the process list is hidden (another PID namespace): used memory minus the idle baseline
            {"used_mib": 1024.0 + 5123, "processes": []},
            ["GPU 1 busy: 5123 MiB used by other processes"],
        ),
        (
            {"used_mib": 1024.0 + 3000, "processes": None},
            ["GPU 1 busy: 3000 MiB used by other processes"],
        ),
        (
            {"used_mib": 9000.0, "processes": [FakeProcess(pid=os.getpid(), usedGpuMemory=8400 * MIB)]},
            [],
        ),
        (
            {"used_mib": 1024.0 + 900, "processes": [FakeProcess(pid=4242, usedGpuMemory=900 * MIB)]},
            [],
        ),
        (
            {"memory_error": NVML_ERROR_NOT_SUPPORTED, "processes": [FakeProcess(pid=7, usedGpuMemory=None)]},
            [],
        ),
        ({"handle_error": NVML_ERROR_NOT_FOUND}, []),
    ],
    ids=["process-list", "hidden-processes", "no-process-list", "own-process", "below-threshold",
         "cannot-tell", "gpu-not-found"],
)
def test_preflight_names_busy_gpus(gpu1, expected):
    fake = busy_host(**gpu1)
    assert preflight([identity(fake, 0), identity(fake, 1)], threshold_mib=1024, nvml=fake) == expected
    assert_balanced(fake)


def test_preflight_without_nvml_finds_nothing():
    fake = busy_host(used_mib=100_000.0)
    fake.fail["nvmlInit"] = NVML_ERROR_DRIVER_NOT_LOADED
    assert preflight([identity(fake, 1)], threshold_mib=1024, nvml=fake) == []


# --- memory.json ---


def test_memory_json_has_the_contract_shape(tmp_path):
    fake = FakeNvml([FakeGpu(uuid=UUID_A, used_mib=512.0), FakeGpu(uuid=UUID_B, memory_error=3)])
    report = MemoryMonitor([identity(fake, 0), identity(fake, 1)], interval_s=0.05, nvml=fake).start().stop()
    path = write_memory_json(tmp_path / "cell" / "memory.json", report)
    written = json.loads(path.read_text())
    assert written == {
        "schema": 1,
        "available": True,
        "reason": None,
        "interval_s": 0.05,
        "sample_count": written["sample_count"],
        "gpus": [
            {"index": 0, "name": "NVIDIA H200", "uuid": UUID_A, "total_mib": 143771.0,
             "used_before_mib": 512.0, "peak_used_mib": 512.0, "interval_s": 0.05,
             "sample_count": written["gpus"][0]["sample_count"], "host": None},
            {"index": 1, "name": "NVIDIA H200", "uuid": UUID_B, "total_mib": None, "used_before_mib": None,
             "peak_used_mib": None, "interval_s": 0.05, "sample_count": 0, "host": None},
        ],
    }
    assert written["sample_count"] >= 1
    assert written["gpus"][0]["sample_count"] >= 1
    assert list(tmp_path.joinpath("cell").iterdir()) == [path]  # no temporary file left behind


def test_memory_json_when_unavailable(tmp_path):
    report = MemoryReport.unavailable("nvmlInit failed: Driver Not Loaded")
    path = write_memory_json(tmp_path / "memory.json", report)
    assert json.loads(path.read_text()) == {
        "schema": 1, "available": False, "reason": "nvmlInit failed: Driver Not Loaded",
        "interval_s": 0.05, "sample_count": 0, "gpus": [],
    }


# --- NVML's reference count after every failure ---

NVML_CALLS = [
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
]


ENTRY_POINTS = {
    "probe": lambda fake, gpus: probe(fake),
    "resolve_gpus": lambda fake, gpus: resolve_gpus(None, nvml=fake),
    "resolve_gpus MIG": lambda fake, gpus: resolve_gpus(f"1,MIG-{UUID_A}/7/0", nvml=fake),
    "preflight": lambda fake, gpus: preflight(gpus, threshold_mib=1, nvml=fake),
    "monitor": lambda fake, gpus: MemoryMonitor(gpus, interval_s=FAST_INTERVAL_S, nvml=fake).start().stop(),
}


def host_with_mig() -> list[FakeGpu]:
    gpus = three_gpus()
    gpus[0].migs = [FakeGpu(uuid=MIG_UUID, gpu_instance=7)]
    return gpus


@pytest.mark.parametrize(
    "failure",
    [NVML_ERROR_UNKNOWN, NVML_ERROR_NOT_SUPPORTED, RuntimeError("not an NVML error")],
    ids=["nvml-error", "not-supported", "other-exception"],
)
@pytest.mark.parametrize("call", ["nvmlInit", *NVML_CALLS])
def test_refcount_balanced_whatever_fails(call, failure):
    fake = FakeNvml(host_with_mig(), fail={call: failure})
    gpus = [identity(fake, 0), identity(fake, 1)]
    for name, entry_point in ENTRY_POINTS.items():
        try:
            entry_point(fake, gpus)
        except NvmlUnavailable:
            assert name.startswith("resolve_gpus")
        except RuntimeError as error:
            assert error is failure
        assert_balanced(fake)
    assert monitor_threads() == []


def test_failing_shutdown_is_tried_once_and_does_not_raise():
    fake = FakeNvml(three_gpus(), fail={"nvmlShutdown": NVML_ERROR_UNKNOWN})
    assert probe(fake).available is True
    report = MemoryMonitor([identity(fake, 0)], nvml=fake).start().stop()
    assert report.available is True
    assert fake.init_calls == fake.shutdown_attempts == 2
