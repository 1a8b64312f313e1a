"""`kubetriton deploy` of a script into users' own images, which have Python and NumPy and nothing of
kubetriton: the model becomes Ready and answers through its Service over HTTP and gRPC, a batched model
and a streaming one; the callable sees the image's NumPy; an edited script rolls the pods under a load
that loses no request; an image without NumPy or without Python ends in a status that says so, and the
command exits non-zero with that message; model names as bind() takes them (with '_', '.', 128
characters) serve in a pod, and a deploy to zero replicas returns once every pod is stopping.

The users' images are named by KUBETRITON_E2E_USER_IMAGES (comma-separated; docs/e2e.md builds them from
e2e/user-images/); without it those tests are skipped. The failing images are ones every cluster of the kit
has: the project's `python:3.12-slim` stand-in (no NumPy) and the pause image (no Python).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pytriton.client import DecoupledModelClient, ModelClient

from e2e import loadgen
from e2e.cluster import INSTANCE_LABEL, Cluster, Settings, kubectl, port_forward, wait_for

USER_IMAGES = [image for image in os.environ.get("KUBETRITON_E2E_USER_IMAGES", "").split(",") if image]
NO_NUMPY_IMAGE = "docker.io/library/python:3.12-slim"
NO_PYTHON_IMAGE = "localhost/ktcluster/pause:3.10"
PLAIN_HTTP = "tritonclient http keep-alive"
LOAD_POD = "kubetriton-e2e-deploy-load"
LOAD_LIMIT_S = 3600

SERVE = """
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

VERSION = "{version}"


@batch
def identity(data):
    return {{"data": data}}


@batch
def about(x):
    text = np.array([f"{{VERSION}} numpy {{np.__version__}}".encode()], dtype=object)
    return {{"about": np.tile(text, (len(x), 1))}}


def stream(requests):
    for step in range(3):
        time.sleep(0.1)
        yield [{{"y": request["x"] + step}} for request in requests]


with Triton() as triton:
    data = [Tensor(name="data", dtype=np.float32, shape=(-1,))]
    x, y = [Tensor(name="x", dtype=np.float32, shape=(1,))], [Tensor(name="y", dtype=np.float32, shape=(1,))]
    batched = ModelConfig(max_batch_size=8)
    triton.bind(model_name="Identity", infer_func=identity, inputs=data, outputs=data, config=batched)
    triton.bind(model_name="About", infer_func=about, inputs=x,
                outputs=[Tensor(name="about", dtype=bytes, shape=(1,))], config=batched)
    triton.bind(model_name="Stream", infer_func=stream, inputs=x, outputs=y,
                config=ModelConfig(batching=False, decoupled=True))
    triton.serve()
"""


def deploy(
    script: Path, *args: str, timeout_s: float = 600
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`kubetriton deploy`, as a user runs it; its result and how long it took."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "deploy", str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    print(f"$ kubetriton deploy {script.name} {' '.join(args)}\n{result.stdout}{result.stderr}")
    return result, time.monotonic() - started


def provisioning_seconds(cluster: Cluster, name: str, namespace: str) -> list[float]:
    """How long each pod's init step ran (its container's start to finish, as the kubelet recorded them)."""
    seconds = []
    for pod in cluster.model_pods(name, namespace).values():
        for status in pod.status.init_container_statuses or []:
            finished = status.state.terminated
            if status.name == "bootstrap" and finished is not None:
                seconds.append((finished.finished_at - finished.started_at).total_seconds())
    return seconds


def about(url: str) -> str:
    with ModelClient(url, "About", init_timeout_s=60) as client:
        return client.infer_batch(x=np.ones((1, 1), np.float32))["about"][0][0].decode()


def _latest(log: str) -> dict[str, Any]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith('{"at"')]
    return lines[-1]["clients"] if lines else {}


@pytest.mark.skipif(not USER_IMAGES, reason="set KUBETRITON_E2E_USER_IMAGES to users' images (docs/e2e.md)")
@pytest.mark.parametrize("image", USER_IMAGES)
def test_deploy_into_a_users_image_serves_and_rolls_an_edited_script(
    image: str, release: dict[str, Any], cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    namespace = settings.models_namespace
    name = "user-" + image.rsplit("/", 1)[-1].split(":")[0].replace(".", "")
    script = tmp_path / "serve.py"
    script.write_text(SERVE.format(version="v1"))
    result, took = deploy(script, "--image", image, "--name", name, "-n", namespace, "--timeout", "600s")
    try:
        assert result.returncode == 0, result.stderr
        assert f"http://{name}.{namespace}.svc" in result.stdout and "ModelClient(" in result.stdout
        provisioning = provisioning_seconds(cluster, name, namespace)
        said = kubectl(
            "logs", "-n", namespace, "-l", f"{INSTANCE_LABEL}={name}", "-c", "bootstrap", "--tail=1"
        )
        own_seconds = float(said.rsplit("(", 1)[1].split(" s)")[0])
        print(f"{image}: Ready {took:.1f} s after `kubetriton deploy`; init {provisioning} s; {said.strip()}")
        assert own_seconds < 5 and all(seconds <= 5 for seconds in provisioning), said
        for protocol, port in (("http", 8000), ("grpc", 8001)):
            with port_forward(namespace, f"service/{name}", port) as local:
                url = f"{protocol}://127.0.0.1:{local}"
                with ModelClient(url, "Identity", init_timeout_s=60) as client:
                    data = np.arange(4, dtype=np.float32).reshape(1, 4)
                    assert client.infer_batch(data=data)["data"].tolist() == data.tolist()
                seen = about(url)
                print(f"{image} over {protocol}: {seen}")
                assert seen.startswith("v1 numpy ")
                numpy_major = int(seen.removeprefix("v1 numpy ").split(".")[0])
                assert numpy_major == (1 if "numpy1" in image else 2), "the image's NumPy must be used"
        with port_forward(namespace, f"service/{name}", 8001) as local:
            with DecoupledModelClient(f"grpc://127.0.0.1:{local}", "Stream", init_timeout_s=60) as client:
                answers = [float(item["y"][0]) for item in client.infer_sample(np.ones(1, np.float32))]
            assert answers == [1.0, 2.0, 3.0]

        service = f"{name}.{namespace}.svc"
        cluster.run_pod(
            LOAD_POD,
            namespace,
            settings.worker_image,
            ["python", "-c", Path(loadgen.__file__).read_text(), f"http://{service}:8000",
             f"grpc://{service}:8001", "Identity", "Stream", str(LOAD_LIMIT_S)],
        )  # fmt: skip
        wait_for(lambda: '"at"' in cluster.pod_log(LOAD_POD, namespace), 600, "the load to start")
        time.sleep(3)
        before = set(cluster.model_pods(name, namespace))
        script.write_text(SERVE.format(version="v2"))
        result, took = deploy(script, "-n", namespace, "--name", name, "--timeout", "600s")
        assert result.returncode == 0, result.stderr
        wait_for(lambda: cluster.settled(name, namespace, before, 1), 600, "the old pod to be gone")
        time.sleep(3)
        outcome = _latest(cluster.pod_log(LOAD_POD, namespace))
        restarts = cluster.restarts(name, namespace)
        with port_forward(namespace, f"service/{name}", 8000) as local:
            assert about(f"http://127.0.0.1:{local}").startswith("v2 numpy ")
    finally:
        cluster.delete_pod(LOAD_POD, namespace)
        subprocess.run(
            [sys.executable, "-m", "kubetriton.cli", "delete", name, "-n", namespace], capture_output=True
        )
    print(f"{image}: the edited script rolled in {took:.1f} s under load: {json.dumps(outcome)}")
    print(restarts or "no container of the model's pods restarted")
    for client_name, counts in outcome.items():
        assert counts["ok"] > 0, f"{client_name} got no answer"
        if client_name == PLAIN_HTTP:  # as in test_rollout: one request per stopped pod at most
            assert counts["failed"] <= 1, counts
        else:
            assert counts["failed"] == 0, f"{client_name}: {counts}"
    wait_for(lambda: not cluster.children(name, namespace), 300, f"{name}'s children to be deleted")
    scripts = kubectl(
        "get", "configmaps", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}", "-o", "name"
    )
    assert not scripts.strip(), f"the model's script ConfigMaps must go with it: {scripts}"


@pytest.mark.parametrize(
    ("image", "reason"),
    [
        (NO_NUMPY_IMAGE, "The worker image cannot run kubetriton: its Python 3.12 has no NumPy"),
        (NO_PYTHON_IMAGE, "The worker image cannot run kubetriton: it has no python3 on its PATH"),
    ],
    ids=["no NumPy", "no Python"],
)
def test_an_image_that_cannot_work_is_named_in_the_status(
    image: str, reason: str, release: dict[str, Any], cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    namespace = settings.models_namespace
    name = "unsupported-" + ("numpy" if image == NO_NUMPY_IMAGE else "python")
    script = tmp_path / "serve.py"
    script.write_text(SERVE.format(version="v1"))
    try:
        result, took = deploy(script, "--image", image, "--name", name, "-n", namespace, "--timeout", "180s")
        assert result.returncode != 0
        assert reason in result.stderr + result.stdout
        model = cluster.model(name, namespace)
        degraded = next(c for c in model["status"]["conditions"] if c["type"] == "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "WorkerImageUnsupported"
        assert reason in degraded["message"] and "\n" not in degraded["message"]
        print(f"{image}: deploy exited {result.returncode} after {took:.1f} s: {degraded['message']}")
    finally:
        subprocess.run(
            [sys.executable, "-m", "kubetriton.cli", "delete", name, "-n", namespace], capture_output=True
        )


NAMED = """
import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def double(x):
    return {{"y": x * 2}}


x, y = [Tensor(name="x", dtype=np.float32, shape=(1,))], [Tensor(name="y", dtype=np.float32, shape=(1,))]
batched = ModelConfig(max_batch_size=8)
with Triton() as triton:
    for name in {names!r}:
        triton.bind(model_name=name, infer_func=double, inputs=x, outputs=y, config=batched)
    triton.serve()
"""
BIND_NAMES = ["add_sub", "resnet50.onnx", "_private", "M" * 128]
"""Names Triton and bind() take that are not DNS labels; the longest would not fit a socket's path whole."""


def test_models_named_as_bind_takes_them_serve_and_scale_to_zero(
    release: dict[str, Any], cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    namespace, name = settings.models_namespace, "bind-names"
    script = tmp_path / "serve.py"
    script.write_text(NAMED.format(names=BIND_NAMES))
    try:
        models = [flag for model_name in BIND_NAMES for flag in ("--model", model_name)]  # bound in a loop
        result, took = deploy(
            script,
            "--image",
            settings.worker_image,
            *models,
            "--name",
            name,
            "-n",
            namespace,
            "--timeout",
            "600s",
        )
        assert result.returncode == 0, result.stderr
        for protocol, port in (("http", 8000), ("grpc", 8001)):
            with port_forward(namespace, f"service/{name}", port) as local:
                url = f"{protocol}://127.0.0.1:{local}"
                for number, model_name in enumerate(BIND_NAMES):
                    with ModelClient(url, model_name, init_timeout_s=60) as client:
                        answer = client.infer_sample(np.array([number], np.float32))["y"].tolist()
                    assert answer == [2.0 * number], (protocol, model_name)
        print(f"{BIND_NAMES[:2]} and a {len(BIND_NAMES[2])}-character name served over HTTP and gRPC")

        result, took = deploy(
            script, *models, "-n", namespace, "--name", name, "--replicas", "0", "--timeout", "300s"
        )
        assert result.returncode == 0, result.stderr
        assert f"{name} is scaled to zero: the model has no replicas" in result.stdout
        pods = cluster.model_pods(name, namespace).values()
        assert all(pod.metadata.deletion_timestamp for pod in pods), "every pod is stopping"
        print(f"deploy --replicas 0 returned in {took:.1f} s")
    finally:
        subprocess.run(
            [sys.executable, "-m", "kubetriton.cli", "delete", name, "-n", namespace], capture_output=True
        )
