"""A model served by two worker processes per pod (`worker.processes: 2`): once from the worker image with a
command of the user's, once through `kubetriton deploy --processes 2` into a user's python:3.13 image with
NumPy 2 and nothing of kubetriton. The pod becomes Ready, both processes answer (the callable returns its
process's index and pid), and one process killed with SIGKILL under ModelClient load over HTTP and gRPC
costs only the requests in flight on it: the other process answers throughout, the killed one answers again
within 5 s, and the pod is not restarted.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import INSTANCE_LABEL, Cluster, Settings, kubectl, port_forward, pytriton_model, wait_for
from e2e.test_deploy import USER_IMAGES, deploy
from tests.test_pod_processes import SCRIPT
from tests.test_processes import ClosedLoop, check_failures_of_a_kill

KILL = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/environ", "rb") as env:
            if b"\\0KUBETRITON_PROCESS_INDEX=1\\0" in b"\\0" + env.read():
                os.kill(int(pid), signal.SIGKILL)
                print(pid)
    except OSError:
        pass
"""
USER_IMAGE_313 = next((image for image in USER_IMAGES if "python3.13" in image), None)
BACK_WITHIN_S = 5.0


def _from_the_worker_image(cluster: Cluster, settings: Settings, name: str, script: Path) -> None:
    namespace = settings.models_namespace
    cluster.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-script"}, "data": {
            "serve.py": script.read_text()}},
        namespace,
    )  # fmt: skip
    cluster.apply(
        pytriton_model(
            name,
            {
                "worker": {
                    "image": settings.worker_image,
                    "script": {"configMap": f"{name}-script"},
                    "command": ["python", "/kubetriton/script/serve.py"],
                    "processes": 2,
                },
                "models": ["Which"],
            },
        ),
        namespace,
    )
    cluster.wait_until_serving(name, namespace, 1, 600)


def _through_deploy(cluster: Cluster, settings: Settings, name: str, script: Path) -> None:
    namespace = settings.models_namespace
    result, took = deploy(
        script, "--image", USER_IMAGE_313, "--processes", "2", "--name", name, "-n", namespace
    )
    assert result.returncode == 0, result.stderr
    print(f"Ready {took:.1f} s after `kubetriton deploy --processes 2`")


@contextlib.contextmanager
def _model(cluster: Cluster, settings: Settings, how: str, tmp_path: Path) -> Iterator[str]:
    name = f"processes-{how}"
    script = tmp_path / "serve.py"
    script.write_text(SCRIPT)
    try:
        {"worker-image": _from_the_worker_image, "deploy": _through_deploy}[how](
            cluster, settings, name, script
        )
        yield name
    finally:
        subprocess.run(
            [sys.executable, "-m", "kubetriton.cli", "delete", name, "-n", settings.models_namespace],
            capture_output=True,
        )
        with contextlib.suppress(AssertionError):
            kubectl(
                "delete", "configmap", f"{name}-script", "-n", settings.models_namespace, "--ignore-not-found"
            )


def _worker_restarts(cluster: Cluster, name: str, namespace: str) -> dict[str, int]:
    return {
        pod_name: status.restart_count
        for pod_name, pod in cluster.model_pods(name, namespace).items()
        for status in pod.status.container_statuses or []
        if status.name == "worker"
    }


@pytest.mark.parametrize(
    "how",
    [
        "worker-image",
        pytest.param(
            "deploy",
            marks=pytest.mark.skipif(
                USER_IMAGE_313 is None, reason="name a python3.13 user image in KUBETRITON_E2E_USER_IMAGES"
            ),
        ),
    ],
)
def test_two_processes_serve_and_a_killed_one_comes_back_alone(
    how: str, release: dict[str, Any], cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    namespace = settings.models_namespace
    with (
        _model(cluster, settings, how, tmp_path) as name,
        port_forward(namespace, f"service/{name}", 8000) as http_port,
        port_forward(namespace, f"service/{name}", 8001) as grpc_port,
    ):
        (pod,) = cluster.model_pods(name, namespace)
        restarts = _worker_restarts(cluster, name, namespace)
        loads = [
            ClosedLoop(f"http://127.0.0.1:{http_port}", 3),
            ClosedLoop(f"grpc://127.0.0.1:{grpc_port}", 3),
        ]
        wait_for(
            lambda: {index for load in loads for _, index, _ in load.answers} == {0, 1},
            60,
            "both processes to answer",
            interval_s=0.2,
        )
        kill_sent = time.monotonic()
        killed = kubectl("exec", "-n", namespace, pod, "-c", "worker", "--", "python3", "-c", KILL).split()
        killed_at = time.monotonic()
        assert len(killed) == 1, f"one process has index 1: {killed}"
        wait_for(
            lambda: any(
                index == 1 and pid != int(killed[0]) for load in loads for _, index, pid in load.answers
            ),
            60,
            "the killed process to answer again",
            interval_s=0.1,
        )
        time.sleep(2)
        results = [load.stop() for load in loads]
        after = _worker_restarts(cluster, name, namespace)
        log = kubectl("logs", "-n", namespace, "-l", f"{INSTANCE_LABEL}={name}", "-c", "worker", "--tail=20")
    answers = sorted(answer for load_answers, _ in results for answer in load_answers)
    failures = [failure for _, load_failures in results for failure in load_failures]
    back = min(at for at, index, pid in answers if index == 1 and pid != int(killed[0])) - killed_at
    first_during = [
        at - killed_at for at, index, _ in answers if index == 0 and killed_at <= at <= killed_at + back
    ]
    print(
        f"{how}: {len(answers)} answers, {len(failures)} failed; the killed process answered again "
        f"{back:.2f} s after SIGKILL; process 0 answered {len(first_during)} times meanwhile\n{log}"
    )
    assert back <= BACK_WITHIN_S
    assert first_during, "the other process keeps answering while the killed one restarts"
    check_failures_of_a_kill(failures, kill_sent, killed_at + back)
    assert after == restarts, "the pod's worker container is not restarted"
