"""How a worker in a pod stops without failing a request: wait for the clients to leave, then stop Triton.

When a pod stops, the Service stops sending it *new* connections, but clients keep the connections they
have: HTTP keep-alive and gRPC channels. Triton itself never closes them before it exits, and a native
sidecar gets its SIGTERM only after the worker has exited, so a worker that simply drained and left would
leave Triton answering those connections with "no worker attached". The worker therefore:

1. waits until no client connection to Triton's HTTP or gRPC port is left, within the drain budget: gRPC
   clients move on their own when their connection reaches its maximum age (Triton sends GOAWAY), and
   `ModelClient` renews its HTTP connection just as often;
2. asks the sidecar to stop Triton (a line on the stop FIFO), and serves whatever still arrives while
   Triton finishes the requests in flight and closes the connections that are left;
3. exits once Triton has unloaded the models, that is once no proxy instance is attached any more.

The pod's containers share one network namespace, so the worker sees Triton's connections in
/proc/net/tcp; its own connections to Triton (loopback) do not count.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

ESTABLISHED = "01"
_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_IPV6_LOOPBACK = "00000000000000000000000001000000"
_IPV4_MAPPED_PREFIX = "0000000000000000FFFF0000"


def _is_loopback(address: str) -> bool:
    """Whether an address as /proc/net/tcp{,6} writes it (hex, 32-bit words in host byte order, so
    127.x.y.z ends in 7F) is a loopback address: 127.0.0.0/8, ::1, or 127.0.0.0/8 mapped into IPv6."""
    if len(address) == 8:
        return address.endswith("7F")
    return address == _IPV6_LOOPBACK or (address.startswith(_IPV4_MAPPED_PREFIX) and address.endswith("7F"))


def client_connections(ports: Iterable[int], tables: Iterable[Path] = _TCP_TABLES) -> int | None:
    """How many established TCP connections from other hosts end at one of `ports` here; None when the
    kernel's tables cannot be read (not Linux)."""
    wanted = {f"{port:04X}" for port in ports}
    count, readable = 0, False
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            local, remote, state = line.split()[1:4]
            port = local.rpartition(":")[2]
            if state == ESTABLISHED and port in wanted and not _is_loopback(remote.rpartition(":")[0]):
                count += 1
    return count if readable else None


def request_sidecar_stop(fifo: Path) -> bool:
    """Ask the sidecar's shell to stop tritonserver; False when no sidecar listens on the FIFO."""
    try:
        descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as error:
        if error.errno in (errno.ENXIO, errno.ENOENT):
            return False
        raise
    try:
        os.write(descriptor, b"stop\n")
    finally:
        os.close(descriptor)
    return True
