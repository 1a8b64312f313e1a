"""Pods of a model stop under load without a failed request.

A Pod in the cluster (`e2e/loadgen.py`, run by the worker image) queries a two-model worker through its
Service without pause, with four kinds of clients at once. Meanwhile the model's pods are stopped in every
way a user stops them: a rolling update of two replicas (the worker image changes when
KUBETRITON_E2E_IMAGE_IDENTITY_NEXT names a second image, otherwise an environment variable), `kubectl delete
pod` of one of two, scaling from two to one, and a rolling update of one replica. Each step waits until
the stopped pods are gone. The model's spec uses the documented defaults (drain budget, preStop).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from e2e import loadgen
from e2e.cluster import Cluster, Settings, example_image, kubectl, pytriton_model, wait_for

NAME = "zero-downtime"
LOAD_POD = "kubetriton-e2e-load"
LOAD_LIMIT_S = 3600
"""The load runs until the test deletes its pod; this only bounds it should the test be killed."""
MODEL, STREAM_MODEL = "Identity", "Stream"
PLAIN_HTTP = "tritonclient http keep-alive"
SERVE = f"""
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def identity(data):
    return {{"data": data}}


def stream(requests):
    for step in range(3):
        time.sleep(0.1)
        yield [{{"y": request["x"] + step}} for request in requests]


with Triton() as triton:
    data = [Tensor(name="data", dtype=np.float32, shape=(-1,))]
    triton.bind("{MODEL}", identity, data, data, config=ModelConfig(max_batch_size=8))
    triton.bind("{STREAM_MODEL}", stream, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))],
                config=ModelConfig(batching=False, decoupled=True))
    triton.serve()
"""


def _model(image: str, replicas: int, generation: int) -> dict[str, Any]:
    return pytriton_model(
        NAME,
        {
            "worker": {
                "image": image,
                "command": ["python", "-c", SERVE],
                "env": [{"name": "ROLLOUT", "value": str(generation)}],
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
            },
            "models": [MODEL, STREAM_MODEL],
            "replicas": replicas,
        },
    )


def _latest(log: str) -> dict[str, Any]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith('{"at"')]
    return lines[-1]["clients"] if lines else {}


def test_pods_stop_under_load_without_a_failed_request(
    release: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    namespace = settings.models_namespace
    images = [settings.worker_image, example_image("identity_next") or settings.worker_image]
    generation = 0
    cluster.apply(_model(images[0], 2, generation), namespace)
    stopped_pods = 0
    try:
        cluster.wait_until_serving(NAME, namespace, 2, settings.ready_timeout_s)
        source = Path(loadgen.__file__).read_text()
        service = f"{NAME}.{namespace}.svc"
        urls = [f"http://{service}:8000", f"grpc://{service}:8001"]
        cluster.run_pod(
            LOAD_POD,
            namespace,
            settings.worker_image,
            ["python", "-c", source, *urls, MODEL, STREAM_MODEL, str(LOAD_LIMIT_S)],
        )
        wait_for(lambda: '"at"' in cluster.pod_log(LOAD_POD, namespace), 600, "the load to start")
        time.sleep(5)

        def roll(replicas: int, *, new_pods: bool) -> None:
            nonlocal generation
            generation += new_pods
            cluster.apply(_model(images[generation % 2], replicas, generation), namespace)

        steps = [
            ("rolling update of two replicas", 2, lambda: roll(2, new_pods=True)),
            ("kubectl delete pod, one of two", 2, lambda: cluster.delete_one_pod(NAME, namespace)),
            ("scaling from two to one", 1, lambda: roll(1, new_pods=False)),
            ("rolling update of one replica", 1, lambda: roll(1, new_pods=True)),
        ]
        for step, replicas, act in steps:
            before = set(cluster.model_pods(NAME, namespace))
            act()
            wait_for(
                lambda before=before, replicas=replicas: cluster.settled(NAME, namespace, before, replicas),
                settings.ready_timeout_s,
                f"{step}: the stopped pods to be gone and {replicas} to serve",
            )
            stopped = before - set(cluster.model_pods(NAME, namespace))
            stopped_pods += len(stopped)
            so_far = _latest(cluster.pod_log(LOAD_POD, namespace))
            print(f"{step}: {len(stopped)} pod(s) stopped; so far {json.dumps(so_far)}")
        time.sleep(3)
        load_log = cluster.pod_log(LOAD_POD, namespace)
        outcome = _latest(load_log)
        restarts = cluster.restarts(NAME, namespace)
        assert cluster.pod_phase(LOAD_POD, namespace) == "Running", load_log[-2000:]
    finally:
        cluster.delete_pod(LOAD_POD, namespace)
        kubectl("delete", "pytritonmodel", NAME, "-n", namespace, "--ignore-not-found", "--wait=true")
    print(f"{stopped_pods} pods stopped under load: {json.dumps(outcome, indent=1)}")
    print(restarts or "no container of the model's pods restarted")
    assert set(outcome) == {"ModelClient http", "ModelClient grpc", PLAIN_HTTP, "DecoupledModelClient stream"}
    for name, counts in outcome.items():
        assert counts["ok"] > 0, f"{name} got no answer"
        if name == PLAIN_HTTP:
            # Triton cannot end an HTTP/1.1 connection between two requests: a client that never renews its
            # connection loses it when a pod it is connected to stops, with the request it is sending then.
            assert counts["failed"] <= stopped_pods, counts
            assert not any("No worker is attached" in failure for failure in counts["failures"]), counts
        else:
            assert counts["failed"] == 0, f"{name}: {counts}"
