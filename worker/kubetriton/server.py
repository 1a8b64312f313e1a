"""The Triton server a `Triton()` object serves through: a local process, or the pod's sidecar.

Both are reached through a `TritonControl` (liveness, model loading) holding the repository token. Only the
local server owns a process; stopping it drains in-flight requests (SIGTERM, Triton's exit timeout) and
removes every shared-memory file it created.

A local server is also published, for as long as it runs, in a directory private to the user
(`servers_dir`): where its repository, sockets and arenas are and the tokens that open it. That is how
`RemoteTriton(url)` in another process of the same user binds models to it, as PyTriton's remote mode does
between two scripts on one machine. Only the user can read the record; it names the server by its ports.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import glob
import json
import os
import queue
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytriton.exceptions import PyTritonRuntimeError

from kubetriton.control import TritonControl
from kubetriton.endpoint import Endpoint
from kubetriton.podenv import DEFAULT_PROTECTED_ENDPOINTS, tritonserver_args
from kubetriton.private_files import PRIVATE_FILE, private_folder
from kubetriton.triton_home import TritonHome

OWNER_LOCK = ".owner.lock"
TRITON_UMASK = 0o077
"""What a local tritonserver and its Python-backend stubs create (the bytecode they compile into the model
repository and the proxy's runtime, among others) is for this user alone, whatever the script's umask."""
TRITON_REGION_SUFFIX = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""What Triton's Python backend appends to the shared-memory prefix for each region it creates."""


def claim(directory: Path) -> int:
    """Create `directory` and hold its owner lock for as long as the returned descriptor stays open.

    A lock, not a PID in the name: it is released by the kernel however the owner ends, and it works
    across PID namespaces (containers sharing a volume) as well. The directory is for this user alone."""
    private_folder(directory)
    fd = os.open(directory / OWNER_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PyTritonRuntimeError(f"{directory} belongs to a running server; choose another id") from None
    return fd


def remove_owned(directory: Path) -> None:
    """A claimed directory, and the shared-memory regions Triton created under its name as prefix."""
    shutil.rmtree(directory, ignore_errors=True)
    for entry in directory.parent.glob(glob.escape(directory.name) + "*"):
        if TRITON_REGION_SUFFIX.fullmatch(entry.name[len(directory.name) :]):
            entry.unlink(missing_ok=True)


def remove_abandoned(parent: Path) -> None:
    """Remove what local servers of killed processes left in `parent` (SIGKILL allows no clean-up):
    every `kubetriton-*` directory whose owner lock nobody holds, with its regions."""
    for lock in parent.glob(f"kubetriton-*/{OWNER_LOCK}"):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            remove_owned(lock.parent)
        except BlockingIOError:
            continue
        finally:
            os.close(fd)


@dataclasses.dataclass(frozen=True)
class PublishedServer:
    """What another process of the same user needs to bind models to a running local server."""

    ports: dict[str, int]
    """The server's port per protocol that is on: "http", "grpc"."""
    model_repository: str
    runtime: str
    sockets: str
    arena_dir: str
    repository_token: str
    access_token: str | None


def servers_dir() -> Path:
    """The directory where local servers are published: `$XDG_RUNTIME_DIR/kubetriton` (a directory of the
    user's session), else `kubetriton-servers-<uid>` in the temporary directory. It is created readable by
    the user alone, and refused (PyTritonRuntimeError) when it is a link, another user's, or open to others:
    the records hold the servers' tokens."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        directory = Path(runtime) / "kubetriton"
    else:
        directory = Path(tempfile.gettempdir()) / f"kubetriton-servers-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    status = directory.lstat()
    if (
        not stat.S_ISDIR(status.st_mode)
        or status.st_uid != os.getuid()
        or stat.S_IMODE(status.st_mode) & 0o077
    ):
        raise PyTritonRuntimeError(
            f"{directory} must be a directory of user {os.getuid()} that nobody else may use "
            "(mode 0700); remove it, or set XDG_RUNTIME_DIR to such a directory"
        )
    return directory


def publish(server: PublishedServer) -> tuple[Path, int]:
    """Publish `server` for the processes of this user; the record lives while the returned descriptor
    stays open (an owner lock, which the kernel releases however the process ends), at the returned path."""
    directory = servers_dir()
    name = f"{os.getpid()}-{os.urandom(4).hex()}"
    draft = directory / f".{name}.draft"
    fd = os.open(draft, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps(dataclasses.asdict(server)).encode())
    record = directory / f"{name}.json"
    os.rename(draft, record)
    return record, fd


def find_published(endpoint: Endpoint) -> PublishedServer | None:
    """The local server of this user that listens at `endpoint`, when it is on this machine and published;
    records of servers that ended are removed on the way."""
    if not is_this_machine(endpoint.host):
        return None
    for record in sorted(servers_dir().glob("*.json")):
        try:
            fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            record.unlink(missing_ok=True)  # its owner holds the lock no more
            continue
        except BlockingIOError:
            server = PublishedServer(**json.loads(os.pread(fd, os.fstat(fd).st_size, 0)))
        finally:
            os.close(fd)
        if server.ports.get(endpoint.protocol) == endpoint.port:
            return server
    return None


def is_this_machine(host: str) -> bool:
    """Whether `host` names this machine: a socket can be bound to one of its addresses."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                continue
            return True
    return False


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this child process (run before it executes) if its parent dies: the thread
    that started it, to be exact (see `start_owned`)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_owned(argv: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
    """Start a child process that the kernel stops when this process dies, however it is started.

    The kernel sends `die_with_parent`'s signal when the thread that started the child ends, not the
    process: a server started from a thread that then ended (an application's start-up hook) was stopped at
    once. So a thread of its own starts the child and waits for it, living as long as the child, or as this
    process."""
    started: queue.Queue[subprocess.Popen[bytes] | BaseException] = queue.Queue(maxsize=1)

    def own() -> None:
        try:
            process = subprocess.Popen(argv, preexec_fn=die_with_parent, **options)
        except BaseException as error:
            started.put(error)
            return
        started.put(process)
        process.wait()

    threading.Thread(target=own, name=f"{Path(argv[0]).name} owner", daemon=True).start()
    result = started.get()
    if isinstance(result, BaseException):
        raise result
    return result


def _how_it_ended(returncode: int) -> str:
    if returncode >= 0:
        return f"It exited with status {returncode}."
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    cause = (
        " (the kernel's out-of-memory killer sends it, as does kill -9)"
        if -returncode == signal.SIGKILL
        else ""
    )
    return f"It was killed by {name}{cause}."


class LocalTritonServer:
    """A tritonserver child process with its model repository and shared memory in private places."""

    def __init__(
        self,
        home: TritonHome,
        *,
        model_repository: Path,
        repository_token: str,
        shm_prefix: str,
        log_path: Path,
        http_port: int,
        grpc_port: int,
        metrics_port: int,
        exit_timeout_s: float,
        log_verbose: int,
        extra_args: list[str],
        access_token: str | None = None,
        protected_endpoints: Sequence[str] = DEFAULT_PROTECTED_ENDPOINTS,
        control_url: str | None = None,
        listening: Mapping[str, int] | None = None,
    ) -> None:
        """`control_url` is where kubetriton manages the server (its HTTP port on this machine by default);
        `listening` names the ports that must be free before launching (HTTP, gRPC and metrics by default)."""
        self.control = TritonControl(
            control_url or f"http://127.0.0.1:{http_port}",
            repository_token=repository_token,
            access_token=access_token,
        )
        self._home = home
        self._shm_prefix = shm_prefix
        self._log_path = log_path
        self._exit_timeout_s = exit_timeout_s
        self._ports = (
            {"HTTP": http_port, "gRPC": grpc_port, "metrics": metrics_port}
            if listening is None
            else listening
        )
        common = tritonserver_args(
            model_repository=str(model_repository),
            repository_token=repository_token,
            access_token=access_token,
            protected_endpoints=protected_endpoints,
            exit_timeout_s=exit_timeout_s,
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            log_verbose=log_verbose,
            access_token_opens_repository=True,
        )
        self._args = [
            *common,
            f"--backend-directory={home.backends}",
            f"--backend-config=python,shm-region-prefix-name={Path(shm_prefix).name}",
            *extra_args,
        ]
        self._process: subprocess.Popen[bytes] | None = None
        self._shm_lock: int | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        self._check_ports_free()
        self._shm_lock = claim(Path(self._shm_prefix))
        log_descriptor = os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE)
        with open(log_descriptor, "ab") as log:
            self._process = start_owned(
                [str(self._home.executable), *self._args],
                env=self._home.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                umask=TRITON_UMASK,
                start_new_session=True,  # a terminal's Ctrl-C reaches kubetriton alone, which stops Triton
            )
        try:
            self.control.wait_until_live(timeout_s, self.is_running)
        except PyTritonRuntimeError as error:
            self.stop()
            raise PyTritonRuntimeError(
                f"{error}. Last lines of {self._log_path}:\n{self.log_tail()}"
            ) from None

    def _check_ports_free(self) -> None:
        """Fail before launching when a port is taken: the server already there would answer in its place."""
        for what, port in self._ports.items():
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("0.0.0.0", port))
                except OSError as error:
                    raise PyTritonRuntimeError(
                        f"Cannot start tritonserver: its {what} port {port} is in use ({error.strerror}). "
                        "Stop what listens there, or choose other ports with "
                        "TritonConfig(http_port=..., grpc_port=..., metrics_port=...)"
                    ) from None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def exit_report(self, lines: int = 20) -> str:
        """Why the server ended: how (its exit status, or the signal that killed it), then as far as its
        log says, its last error lines and its last lines (a crash's are a stack trace, which names no
        cause)."""
        code = None if self._process is None else self._process.poll()
        ended = [] if code is None else [_how_it_ended(code)]
        try:
            log = self._log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "\n".join(ended)
        errors = [line for line in log[:-lines] if line.startswith("E")][-lines:]
        return "\n".join(
            [*ended, *(["Its last errors:", *errors, "Its last lines:"] if errors else []), *log[-lines:]]
        )

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM, wait for Triton to drain within its exit timeout (or within `grace_s`, where nothing is
        worth draining), then make sure it is gone."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(self._exit_timeout_s + 5 if grace_s is None else grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.control.close()
        if self._shm_lock is not None:
            remove_owned(Path(self._shm_prefix))
            os.close(self._shm_lock)
            self._shm_lock = None
