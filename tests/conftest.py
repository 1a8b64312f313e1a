"""Shared test helpers: free ports for real tritonserver instances, a fresh shared-memory check, and a
stand-in for a Service's port in front of a server."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on right now (bound and released at once; good enough on a test box)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def shm_entries() -> set[str]:
    return {entry.name for entry in Path("/dev/shm").iterdir()}


@pytest.fixture
def ports() -> Iterator[tuple[int, int, int]]:
    http, grpc, metrics = free_ports(3)
    yield http, grpc, metrics


def node_address() -> str:
    """This machine's address on its default route: connections from it look to the pod's worker like
    connections from another host (its own, over loopback, do not count as clients)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe_socket:
        probe_socket.connect(("10.255.255.255", 1))  # a UDP connect sends nothing; it only picks a route
        return probe_socket.getsockname()[0]


class ServicePort:
    """A stand-in for one port of a Service, as kube-proxy gives it: each new connection goes to the backend
    of the moment and keeps it (conntrack), so moving the backend affects only the connections that follow.
    Connections reach the backend from the node's address, as they would from another pod."""

    def __init__(self, backend: int) -> None:
        self.backend = backend
        self.bytes_to: dict[int, int] = {}
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._source = node_address()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            backend = self.backend
            try:
                upstream = socket.create_connection((self._source, backend), source_address=(self._source, 0))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream, backend), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket, backend: int) -> None:
        peers = {client: upstream, upstream: client}
        try:
            while True:
                readable, _, _ = select.select(list(peers), [], [])
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
                    if sock is client:
                        with self._lock:
                            self.bytes_to[backend] = self.bytes_to.get(backend, 0) + len(data)
        except OSError:
            return
        finally:
            for sock in peers:
                sock.close()

    def sent_to(self, backend: int) -> int:
        with self._lock:
            return self.bytes_to.get(backend, 0)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
