"""The supervisor of a script's worker processes: several copies of one script serve its models together.

A model's instances are threads of one process, so callables that hold the GIL (tensor conversion, kernel
launches, pre- and post-processing) run one at a time however many instances there are. Processes do
not share a GIL: each runs the user's unchanged script, with its own copy of the model (its own CUDA
context), and Triton sees one model whose instance group is every process's instances
(`podenv.ProcessGroup`), spread over them by its scheduler.

The supervisor runs no user code. It starts the processes, each told its index and the count
(KUBETRITON_PROCESS_INDEX, KUBETRITON_PROCESS_COUNT) and, where the container was given one GPU per
process, shown only its own (`process_devices`); restarts one that exits, alone, while the others serve;
gives up once one keeps exiting (`RestartPolicy`), with its last error, and at once when one exits with a
status that no restart mends (`NO_RESTART_EXIT_CODES`); and on SIGTERM or SIGINT stops them all, each
draining as a worker alone would. Their output becomes the supervisor's, each line prefixed with the
process's index.

- In a pod (`spec.worker.processes`), the launcher hands the worker container to it. The processes attach
  to the Triton sidecar; the supervisor serves the pod's probes and metrics from theirs
  (`health.ProcessesHealth`), and giving up ends the container with the error as its termination message,
  which the operator reports.
- Locally (`kubetriton run --processes N script.py`), it also hosts the one local tritonserver, launched
  as the first process's `Triton()` configures it (`ServerHost`), so a process that dies does not take
  Triton with it. Each process runs the script through kubetriton's launcher, as in a pod.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from pytriton.settings import DefaultTritonLifecyclePolicy, TritonConfig, TritonSecurityConfig

from kubetriton import podenv
from kubetriton.health import ProcessesHealth
from kubetriton.server import claim, die_with_parent, remove_owned
from kubetriton.triton_serving import TritonServing, supervisor_stopping_mark

LOGGER = logging.getLogger(__name__)

LAST_LINES = 10
"""How many of a process's last lines of error output are kept for the message when the supervisor gives
up."""
STOP_SLACK_S = 15.0
"""Beyond the drain budget and Triton's exit timeout: how long stopping processes may take to exit before
they are killed."""
WATCH_INTERVAL_S = 0.1
RELAY_DRAIN_S = 2.0
"""How long the last lines of a process that exited may take to be read (a child of its own may hold its
output open)."""
_GPU_UUID = re.compile(r"^(GPU|MIG)-")
NO_RESTART_EXIT_CODES = (
    podenv.UNSUPPORTED_IMAGE_EXIT_CODE,
    podenv.MODEL_NOT_BOUND_EXIT_CODE,
    podenv.CONFIGURATION_ERROR_EXIT_CODE,
)
"""A process's exit statuses that say the image, the spec or the user's settings are wrong, not the process:
the supervisor stops at once with the same status."""


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """When a process that exited is started again, and when the supervisor gives up on it.

    An exit within `quick_exit_s` of the process's start counts as one more failure in a row; a process
    that ran longer starts its count afresh. The first restart is immediate (a killed process should serve
    again at once), later ones wait `backoff_s` in turn; the `give_up_after`-th failure in a row ends the
    supervision, as a crash-looping container ends in Kubernetes."""

    quick_exit_s: float = 60.0
    give_up_after: int = 5
    backoff_s: tuple[float, ...] = (0.0, 1.0, 2.0, 4.0, 8.0)

    def after_exit(self, failures_in_a_row: int, ran_s: float) -> tuple[int, float | None]:
        """The failures in a row counting this exit, and how long to wait before the restart (None: give
        up)."""
        failures = failures_in_a_row + 1 if ran_s < self.quick_exit_s else 1
        if ran_s < self.quick_exit_s and failures >= self.give_up_after:
            return failures, None
        return failures, self.backoff_s[min(failures, len(self.backoff_s)) - 1]


def process_devices(count: int, environ: Mapping[str, str]) -> list[str | None]:
    """Each process's CUDA_VISIBLE_DEVICES: where the container sees exactly one GPU per process, process i
    gets the i-th, else None (the processes see what the container sees, and a script picks its device by
    its index). The GPUs are those CUDA_VISIBLE_DEVICES lists when set, else those NVIDIA_VISIBLE_DEVICES
    lists (the NVIDIA device plugin sets it to the allocated GPUs' UUIDs): a UUID is kept as it is, a
    number becomes its position, which is how CUDA numbers the devices the container sees."""
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        devices = [entry.strip() for entry in cuda.split(",") if entry.strip()]
    else:
        nvidia = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
        if nvidia in ("", "all", "none", "void"):
            return [None] * count
        entries = [entry.strip() for entry in nvidia.split(",") if entry.strip()]
        devices = [
            entry if _GPU_UUID.match(entry) else str(position) for position, entry in enumerate(entries)
        ]
    return list(devices) if len(devices) == count else [None] * count


def process_environment(
    index: int, count: int, environ: Mapping[str, str], extra: Mapping[str, str]
) -> dict[str, str]:
    """The environment of process `index`: the supervisor's, its place in the group, its GPU where it has
    one of its own, unbuffered output (lines reach the log as they are written) and `extra`."""
    env = {
        **environ,
        podenv.ENV_PROCESS_INDEX: str(index),
        podenv.ENV_PROCESS_COUNT: str(count),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    device = process_devices(count, environ)[index]
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    return env


class WorkerProcess:
    """One worker process: its command, environment, the last lines it wrote to stderr, and its restarts."""

    def __init__(self, index: int, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.index = index
        self._argv = list(argv)
        self._env = dict(env)
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.failures_in_a_row = 0
        self.restarts = 0
        self.restart_at: float | None = None
        self.last_lines: deque[str] = deque(maxlen=LAST_LINES)
        self._relays: list[threading.Thread] = []

    def start(self) -> None:
        self.process = subprocess.Popen(
            self._argv,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor alone, which orders the stop
            preexec_fn=die_with_parent,
        )
        self.started_at = time.monotonic()
        self.restart_at = None
        self.last_lines.clear()  # an exit is described by its own run's lines, not an earlier one's too
        assert self.process.stdout is not None and self.process.stderr is not None
        self._relays = [
            relay_output(self.process.stdout, self.index, sys.stdout, None),
            relay_output(self.process.stderr, self.index, sys.stderr, self.last_lines),
        ]

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def send(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def describe_exit(self, code: int) -> str:
        """How the process ended, with its last lines once its output is read to the end."""
        for relay in self._relays:
            relay.join(RELAY_DRAIN_S)
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        last = "; its last lines: " + " | ".join(self.last_lines) if self.last_lines else ""
        return f"worker process {self.index} {how}{last}"


def relay_output(pipe: IO[bytes], index: int, target: IO[str], keep: deque[str] | None) -> threading.Thread:
    """Copy a process's output to the supervisor's, line by line with the process's index in front, in a
    thread of its own until the pipe closes; keep its last non-empty lines in `keep`."""

    def copy() -> None:
        with pipe:
            for line in iter(pipe.readline, b""):
                text = line.decode(errors="replace").rstrip("\n")
                if keep is not None and text.strip():
                    keep.append(text.strip())
                target.write(f"[{index}] {text}\n")
                target.flush()

    thread = threading.Thread(target=copy, name=f"kubetriton-output-{index}", daemon=True)
    thread.start()
    return thread


class Supervisor:
    """Starts the worker processes, restarts them, gives up on one that keeps exiting, and stops them all.

    `before_stop` runs once stopping begins, before the processes are told (in a pod: which of them have not
    reached `Triton()`; locally: the mark by which they know that all of them stop); `after_telling` runs
    once they are told (locally: Triton stops then, and finishes the requests in flight while the processes
    that serve wait for it to let go of them; a process that was still loading has stopped at once, before
    Triton went away under it). `check` runs at every turn and returns why the supervision cannot go on
    (the hosted Triton exited), or None."""

    def __init__(
        self,
        argv: Sequence[str],
        count: int,
        *,
        environ: Mapping[str, str],
        extra_env: Callable[[int], Mapping[str, str]] = lambda index: {},
        policy: RestartPolicy = RestartPolicy(),
        stop_timeout_s: float,
        before_stop: Callable[[], None] = lambda: None,
        after_telling: Callable[[], None] = lambda: None,
        check: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.processes = [
            WorkerProcess(index, argv, process_environment(index, count, environ, extra_env(index)))
            for index in range(count)
        ]
        self._policy = policy
        self._stop_timeout_s = stop_timeout_s
        self._before_stop = before_stop
        self._after_telling = after_telling
        self._check = check
        self._stop_requested = False
        self._exit_code = 1
        self.stopping = False
        self.failure: str | None = None
        """Why the supervision gave up, once it has."""

    def request_stop(self, *_: object) -> None:
        """The handler of SIGTERM and SIGINT: it takes no lock, as `serving.SIGNAL_CHECK_S` explains."""
        self._stop_requested = True

    def restarts(self) -> list[int]:
        return [process.restarts for process in self.processes]

    def run(self) -> int:
        """Supervise until stopped (0), or until a process keeps exiting or `check` fails (1), or a process
        exits with one of NO_RESTART_EXIT_CODES (that status)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.request_stop)
        for process in self.processes:
            process.start()
        LOGGER.info("Started %d worker processes", len(self.processes))
        failure = None
        while not self._stop_requested:
            failure = self._check() or self._watch()
            if failure is not None:
                break
            time.sleep(WATCH_INTERVAL_S)
        self._stop(failure)
        self.failure = failure
        if failure is None:
            return 0
        LOGGER.error("%s", failure)
        return self._exit_code

    def _watch(self) -> str | None:
        """Restart the processes that exited, when their time comes; why to give up, or None."""
        now = time.monotonic()
        for process in self.processes:
            if process.restart_at is not None:
                if now >= process.restart_at:
                    process.restarts += 1
                    process.start()
                continue
            code = process.exit_code()
            if code is None:
                continue
            if code in NO_RESTART_EXIT_CODES:
                self._exit_code = code
                return process.describe_exit(code)
            process.failures_in_a_row, delay = self._policy.after_exit(
                process.failures_in_a_row, now - process.started_at
            )
            if delay is None:
                return (
                    f"{process.describe_exit(code)} ({process.failures_in_a_row} times in a row, each "
                    f"within {self._policy.quick_exit_s:g} s of its start)"
                )
            LOGGER.warning("%s; starting it again in %g s", process.describe_exit(code), delay)
            process.restart_at = now + delay
        return None

    def _stop(self, failure: str | None) -> None:
        """Stop every process: each drains on SIGTERM; those still running after the timeout are killed."""
        self.stopping = True
        if failure is None:
            LOGGER.info("Stopping %d worker processes", len(self.processes))
        self._before_stop()
        for process in self.processes:
            process.send(signal.SIGTERM)
        self._after_telling()
        deadline = time.monotonic() + (STOP_SLACK_S if failure else self._stop_timeout_s)
        for process in self.processes:
            if process.process is None:
                continue
            try:
                process.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                LOGGER.warning("Worker process %d did not stop in time; killing it", process.index)
                process.process.kill()
                process.process.wait()


class ServerHost:
    """Local mode: the one tritonserver every worker process serves through, hosted by the supervisor.

    Each process's `Triton()` asks for it with its settings (`TritonConfig`, workspace, security) through
    `triton_serving.ask_for_server`. The host launches it as process 0's `Triton()` would have (process 0
    loads the models, so the others could not serve before it anyway) and then answers every ask: the
    server's record when the settings are the same, an error naming the difference otherwise. An error in
    the settings (that one, or one that launching raises) is a refusal, which the asking process raises as
    a configuration error (`podenv.CONFIGURATION_ERRORS`); any other failure to launch is not. The server is
    published like any local server, so `RemoteTriton(url)` finds it too; the host watches it through the
    `TritonServing` that launched it."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "server.sock"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen()
        self._asks: queue.SimpleQueue[tuple[dict[str, Any], queue.SimpleQueue[dict[str, Any]]] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._triton: TritonServing | None = None
        threading.Thread(target=self._accept, name="kubetriton-server-asks", daemon=True).start()
        self._host_thread = threading.Thread(target=self._host, name="kubetriton-server-host", daemon=True)
        self._host_thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rwb") as stream, contextlib.suppress(OSError, ValueError):
            reply_box: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
            self._asks.put((json.loads(stream.readline()), reply_box))
            stream.write(json.dumps(reply_box.get()).encode() + b"\n")
            stream.flush()

    def _host(self) -> None:
        """Launch the server for process 0's ask, then answer the asks, in this one thread for as long as
        the host runs: the kernel stops tritonserver when the thread that launched it ends."""
        waiting: list[tuple[dict[str, Any], queue.SimpleQueue[dict[str, Any]]]] = []
        launched: tuple[dict[str, Any], dict[str, Any]] | None = None
        while (ask := self._asks.get()) is not None:
            waiting.append(ask)
            if launched is None:
                first = next((item for item in waiting if item[0]["process"] == 0), None)
                if first is None:
                    continue
                waiting.remove(first)
                try:
                    launched = first[0], self._launch(first[0])
                except podenv.CONFIGURATION_ERRORS as error:
                    first[1].put({"error": str(error), "refused": True})
                    continue
                except Exception as error:
                    first[1].put({"error": f"{type(error).__name__}: {error}"})
                    continue
                waiting.insert(0, first)
            for settings, reply_box in waiting:
                differing = _differences(launched[0], settings)
                reply_box.put(
                    {
                        "error": f"worker process {settings['process']} configures Triton differently from "
                        f"worker process 0 ({', '.join(differing)}): the processes of one script share one "
                        "server, so they must configure it alike",
                        "refused": True,
                    }
                    if differing
                    else launched[1]
                )
            waiting.clear()

    def _launch(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Launch the server as these settings say; where the processes find it."""
        security = settings["security"]
        triton = TritonServing(
            config=TritonConfig.from_dict(settings["config"]),
            workspace=settings["workspace"],
            lifecycle=DefaultTritonLifecyclePolicy,
            security=TritonSecurityConfig(
                access_token=security["access_token"], restricted_endpoints=security["restricted_endpoints"]
            ),
        )
        with self._lock:
            self._triton = triton
        triton.connect()
        return triton.hosted_reply()

    def mark_stopping(self) -> None:
        """Mark, before the processes are told, that the supervisor stops all of them: each then serves on
        until Triton, stopped next, lets go of it, where a process stopped alone leaves at once (its
        `TritonServing._leave_triton`)."""
        supervisor_stopping_mark(self.path).touch()

    def failure(self) -> str | None:
        """Why the hosted server cannot serve any more (it exited), or None."""
        with self._lock:
            triton = self._triton
        if triton is None or not triton.is_connected():
            return None
        return triton.failure()

    def stop(self) -> None:
        """Stop the server (it finishes the requests in flight first) and remove what it left."""
        self._listener.close()
        with self._lock:
            triton = self._triton
        if triton is not None:
            triton.stop()
        self._asks.put(None)
        self._host_thread.join(60)


def _differences(first: Mapping[str, Any], second: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The settings, as dotted names, in which two asks differ; which process asked is no setting."""
    names = []
    for key in sorted(set(first) | set(second)):
        if key == "process":
            continue
        one, other = first.get(key), second.get(key)
        if isinstance(one, Mapping) and isinstance(other, Mapping):
            names += _differences(one, other, f"{prefix}{key}.")
        elif one != other:
            names.append(prefix + key)
    return names


def supervise_pod(argv: Sequence[str], count: int) -> int:
    """Run `count` worker processes of `argv` in a pod's worker container, with the pod's probe endpoint."""
    settings = podenv.AttachSettings.from_environ()
    health_port = settings.health_port if settings else podenv.HEALTH_PORT
    drain_s = settings.drain_seconds if settings else podenv.DEFAULT_DRAIN_SECONDS
    starting: list[int] = []  # the processes that had not reached Triton() when stopping began
    supervisor = Supervisor(
        argv,
        count,
        environ=os.environ,
        extra_env=lambda index: {podenv.ENV_HEALTH_PORT: str(podenv.process_health_port(health_port, index))},
        stop_timeout_s=drain_s + podenv.SIDECAR_EXIT_TIMEOUT_S + STOP_SLACK_S,
        before_stop=lambda: starting.extend(health.not_started()),
    )
    health = ProcessesHealth(
        health_port,
        processes=count,
        draining=lambda: supervisor.stopping,
        restarts=supervisor.restarts,
        restart_bound_s=settings.startup_seconds if settings else None,
    )
    health.start()
    try:
        code = supervisor.run()
    finally:
        health.stop()
    if supervisor.failure:
        podenv.write_termination_message(supervisor.failure)
    elif starting:
        podenv.write_termination_message(
            f"stopped while worker process {', '.join(map(str, starting))} had not reached Triton() yet: "
            "a worker whose script takes longer than startupSeconds to get there, at its start or after a "
            "restart, is stopped"
        )
    return code


def supervise_locally(argv: Sequence[str], count: int) -> int:
    """Run `count` worker processes of `argv` on this machine, hosting the local tritonserver they share."""
    directory = Path(tempfile.mkdtemp(prefix="kubetriton-supervisor-"))
    owner = claim(directory)  # what a killed supervisor left goes with the next local `Triton()`
    try:
        host = ServerHost(directory)
        supervisor = Supervisor(
            argv,
            count,
            environ=os.environ,
            extra_env=lambda index: {podenv.ENV_SUPERVISOR: str(host.path)},
            stop_timeout_s=podenv.DEFAULT_DRAIN_SECONDS + STOP_SLACK_S,
            before_stop=host.mark_stopping,
            after_telling=host.stop,
            check=host.failure,
        )
        return supervisor.run()
    finally:
        remove_owned(directory)
        os.close(owner)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--processes",
        type=_positive,
        default=1,
        help="how many worker processes run the script; each serves its own instances of every model "
        "(default: 1)",
    )
    parser.add_argument("script", help="the PyTriton script, as `python SCRIPT` would run it")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def run(args: argparse.Namespace) -> int:
    if not Path(args.script).is_file():
        print(f"kubetriton run: {args.script}: no such file", file=sys.stderr)
        return 2
    argv = [sys.executable, "-m", "kubetriton.launch", podenv.LAUNCHER_LOCAL, args.script, *args.args]
    if args.processes == 1:
        os.execv(sys.executable, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if podenv.AttachSettings.from_environ() is not None:
        return supervise_pod(argv, args.processes)
    return supervise_locally(argv, args.processes)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of processes")
    return value
