"""The wire between the hosts of a cell: TLS 1.3 with both ends proving they hold the cell's key, then framed
messages. Every TCP connection of a cell across hosts goes through here (an agent to host 0's hub, a rank to its
RankSet's listener); a rank pool on one host keeps its Unix socket (launcher.handshake).

The cell's credentials are one PEM file, a private key and its self-signed certificate, that the engine made for
this cell alone (harness.engines.credentials) and handed every host as a file only the job's user can read; what
a process is told is its path. Both ends load it as their own certificate and as the only one they trust
(`ssl.CERT_REQUIRED` both ways), and check that the peer's is that very certificate: a peer with another cell's
certificate, or none, fails the handshake, and nothing it sends is read. Admission keeps a deadline over the
whole handshake and first message (a peer that trickles is dropped as one that stays silent is) and a bound on
a message's size, read from its header before anything is allocated.

A `Channel` speaks as multiprocessing's Connection does (send/recv of pickles, send_bytes/recv_bytes, poll,
fileno, close), and `wait` stands for multiprocessing.connection.wait over both kinds. OpenSSL's objects are
not safe to use from two threads at once, yet a hub reads in one thread while others send heartbeats: the socket
is non-blocking underneath, each OpenSSL call holds a lock, and waiting for the socket happens outside it.
Standard library only: the cell's own interpreter may lack everything else.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import pickle
import select
import socket
import ssl
import struct
import threading
import time
from pathlib import Path

HEADER = struct.Struct("!Q")  # a message's length, before it
# An authenticated peer's messages (a call's pickled result can be large); admission allows far less.
MAX_MESSAGE_BYTES = 1 << 34
READ_CHUNK = 1 << 20
WRITE_CHUNK = 1 << 20


class Refused(ConnectionError):
    """The peer is not of this cell, did not finish the handshake in time, or sent a message too large."""


def _context(credentials: str | Path, purpose: int) -> ssl.SSLContext:
    """TLS 1.3 only, our certificate, and the same certificate as the only one trusted."""
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    if purpose == ssl.PROTOCOL_TLS_CLIENT:
        context.check_hostname = False  # hosts are named by the cluster; the certificate is pinned instead
    else:
        context.num_tickets = 0  # no session resumption: nothing arrives after the handshake but messages
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(str(credentials))
        context.load_verify_locations(cafile=str(credentials))
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot load the cell's TLS credentials from {credentials}: {error}") from None
    return context


def server_context(credentials: str | Path) -> ssl.SSLContext:
    return _context(credentials, ssl.PROTOCOL_TLS_SERVER)


def client_context(credentials: str | Path) -> ssl.SSLContext:
    return _context(credentials, ssl.PROTOCOL_TLS_CLIENT)


def _wait_for(sock: socket.socket, want_write: bool, deadline: float | None) -> None:
    """Until the socket can be read (or written); TimeoutError past the deadline."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT if want_write else select.POLLIN)
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("the peer did not keep up with the deadline")
        if poller.poll(None if left is None else max(1, int(left * 1000))):
            return


def _handshake(sock: ssl.SSLSocket, context: ssl.SSLContext, deadline: float | None) -> None:
    while True:
        try:
            sock.do_handshake()
            break
        except ssl.SSLWantReadError:
            _wait_for(sock, False, deadline)
        except ssl.SSLWantWriteError:
            _wait_for(sock, True, deadline)
    # The trust store holds one certificate; a peer must present exactly it, not another it could sign.
    if sock.getpeercert(binary_form=True) not in context.get_ca_certs(binary_form=True):
        raise ssl.SSLCertVerificationError("the peer's certificate is not the cell's")


def accept(sock: socket.socket, context: ssl.SSLContext, deadline: float) -> Channel | None:
    """The server's side of a new TCP connection: a Channel once the peer proved it holds the cell's key, or
    None (the socket closed) for anything else, or for nothing before `deadline`."""
    sock.setblocking(False)
    try:
        tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    except OSError:
        sock.close()
        return None
    try:
        _handshake(tls, context, deadline)
    except (OSError, TimeoutError):
        tls.close()
        return None
    return Channel(tls)


def dial(address: tuple[str, int], context: ssl.SSLContext, timeout_s: float | None) -> Channel:
    """Connect and prove ourselves; the server must be the cell's too. OSError (ssl.SSLError for a peer that is
    not of the cell) when it cannot be done within `timeout_s` (None: as long as it takes)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.setblocking(False)
    tls = context.wrap_socket(sock, server_side=False, do_handshake_on_connect=False)
    try:
        _handshake(tls, context, deadline)
    except BaseException:
        tls.close()
        raise
    return Channel(tls)


class Channel:
    """Framed messages over one TLS connection: an 8-byte length, then the bytes."""

    def __init__(self, sock: ssl.SSLSocket):
        self._sock = sock
        self._tls = threading.Lock()  # one OpenSSL call at a time
        self._sending = threading.Lock()  # whole messages, never interleaved
        self._receiving = threading.Lock()
        self._buffer = bytearray()
        self._ended = False  # the peer closed its side (what is buffered may still be read)
        self._closed = False

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------ sending

    def send_bytes(self, data: bytes) -> None:
        if self._closed:
            raise OSError("the channel is closed")
        message = memoryview(HEADER.pack(len(data)) + bytes(data))
        with self._sending:
            while message:
                chunk = message[:WRITE_CHUNK]  # after a want-write OpenSSL must be offered the same bytes again
                with self._tls:
                    if self._closed:
                        raise OSError("the channel is closed")
                    try:
                        sent, want_write = self._sock.send(chunk), None
                    except ssl.SSLWantWriteError:
                        sent, want_write = 0, True
                    except ssl.SSLWantReadError:
                        sent, want_write = 0, False
                if want_write is not None:
                    _wait_for(self._sock, want_write, None)
                message = message[sent:]

    def send(self, message: object) -> None:
        self.send_bytes(pickle.dumps(message))

    # ------------------------------------------------------------ receiving

    def _drain(self) -> bool | None:
        """Read what has arrived, without waiting. True: something came; False: nothing yet, wait for the socket
        to be readable; None: nothing yet, wait for it to be writable."""
        came = False
        while not self._ended:
            with self._tls:
                if self._closed:
                    raise OSError("the channel is closed")
                try:
                    chunk = self._sock.recv(READ_CHUNK)
                except ssl.SSLWantReadError:
                    return came
                except ssl.SSLWantWriteError:
                    return came or None
            if not chunk:
                self._ended = True
                return True
            self._buffer += chunk
            came = True
        return True

    def _message(self, max_bytes: int) -> bytes | None:
        """The first whole message buffered, if any; Refused for one announced larger than `max_bytes`."""
        if len(self._buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > max_bytes:
            raise Refused(f"a message of {length} bytes; at most {max_bytes} are taken here")
        if len(self._buffer) < HEADER.size + length:
            return None
        with memoryview(self._buffer) as view:
            message = bytes(view[HEADER.size:HEADER.size + length])
        del self._buffer[:HEADER.size + length]
        return message

    def recv_bytes(self, max_bytes: int = MAX_MESSAGE_BYTES, deadline: float | None = None) -> bytes:
        """The next message; EOFError once the peer closed, TimeoutError past `deadline` (None: none)."""
        with self._receiving:
            while True:
                message = self._message(max_bytes)
                if message is not None:
                    return message
                if self._ended:
                    raise EOFError("the peer closed the connection")
                if self._closed:
                    raise OSError("the channel is closed")
                came = self._drain()
                if not came:
                    _wait_for(self._sock, came is None, deadline)

    def recv(self, max_bytes: int = MAX_MESSAGE_BYTES, deadline: float | None = None) -> object:
        return pickle.loads(self.recv_bytes(max_bytes, deadline))

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether a message (or the end) has begun to arrive, waiting up to `timeout` seconds for it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._receiving:
            while True:
                try:
                    came = self._drain()
                except OSError:  # a reset or a closed channel: recv says which
                    return True
                if self._buffer or self._ended:
                    return True
                try:
                    _wait_for(self._sock, came is None, deadline)
                except TimeoutError:
                    return False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The plain socket's shutdown, outside the lock, wakes a thread waiting in poll or recv (SSLSocket's own
        # would first drop its TLS state, and a send racing it would go out unencrypted); then the close, under
        # the lock, between two OpenSSL calls.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
        with self._tls:
            self._sock.close()


def wait(connections: list, timeout: float) -> list:
    """multiprocessing.connection.wait for Connections and Channels alike: a Channel may hold a decrypted message
    that its socket no longer shows."""
    channels = [each for each in connections if isinstance(each, Channel)]
    ready = [channel for channel in channels if channel.poll(0)]
    if ready:
        return ready
    return [each for each in multiprocessing.connection.wait(connections, timeout)
            if not isinstance(each, Channel) or each.poll(0)]
