"""The persistent rank pool (harness/ranks/pool.py), on CPU ranks with gloo: reuse, isolation between calls,
a fresh pool after a crash or a hang, the spawn fallback, and the pytest plugin around it."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
from installed_module import import_installed_module
from process_helpers import is_alive, sleep_forever

from harness.ranks import RankFailedError, RankTimeoutError, zygote
from harness.ranks.pool import PoolLauncher
from harness.ranks.rank import KEPT_GROUPS_MAX

torch = pytest.importorskip("torch")
pytest_plugins = ["pytester"]

# ---------------------------------------------------------------- functions the ranks run (module level)

LEFTOVER = None


def identify():
    import torch.distributed as dist

    return {"rank": dist.get_rank(), "pid": os.getpid(), "parent": os.getppid()}


def observe():
    """What a test sees when it starts: it must be the same on a fresh pool and after a messy call."""
    import torch.distributed as dist

    return {"pid": os.getpid(), "leftover": LEFTOVER, "dtype": str(torch.get_default_dtype()),
            "torch_random": torch.rand(3).tolist(), "python_random": random.random(),
            "environ": os.environ.get("HARNESS_TEST_LEFTOVER"), "cwd": os.getcwd(),
            "grad": torch.is_grad_enabled(), "groups": len(dist.distributed_c10d._world.pg_map),
            "sys_path_end": sys.path[-1]}


def leave_a_mess(freed_marker):
    """Everything a careless test might leave behind in a rank."""
    import torch.distributed as dist

    global LEFTOVER
    LEFTOVER = torch.ones(64, 1024, 1024, dtype=torch.uint8)  # 64 MiB
    weakref.finalize(LEFTOVER, Path(freed_marker).write_text, "freed")
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1234)
    random.seed(1234)
    os.environ["HARNESS_TEST_LEFTOVER"] = "1"
    os.chdir("/")
    torch.set_grad_enabled(False)
    dist.new_group(backend="gloo")
    sys.path.append("/leftover")
    return "messy"


def op_on_a_new_mesh():
    """One DTensor op on a fresh 2-D mesh (its size-1 dim gets a process group of this call's own); the groups
    that the op's output mesh names must resolve."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    doubled = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0), Replicate()]) * 2
    return [doubled.device_mesh.get_group(name).size() for name in ("dp", "tp")]


def ops_on_distinct_meshes(count):
    """`count` meshes that compare unequal (their dimensions' names differ), one DTensor op on each."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    for index in range(count):
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=(f"dp{index}", f"tp{index}"))
        distribute_tensor(torch.ones(4, 4), mesh, [Shard(0), Replicate()]) * 2
    return count


def keep_a_mesh_in_a_library():
    """Like a cache the pool does not know of: a mesh kept by an installed package's class, not by the suite
    (a module-level binding would be put back after the call, as a fresh rank has none)."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.distributed.device_mesh.DeviceMesh._harness_kept_mesh = init_device_mesh("cpu", (2, 1),
                                                                               mesh_dim_names=("dp", "tp"))


def use_the_kept_mesh():
    return torch.distributed.device_mesh.DeviceMesh._harness_kept_mesh.get_group("tp").size()


def forget_the_kept_mesh():
    vars(torch.distributed.device_mesh.DeviceMesh).get("_harness_kept_mesh") and \
        delattr(torch.distributed.device_mesh.DeviceMesh, "_harness_kept_mesh")


def keep_many_objects_in_a_library(count):
    torch.distributed.device_mesh.DeviceMesh._harness_kept_objects = [[index] for index in range(count)]


def forget_the_kept_objects():
    vars(torch.distributed.device_mesh.DeviceMesh).get("_harness_kept_objects") is not None and \
        delattr(torch.distributed.device_mesh.DeviceMesh, "_harness_kept_objects")


class SelfReferring:
    """A reference cycle: only a collection that reaches it frees it."""

    def __init__(self) -> None:
        self.me = self


def keep_a_cycle_in_a_library():
    cycle = SelfReferring()
    torch.distributed.device_mesh.DeviceMesh._harness_kept_cycle = cycle
    torch.distributed.device_mesh.DeviceMesh._harness_cycle_ref = weakref.ref(cycle)


def let_the_kept_cycle_go():
    vars(torch.distributed.device_mesh.DeviceMesh).get("_harness_kept_cycle") is not None and \
        delattr(torch.distributed.device_mesh.DeviceMesh, "_harness_kept_cycle")


def the_let_go_cycle_is_alive():
    """Whether the cycle is alive still; its attributes are gone after."""
    let_the_kept_cycle_go()
    alive = torch.distributed.device_mesh.DeviceMesh._harness_cycle_ref() is not None
    delattr(torch.distributed.device_mesh.DeviceMesh, "_harness_cycle_ref")
    return alive


def redistribute_on_a_mesh_of_its_own():
    """A DTensor redistribution: torch caches its planner per mesh, and the planner refers to itself."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, _redistribute, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    sharded = distribute_tensor(torch.arange(4.0).reshape(2, 2), mesh, [Shard(0), Replicate()])
    whole = sharded.redistribute(mesh, [Replicate(), Replicate()]).to_local()
    return whole.sum().item(), len(_redistribute._planner_cache)


def objects_the_collector_walks():
    import gc

    return len(gc.get_objects())


SETTINGS = {"scale": 1}  # a suite module's container, which a careless test mutates in place


def pollute_a_suite_dict():
    SETTINGS["scale"] = 2


def patch_torch_then_fail():
    torch.nn.functional.relu = torch.neg
    raise AssertionError("the patched test failed, in order, on every rank")


def default_device_meta():
    torch.set_default_device("meta")


def flush_denormals():
    torch.set_flush_denormal(True)


def cpu_autocast_on():
    torch.set_autocast_enabled("cpu", True)


def close_stdout():
    sys.stdout.close()


def close_fds_one_and_two():
    os.close(1)
    os.close(2)


def leave_a_thread():
    threading.Thread(target=time.sleep, args=(3600,), name="left-behind", daemon=True).start()


def import_a_module_first():
    import wave  # noqa: F401 - imported by no rank before


def fresh_view():
    """What a victim test sees of the state the polluters above change."""
    import io

    print("a victim prints", flush=True)
    os.write(1, b"")
    return {"scale": SETTINGS["scale"], "relu": torch.nn.functional.relu(torch.tensor([-1.0, 2.0])).tolist(),
            "device": str(torch.empty(1).device), "denormal": torch.tensor([1e-40]).mul(1.0).item() != 0.0,
            "matmul_dtype": str((torch.ones(2, 2) @ torch.ones(2, 2)).dtype),
            "stdout": isinstance(sys.stdout, io.TextIOBase) and not sys.stdout.closed,
            "fds": [os.fstat(fd).st_ino for fd in (1, 2)],
            "threads": sorted(thread.name for thread in threading.enumerate())}


def raise_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise AssertionError("the answer is 41")
    dist.barrier()


def raise_on_rank_one_together(first_to_report):
    """raise_on_rank_one with its check inside `together`; `first_to_report` is the rank whose failure reaches
    the launcher first (the other waits a little after agreeing): it must not decide which error is reported."""
    import torch.distributed as dist

    from harness.ranks import together

    try:
        with together("the answer check"):
            if dist.get_rank() == 1:
                raise AssertionError("the answer is 41")
        dist.barrier()
    finally:
        if dist.get_rank() != first_to_report:
            time.sleep(0.2)


def raise_on_rank_one_alone():
    """Fails on rank 1 with no collective after it: every rank answers, and the pool can serve on."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise AssertionError("the answer is 41")
    return "fine"


def exit_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(7)
    dist.barrier()


def die_on_rank_one_if_it_served_before(folder: str, always: bool = False):
    """Rank 1 dies by a signal in a call when its process took an earlier call (a mark in `folder`: state a kept set
    has and a fresh one has not, as a long-lived rank's crash), or every time with `always`."""
    import torch.distributed as dist

    mark = Path(folder) / str(os.getpid())
    served_before = mark.exists()
    mark.touch()
    if dist.get_rank() == 1 and (always or served_before):
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return os.getpid()


def hang_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        sleep_forever()
    dist.barrier()


def spin_in_c(pid_dir):
    """Write this rank's pid and its parent's, then backtrack for ages inside C code, holding the GIL (no
    Python thread of the rank runs again)."""
    import re

    import torch.distributed as dist

    Path(pid_dir, f"rank{dist.get_rank()}").write_text(f"{os.getpid()} {os.getppid()}")
    re.match(r"(a+)+$", "a" * 64 + "b")


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []


def _wait_until_gone(pids, seconds=5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if is_alive(pid)]


# ---------------------------------------------------------------- the launcher


@pytest.fixture(scope="module")
def launcher():
    launcher = PoolLauncher()
    yield launcher
    launcher.close()


def pids(launcher) -> list[int]:
    return [result.value["pid"] for result in launcher(2, identify, timeout=60, device="cpu")]


def test_calls_reuse_the_ranks_and_return_results_by_rank(launcher):
    results = launcher(2, identify, timeout=60, device="cpu")
    assert [result.rank for result in results] == [0, 1]
    assert [result.value["rank"] for result in results] == [0, 1]
    assert all(result.peak_allocated_mib is None and result.peak_reserved_mib is None for result in results)
    assert pids(launcher) == [result.value["pid"] for result in results]
    zygote = {result.value["parent"] for result in results}
    assert len(zygote) == 1 and zygote != {os.getpid()}  # forked by the zygote, not spawned by this process


def test_what_a_call_leaves_behind_does_not_reach_the_next(launcher, tmp_path):
    fresh = [result.value for result in launcher(2, observe, timeout=60, device="cpu")]
    freed = tmp_path / "freed"
    assert [result.value for result in launcher(2, leave_a_mess, str(freed), timeout=60, device="cpu")] == \
        ["messy", "messy"]
    after = [result.value for result in launcher(2, observe, timeout=60, device="cpu")]
    assert after == fresh  # the same ranks (pids included), seeing what a fresh pool sees
    assert after[0]["leftover"] is None and after[0]["dtype"] == "torch.float32"
    assert freed.read_text() == "freed"  # the 64 MiB tensor was collected, not only forgotten


@pytest.mark.parametrize(("polluter", "retired_because"), [
    (pollute_a_suite_dict, None),
    (patch_torch_then_fail, None),
    (default_device_meta, None),
    (flush_denormals, None),
    (cpu_autocast_on, None),
    (close_fds_one_and_two, None),
    (close_stdout, "sys.stdout closed"),
    (leave_a_thread, "threads left running: left-behind"),
    (import_a_module_first, "modules imported first during a call: wave"),
])
def test_a_victim_after_a_polluter_sees_what_a_fresh_pool_shows(launcher, polluter, retired_because):
    """Within one test (between tests its ranks end: test_no_test_sees_what_an_earlier_test_left_in_its_ranks):
    each polluter leaves process-global state behind; the test's next call must see a fresh rank's. What can be
    put back exactly is (the same ranks serve on); what cannot retires the set, and says why."""
    launcher.renew()
    fresh = [result.value for result in launcher(2, fresh_view, timeout=60, device="cpu")]
    before = pids(launcher)
    with contextlib.suppress(RankFailedError):
        launcher(2, polluter, timeout=60, device="cpu")
    assert [result.value for result in launcher(2, fresh_view, timeout=60, device="cpu")] == fresh
    after = pids(launcher)
    retirements = launcher.renew()
    if retired_because is None:
        assert retirements == [] and after == before
    else:
        assert len(retirements) == 1 and retired_because in retirements[0], retirements
        assert set(after).isdisjoint(before)


def groups(launcher) -> list[int]:
    return [result.value["groups"] for result in launcher(2, observe, timeout=60, device="cpu")]


def test_warm_caches_hand_a_later_call_an_earlier_mesh_whose_groups_are_alive(launcher):
    """DTensor caches output shardings (in its C++ dispatch too), keyed by meshes that compare equal across calls.
    The caches stay warm: a later call's op returns the first call's mesh, whose groups the rank keeps for it.
    Groups do not grow with the calls: the caches hand back the one mesh."""
    with contextlib.suppress(RankFailedError):  # a failed call clears the caches: start from cold ones
        launcher(2, raise_on_rank_one_alone, timeout=60, device="cpu")
    world = groups(launcher)
    for _ in range(2):  # a process's first DTensor op may not fill the cache
        assert [result.value for result in launcher(2, op_on_a_new_mesh, timeout=60, device="cpu")] == [[2, 1]] * 2
    kept = groups(launcher)
    assert kept == [count + 1 for count in world]  # one mesh's size-1 group, named by the warm cache
    for _ in range(3):
        assert [result.value for result in launcher(2, op_on_a_new_mesh, timeout=60, device="cpu")] == [[2, 1]] * 2
    assert groups(launcher) == kept


def test_after_a_failed_call_the_caches_and_every_group_but_the_worlds_are_forgotten(launcher):
    """A group a failure may have left half-used is never handed to a later call by a warm cache."""
    launcher(2, op_on_a_new_mesh, timeout=60, device="cpu")
    with pytest.raises(RankFailedError):
        launcher(2, raise_on_rank_one_alone, timeout=60, device="cpu")
    assert groups(launcher) == [1, 1]
    assert [result.value for result in launcher(2, op_on_a_new_mesh, timeout=60, device="cpu")] == [[2, 1]] * 2


def test_groups_kept_for_warm_caches_stay_bounded(launcher):
    """Meshes of distinct dimension names do not compare equal: each cached op keeps its own mesh's group. Past
    KEPT_GROUPS_MAX the rank clears the caches, and the groups go with them."""
    for _ in range(3):
        assert launcher(2, ops_on_distinct_meshes, 20, timeout=60, device="cpu")[0].value == 20
        assert max(groups(launcher)) <= KEPT_GROUPS_MAX + 1


def test_a_group_that_a_mesh_kept_elsewhere_names_stays_until_the_mesh_goes(launcher):
    with contextlib.suppress(RankFailedError):  # a failed call clears the caches: no cached mesh keeps a group
        launcher(2, raise_on_rank_one_alone, timeout=60, device="cpu")
    before = groups(launcher)
    try:
        launcher(2, keep_a_mesh_in_a_library, timeout=60, device="cpu")
        # twice: after the first call's reset the mesh is among what the rank froze (harness.ranks.survivors),
        # out of every later scan of the heap, and its group must still stay
        for _ in range(2):
            assert [result.value for result in launcher(2, use_the_kept_mesh, timeout=60, device="cpu")] == [1, 1]
        assert groups(launcher) == [count + 1 for count in before]  # the kept mesh's own group, nothing more
    finally:
        launcher(2, forget_the_kept_mesh, timeout=60, device="cpu")
    assert groups(launcher) == before


def test_what_a_call_leaves_alive_is_out_of_later_collections_way(launcher):
    """A rank's collections after a reset walk only what later calls make, not all that earlier calls left alive
    (a rank serving the suite held 255,000 objects: a full collection of them cost 0.13-0.36 s a reset)."""
    left = 200_000
    try:
        launcher(2, keep_many_objects_in_a_library, left, timeout=60, device="cpu")
        walked = [result.value for result in launcher(2, objects_the_collector_walks, timeout=60, device="cpu")]
        assert max(walked) < left // 4, walked
    finally:
        launcher(2, forget_the_kept_objects, timeout=60, device="cpu")


def test_a_failed_call_lets_go_of_a_cached_planners_mesh_without_walking_the_whole_heap(launcher):
    """After a failed call every cache that holds a mesh is cleared and the call's groups go. A redistribution
    planner torch caches per mesh refers to itself (its cost closure): frozen at an earlier reset, it would keep
    its mesh and groups until a collection of the whole heap (0.4-1.7 s a rank on 2 loaded cores, once per failed
    call). A cycle that died after a reset shows whether such a collection ran: only one frees it."""
    with contextlib.suppress(RankFailedError):  # start from cold caches
        launcher(2, raise_on_rank_one_alone, timeout=60, device="cpu")
    before = groups(launcher)
    for _ in range(2):  # a process's first DTensor op may not fill the caches
        results = launcher(2, redistribute_on_a_mesh_of_its_own, timeout=60, device="cpu")
    assert [result.value for result in results] == [(6.0, 1)] * 2  # one planner cached, for the call's mesh
    launcher(2, keep_a_cycle_in_a_library, timeout=60, device="cpu")
    try:
        launcher(2, let_the_kept_cycle_go, timeout=60, device="cpu")  # dead, frozen at the last reset
        assert groups(launcher) != before  # the warm caches keep the mesh's groups
        with contextlib.suppress(RankFailedError):
            launcher(2, raise_on_rank_one_alone, timeout=60, device="cpu")
        assert groups(launcher) == before  # the planner's mesh is gone, its groups too
    finally:  # a later test's ranks must not find the cycle's attributes, whatever failed above
        alive = [result.value for result in launcher(2, the_let_go_cycle_is_alive, timeout=60, device="cpu")]
    assert alive == [True] * 2


def test_an_exception_a_peer_waits_on_fails_the_call_with_the_peers_stack_and_the_next_gets_a_fresh_pool(launcher):
    before = pids(launcher)
    with pytest.raises(RankFailedError) as failure:
        launcher(2, raise_on_rank_one, timeout=60, device="cpu")
    assert failure.value.rank == 1
    assert str(failure.value).startswith("rank 1 raised AssertionError: the answer is 41")
    assert "in raise_on_rank_one" in failure.value.details
    # rank 0 waits in the barrier (its collective timeout is past the launch's): collateral, with its stack
    [waiting] = failure.value.other_failures
    assert waiting.startswith("rank 0 was still running and was killed") and "barrier" in waiting
    after = pids(launcher)
    assert set(after).isdisjoint(before)
    assert _wait_until_gone(before) == []


def test_a_rank_that_exits_is_reported_with_its_exit_code_and_the_next_call_gets_a_fresh_pool(launcher):
    before = pids(launcher)
    with pytest.raises(RankFailedError, match=r"^rank 1 exited with code 7 without a result"):
        launcher(2, exit_on_rank_one, timeout=60, device="cpu")
    assert set(pids(launcher)).isdisjoint(before)


def test_a_hang_is_killed_at_the_timeout_with_every_ranks_stack_and_the_next_call_gets_a_fresh_pool(launcher):
    before = pids(launcher)
    started = time.monotonic()
    with pytest.raises(RankTimeoutError) as failure:
        launcher(2, hang_on_rank_one, timeout=3, device="cpu")
    assert time.monotonic() - started < 3 + 10
    error = failure.value
    assert str(error).startswith("ranks [0, 1] still running after 3s; killed.")
    assert "in sleep_forever" in error.stacks[1]
    assert "in hang_on_rank_one" in error.stacks[0] and "barrier" in error.stacks[0]
    assert _wait_until_gone(before) == []
    assert set(pids(launcher)).isdisjoint(before)


def test_a_rank_killed_between_calls_is_found_before_the_next_call_and_replaced(launcher):
    first = [result.value["pid"] for result in launcher(2, identify, timeout=60, device="cpu")]
    os.kill(first[1], signal.SIGKILL)  # and at once the next call: it must find the rank dead, not fail
    second = [result.value["pid"] for result in launcher(2, identify, timeout=60, device="cpu")]
    assert set(second).isdisjoint(first)
    assert _wait_until_gone(first) == []


def test_a_rank_that_dies_on_a_kept_set_is_called_again_on_fresh_ranks_whose_outcome_is_the_calls(tmp_path):
    """A verdict must not depend on the calls before: a crash of a rank that served earlier calls may be that past's,
    so the call runs again on fresh ranks, as --no-ranks-pool runs it, and their outcome stands, named in the report."""
    launcher = PoolLauncher()
    try:
        first = [result.value for result in launcher(2, die_on_rank_one_if_it_served_before, str(tmp_path), timeout=60,
                                                     device="cpu")]
        again = [result.value for result in launcher(2, die_on_rank_one_if_it_served_before, str(tmp_path), timeout=60,
                                                     device="cpu")]
        assert set(again).isdisjoint(first)  # fresh ranks answered: the kept set's crash decided nothing
        assert launcher.pools_crashed == 1
        [line] = launcher.renew()
        assert "rank 1 exited by signal SIGKILL without a result on a rank set that had served 1 earlier calls" in line
        assert "ran again on fresh ranks" in line and "1 calls run again on fresh ranks" in launcher.summary()
        # a crash that fresh ranks repeat fails the call with their error
        with pytest.raises(RankFailedError, match=r"^rank 1 exited by signal SIGKILL without a result"):
            launcher(2, die_on_rank_one_if_it_served_before, str(tmp_path), True, timeout=60, device="cpu")
        assert launcher.pools_crashed == 2
        # a rank that raises is the call's own failure, not called again
        with pytest.raises(RankFailedError, match=r"^rank 1 raised AssertionError"):
            launcher(2, raise_on_rank_one_alone, timeout=60, device="cpu")
        assert launcher.pools_crashed == 2
    finally:
        launcher.close()


def test_a_killed_zygote_takes_its_ranks_along_and_the_next_call_gets_a_fresh_pool(launcher):
    first = [result.value for result in launcher(2, identify, timeout=60, device="cpu")]
    os.kill(first[0]["parent"], signal.SIGKILL)
    assert _wait_until_gone([value["pid"] for value in first]) == []  # they died with it (PDEATHSIG)
    second = [result.value for result in launcher(2, identify, timeout=60, device="cpu")]
    assert second[0]["parent"] != first[0]["parent"]  # a new pool, forked by a new zygote


def test_an_orderly_failure_keeps_the_pool(launcher):
    before = pids(launcher)
    with pytest.raises(RankFailedError, match=r"^rank 1 raised AssertionError: the answer is 41") as failure:
        launcher(2, raise_on_rank_one_alone, timeout=60, device="cpu")
    assert failure.value.other_failures == []
    assert pids(launcher) == before  # every rank answered and the probe collective passed


@pytest.mark.parametrize("first_to_report", [0, 1])
def test_a_check_that_fails_together_keeps_the_pool_and_reports_the_failing_ranks_error(launcher, first_to_report):
    """The check of raise_on_rank_one inside `together`: rank 0 stops with rank 1 instead of waiting for it in
    the barrier, so every rank answers and the pool serves on; rank 1's own error is the one reported."""
    before, replaced = pids(launcher), launcher.pools_replaced
    with pytest.raises(RankFailedError, match=r"^rank 1 raised AssertionError: the answer is 41") as failure:
        launcher(2, raise_on_rank_one_together, first_to_report, timeout=60, device="cpu")
    assert failure.value.error_type == "AssertionError"
    assert failure.value.other_failures == [
        "rank 0 raised PeerFailure: rank 0 passed the answer check; stopped with rank 1, which failed it"]
    assert pids(launcher) == before
    assert launcher.pools_replaced == replaced


def test_a_hang_on_a_warm_pool_reports_the_hung_ranks_stack():
    """The launch timeout equals the one the pool was started with: the ranks' own collective timeout must
    not win the race against the launcher collecting the hung rank's stack."""
    launcher = PoolLauncher()
    try:
        before = [result.value["pid"] for result in launcher(2, identify, timeout=4, device="cpu")]
        with pytest.raises(RankTimeoutError) as failure:
            launcher(2, hang_on_rank_one, timeout=4, device="cpu")
        assert failure.value.hung_ranks == [0, 1] and failure.value.hung_first == [1]
        assert "in sleep_forever" in failure.value.stacks[1] and "in hang_on_rank_one" in failure.value.stacks[1]
        assert "barrier" in failure.value.stacks[0]
    finally:
        launcher.close()
    assert _wait_until_gone(before) == []


PARENT_THAT_DIES = """
import os
import signal
import sys

from harness.ranks.pool import PoolLauncher

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    import test_rank_pool

    results = PoolLauncher()(2, test_rank_pool.identify, timeout=60, device="cpu")
    print(" ".join(str(pid) for result in results for pid in (result.value["pid"], result.value["parent"])),
          flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_ranks_and_the_zygote_exit_when_their_parent_is_killed(tmp_path):
    script = tmp_path / "parent_that_dies.py"
    script.write_text(PARENT_THAT_DIES)
    environ = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                            os.environ.get("PYTHONPATH", "")])}
    completed = subprocess.run([sys.executable, str(script), str(Path(__file__).parent)], env=environ,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == -signal.SIGKILL, completed.stderr
    pids = [int(pid) for pid in completed.stdout.split()]
    assert len(pids) == 4
    assert _wait_until_gone(pids, seconds=10) == []


PARENT_KILLED_WHILE_RANKS_SPIN = """
import sys

from harness.ranks.pool import PoolLauncher
from harness.ranks.spawn import run_distributed

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    import test_rank_pool

    launcher = PoolLauncher() if sys.argv[2] == "pool" else run_distributed
    launcher(2, test_rank_pool.spin_in_c, sys.argv[3], timeout=600, device="cpu")
"""


@pytest.mark.parametrize("how", ["pool", "spawn"])
def test_ranks_spinning_in_c_die_with_their_killed_parent(tmp_path, how):
    script = tmp_path / "parent.py"
    script.write_text(PARENT_KILLED_WHILE_RANKS_SPIN)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    environ = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                            os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, str(script), str(Path(__file__).parent), how, str(pid_dir)],
                              env=environ)
    try:
        deadline = time.monotonic() + 120
        while len(list(pid_dir.iterdir())) < 2:
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)  # into the spin
    finally:
        parent.kill()
        parent.wait()
    pids = {int(pid) for path in pid_dir.iterdir() for pid in path.read_text().split()} - {parent.pid}
    assert len(pids) == (3 if how == "pool" else 2)  # both ranks, and the zygote that forked them
    assert _wait_until_gone(list(pids), seconds=10) == []


def test_a_function_that_does_not_pickle_is_refused_before_any_rank_runs(launcher):
    with pytest.raises(TypeError, match="module-level function and picklable arguments"):
        launcher(2, lambda: None, timeout=60, device="cpu")


@pytest.mark.parametrize(("world_size", "device"), [(0, "cpu"), (2, "tpu")])
def test_bad_arguments_are_refused(launcher, world_size, device):
    with pytest.raises(ValueError):
        launcher(world_size, identify, timeout=60, device=device)


def _import_written(request, name: str, source: str):
    """A module installed (the zygote imports no other) and imported, as the ranks will import it by name."""
    return import_installed_module(request, name, source)


THREAD_AT_IMPORT = """
import os
import threading
import time

threading.Thread(target=time.sleep, args=(600,), daemon=True).start()


def identify():
    return {"pid": os.getpid(), "parent": os.getppid()}
"""


def test_a_module_that_makes_forking_unsafe_is_not_imported_by_the_zygote(request):
    starts_a_thread = _import_written(request, "starts_a_thread", THREAD_AT_IMPORT)
    launcher = PoolLauncher()
    try:
        first = [result.value for result in launcher(2, starts_a_thread.identify, timeout=60, device="cpu")]
        assert "started threads" in launcher.preload_refused and launcher.fork_refused is None
        assert "importing torch alone" in launcher.summary()
        assert os.getpid() not in {value["parent"] for value in first}  # still forked, by a bare zygote
        again = [result.value for result in launcher(2, starts_a_thread.identify, timeout=60, device="cpu")]
        assert again == first
    finally:
        launcher.close()
    assert _wait_until_gone([value["pid"] for value in first]) == []


class _FakeCuda:
    def __init__(self, initialized: bool):
        self.initialized = initialized

    def is_initialized(self) -> bool:
        return self.initialized


@pytest.mark.parametrize(("initialized", "threads", "hazard"), [
    (False, ["python", "python"], None),  # torch's own thread; libcuda mapped or not, forking is safe
    (True, ["python"], "the zygote's imports initialized CUDA"),
    (False, ["python", "cuda-EvtHandlr"], "initialized the CUDA driver (its threads ['cuda-EvtHandlr'] run)"),
])
def test_only_an_initialized_cuda_driver_makes_forking_unsafe(monkeypatch, initialized, threads, hazard):
    monkeypatch.setattr(zygote, "native_thread_names", lambda: threads)
    monkeypatch.setattr(zygote.threading, "enumerate", lambda: [threading.current_thread()])
    found = zygote.fork_hazard(SimpleNamespace(cuda=_FakeCuda(initialized)))
    assert found == hazard if hazard is None else hazard in found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_native_thread_names_include_this_thread():
    assert Path("/proc/self/comm").read_text().strip() in zygote.native_thread_names()


CHILDREN_DIE_AT_FORK = """
import os

os.register_at_fork(after_in_child=lambda: os._exit(9))


def identify():
    return {"pid": os.getpid(), "parent": os.getppid()}
"""


def test_a_dead_ranks_signal_is_named_though_the_zygote_that_reaps_it_is_slow_to_say(tmp_path):
    """On a loaded machine the zygote can take over a second to report a rank's exit; the error must still say how
    it died (it said "(exit status unknown)" when the launcher waited 1 s). The zygote is stopped for 3 s here."""
    launcher = PoolLauncher()
    try:
        launcher(2, die_on_rank_one_if_it_served_before, str(tmp_path), timeout=60, device="cpu")
        zygote_pid = launcher._zygote.pid
        os.kill(zygote_pid, signal.SIGSTOP)
        threading.Timer(3.0, os.kill, (zygote_pid, signal.SIGCONT)).start()
        # rank 1 of the kept set dies; the call runs again on fresh ranks, forked once the zygote goes on
        launcher(2, die_on_rank_one_if_it_served_before, str(tmp_path), timeout=60, device="cpu")
        [line] = launcher.renew()
        assert "rank 1 exited by signal SIGKILL without a result on a rank set that had served 1" in line
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(zygote_pid, signal.SIGCONT)
        launcher.close()


def test_when_forked_ranks_cannot_start_but_spawned_ones_can_the_session_spawns(request):
    children_die_at_fork = _import_written(request, "children_die_at_fork", CHILDREN_DIE_AT_FORK)
    launcher = PoolLauncher()
    try:
        first = [result.value for result in launcher(2, children_die_at_fork.identify, timeout=60, device="cpu")]
        # Both ranks die at their fork; the one noticed first is named (on a busy machine rank 0 can start later).
        assert re.match(r"forked ranks could not start: rank [01] exited with code 9", launcher.fork_refused)
        assert {value["parent"] for value in first} == {os.getpid()}
        assert "ranks spawned (forked ranks could not start" in launcher.summary()
    finally:
        launcher.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA, where device='cuda' fails")
def test_a_start_that_fails_spawned_too_does_not_turn_forking_off():
    launcher = PoolLauncher()  # no forked pool has formed yet: the spawned retry is what is tested
    try:
        # Either rank may fail first: on a busy machine rank 0 can still be importing torch when rank 1 fails.
        with pytest.raises(RankFailedError, match=r"rank (\d) raised RuntimeError: rank \1 needs GPU \1, but 0 are"):
            launcher(2, identify, timeout=60, device="cuda")
        assert launcher.fork_refused is None
        assert launcher.pools_started == 2
    finally:
        launcher.close()


def test_spawned_pools_are_reused_too():
    launcher = PoolLauncher(fork=False)
    try:
        first = [result.value for result in launcher(2, identify, timeout=60, device="cpu")]
        assert {value["parent"] for value in first} == {os.getpid()}
        assert [result.value for result in launcher(2, identify, timeout=60, device="cpu")] == first
    finally:
        launcher.close()
    assert _wait_until_gone([value["pid"] for value in first]) == []


# ---------------------------------------------------------------- the plugin, in pytest sessions

SUITE = """
import json
import os
from pathlib import Path

import pytest

from harness.ranks.plugin import LAUNCHER_KEY

PIDS = Path(os.environ["POOL_TEST_PIDS"])


def identify(name):
    import torch.distributed as dist

    return {"test": name, "rank": dist.get_rank(), "pid": os.getpid(), "parent": os.getppid()}


def crash_on_rank_one():
    # every time: on the kept set, and again on the fresh ranks the call is then run on
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


def crash_once_on_rank_one(marker):
    import torch.distributed as dist

    if dist.get_rank() == 1 and not Path(marker).exists():
        Path(marker).write_text("crashed once")
        os._exit(3)
    dist.barrier()


def hang_on_rank_one():
    import time

    import torch.distributed as dist

    while dist.get_rank() == 1:
        time.sleep(1)
    dist.barrier()


def record(ranks, name):
    with PIDS.open("a") as pids:
        for value in ranks.run(2, identify, name):
            pids.write(json.dumps(value) + "\\n")
"""

REUSE_AND_CRASH_TESTS = SUITE + """

def test_first(ranks):
    record(ranks, "first")


def test_second(ranks):
    record(ranks, "second")


def test_crash(ranks):
    ranks.run(2, crash_on_rank_one)


def test_after_the_crash(ranks):
    record(ranks, "after the crash")


def test_hang(request):
    request.config.stash[LAUNCHER_KEY](2, hang_on_rank_one, timeout=2)


def test_after_the_hang(ranks):
    record(ranks, "after the hang")
"""


def run_suite(pytester, monkeypatch, tests: str, *args: str, pool: str | None = None):
    """Run `tests` in a pytest session with the pool plugin; (result, {test name: [pid per rank]}, parents)."""
    pid_file = pytester.path / "pids.jsonl"
    monkeypatch.setenv("POOL_TEST_PIDS", str(pid_file))
    monkeypatch.setenv("HARNESS_CPU_RANKS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    if pool is None:
        monkeypatch.delenv("HARNESS_RANKS_POOL", raising=False)
    else:
        monkeypatch.setenv("HARNESS_RANKS_POOL", pool)
    pytester.makepyfile(test_suite=tests)
    result = pytester.runpytest(*args)
    values = [json.loads(line) for line in pid_file.read_text().splitlines()] if pid_file.exists() else []
    by_test: dict[str, list[int]] = {}
    for value in values:
        by_test.setdefault(value["test"], []).append(value["pid"])
    return result, by_test, {value["parent"] for value in values}


def test_a_session_keeps_ranks_across_tests_and_a_crash_or_hang_fails_only_its_own_test(pytester, monkeypatch):
    result, pids, parents = run_suite(pytester, monkeypatch, REUSE_AND_CRASH_TESTS)
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines(["rank pool: on (ranks forked from a zygote)",
                                 "E *RankFailedError: rank 1 exited with code 3 without a result",
                                 "E *RankTimeoutError: ranks [[]0, 1[]] still running after 2s; killed.*",
                                 "rank pool: 6 calls, 4 pools started (2 ahead of their test), kept across tests 4 "
                                 "times, 0 GPU pools ended with their test, 3 replaced after*1 calls run again on "
                                 "fresh ranks after a rank of a kept set died in them*",
                                 # the crash came on a kept set: fresh ranks ran the call again, and crashed too
                                 "rank pool: pool replaced in test_suite.py::test_crash: rank 1 exited with code 3 "
                                 "without a result on a rank set that had served 2 earlier calls; the call ran again "
                                 "on fresh ranks, whose outcome is the test's"])
    assert "in hang_on_rank_one" in result.stdout.str()  # the hung rank's stack is in the report
    assert pids["first"] == pids["second"]  # a test that left nothing hands its ranks to the next
    # a crash or a hang ends its ranks: the next test gets new ones
    ranks_of = [pids[test] for test in ("second", "after the crash", "after the hang")]
    assert len({pid for ranks in ranks_of for pid in ranks}) == 6
    assert len(parents) == 1  # every test's ranks forked from the session's one zygote, which the failures spared
    # no rank, and not the zygote that forked them, outlives the session
    assert _wait_until_gone([pid for ranks in pids.values() for pid in ranks] + list(parents)) == []


POLLUTING_TESTS = SUITE + """
import resource

import torch
from torch.utils._python_dispatch import TorchDispatchMode

VIEWS = Path(os.environ["POOL_TEST_PIDS"]).with_name("views.jsonl")


def view(name):
    \"\"\"What a test's ranks see of what the polluters below change.\"\"\"
    import torch.distributed as dist

    linear = torch.nn.Linear(2, 1)
    torch.nn.init.ones_(linear.weight), torch.nn.init.zeros_(linear.bias)
    calls = []
    forward = torch.nn.Identity()
    forward.register_forward_hook(lambda *_: calls.append("hook"))  # this module's own hook: not a global one
    forward(torch.ones(1))
    return {"test": name, "rank": dist.get_rank(), "pid": os.getpid(),
            "linear": linear(torch.ones(1, 2)).tolist(), "hooks_seen": calls,
            "global_forward_hooks": len(torch.nn.modules.module._global_forward_hooks),
            "anomaly": torch.is_anomaly_enabled(), "rlimit_as": resource.getrlimit(resource.RLIMIT_AS),
            "dispatch_modes": torch._C._len_torch_dispatch_stack(), "affinity": sorted(os.sched_getaffinity(0)),
            "sum": torch.arange(4.0).sum().item()}


class Doubling(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 2 if isinstance(out, torch.Tensor) and out.is_floating_point() else out


def patch_linear_forward():
    torch.nn.Linear.forward = lambda self, x: x.sum(-1, keepdim=True) * 0 + 41.0


def global_forward_hook():
    torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out)


def detect_anomaly():
    torch.autograd.set_detect_anomaly(True)


def lower_rlimit_as():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (8 << 40, hard))  # 8 TiB: lower than unlimited, harmless meanwhile


def enter_a_dispatch_mode():
    Doubling().__enter__()


def narrow_affinity():
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def polluted_view(polluter, name):
    polluter()
    return view(name)


def record_view(ranks, name, polluter=None):
    with VIEWS.open("a") as views:
        for value in ranks.run(2, view, name) if polluter is None else ranks.run(2, polluted_view, polluter, name):
            views.write(json.dumps(value) + "\\n")


def test_a_first(ranks):
    record_view(ranks, "first")


@pytest.mark.parametrize("polluter", [patch_linear_forward, global_forward_hook, detect_anomaly, lower_rlimit_as,
                                      enter_a_dispatch_mode, narrow_affinity])
def test_b_polluter_then_victim(ranks, polluter):
    record_view(ranks, "polluted " + polluter.__name__, polluter)


def test_c_victim(ranks):
    record_view(ranks, "victim")
"""


def test_no_test_sees_what_an_earlier_test_left_in_its_ranks(pytester, monkeypatch):
    """The six pollutions that outlived a call on a pool kept for the session (a class of torch patched, a global
    forward hook, anomaly detection, a lowered RLIMIT_AS, a dispatch mode entered and never left, a narrowed CPU
    affinity): each is seen by its own test's next call, and by no later test. Ranks serve on across tests: what
    the audit puts back (harness.ranks.boundary) is gone from the same ranks; the dispatch mode, which cannot be
    left from outside, retires them, and the report of the test that left it says why."""
    result, _, parents = run_suite(pytester, monkeypatch, POLLUTING_TESTS, "-p", "no:randomly")
    result.assert_outcomes(passed=8)
    views = [json.loads(line) for line in (pytester.path / "views.jsonl").read_text().splitlines()]
    by_test = {}
    for value in views:
        by_test.setdefault(value.pop("test"), []).append(value)
    first, victim = by_test.pop("first"), by_test.pop("victim")
    assert [{**view, "pid": None} for view in victim] == [{**view, "pid": None} for view in first]
    polluted = {name.removeprefix("polluted "): views for name, views in by_test.items()}
    fresh = first[0]
    # each pollution took, in its own test's ranks (a later test sharing them would have seen it) ...
    changed = {name: sorted(key for key in fresh if key not in ("rank", "pid") and views[0][key] != fresh[key])
               for name, views in polluted.items()}
    assert changed == {"patch_linear_forward": ["linear"], "global_forward_hook": ["global_forward_hooks"],
                       "detect_anomaly": ["anomaly"], "lower_rlimit_as": ["rlimit_as"],
                       "enter_a_dispatch_mode": ["dispatch_modes", "linear", "sum"], "narrow_affinity": ["affinity"]}
    # ... put back between tests on the same ranks, but for the dispatch mode, which retired them
    sets = [first, *polluted.values(), victim]
    pids = [tuple(view["pid"] for view in views) for views in sets]
    mode_test = 1 + list(polluted).index("enter_a_dispatch_mode")
    assert len(set(pids[:mode_test + 1])) == 1 and len(set(pids[mode_test + 1:])) == 1
    assert pids[mode_test] != pids[mode_test + 1]
    result.stdout.fnmatch_lines(["*pool replaced after *test_b_polluter_then_victim[[]enter_a_dispatch_mode[]]: "
                                 "torch dispatch modes entered left at 1 (fresh: 0)*"])
    assert _wait_until_gone([pid for ranks in pids for pid in ranks] + list(parents)) == []


RERUN_AND_TIMEOUT_TESTS = SUITE + """

def test_crashes_once(ranks, tmp_path_factory):
    ranks.run(2, crash_once_on_rank_one, str(tmp_path_factory.getbasetemp() / "crashed"))
    record(ranks, "rerun")


@pytest.mark.flaky(reruns=0)
@pytest.mark.timeout(3)
def test_hangs_past_pytest_timeout(ranks):
    ranks.run(2, hang_on_rank_one)


def test_after_pytest_timeout(ranks):
    record(ranks, "after pytest-timeout")
"""


def test_a_rerun_and_the_test_after_a_pytest_timeout_get_a_healthy_pool(pytester, monkeypatch):
    result, pids, _ = run_suite(pytester, monkeypatch, RERUN_AND_TIMEOUT_TESTS, "--reruns", "1",
                                "--timeout-method", "signal")
    outcomes = result.parseoutcomes()
    assert (outcomes["passed"], outcomes["failed"], outcomes["rerun"]) == (2, 1, 1)
    result.stdout.fnmatch_lines(["E *Failed: Timeout (>3.0s) from pytest-timeout.",
                                 "rank pool: Failed while the ranks ran; the Python stack of every rank:"])
    assert "in hang_on_rank_one" in result.stdout.str()  # the ranks' stacks, not only the waiting parent's
    assert set(pids["after pytest-timeout"]).isdisjoint(pids["rerun"])


def test_turned_off_every_call_spawns_its_own_ranks(pytester, monkeypatch):
    result, pids, parents = run_suite(pytester, monkeypatch, SUITE + """

def test_first(ranks):
    record(ranks, "first")


def test_second(ranks):
    record(ranks, "second")
""", pool="0")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["rank pool: off (ranks spawned for every call)"])
    assert set(pids["first"]).isdisjoint(pids["second"])
    assert parents == {os.getpid()}  # run_distributed spawned them from the session's process


@pytest.mark.parametrize(("pool", "args", "header"), [
    (None, ("--no-ranks-pool",), "rank pool: off*"),
    ("0", ("--ranks-pool",), "rank pool: on (ranks forked*"),
    ("spawn", (), "rank pool: on (ranks spawned)"),
    ("1", ("-o", "ranks_pool=false"), "rank pool: on (ranks forked*"),
    (None, ("-o", "ranks_pool=false"), "rank pool: off*"),
])
def test_the_command_line_wins_over_the_environment_which_wins_over_the_ini(pytester, monkeypatch, pool, args,
                                                                            header):
    result, _, _ = run_suite(pytester, monkeypatch, SUITE, *args, pool=pool)
    result.stdout.fnmatch_lines([header])


def test_a_bad_environment_value_is_a_usage_error(pytester, monkeypatch):
    result, _, _ = run_suite(pytester, monkeypatch, SUITE, pool="sometimes")
    assert "HARNESS_RANKS_POOL must be one of 0, 1, spawn, got 'sometimes'" in result.stderr.str()


def test_the_timing_file_gets_one_line_per_call(pytester, monkeypatch):
    timing = pytester.path / "timing.jsonl"
    monkeypatch.setenv("HARNESS_RANKS_TIMING", str(timing))
    result, _, _ = run_suite(pytester, monkeypatch, SUITE + textwrap.dedent("""

        def test_first(ranks):
            record(ranks, "first")
        """))
    result.assert_outcomes(passed=1)
    [line] = [json.loads(line) for line in timing.read_text().splitlines()]
    assert line["test"] == "test_suite.py::test_first" and line["outcome"] == "passed"
    assert line["world_size"] == 2 and len(line["rank_work_s"]) == 2
    assert 0 <= line["work_s"] <= line["call_s"] and line["pool_start_s"] > 0


def test_no_ranks_pool_is_a_known_option_of_the_suite():
    """The plugin registers before the command line is parsed (pytest11 entry point), so its options exist."""
    completed = subprocess.run([sys.executable, "-m", "pytest", "tests/gpu", "--no-ranks-pool", "--collect-only",
                                "-q", "-p", "no:cacheprovider"], cwd=Path(__file__).parents[2],
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]


def test_the_running_tests_id_is_in_the_running_test_file_only_while_it_runs(pytester, monkeypatch):
    """harness run points HARNESS_RUNNING_TEST_FILE into the cell's folder: a cell stopped mid-test names it."""
    running = pytester.path / "running-test.txt"
    monkeypatch.setenv("HARNESS_RUNNING_TEST_FILE", str(running))
    pytester.makepyfile(test_running="""
        import os

        def test_sees_its_own_id():
            with open(os.environ["HARNESS_RUNNING_TEST_FILE"]) as running:
                assert running.read() == "test_running.py::test_sees_its_own_id\\n"
    """)
    pytester.runpytest().assert_outcomes(passed=1)
    assert not running.exists()


def destroy_the_cached_meshs_group():
    """A test that tears down its own groups: the mesh a warm cache holds then names a group that is gone."""
    import torch.distributed as dist

    for group in list(dist.distributed_c10d._world.pg_map):
        if group is not dist.group.WORLD:
            dist.destroy_process_group(group)


def test_a_cached_mesh_whose_group_a_call_destroyed_is_forgotten(launcher):
    for _ in range(2):  # the second op fills the cache with its mesh
        launcher(2, op_on_a_new_mesh, timeout=60, device="cpu")
    launcher(2, destroy_the_cached_meshs_group, timeout=60, device="cpu")
    assert [result.value for result in launcher(2, op_on_a_new_mesh, timeout=60, device="cpu")] == [[2, 1]] * 2
