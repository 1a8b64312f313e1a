"""Several worker processes of one script on this machine (`kubetriton run --processes N`), against a real
tritonserver: every process serves its share of the model's instances, a killed one comes back alone while
the other serves on, one that keeps dying ends the supervision with its error, a configuration error ends it
at once, and a stop leaves nothing, even a Ctrl-C while the models load.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from kubetriton import launch, podenv
from pytriton.client import ModelClient

from tests.conftest import free_ports, shm_entries

SCRIPT = """
import itertools
import os
import sys

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

INDEX = int(os.environ.get("KUBETRITON_PROCESS_INDEX", "0"))
http, grpc, metrics = (int(port) for port in sys.argv[1:4])
if INDEX == 1 and "--second-on-other-ports" in sys.argv:
    http += 1
if INDEX == 1 and "--second-fails" in sys.argv:
    raise RuntimeError("process 1 found no weights")


@batch
def which(x):
    return {"process": np.tile(np.array([[INDEX, os.getpid()]], np.int64), (x.shape[0], 1))}


with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
    triton.bind(
        "Which",
        [which, which],
        [Tensor(name="x", shape=(1,), dtype=np.float32)],
        [Tensor(name="process", shape=(2,), dtype=np.int64)],
        config=ModelConfig(max_batch_size=8),
    )
    if INDEX == 0 and "--first-keeps-binding" in sys.argv:  # a script that loads one model after another
        for spare in itertools.count():
            triton.bind(
                f"Spare{spare}",
                which,
                [Tensor(name="x", shape=(1,), dtype=np.float32)],
                [Tensor(name="process", shape=(2,), dtype=np.int64)],
                config=ModelConfig(max_batch_size=8),
            )
            print(f"process {INDEX} bound Spare{spare}", flush=True)
    print(f"process {INDEX} serves", flush=True)
    triton.serve()
"""


class Supervised:
    """`kubetriton run --processes N` of the script (2 unless told), its output in a file. It runs as a
    command typed in a terminal does: in a process group of its own, with SIGINT at its default (a test
    runner started in the background hands its children SIGINT ignored), so that `interrupt()` is Ctrl-C."""

    def __init__(
        self, directory: Path, *extra: str, processes: int = 2, env: Mapping[str, str] | None = None
    ) -> None:
        self.http, self.grpc, self.metrics = free_ports(3)
        script = directory / "serve.py"
        script.write_text(SCRIPT)
        self.log_path = directory / "supervisor.log"
        command = [sys.executable, "-m", "kubetriton.cli", "run", "--processes", str(processes), str(script)]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [*command, str(self.http), str(self.grpc), str(self.metrics), *extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, line: str, timeout_s: float = 180) -> None:
        """Wait until the output has `line`; fail with the output if the command ends or the time is up."""
        deadline = time.monotonic() + timeout_s
        while line not in self.log():
            ended = self.process.poll() is not None or time.monotonic() > deadline
            assert not ended, f"no {line!r} in:\n{self.log()}"
            time.sleep(0.1)

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the command's process group."""
        os.killpg(self.process.pid, signal.SIGINT)

    def ask(self, url: str) -> tuple[int, int]:
        """Which process (index, pid) answers one request."""
        with ModelClient(url, "Which", init_timeout_s=120, inference_timeout_s=60) as client:
            index, pid = client.infer_batch(x=np.ones((1, 1), np.float32))["process"][0]
        return int(index), int(pid)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        return self.process.wait(90)


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    running = Supervised(tmp_path)
    try:
        yield running
    finally:
        code = running.stop()
        assert code == 0, running.log()
        own = f"kubetriton-{running.process.pid}-"  # the server the supervisor hosts is named by its pid
        assert not [entry for entry in shm_entries() if entry.startswith(own)], "a stop leaves nothing"


def _processes_answering(supervised: Supervised, url: str, tries: int = 200) -> dict[int, int]:
    """Each process index that answered, with its pid, within `tries` requests from four clients."""
    seen: dict[int, int] = {}
    with ModelClient(url, "Which", init_timeout_s=120) as client:
        for _ in range(tries):
            index, pid = client.infer_batch(x=np.ones((4, 1), np.float32))["process"][0]
            seen[int(index)] = int(pid)
            if len(seen) == 2:
                break
    return seen


def test_both_processes_serve_over_http_and_grpc(supervised: Supervised) -> None:
    supervised.ask(f"http://127.0.0.1:{supervised.http}")  # waits for the model
    load = ClosedLoop(f"http://127.0.0.1:{supervised.http}", clients=4)
    time.sleep(2)
    answers, failures = load.stop()
    assert failures == []
    assert {index for _, index, _ in answers} == {0, 1}, "Triton spreads the requests over both processes"
    for url in (f"http://127.0.0.1:{supervised.http}", f"grpc://127.0.0.1:{supervised.grpc}"):
        assert supervised.ask(url)[0] in (0, 1)


class ClosedLoop:
    """Closed-loop ModelClients of model Which, each recording when each answer came and from which process
    (index, pid), and when each failure came, from which client, and what it said."""

    def __init__(self, url: str, clients: int) -> None:
        self.answers: list[tuple[float, int, int]] = []
        self.failures: list[tuple[float, str, str]] = []
        self._running = threading.Event()
        self._running.set()
        self._threads = [
            threading.Thread(target=self._loop, args=(url, f"{url} #{index}")) for index in range(clients)
        ]
        for thread in self._threads:
            thread.start()

    def _loop(self, url: str, name: str) -> None:
        with ModelClient(url, "Which", init_timeout_s=120, inference_timeout_s=60) as client:
            while self._running.is_set():
                try:
                    index, pid = client.infer_batch(x=np.ones((1, 1), np.float32))["process"][0]
                    self.answers.append((time.monotonic(), int(index), int(pid)))
                except Exception as error:  # every failure counts, whatever its type
                    self.failures.append((time.monotonic(), name, f"{type(error).__name__}: {error}"))

    def stop(self) -> tuple[list[tuple[float, int, int]], list[tuple[float, str, str]]]:
        self._running.clear()
        for thread in self._threads:
            thread.join(90)
        return self.answers, self.failures


FAILURES_PER_CLIENT = 2
"""What a killed worker process may cost a client: the request it had in flight there, and one it sent
there while the process was dying (the kernel closes its hops one by one, and a proxy instance whose hop
has not closed yet still sends on it)."""


def check_failures_of_a_kill(
    failures: Sequence[tuple[float, str, str]], killed_at: float, back_at: float
) -> None:
    """Requests failed only while the killed process was away, each because its worker went away, and at
    most FAILURES_PER_CLIENT of each client's."""
    other = [failure for failure in failures if "went away while the request was in flight" not in failure[2]]
    assert not other, f"failures other than a worker going away mid-request, in full: {other}"
    assert all(killed_at <= at < back_at for at, _, _ in failures), "none failed once it was back"
    per_client = collections.Counter(client for _, client, _ in failures)
    assert max(per_client.values(), default=0) <= FAILURES_PER_CLIENT, per_client


def test_a_killed_process_comes_back_alone_while_the_other_serves(supervised: Supervised) -> None:
    http, grpc = f"http://127.0.0.1:{supervised.http}", f"grpc://127.0.0.1:{supervised.grpc}"
    victim = _processes_answering(supervised, http)[1]
    loads = [ClosedLoop(http, clients=3), ClosedLoop(grpc, clients=3)]
    time.sleep(1)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    deadline = killed_at + 60
    while time.monotonic() < deadline and not any(
        index == 1 and pid != victim for load in loads for _, index, pid in load.answers
    ):
        time.sleep(0.1)
    time.sleep(1)
    results = [load.stop() for load in loads]
    answers = sorted(answer for load_answers, _ in results for answer in load_answers)
    failures = [failure for _, load_failures in results for failure in load_failures]
    back = [at - killed_at for at, index, pid in answers if index == 1 and pid != victim]
    assert back, f"the killed process never answered again:\n{supervised.log()}"
    print(f"the killed process answered again {back[0]:.2f} s after SIGKILL")
    assert back[0] < 15, "a killed process is started again at once"
    check_failures_of_a_kill(failures, killed_at, killed_at + back[0])
    first = [at for at, index, _ in answers if index == 0]
    during = [at for at in first if killed_at <= at <= killed_at + back[0]]
    assert during, "the other process answered while the killed one was away"
    assert supervised.process.poll() is None, "the supervisor itself keeps running"
    assert "worker process 1 was killed by SIGKILL; starting it again in 0 s" in supervised.log()


def test_a_process_stopped_alone_leaves_at_once_and_comes_back(supervised: Supervised) -> None:
    """A process that stops with the others serves on until Triton lets go of it; one stopped alone (here by
    SIGTERM) must not wait for a Triton that goes on serving the others."""
    http = f"http://127.0.0.1:{supervised.http}"
    stopped = _processes_answering(supervised, http)[1]
    os.kill(stopped, signal.SIGTERM)
    supervised.wait_for("worker process 1 exited with code 0; starting it again in 0 s", timeout_s=20)
    deadline = time.monotonic() + 120
    while _processes_answering(supervised, http).get(1, stopped) == stopped:
        assert time.monotonic() < deadline, f"process 1 did not come back:\n{supervised.log()}"


def test_a_process_that_keeps_dying_ends_the_supervision_with_its_error(tmp_path: Path) -> None:
    termination_log = Path(launch.TERMINATION_LOG)
    before = termination_log.stat().st_mtime_ns if termination_log.exists() else None
    running = Supervised(tmp_path, "--second-fails")
    try:
        code = running.process.wait(180)
    finally:
        running.stop()
    log = running.log()
    assert code == 1, log
    after = termination_log.stat().st_mtime_ns if termination_log.exists() else None
    assert after == before, "locally the error goes to the output, not to a container's termination message"
    assert log.count("worker process 1 exited with code 1; its last lines: ") == 5, "tried five times"
    assert "(5 times in a row, each within 60 s of its start)" in log
    assert "RuntimeError: process 1 found no weights" in log


@pytest.mark.parametrize(
    ("extra", "env", "refusal"),
    [
        (
            ["--second-on-other-ports"],
            {},
            "worker process 1 exited with code 65; its last lines: PyTritonValidationError: worker process 1 "
            "configures Triton differently from worker process 0 (config.http_port)",
        ),
        (
            [],
            {podenv.ENV_ARENA_BYTES: "lots"},
            "worker process 0 exited with code 65; its last lines: PyTritonValidationError: "
            "KUBETRITON_ARENA_BYTES='lots' is not a positive whole number of bytes",
        ),
    ],
    ids=["a TritonConfig that differs between processes", "an arena size that is no size"],
)
def test_a_configuration_error_ends_the_supervision_at_once(
    tmp_path: Path, extra: list[str], env: dict[str, str], refusal: str
) -> None:
    running = Supervised(tmp_path, *extra, env=env)
    try:
        code = running.process.wait(180)
    finally:
        running.stop()
    log = running.log()
    assert code == podenv.CONFIGURATION_ERROR_EXIT_CODE == 65, log
    assert "starting it again" not in log, f"no restart mends a configuration error:\n{log}"
    assert refusal in log.splitlines()[-1], log
    assert "Traceback" not in log, log


def _descendants(pid: int) -> set[int]:
    """The processes that `pid` started, and theirs, down to the last (tritonserver is started by a thread,
    whose children are its task's)."""
    found: set[int] = set()
    parents = [pid]
    while parents:
        parent = parents.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                for child in map(int, children.read_text().split()):
                    if child not in found:
                        found.add(child)
                        parents.append(child)
    return found


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("processes", [1, 2])
def test_ctrl_c_while_the_models_load_stops_everything_quietly(tmp_path: Path, processes: int) -> None:
    running = Supervised(tmp_path, "--first-keeps-binding", processes=processes)
    try:
        running.wait_for("process 0 bound Spare0")  # and it goes on loading Spare1, Spare2...
        started = _descendants(running.process.pid)
        interrupted_at = len(running.log())
        running.interrupt()
        code = running.process.wait(120)
    finally:
        running.stop()
    log = running.log()
    said = [line for line in log[interrupted_at:].splitlines() if "bound Spare" not in line]
    assert code == 0, log
    assert len(said) <= 1 and "Traceback" not in log, f"at most one calm line:\n{log}"
    deadline = time.monotonic() + 30
    while any(map(_running, started)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in started if _running(pid)], f"processes left behind: {started}"
    own = f"kubetriton-{running.process.pid}-"  # the local server is named by the command's pid
    assert not [entry for entry in shm_entries() if entry.startswith(own)], "a Ctrl-C leaves nothing"
