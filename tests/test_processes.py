"""Several worker processes of one script on this machine (`kubetriton run --processes N`), against a real
tritonserver: every process serves its share of the model's instances, a killed one comes back alone while
the other serves on, one that keeps dying ends the supervision with its error, and a stop leaves nothing.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from kubetriton import launch
from pytriton.client import ModelClient

from tests.conftest import free_ports, shm_entries

SCRIPT = """
import os
import sys

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

INDEX = int(os.environ["KUBETRITON_PROCESS_INDEX"])
http, grpc, metrics = (int(port) for port in sys.argv[1:4])
if INDEX == 1 and "--second-on-other-ports" in sys.argv:
    http += 1


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
    print(f"process {INDEX} serves", flush=True)
    triton.serve()
"""


class Supervised:
    """`kubetriton run --processes 2` of the script, its output in a file."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.http, self.grpc, self.metrics = free_ports(3)
        script = directory / "serve.py"
        script.write_text(SCRIPT)
        self.log_path = directory / "supervisor.log"
        command = [sys.executable, "-m", "kubetriton.cli", "run", "--processes", "2", str(script)]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [*command, str(self.http), str(self.grpc), str(self.metrics), *extra],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

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


def test_a_process_that_keeps_dying_ends_the_supervision_with_its_error(tmp_path: Path) -> None:
    termination_log = Path(launch.TERMINATION_LOG)
    before = termination_log.stat().st_mtime_ns if termination_log.exists() else None
    running = Supervised(tmp_path, "--second-on-other-ports")
    try:
        code = running.process.wait(180)
    finally:
        running.stop()
    log = running.log()
    assert code == 1, log
    after = termination_log.stat().st_mtime_ns if termination_log.exists() else None
    assert after == before, "locally the error goes to the output, not to a container's termination message"
    assert "worker process 1 exited with code 1" in log
    assert "(5 times in a row, each within 60 s of its start)" in log
    assert "configures Triton differently from worker process 0 (config.http_port)" in log
