"""A model's router: plain Triton clients' requests spread over every pod, the router adds little time,
no request through it fails while the model's pods roll or go, and a router is ready only while it has
a pod to send to.

The model has three replicas and `router: true`. Its worker serves `Slow`, whose one instance takes 20 ms
per request (no batching) and answers with the name of its pod, and `Echo`, an identity for small
requests. The clients are `e2e/routerload.py` in Pods of the cluster, plain `tritonclient.http` clients
(one keep-alive connection each) and `tritonclient.grpc` clients (one HTTP/2 connection each), every one
kept for the whole run, through the router's Service: through the model's own Service each would stay
on the pod its connection went to.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubetriton.operator import naming, report
from pytriton.client import ModelClient

from e2e import routerload
from e2e.cluster import Cluster, Settings, kubectl, port_forward, pytriton_model, wait_for
from e2e.conftest import upgrade
from e2e.test_deploy import deploy

NAME = "routed"
SLOW, ECHO = "Slow", "Echo"
LOAD_POD = "kubetriton-e2e-router-load"
SPREAD_CLIENTS, SPREAD_SECONDS = 6, 60
LATENCY_ROUNDS, LATENCY_REQUESTS = 5, 200
MAX_ADDED_P50_MS = 0.5
LIVENESS_FAILURES_S = 40
"""Longer than the router's liveness probe takes to restart a container that fails it (3 x 10 s)."""
SERVE = f"""
import socket
import time

import numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

POD = socket.gethostname().encode()


def slow(requests):
    time.sleep(0.02 * len(requests))
    return [{{"y": request["x"], "pod": np.array([POD], dtype=np.bytes_)}} for request in requests]


def echo(requests):
    return [{{"y": request["x"]}} for request in requests]


with Triton() as triton:
    x, y = Tensor(name="x", dtype=np.float32, shape=(-1,)), Tensor(name="y", dtype=np.float32, shape=(-1,))
    triton.bind("{SLOW}", slow, [x], [y, Tensor(name="pod", dtype=bytes, shape=(1,))],
                config=ModelConfig(batching=False))
    triton.bind("{ECHO}", echo, [x], [y], config=ModelConfig(batching=False))
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
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
            },
            "models": [SLOW, ECHO],
            "replicas": replicas,
            "router": True,
        },
    )


def _router_serving(cluster: Cluster, namespace: str, name: str = NAME) -> dict[str, Any] | None:
    """The model once its status shows both router replicas ready and RouterReady true."""
    model = cluster.model(name, namespace) or {}
    condition, ready = _router_state(model)
    return model if condition.get("status") == "True" and ready == 2 else None


def _run_to_the_end(cluster: Cluster, settings: Settings, namespace: str, arguments: list[str]) -> str:
    """routerload.py with `arguments` in a Pod, until it ends; its log."""
    source = Path(routerload.__file__).read_text()
    cluster.run_pod(LOAD_POD, namespace, settings.worker_image, ["python", "-c", source, *arguments])
    try:
        wait_for(
            lambda: cluster.pod_phase(LOAD_POD, namespace) in ("Succeeded", "Failed"),
            900,
            "the clients to end",
        )
        log = cluster.pod_log(LOAD_POD, namespace)
        assert cluster.pod_phase(LOAD_POD, namespace) == "Succeeded", log[-3000:]
        return log
    finally:
        cluster.delete_pod(LOAD_POD, namespace)


def _last(log: str) -> dict[str, Any]:
    return json.loads([line for line in log.splitlines() if line.startswith("{")][-1])


@pytest.fixture(scope="module")
def routed(release: dict[str, Any], cluster: Cluster, settings: Settings) -> Iterator[dict[str, Any]]:
    """The model with its router, both serving; deleted afterwards."""
    namespace = settings.models_namespace
    cluster.apply(_model(settings.worker_image, 3, 0), namespace)
    try:
        cluster.wait_until_serving(NAME, namespace, 3, settings.ready_timeout_s)
        yield wait_for(lambda: _router_serving(cluster, namespace), settings.ready_timeout_s, "the router")
    finally:
        kubectl("delete", "pytritonmodel", NAME, "-n", namespace, "--ignore-not-found", "--wait=true")


def test_plain_clients_spread_over_every_pod_and_the_router_adds_little(
    routed: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    namespace = settings.models_namespace
    router = routed["status"]["router"]
    host = f"{NAME}-router.{namespace}.svc"
    assert (router["url"], router["grpcUrl"]) == (f"http://{host}:8000", f"grpc://{host}:8001")
    assert f"http://{host}:8000, grpc://{host}:8001 (2 of 2 ready)" in report.describe(routed, [])
    pods = set(cluster.model_pods(NAME, namespace))

    spread = _last(
        _run_to_the_end(
            cluster, settings, namespace, ["spread", host, SLOW, str(SPREAD_CLIENTS), str(SPREAD_SECONDS)]
        )
    )
    print(f"{SPREAD_CLIENTS} clients through the router for {SPREAD_SECONDS} s: {json.dumps(spread)}")
    latency = _last(
        _run_to_the_end(
            cluster,
            settings,
            namespace,
            [
                "latency",
                host,
                f"{NAME}-pods.{namespace}.svc",
                ECHO,
                str(LATENCY_ROUNDS),
                str(LATENCY_REQUESTS),
            ],
        )
    )
    print(f"router against straight to a pod, one request at a time: {json.dumps(latency)}")

    total: dict[str, int] = {}
    for protocol in routerload.PROTOCOLS:
        answers = spread[protocol]
        assert answers["failed"] == 0, answers["failures"]
        assert set(answers["pods"]) == pods, f"{protocol}: every pod serves"
        for pod, count in answers["pods"].items():
            total[pod] = total.get(pod, 0) + count
    mean = sum(total.values()) / len(total)
    shares = {pod: round(count / mean, 3) for pod, count in total.items()}
    print(f"each pod's requests against the mean: {shares}")
    assert all(0.75 <= share <= 1.25 for share in shares.values()), shares
    assert latency["pods"] == 3
    for protocol in routerload.PROTOCOLS:
        assert latency[f"{protocol} added p50"] <= MAX_ADDED_P50_MS, latency


def test_no_request_through_the_router_fails_while_the_pods_roll_or_go(
    routed: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    namespace = settings.models_namespace
    source = Path(routerload.__file__).read_text()
    host = f"{NAME}-router.{namespace}.svc"
    cluster.run_pod(
        LOAD_POD,
        namespace,
        settings.worker_image,
        ["python", "-c", source, "spread", host, SLOW, "4", "3600"],
    )
    try:
        wait_for(lambda: '"at"' in cluster.pod_log(LOAD_POD, namespace), 600, "the load to start")
        time.sleep(5)
        steps = [
            ("rolling update of three replicas", 3, _model(settings.worker_image, 3, 1)),
            ("scaling from three to one", 1, _model(settings.worker_image, 1, 1)),
        ]
        for step, replicas, model in steps:
            before = set(cluster.model_pods(NAME, namespace))
            started = time.monotonic()
            cluster.apply(model, namespace)
            wait_for(
                lambda before=before, replicas=replicas: cluster.settled(NAME, namespace, before, replicas),
                settings.ready_timeout_s,
                f"{step}: the stopped pods to be gone and {replicas} to serve",
            )
            took = time.monotonic() - started
            print(f"{step} in {took:.0f} s; so far {json.dumps(_last(cluster.pod_log(LOAD_POD, namespace)))}")
        time.sleep(5)
        outcome = _last(cluster.pod_log(LOAD_POD, namespace))
        assert cluster.pod_phase(LOAD_POD, namespace) == "Running"
    finally:
        cluster.delete_pod(LOAD_POD, namespace)
    print(f"through the router while the pods rolled and went: {json.dumps(outcome)}")
    for protocol in routerload.PROTOCOLS:
        assert sum(outcome[protocol]["pods"].values()) > 0, f"{protocol}: no answer"
        assert outcome[protocol]["failed"] == 0, outcome[protocol]["failures"]


def _router_state(model: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The model's RouterReady condition ({} while it has none) and its ready router pods."""
    found = model.get("status") or {}
    condition = next((c for c in found.get("conditions", []) if c["type"] == "RouterReady"), {})
    return condition, (found.get("router") or {}).get("readyReplicas", 0)


def _router_ready(cluster: Cluster, namespace: str, name: str) -> tuple[dict[str, Any], int]:
    return _router_state(cluster.model(name, namespace) or {})


def _router_waiting(cluster: Cluster, namespace: str) -> str | None:
    """RouterReady's message once it is false and no router pod is ready."""
    condition, ready = _router_ready(cluster, namespace, NAME)
    return condition.get("message") if condition.get("status") == "False" and not ready else None


def _router_pods(cluster: Cluster, namespace: str, name: str) -> list[Any]:
    selector = ",".join(f"{key}={value}" for key, value in naming.router_selector_labels(name).items())
    return cluster.core.list_namespaced_pod(namespace, label_selector=selector).items


def _router_restarts(cluster: Cluster, namespace: str) -> dict[str, int]:
    return {
        pod.metadata.name: sum(status.restart_count for status in pod.status.container_statuses or [])
        for pod in _router_pods(cluster, namespace, NAME)
    }


def test_routers_are_ready_only_while_a_pod_is_and_wait_for_one_without_restarting(
    routed: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    """Scaled to zero, the model leaves its routers nothing to send to: they turn unready, which takes them
    out of their Service, and the status says why; their liveness still passes, and an eviction may take
    one although none is Ready (their budget's `unhealthyPodEvictionPolicy`). Scaled back, they serve
    again."""
    namespace = settings.models_namespace
    routers = _router_restarts(cluster, namespace)
    cluster.apply(_model(settings.worker_image, 0, 1), namespace)
    message = wait_for(
        lambda: _router_waiting(cluster, namespace), settings.ready_timeout_s, "routers unready"
    )
    print(f"RouterReady with no pod: {message}")
    assert "none is" in message
    time.sleep(LIVENESS_FAILURES_S)
    assert _router_restarts(cluster, namespace) == routers, "no router restarted, none replaced"
    evicted = sorted(routers)[0]  # a drain may take an unready router, whatever the budget's count
    eviction = {"metadata": {"name": evicted, "namespace": namespace}}
    cluster.core.create_namespaced_pod_eviction(evicted, namespace, eviction)
    wait_for(lambda: evicted not in _router_restarts(cluster, namespace), 120, "the evicted router gone")

    cluster.apply(_model(settings.worker_image, 1, 1), namespace)
    cluster.wait_until_serving(NAME, namespace, 1, settings.ready_timeout_s)
    wait_for(lambda: _router_serving(cluster, namespace), settings.ready_timeout_s, "the routers again")
    outcome = _last(
        _run_to_the_end(
            cluster, settings, namespace, ["spread", f"{NAME}-router.{namespace}.svc", SLOW, "2", "5"]
        )
    )
    print(f"through the router once it served again: {json.dumps(outcome)}")
    for protocol in routerload.PROTOCOLS:
        assert sum(outcome[protocol]["pods"].values()) > 0, f"{protocol}: no answer"
        assert outcome[protocol]["failed"] == 0, outcome[protocol]["failures"]


DEPLOYED = "routed-deploy"


def test_deploy_with_a_router_returns_once_the_router_serves(
    release: dict[str, Any], cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    """`kubetriton deploy --router` waits past the model's Ready until a router serves: the router's
    address it prints answers at once."""
    namespace = settings.models_namespace
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    options = ["--image", settings.worker_image, "--router", "--name", DEPLOYED, "-n", namespace]
    result, took = deploy(script, *options, "--timeout", "600s")
    try:
        assert result.returncode == 0, result.stderr
        print(f"returned {took:.1f} s after it started")
        condition, ready = _router_ready(cluster, namespace, DEPLOYED)
        assert condition.get("status") == "True" and ready >= 1, condition
        assert f"Router: http://{DEPLOYED}-router.{namespace}.svc:8000" in result.stdout
        with (
            port_forward(namespace, f"service/{DEPLOYED}-router", 8000) as local,
            ModelClient(f"http://127.0.0.1:{local}", ECHO, init_timeout_s=30) as client,
        ):
            data = np.arange(3, dtype=np.float32)
            assert client.infer_sample(x=data)["y"].tolist() == data.tolist()
    finally:
        subprocess.run(
            [sys.executable, "-m", "kubetriton.cli", "delete", DEPLOYED, "-n", namespace], capture_output=True
        )


PLACED = "routed-placed"
TAINT = "kubetriton.dev/e2e-routers-only"
UNTOLERATED = "kubetriton.dev/e2e-no-routers"


def _router_condition(cluster: Cluster, namespace: str, name: str, reason: str) -> dict[str, Any] | None:
    """The model's RouterReady condition once its reason is `reason`."""
    condition, _ = _router_ready(cluster, namespace, name)
    return condition if condition.get("reason") == reason else None


def test_routers_run_where_the_chart_places_them_on_a_node_the_models_pods_may_not_use(
    release: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    """router.nodeSelector and router.tolerations reach the router pods through the operator: with the node
    tainted NoSchedule, which the model's own new pods do not tolerate, its routers start and serve. While
    a second taint, which they do not tolerate either, keeps them from the node, RouterReady says so."""
    namespace = settings.models_namespace
    (node,) = [item.metadata.name for item in cluster.core.list_node().items]
    placement = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    }
    model = _model(settings.worker_image, 1, 0)
    model["metadata"]["name"] = PLACED
    model["spec"]["router"] = False
    upgrade(settings, {**release["config"], "router": placement})
    try:
        cluster.apply(model, namespace)
        cluster.wait_until_serving(PLACED, namespace, 1, settings.ready_timeout_s)
        kubectl("taint", "node", node, f"{TAINT}=yes:NoSchedule")
        kubectl("taint", "node", node, f"{UNTOLERATED}=yes:NoSchedule")
        model["spec"]["router"] = True
        cluster.apply(model, namespace)
        unschedulable = wait_for(
            lambda: _router_condition(cluster, namespace, PLACED, "Unschedulable"),
            settings.ready_timeout_s,
            "RouterReady to say the routers have no node",
        )
        print(f"RouterReady while no node takes the routers: {unschedulable['message']}")
        assert unschedulable["status"] == "False" and UNTOLERATED in unschedulable["message"]
        kubectl("taint", "node", node, f"{UNTOLERATED}-")
        wait_for(lambda: _router_serving(cluster, namespace, PLACED), settings.ready_timeout_s, "the routers")
        pods = _router_pods(cluster, namespace, PLACED)
        assert pods and all(pod.spec.node_selector == placement["nodeSelector"] for pod in pods)
        assert all(any(t.key == TAINT for t in pod.spec.tolerations or []) for pod in pods)
    finally:
        for taint in (UNTOLERATED, TAINT):
            with contextlib.suppress(AssertionError):  # not tainted: the test failed before, or untainted
                kubectl("taint", "node", node, f"{taint}-")
        kubectl("delete", "pytritonmodel", PLACED, "-n", namespace, "--ignore-not-found", "--wait=true")
        upgrade(settings, release["config"])
