"""Shared test helpers: free ports for real tritonserver instances, and a fresh shared-memory check."""

from __future__ import annotations

import socket
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
