"""One-device tests sharing a GPU (harness.ranks.gpushare): how many share one, and a packed session that puts
them on the same GPU in workers of their own, its free memory read through a stand-in for NVML."""

from __future__ import annotations

import json
import os

import pytest
from packed_suites import MEET

from harness.ranks import gpushare

pytest_plugins = ["pytester"]

GIB = 1024


@pytest.mark.parametrize("free, peak, cpus, gpus, expected", [
    (80 * GIB, 2048, 16, 1, gpushare.MAX_SHARE),  # an H100 on 16 cores: capped
    (80 * GIB, 2048, 4, 1, 4),  # the cores feed 4 ranks
    (80 * GIB, 2048, 16, 8, 2),  # eight GPUs share the 16 cores
    (7 * GIB, 2048, 16, 1, 2),  # the memory holds 2 (2 GiB and a context each)
    (GIB, 2048, 16, 1, 1),  # not even one fits: one at a time, as serially
    (None, 2048, 16, 1, 1),  # NVML cannot say: no sharing
])
def test_shares(free, peak, cpus, gpus, expected):
    assert gpushare.shares(free, peak, cpus, gpus) == expected


def test_slots_go_gpu_after_gpu_so_workers_spread():
    free = {"a": 80 * GIB, "b": 7 * GIB}
    assert gpushare.shared_slots(("a", "b"), 2048, 16, free.get) == ("a", "b", "a", "b", *["a"] * 6)  # 8 and 2


class FakeNvml:
    def __init__(self, free_mib: dict[str, int], fails: bool = False):
        self.free_mib, self.fails, self.shutdowns = free_mib, fails, 0

    def nvmlInit(self):
        if self.fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return str(index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.free_mib:
            raise KeyError(uuid)
        return uuid

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Memory", (), {"free": self.free_mib[handle] << 20})()


def test_free_memory_by_index_or_uuid_and_none_where_nvml_cannot_say():
    nvml = FakeNvml({"0": 1000, "GPU-1234": 2000})
    assert gpushare.nvml_free_mib("0", nvml) == 1000
    assert gpushare.nvml_free_mib("GPU-1234", nvml) == 2000
    assert gpushare.nvml_free_mib("GPU-none", nvml) is None
    assert nvml.shutdowns == 3  # every init is balanced
    assert gpushare.nvml_free_mib("0", FakeNvml({}, fails=True)) is None


SUITE = """
import json
import os

import pytest

pytestmark = pytest.mark.one_device(peak_mib=2048)


@pytest.mark.parametrize("index", range(4))
def test_on_the_device(index):
    with open(os.environ["SHARE_TEST_SEEN"], "a") as seen:
        seen.write(json.dumps({"pid": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\\n")
    meet(os.environ["SHARE_TEST_SEEN"], int(os.environ["SHARE_TEST_PEERS"]))  # the workers sharing the GPU
""" + MEET

# NVML as the coordinator sees it: pynvml beside the suite is found first (python -m puts the folder on sys.path).
FAKE_PYNVML = """
import os

def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetHandleByUUID(uuid): return uuid
def nvmlDeviceGetMemoryInfo(handle):
    return type("Memory", (), {"free": int(os.environ["SHARE_TEST_FREE_MIB"]) << 20})()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="sharing needs a core per rank, two at least")
@pytest.mark.parametrize("free_mib, workers", [(80 * GIB, 2), (2 * GIB, 1)])
def test_one_device_tests_share_the_gpu_where_its_memory_allows(pytester, monkeypatch, free_mib, workers):
    monkeypatch.setenv("SHARE_TEST_SEEN", str(pytester.path / "seen.jsonl"))
    monkeypatch.setenv("SHARE_TEST_FREE_MIB", str(free_mib))
    monkeypatch.setenv("SHARE_TEST_PEERS", str(workers))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-fake")
    pytester.makepyfile(test_suite=SUITE, pynvml=FAKE_PYNVML)
    result = pytester.runpytest_subprocess("-p", "harness.ranks.packing", "--pack-tests", "-p", "no:randomly")
    assert result.parseoutcomes() == {"passed": 4}
    seen = [json.loads(line) for line in (pytester.path / "seen.jsonl").read_text().splitlines()]
    assert {entry["gpus"] for entry in seen} == {"GPU-fake"}  # the same GPU, named once
    assert len({entry["pid"] for entry in seen}) == workers
