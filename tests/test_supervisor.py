"""The supervisor's rules, table-tested, and the pod's probes and metrics built from its processes' own."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubetriton import podenv
from kubetriton.health import HealthServer, ProcessesHealth
from kubetriton.server import remove_abandoned
from kubetriton.supervisor import (
    RestartPolicy,
    WorkerProcess,
    _differences,
    process_devices,
    process_environment,
)

from tests.conftest import consecutive_free_ports

POLICY = RestartPolicy(quick_exit_s=60, give_up_after=5, backoff_s=(0, 1, 2, 4, 8))


@pytest.mark.parametrize(
    ("failures_before", "ran_s", "failures", "delay"),
    [
        (0, 3600, 1, 0),  # killed after an hour: back at once
        (0, 5, 1, 0),  # the first quick exit: back at once too
        (1, 5, 2, 1),
        (2, 5, 3, 2),
        (3, 5, 4, 4),
        (4, 5, 5, None),  # the fifth quick exit in a row: give up
        (4, 61, 1, 0),  # ran longer than the window: the count starts afresh
    ],
)
def test_restarts_back_off_and_give_up_on_a_process_that_keeps_exiting(
    failures_before: int, ran_s: float, failures: int, delay: float | None
) -> None:
    assert POLICY.after_exit(failures_before, ran_s) == (failures, delay)


def test_backoff_keeps_its_last_step_beyond_the_table() -> None:
    assert RestartPolicy(give_up_after=9, backoff_s=(0, 3)).after_exit(5, 1) == (6, 3)


@pytest.mark.parametrize(
    ("count", "environ", "devices"),
    [
        (2, {}, [None, None]),
        (2, {"NVIDIA_VISIBLE_DEVICES": "all"}, [None, None]),
        (2, {"NVIDIA_VISIBLE_DEVICES": "void"}, [None, None]),
        (2, {"NVIDIA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}, ["GPU-aaa", "GPU-bbb"]),
        (2, {"NVIDIA_VISIBLE_DEVICES": "MIG-aaa,MIG-bbb"}, ["MIG-aaa", "MIG-bbb"]),
        (2, {"NVIDIA_VISIBLE_DEVICES": "3,5"}, ["0", "1"]),  # the container sees them as 0 and 1
        (3, {"NVIDIA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}, [None, None, None]),  # not one each
        (1, {"NVIDIA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}, [None]),
        (2, {"CUDA_VISIBLE_DEVICES": "1,0", "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, ["1", "0"]),
        (2, {"CUDA_VISIBLE_DEVICES": ""}, [None, None]),
    ],
)
def test_each_process_sees_its_own_gpu_where_there_is_one_each(
    count: int, environ: dict[str, str], devices: list[str | None]
) -> None:
    assert process_devices(count, environ) == devices


def test_a_process_learns_its_place_and_its_gpu() -> None:
    env = process_environment(1, 2, {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "HOME": "/h"}, {"EXTRA": "x"})
    assert podenv.ProcessGroup.from_environ(env) == podenv.ProcessGroup(index=1, count=2)
    assert (env["CUDA_VISIBLE_DEVICES"], env["HOME"], env["EXTRA"], env["PYTHONUNBUFFERED"]) == (
        "GPU-b",
        "/h",
        "x",
        "1",
    )
    assert "CUDA_VISIBLE_DEVICES" not in process_environment(0, 3, {"NVIDIA_VISIBLE_DEVICES": "all"}, {})


@pytest.mark.parametrize(
    "environ",
    [
        {podenv.ENV_PROCESS_COUNT: "2", podenv.ENV_PROCESS_INDEX: "2"},
        {podenv.ENV_PROCESS_COUNT: "0"},
        {podenv.ENV_PROCESS_COUNT: "two"},
        {podenv.ENV_PROCESS_INDEX: "-1"},
    ],
)
def test_a_place_outside_the_group_is_refused(environ: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="no place in a group of worker processes"):
        podenv.ProcessGroup.from_environ(environ)


def test_alone_a_process_is_its_group_and_loads_the_models() -> None:
    group = podenv.ProcessGroup.from_environ({})
    assert (group, group.loads_models, group.first_instance(3)) == (podenv.ProcessGroup(0, 1), True, 0)
    second = podenv.ProcessGroup.from_environ({podenv.ENV_PROCESS_COUNT: "4", podenv.ENV_PROCESS_INDEX: "2"})
    assert (second.loads_models, second.first_instance(3)) == (False, 6)


def test_differences_between_asks_for_the_server_name_the_settings() -> None:
    first = {"process": 0, "config": {"http_port": 1, "log_verbose": None}, "workspace": None}
    assert _differences(first, {**first, "process": 3}) == []
    second = {"process": 1, "config": {"http_port": 2, "log_verbose": 1}, "workspace": "/w"}
    assert _differences(first, second) == ["config.http_port", "config.log_verbose", "workspace"]


class _Worker:
    """What the health endpoint reads of a model's worker."""

    def __init__(self, attached: bool) -> None:
        self.attached = attached
        self.in_flight = 1
        self.instances: list = []
        self.spec = type("Spec", (), {"name": "Echo"})()


def _process_endpoint(port: int, index: int, worker: _Worker) -> HealthServer:
    """Worker process `index`'s own probe endpoint, on loopback, for a pod whose health port is `port`."""
    return HealthServer(
        podenv.process_health_port(port, index),
        model_ready=lambda name: True,
        declared_models=["Echo"],
        workers=lambda: {"Echo": worker},
        draining=lambda: False,
        address="127.0.0.1",
    )


@pytest.fixture
def processes() -> Iterator[tuple[int, list[_Worker], ProcessesHealth]]:
    """Two processes' real probe endpoints on loopback, and the pod's endpoint in front of them."""
    port = consecutive_free_ports(3)
    workers = [_Worker(attached=True), _Worker(attached=False)]
    servers = [_process_endpoint(port, index, worker) for index, worker in enumerate(workers)]
    pod = ProcessesHealth(port, processes=2, draining=lambda: False, restarts=lambda: [0, 3])
    for server in [*servers, pod]:
        server.start()
    try:
        yield port, workers, pod
    finally:
        for server in [*servers, pod]:
            server.stop()


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_pod_is_ready_when_every_process_is(processes) -> None:
    port, workers, _ = processes
    assert _get(port, "/readyz") == (503, "process 1: Echo: proxy instances not attached\n")
    workers[1].attached = True
    assert _get(port, "/readyz") == (200, "ok\n")


def test_a_process_that_does_not_answer_keeps_the_pod_unready() -> None:
    port = consecutive_free_ports(2)
    pod = ProcessesHealth(port, processes=1, draining=lambda: False, restarts=lambda: [0])
    pod.start()
    try:
        assert _get(port, "/readyz") == (503, "process 0: not answering\n")
        assert _get(port, "/livez") == (503, "process 0: not started yet\n")
    finally:
        pod.stop()


class _Instance:
    def __init__(self) -> None:
        self.instance, self.alive = 0, True

    def is_alive(self) -> bool:
        return self.alive


def test_the_pod_is_live_once_every_process_answered_and_while_none_lost_its_instances() -> None:
    port = consecutive_free_ports(3)
    worker = _Worker(attached=True)
    worker.instances = [_Instance()]
    pod = ProcessesHealth(port, processes=2, draining=lambda: False, restarts=lambda: [0, 0])
    first, second = _process_endpoint(port, 0, worker), _process_endpoint(port, 1, worker)
    pod.start()
    first.start()
    try:
        assert _get(port, "/livez") == (503, "process 1: not started yet\n"), "its script is still loading"
        assert pod.not_started() == [1]
        second.start()
        assert _get(port, "/livez") == (200, "ok\n")
        assert pod.not_started() == []
        second.stop()
        assert _get(port, "/livez") == (200, "ok\n"), "a process being restarted keeps the pod live"
        assert pod.not_started() == [1]
        worker.instances[0].alive = False
        assert _get(port, "/livez") == (503, "process 0: instance threads stopped: Echo/0\n")
    finally:
        for server in (first, pod):
            server.stop()


def test_a_restarted_process_that_does_not_answer_within_startup_seconds_ends_the_pods_liveness() -> None:
    port, now = consecutive_free_ports(2), [100.0]
    pod = ProcessesHealth(
        port,
        processes=1,
        draining=lambda: False,
        restarts=lambda: [1],
        restart_bound_s=60,
        clock=lambda: now[0],
    )
    pod.start()
    try:
        for _ in range(2):
            process = _process_endpoint(port, 0, _Worker(attached=True))
            process.start()
            assert _get(port, "/livez") == (200, "ok\n")
            process.stop()  # killed, and restarted: the first time it comes back, the second it hangs
            assert _get(port, "/livez") == (200, "ok\n")
            now[0] += 60
            assert _get(port, "/livez") == (200, "ok\n"), "within startupSeconds it may still come back"
        now[0] += 1
        assert _get(port, "/livez") == (
            503,
            "process 0: not back 61 s after it stopped answering (startupSeconds: 60)\n",
        ), "the bound counts from the last time it stopped answering"
    finally:
        pod.stop()


def test_the_pods_metrics_are_each_processs_with_its_index(processes) -> None:
    port, _, _ = processes
    status, text = _get(port, "/metrics")
    assert status == 200
    lines = text.splitlines()
    assert 'kubetriton_attached{model="Echo",process="0"} 1.0' in lines
    assert 'kubetriton_attached{model="Echo",process="1"} 0.0' in lines
    assert 'kubetriton_process_restarts_total{process="1"} 3.0' in lines
    assert sum(line.startswith("# TYPE kubetriton_attached ") for line in lines) == 1
    assert any(line.startswith('process_start_time_seconds{process="1"}') for line in lines)


def test_an_exit_is_described_by_the_lines_of_its_own_run() -> None:
    process = WorkerProcess(
        1, [sys.executable, "-c", "import sys; sys.stderr.write('once\\n'); sys.exit(3)"], {}
    )
    for _ in range(3):  # as restarts do
        process.start()
        assert process.process is not None and process.process.wait(30) == 3
        described = process.describe_exit(3)
    assert described == "worker process 1 exited with code 3; its last lines: once"


@pytest.mark.parametrize(
    ("given", "said"), [("abc", "'abc' is not a number of processes"), ("0", "0 is not a positive")]
)
def test_a_process_count_that_is_no_count_is_refused_in_words(given: str, said: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "run", "--processes", given, "serve.py"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and f"argument --processes: {said}" in result.stderr, result.stderr


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_configuration_error_ends_the_run_at_once_with_its_own_status(tmp_path, processes: str) -> None:
    script = tmp_path / "serve.py"
    script.write_text("from pytriton.triton import Triton\n\nTriton()\n")
    result = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "run", "--processes", processes, str(script)],
        env={**os.environ, podenv.ENV_DEBUG: "maybe"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    refusal = "PyTritonValidationError: KUBETRITON_DEBUG='maybe': use 1 (or true, yes, on) or 0"
    assert result.returncode == podenv.CONFIGURATION_ERROR_EXIT_CODE, result.stderr
    if processes == "1":
        assert result.stderr == f"{refusal}\n"
    else:
        assert "starting it again" not in result.stderr, "no restart mends a configuration error"
        assert "Traceback" not in result.stderr
        assert result.stderr.splitlines()[-1].endswith(f"exited with code 65; its last lines: {refusal}")


def test_what_a_killed_supervisor_left_goes_with_the_next_local_server(tmp_path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(
        f"import os, time\n\nprint(os.environ['{podenv.ENV_SUPERVISOR}'], flush=True)\ntime.sleep(60)\n"
    )
    command = [sys.executable, "-m", "kubetriton.cli", "run", "--processes", "2", str(script)]
    supervisor = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert supervisor.stdout is not None
        directory = Path(supervisor.stdout.readline().split()[-1]).parent  # "[0] <directory>/server.sock"
        remove_abandoned(directory.parent)  # as each local Triton() does as it starts
        assert directory.is_dir(), "a running supervisor's directory is its own"
    finally:
        supervisor.kill()
        supervisor.wait()
    remove_abandoned(directory.parent)
    assert not directory.exists()
