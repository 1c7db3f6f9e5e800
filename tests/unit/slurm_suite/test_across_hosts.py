"""What a cell on 4 Slurm hosts x 2 CPU ranks runs (tests/unit/test_slurm.py submits it): the rank pool
places ranks on every host, and each rank sees its own host. Not collected by the unit run (its folder has
no conftest and it is run only inside a Slurm job, where $HARNESS_HOSTS is set)."""

import os
import socket
import time
from pathlib import Path

import pytest

from harness.ranks import RankTimeoutError

pytestmark = pytest.mark.skipif(int(os.environ.get("HARNESS_HOSTS", "1")) <= 1, reason="runs inside a Slurm cell")


def where():
    import torch
    import torch.distributed as dist

    total = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(total)
    return {"rank": dist.get_rank(), "host": socket.gethostname(), "local_rank": int(os.environ["LOCAL_RANK"]),
            "local_world": int(os.environ["LOCAL_WORLD_SIZE"]), "sum": int(total.item()),
            "node": os.environ.get("SLURM_NODEID"), "threads": torch.get_num_threads(),
            "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}


def wait_for_the_test(marker_folder, seconds):
    """Say that this rank got here, then hold a collective open: the harness test breaks a host meanwhile."""
    import torch
    import torch.distributed as dist

    Path(marker_folder, f"rank{dist.get_rank()}.{socket.gethostname()}").write_text(str(os.getpid()))
    time.sleep(seconds)
    dist.all_reduce(torch.ones(1))
    return dist.get_rank()


def hang_on_rank_5():
    import torch.distributed as dist

    if dist.get_rank() == 5:
        hang_here_on_purpose()
    return socket.gethostname()


def hang_here_on_purpose():
    time.sleep(3600)


def test_a_hung_ranks_stack_comes_back_from_its_host(request, ranks):
    from harness.ranks.plugin import LAUNCHER_KEY

    assert len(ranks.run(8, where)) == 8  # the pool is up: the call's own deadline is all that is measured
    launcher = request.config.stash[LAUNCHER_KEY]
    with pytest.raises(RankTimeoutError) as error:
        launcher(8, hang_on_rank_5, timeout=10)
    assert error.value.hung_ranks == [5]
    assert "hang_here_on_purpose" in error.value.stacks[5], error.value.stacks[5]


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ranks_land_on_their_hosts(ranks, world_size):
    seen = ranks.run(world_size, where)
    hosts = sorted({value["host"] for value in seen})
    assert len(hosts) == world_size // 2
    assert [value["sum"] for value in seen] == [world_size * (world_size + 1) // 2] * world_size
    for value in seen:
        assert value["local_rank"] == value["rank"] % 2 and value["local_world"] == 2
        assert value["node"] == str(value["rank"] // 2)  # the host's own SLURM_NODEID, not host 0's
        assert value["gloo_ifname"] != "lo" or world_size == 2
        assert value["threads"] == max(1, (os.cpu_count() or 1) // 2)


def test_a_host_breaks_while_ranks_wait(ranks):
    folder = os.environ.get("HARNESS_TEST_MARKERS")
    if not folder:
        pytest.skip("HARNESS_TEST_MARKERS names the folder the harness test watches")
    ranks.run(8, wait_for_the_test, folder, 600)
