"""Another machine on a cell's network against the wire between its hosts (harness.ranks.tls): it records every
byte between a host and host 0 (a real relay in between), dials the hub or a RankSet's listener with another
cell's certificate, with none, or without TLS at all, stays silent, trickles, announces a huge message, or plays
a hub of its own. None may read a key or a message, have anything unpickled, or hold admission for long; the
cell's own agents and ranks still get in."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import multiprocessing
import os
import pickle
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from relay_helpers import RecordingRelay

from harness.engines import credentials
from harness.ranks import agent, hosts, tls
from harness.ranks.protocol import AgentHello, Heartbeat

pytest_plugins = ["pytester"]

GUARD_S = 120  # a wait that has not ended by now is itself the failure: far above what the work takes
PLANTED = "planted-value-7f3e9a"  # an environment value host 0 sends its ranks: it must not be readable on the wire
PLAINTEXT = "a plaintext message 51c2"  # what a call returns


def cell_credentials(tmp_path: Path, name: str) -> Path:
    return credentials.write(tmp_path / name, f"cell-{name}")


def key_material(path: Path) -> list[bytes]:
    """What of a credentials file must never be on the wire or in a log: the key's PEM lines, its DER, its
    scalar."""
    from cryptography.hazmat.primitives import serialization

    text = path.read_bytes()
    key = serialization.load_pem_private_key(text, password=None)
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    body = text.split(b"-----END PRIVATE KEY-----")[0].splitlines()[1:]
    return [b"PRIVATE KEY", der, key.private_numbers().private_value.to_bytes(32, "big"),
            *(line for line in body if len(line) >= 16), base64.b64encode(der)[:40]]


def assert_unreadable(captured: bytes, secrets: list[bytes], plaintext: list[bytes]) -> None:
    assert len(captured) > 2000, f"only {len(captured)} bytes went through the relay"
    readable = [needle for needle in [*secrets, *plaintext, b"harness.ranks", b"protocol", b"RankSpec",
                                      b"AgentHello", b"Preload", b"Heartbeat", b"builtins", b"CERTIFICATE",
                                      b"harness cell"] if needle in captured]
    assert readable == [], f"readable on the wire: {readable}"


class Trap:
    """Unpickling it makes a folder: proof that a peer's bytes were unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def say(text: str) -> str:
    import torch.distributed as dist

    return f"{text} from rank {dist.get_rank()}"


def dropped(sock: socket.socket) -> bool:
    """Whether the other end closed the connection (what it sent before is read and ignored)."""
    try:
        while chunk := sock.recv(65536):
            del chunk
        return True
    except (ConnectionResetError, ssl.SSLError):
        return True
    except (BlockingIOError, ssl.SSLWantReadError, TimeoutError):
        return False


def wait_dropped(sock: socket.socket) -> None:
    sock.settimeout(GUARD_S)
    assert dropped(sock), f"still connected after {GUARD_S}s"


@pytest.fixture
def hub(tmp_path):
    config = hosts.HostsConfig(hosts=3, ranks_per_host=2, hub_address=("127.0.0.1", 0),
                               credentials=cell_credentials(tmp_path, "ours"), cause_file=tmp_path / "host-lost.json")
    made = hosts.Hub(config)
    yield made
    made.close()


def address(hub: hosts.Hub) -> tuple[str, int]:
    return hub._server.getsockname()[:2]


def intruder_context(tmp_path: Path, certificate: str) -> ssl.SSLContext:
    """TLS 1.3 as an intruder speaks it: it trusts any server, and shows another cell's certificate or none."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if certificate == "another cell's":
        context.load_cert_chain(cell_credentials(tmp_path, "theirs"))
    return context


def framed(payload: bytes) -> bytes:
    return tls.HEADER.pack(len(payload)) + payload


# ---------------------------------------------------------------- the hub


def test_an_agent_of_the_cell_is_admitted_and_its_loss_named(hub):
    link = tls.dial(address(hub), tls.client_context(hub.config.credentials), GUARD_S)
    link.send(AgentHello(host=1, hostname="h2", pid=123))
    hub.wait_agents(2, time.monotonic() + GUARD_S)
    assert list(hub.links) == [1]
    assert isinstance(link.recv(deadline=time.monotonic() + GUARD_S), Heartbeat)  # an agent notices host 0 going
    link.close()  # the agent's host is killed: named at once, written for the engine
    deadline = time.monotonic() + GUARD_S
    while hub.loss is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.loss is not None and hub.loss.host == 1
    assert json.loads(hub.config.cause_file.read_text())["hostname"] == "h2"


@pytest.mark.parametrize("certificate", ["another cell's", "no"])
def test_a_peer_not_of_the_cell_is_refused_before_anything_it_sends_is_read(hub, tmp_path, certificate):
    """TLS 1.3 ends the client's handshake before the server has judged its certificate: the intruder sends an
    agent's hello and a pickle that would make a folder if unpickled; the hub refuses it unread."""
    marker = tmp_path / "unpickled"
    with intruder_context(tmp_path, certificate).wrap_socket(socket.create_connection(address(hub))) as intruder:
        with contextlib.suppress(OSError):
            intruder.sendall(framed(pickle.dumps(AgentHello(host=1, hostname="evil", pid=1))))
            intruder.sendall(framed(pickle.dumps(Trap(marker))))
        wait_dropped(intruder)
    assert not marker.exists() and hub.links == {}


def test_a_peer_without_tls_is_refused_unread(hub, tmp_path):
    marker = tmp_path / "unpickled"
    with socket.create_connection(address(hub)) as intruder:
        with contextlib.suppress(OSError):
            intruder.sendall(framed(pickle.dumps(Trap(marker))) * 4)
        wait_dropped(intruder)
    assert not marker.exists() and hub.links == {}


def test_a_silent_peer_is_dropped_after_the_admission_timeout(hub, monkeypatch):
    monkeypatch.setattr(hosts, "ADMISSION_TIMEOUT_S", 0.5)
    with socket.create_connection(address(hub)) as silent:
        wait_dropped(silent)


def client_hello(context: ssl.SSLContext) -> bytes:
    """The first bytes a TLS client sends, as they would go out."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    with pytest.raises(ssl.SSLWantReadError):
        context.wrap_bio(incoming, outgoing).do_handshake()
    return outgoing.read()


def trickle(sock: socket.socket, data: bytes) -> int:
    """Send `data` a byte at a time, 20 bytes a second, until the other end closes; how many bytes went."""
    sock.setblocking(False)
    for sent, byte in enumerate(data):
        if select.select([sock], [], [], 0.05)[0] and dropped(sock):
            return sent
        try:
            sock.send(bytes([byte]))
        except OSError:  # closed while we sent
            return sent
    return len(data)


def test_a_peer_that_trickles_its_handshake_is_dropped_while_it_still_sends(hub, monkeypatch):
    """A receive timeout per read would keep this peer forever: the deadline is over the whole admission."""
    monkeypatch.setattr(hosts, "ADMISSION_TIMEOUT_S", 0.5)
    hello = client_hello(tls.client_context(hub.config.credentials))
    with socket.create_connection(address(hub)) as trickler:
        assert trickle(trickler, hello) < len(hello)


def test_an_agent_that_trickles_its_hello_is_dropped_while_it_still_sends(hub, monkeypatch):
    monkeypatch.setattr(hosts, "ADMISSION_TIMEOUT_S", 1.0)
    context = tls.client_context(hub.config.credentials)
    with context.wrap_socket(socket.create_connection(address(hub))) as trickler:
        hello = framed(pickle.dumps(AgentHello(host=1, hostname="h2", pid=123)))
        assert trickle(trickler, hello * 10) < len(hello)
    assert hub.links == {}


@pytest.mark.parametrize("size", ["announced", "sent"])
def test_an_oversized_hello_is_refused_without_reading_it(hub, monkeypatch, size):
    """Admission takes at most ADMISSION_MAX_BYTES: a header announcing a terabyte is refused at once, nothing
    allocated, as is a megabyte really sent. (The admission timeout is long here: only the bound can drop it.)"""
    monkeypatch.setattr(hosts, "ADMISSION_TIMEOUT_S", 3600)
    context = tls.client_context(hub.config.credentials)
    with context.wrap_socket(socket.create_connection(address(hub))) as peer:
        with contextlib.suppress(OSError):
            if size == "announced":
                peer.sendall(tls.HEADER.pack(1 << 40))
            else:
                peer.sendall(framed(pickle.dumps(AgentHello(host=1, hostname="h" * (1 << 20), pid=1))))
        wait_dropped(peer)
    assert hub.links == {}


def test_connections_in_admission_at_once_are_bounded(tmp_path, monkeypatch):
    """Past MAX_ADMITTING peers in admission, more are closed at once; once they go, an agent gets in."""
    monkeypatch.setattr(hosts, "MAX_ADMITTING", 2)
    monkeypatch.setattr(hosts, "ADMISSION_TIMEOUT_S", 3600)
    config = hosts.HostsConfig(hosts=2, ranks_per_host=1, hub_address=("127.0.0.1", 0),
                               credentials=cell_credentials(tmp_path, "ours"), cause_file=None)
    hub = hosts.Hub(config)
    try:
        squatters = [socket.create_connection(address(hub)) for _ in range(2)]
        with socket.create_connection(address(hub)) as third:
            wait_dropped(third)  # accepted after both squatters, whose admissions wait an hour
        for squatter in squatters:
            squatter.close()  # their admissions end; the hub takes the next peer again
        deadline = time.monotonic() + GUARD_S
        while not hub.links and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                link = tls.dial(address(hub), tls.client_context(config.credentials), GUARD_S)
                link.send(AgentHello(host=1, hostname="h2", pid=1))
                hub.wait_agents(2, time.monotonic() + 1)
        assert list(hub.links) == [1]
    finally:
        hub.close()


def test_the_hub_listens_on_the_cells_address_only(hub):
    assert address(hub)[0] == "127.0.0.1"
    with pytest.raises(OSError):  # nothing on the host's other addresses answers
        socket.create_connection(("127.0.0.2", address(hub)[1]), timeout=GUARD_S).close()


def test_an_agent_refuses_a_hub_that_is_not_the_cells(tmp_path):
    """A machine that took host 0's address with another cell's certificate learns nothing from the agent."""
    ours, theirs = cell_credentials(tmp_path, "ours"), cell_credentials(tmp_path, "theirs")
    impostor = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    impostor.load_cert_chain(theirs)
    received = bytearray()
    with socket.create_server(("127.0.0.1", 0)) as server:
        def serve():
            sock, _ = server.accept()
            with contextlib.suppress(OSError), impostor.wrap_socket(sock, server_side=True) as tls_sock:
                while chunk := tls_sock.recv(65536):
                    received.extend(chunk)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with pytest.raises(ConnectionError, match="is not this cell's"):
            agent.dial(server.getsockname()[:2], ours, time.monotonic() + GUARD_S)
        thread.join(GUARD_S)
    assert received == b""


# ---------------------------------------------------------------- a RankSet's listener across hosts


def test_a_rank_across_hosts_reaches_its_listener_only_through_tls(hub, tmp_path, monkeypatch):
    """A rank's connection through the recording relay: the call's environment and result are not on the wire;
    an intruder with another cell's certificate, there first, is refused unread and does not stop the rank."""
    pytest.importorskip("torch")
    from harness.ranks.launcher import RankSet, pickle_call, to_results
    from harness.ranks.rank import spawned_rank_main

    monkeypatch.setenv("HARNESS_TEST_PLANTED", PLANTED)
    marker = tmp_path / "unpickled"
    ranks = RankSet(1, "cpu", collective_timeout_s=GUARD_S, placement=hosts.Placement(hub, 1))
    [spec] = ranks.specs()
    assert spec.authkey == b"" and spec.credentials == str(hub.config.credentials)  # no key travels in a spec
    relay = RecordingRelay(spec.address)
    outcome: dict = {}

    def intrude(connected: socket.socket):
        try:
            with intruder_context(tmp_path, "another cell's").wrap_socket(connected) as intruder:
                with contextlib.suppress(OSError):  # the listener may have closed it already
                    intruder.sendall(framed(pickle.dumps(Trap(marker))))
                outcome["dropped"] = dropped(intruder)
        except OSError:  # refused while its own side of the handshake ended
            outcome["dropped"] = True

    # Connected before the rank starts: the listener takes the intruder first.
    intruder = threading.Thread(target=intrude, args=(socket.create_connection(spec.address),), daemon=True)
    intruder.start()
    rank = multiprocessing.get_context("spawn").Process(
        target=spawned_rank_main, args=(dataclasses.replace(spec, address=relay.address),))
    try:
        rank.start()
        ranks.adopt([rank.pid], lambda pid, wait_s: (rank.join(wait_s), rank.exitcode)[1])
        ranks.wait_ready(GUARD_S)
        [result] = to_results(ranks.call(pickle_call(1, say, (PLAINTEXT,), "cpu", "test"), GUARD_S))
        assert result.value == f"{PLAINTEXT} from rank 0"
        intruder.join(GUARD_S)
    finally:
        ranks.kill()
        rank.join(GUARD_S)
        relay.close()
    assert outcome == {"dropped": True} and not marker.exists()
    assert relay.connections == 1
    assert_unreadable(relay.captured, key_material(hub.config.credentials),
                      [PLANTED.encode(), PLAINTEXT.encode(), b"HARNESS_TEST_PLANTED", b"Done", b"Ready"])


# ---------------------------------------------------------------- two hosts, a relay between host 1 and the hub

TWO_HOST_SUITE = f'''
def say(text):
    import torch.distributed as dist

    return f"{{text}} from rank {{dist.get_rank()}}"


def test_both_hosts_answer(ranks):
    assert ranks.run(2, say, "{PLAINTEXT}") == ["{PLAINTEXT} from rank 0", "{PLAINTEXT} from rank 1"]
'''


def test_a_relay_between_a_host_and_the_hub_records_no_key_and_no_message(pytester, monkeypatch):
    """harness host 0 runs pytest, host 1 an agent that reaches the hub only through the relay: every byte of
    their connection (the hello, Preload, Fork with the ranks' specs and host 0's environment, heartbeats) is
    recorded, and none is readable; the cell still passes, and no log holds the key."""
    from harness.ranks.ports import port_outside_ephemeral_range

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("HARNESS_TEST_PLANTED", PLANTED)
    monkeypatch.delenv("HARNESS_RANKS_POOL", raising=False)
    pytester.makepyfile(test_two_hosts=TWO_HOST_SUITE)
    cell = credentials.write(pytester.path / "private", "two-hosts")
    assert oct(cell.stat().st_mode & 0o777) == "0o600" and oct(cell.parent.stat().st_mode & 0o777) == "0o700"
    hub_port = port_outside_ephemeral_range("127.0.0.1")
    relay = RecordingRelay(("127.0.0.1", hub_port))
    host = [sys.executable, "-m", "harness", "host", "--count", "2", "--host0", "127.0.0.1", "--ranks-per-host", "1",
            "--credentials", str(cell)]
    with (pytester.path / "host1.log").open("w+") as host1_log:
        # Host 1 dials the relay; the relay passes everything on to the hub's port.
        agent_host = subprocess.Popen([*host, "--hub-port", str(relay.address[1]), "--index", "1"], stdout=host1_log,
                                      stderr=subprocess.STDOUT)
        try:
            leader = subprocess.run([*host, "--hub-port", str(hub_port), "--index", "0", "--cpu-ranks", "--cwd",
                                     str(pytester.path), "--", sys.executable, "-m", "pytest", "-p",
                                     "no:cacheprovider"], capture_output=True, text=True, timeout=600)
        finally:
            agent_host.wait(timeout=GUARD_S)
            relay.close()
        host1_log.seek(0)
        logs = leader.stdout + leader.stderr + host1_log.read()
    assert "1 passed" in leader.stdout, logs[-3000:]
    assert relay.connections == 1 and relay.to_target and relay.from_target
    secrets = key_material(cell)
    assert_unreadable(relay.captured, secrets, [PLANTED.encode(), b"HARNESS_TEST_PLANTED",
                                                str(pytester.path).encode(), b"test_two_hosts"])
    assert [secret for secret in secrets if secret in logs.encode()] == []
