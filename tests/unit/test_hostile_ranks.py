"""Another process on the host against a rank pool's socket (abstract on Linux, so anyone can connect): a
peer that says nothing, one of another user, one without the key. None may stall or join the pool. (Across hosts
the ranks dial over TLS instead: test_hostile_hosts.py.)"""

from __future__ import annotations

import multiprocessing.connection
import os
import socket
import subprocess
import sys
import threading
import uuid

import pytest

from harness.ranks import launcher
from harness.ranks.launcher import RankSet, handshake

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
        from harness.ranks.launcher import pickle_call, to_results

        [result] = to_results(ranks.call(pickle_call(1, identify, (), "cpu", "test"), 60))
        assert result.value == 0
    finally:
        squatter.close()
        ranks.kill()
