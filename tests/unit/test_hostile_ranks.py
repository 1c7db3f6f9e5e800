"""Another process on the host against a rank pool's socket (abstract on Linux, so anyone can connect): a
peer that says nothing, one of another user, one without the key. None may stall or join the pool. (Across hosts
the ranks dial over TLS instead: test_hostile_hosts.py.) And against the ranks' rendezvous: on one host no port of
theirs takes a store write (they meet through a file in a 0700 folder no other user can open); across hosts rank
0's store listens on host 0's address in the cell alone."""

from __future__ import annotations

import ipaddress
import multiprocessing.connection
import os
import socket
import stat
import subprocess
import sys
import threading
import uuid

import pytest
from process_helpers import host_0_environ, listening_sockets, start_agent

from harness.engines import credentials
from harness.ranks import launcher, ports
from harness.ranks.launcher import RankSet, handshake, pickle_call, to_results
from harness.ranks.rank import store_path

KEY = os.urandom(32)


def identify():
    import torch.distributed as dist

    return dist.get_rank()


def test_a_silent_peer_is_dropped_after_the_handshake_timeout():
    ours, theirs = socket.socketpair()
    with theirs:
        assert handshake(ours, KEY, timeout_s=0.2) is None  # theirs never answers


def test_a_peer_with_the_wrong_key_is_dropped():
    ours, theirs = socket.socketpair()
    answer = threading.Thread(target=_answer, args=(theirs, os.urandom(32)), daemon=True)
    answer.start()
    assert handshake(ours, KEY, timeout_s=60) is None
    answer.join()


def test_a_rank_with_the_key_is_connected_and_its_calls_have_no_timeout():
    ours, theirs = socket.socketpair()
    answer = threading.Thread(target=_answer, args=(theirs, KEY), daemon=True)
    answer.start()
    connection = handshake(ours, KEY, timeout_s=60)
    answer.join()
    assert connection is not None
    with socket.socket(fileno=os.dup(connection.fileno())) as same:
        assert same.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == bytes(16)
    connection.close()


def _answer(sock: socket.socket, key: bytes) -> None:
    connection = multiprocessing.connection.Connection(sock.detach())
    try:
        multiprocessing.connection.answer_challenge(connection, key)
        multiprocessing.connection.deliver_challenge(connection, key)
    except (multiprocessing.AuthenticationError, EOFError, OSError):
        pass
    finally:
        connection.close()


# The other user's interpreter: one outside root's home (a venv or pyenv there is not theirs to run).
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.getuid() != 0, reason="needs root to be another user")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} for the other user")
def test_a_peer_of_another_user_is_dropped_before_any_handshake():
    name = f"harness-test-{uuid.uuid4().hex}"
    address = "\0" + name  # abstract: no file whose permissions could stop the other user
    # Another user that connects and then stays silent. A fresh interpreter (subprocess's user= sets the uid
    # between fork and exec): forking this process, which may hold torch's threads by now, can hang the child.
    peer = (
        "import socket, sys, time\n"
        "client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "client.connect(chr(0) + sys.argv[1])\n"
        "time.sleep(3600)\n"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(address)
        server.listen(1)
        child = subprocess.Popen([SYSTEM_PYTHON, "-c", peer, name], user=65534, cwd="/")
        try:
            server.settimeout(120)  # the peer's start: a failure to connect fails here, not at pytest's timeout
            sock, _ = server.accept()
            sock.settimeout(None)
            assert launcher.peer_uid(sock) == 65534
            # An hour's timeout: only the uid check can end this before pytest's own timeout.
            assert handshake(sock, KEY, timeout_s=3600) is None
        finally:
            child.kill()
            child.wait()


def test_a_tcp_peer_has_no_uid_to_check():
    """A rank of another host dials host 0 over TCP: SO_PEERCRED there says nothing (uid -1), so a uid check on it
    would refuse every remote rank; TLS with the cell's certificate admits those (test_hostile_hosts.py)."""
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()):
        accepted, _ = server.accept()
        with accepted:
            assert launcher.peer_uid(accepted) is None


def test_a_silent_connection_does_not_stall_the_ranks_start():
    pytest.importorskip("torch")
    ranks = RankSet(1, "cpu", collective_timeout_s=60)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        squatter.connect(ranks.specs()[0].address)  # connects first, then sends nothing
        ranks.spawn()
        ranks.wait_ready()
        [result] = to_results(ranks.call(pickle_call(1, identify, (), "cpu", "test"), 60))
        assert result.value == 0
    finally:
        squatter.close()
        ranks.kill()


def rendezvous_view() -> dict:
    """What a rank sees of its rendezvous: MASTER_ADDR and MASTER_PORT, and the TCP ports it listens on."""
    return {"master": (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), "listening": listening_sockets()}


@pytest.fixture
def single_host_ranks():
    """Two spawned CPU ranks on this host, their process group formed."""
    pytest.importorskip("torch")
    ranks = RankSet(2, "cpu", collective_timeout_s=60)
    try:
        ranks.spawn()
        ranks.wait_ready()
        yield ranks
    finally:
        ranks.kill()


def test_another_local_process_can_reach_no_store_of_a_single_host_cell(single_host_ranks):
    """A TCPStore on *:MASTER_PORT took a write from any process of any user of the host (and a client that
    connects and says nothing stalls it). On one host the ranks meet through a FileStore instead, and the only
    ports they listen on are gloo's, on the loopback device."""
    views = [result.value for result in
             to_results(single_host_ranks.call(pickle_call(2, rendezvous_view, (), "cpu", "test"), 60))]
    port = single_host_ranks.launch.port
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=10):
        pass
    for rank, view in enumerate(views):
        assert view["master"][1] == port
        assert [address for address, _ in view["listening"] if not ipaddress.ip_address(address).is_loopback] == [], \
            f"rank {rank} listens beyond the loopback device: {view['listening']}"
        assert port not in [listened for _, listened in view["listening"]], f"rank {rank} listens on MASTER_PORT"
    store = store_path(single_host_ranks.workdir)
    assert store.is_file(), "the ranks met through no FileStore"
    assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700


# The other user opens the store file, and says how that went.
OTHER_USER_OPENS = (
    "import sys\n"
    "try:\n"
    "    open(sys.argv[1], 'rb')\n"
    "    print('opened')\n"
    "except OSError as error:\n"
    "    print(type(error).__name__)\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.getuid() != 0, reason="needs root to be another user")
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} for the other user")
def test_another_user_cannot_open_the_single_host_store(single_host_ranks):
    store = store_path(single_host_ranks.workdir)
    assert store.is_file(), "the ranks met through no FileStore"
    done = subprocess.run([SYSTEM_PYTHON, "-c", OTHER_USER_OPENS, str(store)], user=65534, cwd="/",
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "PermissionError", done.stdout + done.stderr


def test_across_hosts_rank_0s_store_listens_on_host_0s_address_alone(tmp_path, monkeypatch):
    """Two 'hosts' on this one (this process is host 0's pytest, `harness host --index=1` the agent of the other):
    the store the ranks of a cell across hosts meet through listens on the cell's address, not on every
    interface of host 0."""
    pytest.importorskip("torch")
    from harness.ranks.pool import PoolLauncher

    port, cell = ports.port_outside_ephemeral_range("127.0.0.1"), credentials.write(tmp_path / "private", "store")
    for name, value in host_0_environ(port, cell).items():
        monkeypatch.setenv(name, value)
    agent = start_agent(1, port, cell, tmp_path / "agent.log")
    pool = PoolLauncher()
    try:
        views = [result.value for result in pool(2, rendezvous_view, device="cpu", timeout=120)]
        master = views[0]["master"]
        assert master[0] == "127.0.0.1"
        assert [entry for entry in views[0]["listening"] if entry[1] == master[1]] == [master], views[0]["listening"]
    finally:
        pool.close()
        agent.wait(timeout=120)
