"""Every request finds a free replica: ModelClient balancing each request over a model's pods.

Twelve replicas of a model whose one instance takes 20 ms per request (no batching), and twelve
closed-loop ModelClient clients (six over HTTP, six over gRPC, each in a process of its own, each keeping
its client: `e2e/demand.py` in a Pod) first through the name of the model's pods (`<model>-pods`), then
through its Service, today's per-connection balancing, for the record. Each pod's share of the requests
and Triton's queue time are read from every pod's counters (`e2e/timeline.py`). Then, under the same
balanced load, the script is edited (the pods roll one at a time) and the model is scaled from 12 to 2:
no request may fail.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubetriton.operator import naming

from e2e.cluster import Cluster, Settings, kubectl, pytriton_model, wait_for
from e2e.timeline import Sample, Timeline, demand_pod

MODEL = "Sleep"
REPLICAS = 12
CLIENTS = 12
MEASURE_S = 60
WARM_UP_S = 20
SAMPLE_EVERY_S = 5
LOAD_POD = "kubetriton-e2e-balance"
SERVE = f"""
import os
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

EDITION = os.environ.get("EDITION", "1")


@batch
def sleep(x):
    time.sleep(0.02)
    return {{"y": x}}


with Triton() as triton:
    triton.bind("{MODEL}", sleep, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))], config=ModelConfig(max_batch_size=1))
    triton.serve()
"""


def sleep_model(name: str, image: str, replicas: int, edition: str = "1") -> dict[str, Any]:
    return pytriton_model(
        name,
        {
            "worker": {
                "image": image,
                "command": ["python", "-c", SERVE],
                "env": [{"name": "EDITION", "value": edition}],
                "resources": {"requests": {"cpu": "10m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
            },
            "triton": {"resources": {"requests": {"cpu": "10m", "memory": "128Mi"}}},
            "models": [MODEL],
            "replicas": replicas,
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

    schedule = f"{WARM_UP_S + MEASURE_S + 600}:{CLIENTS}"
    with demand_pod(
        cluster, settings.worker_image, model_name, namespace, LOAD_POD, schedule, host=pods_host, model=MODEL
    ) as timeline:
        balanced = _measure(timeline, MEASURE_S)
        spread = _spread(balanced)
        balanced_queue = _summary("through the pods' name", balanced, spread)

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
    print(f"through the Service, answers and failures: {service_failures}")
    print(f"through the pods' name, rolled at {rolled:.0f} s, then scaled to 2: {failures}")
    assert len(spread) == REPLICAS, f"every pod served: {spread}"
    assert all(0.75 <= share <= 1.25 for share in spread.values()), spread
    assert balanced_queue < 2.0, f"queue p50 {balanced_queue:.2f} ms (Service: {service_queue:.2f} ms)"
    for protocol, counts in failures.items():
        assert counts["ok"] > 0 and counts["failed"] == 0, (protocol, counts)
