"""Shared test helpers: free ports for real tritonserver instances, a fresh shared-memory check, a plain
tritonserver for Python-backend models of the test's own, and a stand-in for a Service's port in front of
a server."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import select
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from kubetriton.podenv import REPOSITORY_TOKEN_HEADER
from kubetriton.server import LocalTritonServer
from kubetriton.triton_home import TritonHome

TEST_PORTS = range(20000, 30000)
"""Below the kernel's ephemeral range (32768-60999 by default), from which every outgoing connection on the
machine takes its local port (a port picked there may be taken before the server under test listens), and
below Kubernetes' NodePorts (30000-32767), which a local cluster's kube-proxy may hold."""
PORT_CLAIMS = Path(tempfile.gettempdir()) / f"kubetriton-test-ports-{os.getuid()}"
_claimed: list[int] = []
"""Descriptors of the claim files this process holds, until it exits."""


def _claim(port: int) -> bool:
    """Whether `port` is now this process's: no other test process claimed it, and nothing listens there."""
    fd = os.open(PORT_CLAIMS / str(port), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with socket.socket() as probe:
            probe.bind(("", port))
    except OSError:
        os.close(fd)
        return False
    _claimed.append(fd)
    return True


def free_ports(count: int) -> list[int]:
    """Ports for the servers a test starts, free now and kept from other test processes on this machine
    (each claimed by a lock on a file named for it, held for the rest of this process), and outside the
    range outgoing connections take theirs from."""
    PORT_CLAIMS.mkdir(exist_ok=True)
    start = random.randrange(len(TEST_PORTS))
    found: list[int] = []
    for offset in range(len(TEST_PORTS)):
        port = TEST_PORTS[(start + offset) % len(TEST_PORTS)]
        if _claim(port):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError(f"no {count} free ports in {TEST_PORTS}")


def consecutive_free_ports(count: int) -> int:
    """The first of `count` consecutive ports claimed as `free_ports` claims them: a pod's health port
    and those of its worker processes after it."""
    PORT_CLAIMS.mkdir(exist_ok=True)
    for _ in range(len(TEST_PORTS)):
        first = random.randrange(TEST_PORTS.start, TEST_PORTS.stop - count)
        if all(_claim(port) for port in range(first, first + count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports in {TEST_PORTS}")


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, valid for a day, and its key: (server.pem, server.key)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the test certificates")
    cert, key = directory / "server.pem", directory / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def shm_entries() -> set[str]:
    return {entry.name for entry in Path("/dev/shm").iterdir()}


@pytest.fixture
def ports() -> Iterator[tuple[int, int, int]]:
    http, grpc, metrics = free_ports(3)
    yield http, grpc, metrics


@dataclass(frozen=True)
class PlainTriton:
    """A running local tritonserver without kubetriton models: the test writes and loads its own."""

    repository: Path
    http_port: int
    grpc_port: int
    control: httpclient.InferenceServerClient
    token: str = "plain"

    def add_model(self, name: str, source: str, config: str) -> None:
        (self.repository / name / "1").mkdir(parents=True)
        (self.repository / name / "1" / "model.py").write_text(source)
        (self.repository / name / "config.pbtxt").write_text(config)

    def load(self, name: str) -> None:
        self.control.load_model(name, headers={REPOSITORY_TOKEN_HEADER: self.token})


@contextlib.contextmanager
def plain_triton(
    home: TritonHome, workspace: Path, *, address: str | None = None, ports: tuple[int, int] | None = None
) -> Iterator[PlainTriton]:
    """A tritonserver from `home`, its repository and log in `workspace`: on free ports of every address,
    or on `ports` (HTTP, gRPC) of one loopback `address`, so that servers on 127.0.0.1 and 127.0.0.2 can
    share their ports as pods do."""
    repository = workspace / "models"
    repository.mkdir()
    http, grpc, metrics = free_ports(3)
    extra_args: list[str] = []
    if address is not None:
        http, grpc = ports or (http, grpc)
        extra_args = [f"--http-address={address}", f"--grpc-address={address}"]
    host = address or "localhost"
    server = LocalTritonServer(
        home,
        model_repository=repository,
        repository_token=PlainTriton.token,
        shm_prefix=f"/dev/shm/kubetriton-plain-{metrics}",
        log_path=workspace / "tritonserver.log",
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        exit_timeout_s=5,
        log_verbose=0,
        extra_args=extra_args,
        control_url=f"http://{host}:{http}",
        listening=None if address is None else {"metrics": metrics},
    )
    server.start()
    control = httpclient.InferenceServerClient(f"{host}:{http}")
    try:
        yield PlainTriton(repository, http, grpc, control)
    finally:
        control.close()
        server.stop()


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
        except (OSError, ValueError):  # ValueError: `close` closed a socket of this pair meanwhile
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
