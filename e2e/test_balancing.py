"""Every request finds a free replica: ModelClient balancing each request over a model's pods, and the
router doing it for any client.

Twelve replicas of a model whose one instance takes 20 ms per request (no batching), and twelve
closed-loop ModelClient clients (six over HTTP, six over gRPC, each in a process of its own, each keeping
its client: `e2e/demand.py` in a Pod), first through the model's Service, today's per-connection
balancing, for the record, then through the name of the model's pods (`<model>-pods`). Each pod's share
of the requests and Triton's queue time are read from every pod's counters (`e2e/timeline.py`). Between
the two, the same twelve clients as plain `tritonclient` clients through the model's router
(`e2e/routerload.py`), and the router's added latency against requests sent straight to the pods. Then,
under the balanced load and a router load beside it, the script is edited (the pods roll one at a time)
and the model is scaled from 12 to 2: no request may fail.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubetriton.operator import naming

from e2e import routerload
from e2e.cluster import Cluster, Settings, kubectl, pytriton_model, wait_for
from e2e.test_router import ECHO, SERVE, SLOW, _last, _run_to_the_end
from e2e.timeline import Sample, Timeline, demand_pod

MODEL = SLOW
"""The router test's model: its one instance takes 20 ms per request and answers with its pod's name."""
REPLICAS = 12
CLIENTS = 12
MEASURE_S = 60
WARM_UP_S = 20
SAMPLE_EVERY_S = 5
LOAD_POD = "kubetriton-e2e-balance"
ROUTER_LOAD_POD = "kubetriton-e2e-balance-router"
LATENCY_ROUNDS, LATENCY_REQUESTS = 5, 240
MAX_ROUTER_ADDED_P50_MS = 0.5


def sleep_model(name: str, image: str, replicas: int, edition: str = "1") -> dict[str, Any]:
    """The model, with its router."""
    return pytriton_model(
        name,
        {
            "worker": {
                "image": image,
                "command": ["python", "-c", SERVE],
                "env": [{"name": "ROLLOUT", "value": edition}],
                "resources": {"requests": {"cpu": "10m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
            },
            "triton": {"resources": {"requests": {"cpu": "10m", "memory": "128Mi"}}},
            "models": [MODEL, ECHO],
            "replicas": replicas,
            "router": True,
        },
    )


@pytest.fixture
def model_name(settings: Settings) -> Iterator[str]:
    name = "balance"
    yield name
    kubectl(
        "delete", "pytritonmodel", name, "-n", settings.models_namespace, "--ignore-not-found", "--wait=true"
    )


def _measure(timeline: Timeline, seconds: float) -> list[Sample]:
    """Samples every 5 s for `seconds` after the warm-up, each printed."""
    print("\n" + Sample.HEADER)
    deadline = time.monotonic() + WARM_UP_S + seconds
    kept = []
    while time.monotonic() < deadline:
        sample = timeline.sample()
        print(sample.line(), flush=True)
        if sample.at >= WARM_UP_S:
            kept.append(sample)
        time.sleep(SAMPLE_EVERY_S)
    return kept[1:]  # the first kept sample's interval began in the warm-up


def _router_serving(cluster: Cluster, name: str, namespace: str) -> bool:
    found = (cluster.model(name, namespace) or {}).get("status") or {}
    ready = any(c["type"] == "RouterReady" and c["status"] == "True" for c in found.get("conditions", []))
    return ready and (found.get("router") or {}).get("readyReplicas") == 2


def _router_spread(outcome: dict[str, Any]) -> dict[str, float]:
    """Each pod's answers to the router's clients, both protocols, as a share of the mean."""
    served: Counter[str] = Counter()
    for protocol in routerload.PROTOCOLS:
        served.update(outcome[protocol]["pods"])
    if not served:
        return {}
    mean = sum(served.values()) / len(served)
    return {pod: count / mean for pod, count in sorted(served.items())}


def _spread(samples: list[Sample]) -> dict[str, float]:
    """Each pod's requests over the samples, as a share of the mean."""
    served: Counter[str] = Counter()
    for sample in samples:
        served.update(sample.served)
    mean = sum(served.values()) / len(served)
    return {pod: count / mean for pod, count in sorted(served.items())}


def _summary(label: str, samples: list[Sample], spread: dict[str, float]) -> float:
    queue = statistics.median(s.queue_p50_ms for s in samples if s.queue_p50_ms is not None)
    mean = statistics.median(s.queue_mean_ms for s in samples if s.queue_mean_ms is not None)
    latency = statistics.median(s.latency_p50_ms for s in samples if s.latency_p50_ms is not None)
    shares = " ".join(f"{share:.2f}" for share in spread.values())
    print(
        f"{label}: {len(spread)} pods, shares of the mean {shares} (min {min(spread.values()):.2f}, max "
        f"{max(spread.values()):.2f}); queue p50 {queue:.2f} ms (median of the samples), queue mean "
        f"{mean:.2f} ms, client latency p50 {latency:.1f} ms",
        flush=True,
    )
    return queue


def test_clients_of_the_pods_name_spread_evenly_and_lose_nothing_as_pods_go(
    release: dict[str, Any], cluster: Cluster, settings: Settings, model_name: str
) -> None:
    namespace = settings.models_namespace
    cluster.apply(sleep_model(model_name, settings.worker_image, REPLICAS), namespace)
    cluster.wait_until_serving(model_name, namespace, REPLICAS, settings.ready_timeout_s)
    status = (cluster.model(model_name, namespace) or {}).get("status") or {}
    pods_host = naming.pods_host(model_name, namespace)
    assert status["podsGrpcUrl"] == f"grpc://{pods_host}:8001", status

    with demand_pod(
        cluster,
        settings.worker_image,
        model_name,
        namespace,
        f"{LOAD_POD}-service",
        f"{WARM_UP_S + MEASURE_S + 10}:{CLIENTS}",
        model=MODEL,
    ) as timeline:
        through_service = _measure(timeline, MEASURE_S)
        service_failures = timeline.failures()
    service_queue = _summary("through the Service", through_service, _spread(through_service))

    wait_for(lambda: _router_serving(cluster, model_name, namespace), settings.ready_timeout_s, "the router")
    router_host = f"{naming.child_name(model_name, naming.ROUTER_SUFFIX)}.{namespace}.svc"
    seconds = str(WARM_UP_S + MEASURE_S)
    routed = _last(
        _run_to_the_end(cluster, settings, namespace, ["spread", router_host, MODEL, str(CLIENTS), seconds])
    )
    router_spread = _router_spread(routed)
    shares = " ".join(f"{share:.2f}" for share in router_spread.values())
    print(f"through the router, plain tritonclient clients: {len(router_spread)} pods, shares {shares}")
    arguments = ["latency", router_host, pods_host, ECHO, str(LATENCY_ROUNDS), str(LATENCY_REQUESTS)]
    latency = _last(_run_to_the_end(cluster, settings, namespace, arguments))
    print(f"the router's added latency, small requests, side by side: {json.dumps(latency)}")

    schedule = f"{WARM_UP_S + MEASURE_S + 600}:{CLIENTS}"
    with demand_pod(
        cluster, settings.worker_image, model_name, namespace, LOAD_POD, schedule, host=pods_host, model=MODEL
    ) as timeline:
        balanced = _measure(timeline, MEASURE_S)
        spread = _spread(balanced)
        balanced_queue = _summary("through the pods' name", balanced, spread)

        source = Path(routerload.__file__).read_text()
        arguments = ["python", "-c", source, "spread", router_host, MODEL, "4", "3600"]
        cluster.run_pod(ROUTER_LOAD_POD, namespace, settings.worker_image, arguments)
        wait_for(
            lambda: '"at"' in cluster.pod_log(ROUTER_LOAD_POD, namespace), 600, "the router load to start"
        )
        before = set(cluster.model_pods(model_name, namespace))
        cluster.apply(sleep_model(model_name, settings.worker_image, REPLICAS, edition="2"), namespace)
        wait_for(
            lambda: (
                cluster.settled(model_name, namespace, before, REPLICAS)
                and not set(cluster.model_pods(model_name, namespace)) & before
            ),
            settings.ready_timeout_s,
            "every pod replaced by the edited script's",
            interval_s=2,
        )
        rolled = time.time() - timeline.started
        cluster.apply(sleep_model(model_name, settings.worker_image, 2, edition="2"), namespace)
        wait_for(
            lambda: cluster.settled(model_name, namespace, set(), 2), settings.ready_timeout_s, "2 pods", 2
        )
        time.sleep(10)
        failures = timeline.failures()
        through_router = _last(cluster.pod_log(ROUTER_LOAD_POD, namespace))
        cluster.delete_pod(ROUTER_LOAD_POD, namespace)
    print(f"through the Service, answers and failures: {service_failures}")
    print(f"through the pods' name, rolled at {rolled:.0f} s, then scaled to 2: {failures}")
    print(f"through the router meanwhile, plain tritonclient clients: {json.dumps(through_router)}")
    assert len(router_spread) == REPLICAS, f"every pod served through the router: {router_spread}"
    assert all(0.75 <= share <= 1.25 for share in router_spread.values()), router_spread
    for protocol in routerload.PROTOCOLS:
        assert routed[protocol]["failed"] == 0, routed[protocol]["failures"]
        assert latency[f"{protocol} added p50"] <= MAX_ROUTER_ADDED_P50_MS, latency
        assert sum(through_router[protocol]["pods"].values()) > 0, f"{protocol}: no answer through the router"
        assert through_router[protocol]["failed"] == 0, through_router[protocol]["failures"]
    assert len(spread) == REPLICAS, f"every pod served: {spread}"
    assert all(0.75 <= share <= 1.25 for share in spread.values()), spread
    assert balanced_queue < 2.0, f"queue p50 {balanced_queue:.2f} ms (Service: {service_queue:.2f} ms)"
    for protocol, counts in failures.items():
        assert counts["ok"] > 0 and counts["failed"] == 0, (protocol, counts)
