"""A recording TCP relay for the tests of the wire between hosts (test_hostile_hosts.py): it stands between a
host and host 0 as a machine on the cell's network could, passing every byte on and keeping a copy of each."""

from __future__ import annotations

import contextlib
import socket
import threading


class RecordingRelay:
    """Listens on (host, port); each connection is relayed to `target`, every byte recorded both ways."""

    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1", port: int = 0):
        self.target = target
        self.server = socket.create_server((host, port))
        self.address = self.server.getsockname()[:2]
        self.to_target = bytearray()  # what the dialling side sent
        self.from_target = bytearray()  # what the listening side answered
        self.connections = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def captured(self) -> bytes:
        with self._lock:
            return bytes(self.to_target) + bytes(self.from_target)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, self.to_target), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.from_target), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bytearray) -> None:
        while True:
            try:
                chunk = source.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            with self._lock:
                record += chunk
            try:
                sink.sendall(chunk)
            except OSError:
                return

    def close(self) -> None:
        self.server.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
