"""A model scaled on its own signals, under a schedule of demand, seen every few seconds.

`e2e/test_autoscaling.py` asserts on the timeline and `bench/autoscale.py` prints it. The model's
callable takes a fixed 20 ms per batch of at most 4, in one instance per pod, and Triton waits up to
3 ms to fill a batch: 12 closed-loop clients on one pod wait two or three batches (40-50 ms on the kit),
one client waits the 3 ms. Two clients on a pod share a batch only while they send within those 3 ms of
each other; once one of them is later, each waits out the other's batch, and they keep taking turns
(15-20 ms on the kit at 6 replicas). The demand is `e2e/demand.py` in a Pod of the cluster, closed-loop
ModelClient clients through the model's Service. Each sample has the clients of the moment, the
replicas the autoscaler decided on and the Deployment's ready ones, and the time requests waited in
Triton's queue over the last interval, read from every Ready pod's counters through the API server's
pod proxy (the operator's own `signals` do the reading):

- **queue p50**: the median over the interval's requests, each counted with its pod's average wait
  (Triton counts the wait per pod, not per request);
- **queue mean**: all the pods' waits over all their requests.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubetriton import podenv
from kubetriton.operator import signals

from e2e import demand
from e2e.cluster import Cluster, pytriton_model, wait_for

MODEL = "Slow"
BATCH_SECONDS = 0.02
SERVE = f"""
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def slow(x):
    time.sleep({BATCH_SECONDS})
    return {{"y": x}}


config = ModelConfig(max_batch_size=4, batcher=DynamicBatcher(max_queue_delay_microseconds=3000))
with Triton() as triton:
    triton.bind("{MODEL}", slow, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))], config=config)
    triton.serve()
"""


def slow_model(name: str, image: str, autoscaling: Mapping[str, Any], gpus: int = 0) -> dict[str, Any]:
    """The model: the worker image running SERVE, scaled as `autoscaling` says."""
    return pytriton_model(
        name,
        {
            "worker": {
                "image": image,
                "command": ["python", "-c", SERVE],
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
            },
            "models": [MODEL],
            "autoscaling": dict(autoscaling),
            "gpus": {"count": gpus},
        },
    )


def weighted_median(values: list[tuple[float, float]]) -> float | None:
    """The median of `values`, each (value, weight) standing for `weight` observations."""
    total = sum(weight for _, weight in values)
    if total <= 0:
        return None
    seen = 0.0
    for value, weight in sorted(values):
        seen += weight
        if seen >= total / 2:
            return value
    return None


def pod_waits(
    previous: Mapping[str, signals.PodReading], current: Mapping[str, signals.PodReading], model: str
) -> dict[str, tuple[float, float]]:
    """Each pod's queue time (µs) and requests between two readings, for the pods read both times."""
    found = {}
    for pod, reading in current.items():
        waits = signals.pod_waits(previous[pod], reading, (model,)) if pod in previous else None
        if waits:
            (found[pod],) = waits
    return found


def queue_times(waits: Mapping[str, tuple[float, float]]) -> tuple[float | None, float | None]:
    """(p50, mean) of the queue time in milliseconds from each pod's waits (see above)."""
    per_pod = [(waited / served / 1000, served) for waited, served in waits.values() if served]
    served = sum(weight for _, weight in per_pod)
    mean = sum(value * weight for value, weight in per_pod) / served if served else None
    return weighted_median(per_pod), mean


@dataclass(frozen=True)
class Sample:
    """The model at one moment, `at` seconds after the demand started."""

    at: float
    clients: int
    desired: int | None
    replicas: int | None
    ready: int
    queue_p50_ms: float | None
    queue_mean_ms: float | None
    latency_p50_ms: float | None
    reason: str
    served: dict[str, float] = field(default_factory=dict)
    """Requests each Ready pod answered since the last sample."""

    HEADER = "     t  clients  desired  ready  queue p50  queue mean  latency p50  decision"

    def line(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f} ms"

        desired = "-" if self.desired is None else str(self.desired)
        return (
            f"{self.at:5.0f}s  {self.clients:7d}  {desired:>7}  {self.ready:5d}  {ms(self.queue_p50_ms):>9}"
            f"  {ms(self.queue_mean_ms):>10}  {ms(self.latency_p50_ms):>11}  {self.reason}"
        )


@dataclass
class Timeline:
    """Samples of one model under the demand of one load pod."""

    cluster: Cluster
    name: str
    namespace: str
    load_pod: str
    model: str = MODEL
    started: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    _readings: dict[str, signals.PodReading] = field(default_factory=dict)

    def demand_lines(self) -> list[dict[str, Any]]:
        log = self.cluster.pod_log(self.load_pod, self.namespace)
        return [json.loads(line) for line in log.splitlines() if line.startswith("{")]

    def _read_pods(self) -> dict[str, signals.PodReading]:
        readings = {}
        for name, pod in self.cluster.model_pods(self.name, self.namespace).items():
            ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
            if not ready or pod.metadata.deletion_timestamp:
                continue
            with contextlib.suppress(ApiException):
                page = self.cluster.core.connect_get_namespaced_pod_proxy_with_path(
                    f"{name}:{podenv.METRICS_PORT}", self.namespace, "metrics", _request_timeout=5
                )
                readings[name] = signals.PodReading(signals.parse(page, signals.QUEUE_TIME_METRICS))
        return readings

    def sample(self) -> Sample:
        """Read everything once, and keep the sample."""
        model = self.cluster.model(self.name, self.namespace) or {}
        autoscaling = (model.get("status") or {}).get("autoscaling") or {}
        deployment = self.cluster.apps.read_namespaced_deployment(self.name, self.namespace)
        readings = self._read_pods()
        waits = pod_waits(self._readings, readings, self.model)
        p50, mean = queue_times(waits)
        self._readings = readings
        lines = [line for line in self.demand_lines() if "clients" in line]
        last = lines[-1] if lines else {}
        sample = Sample(
            at=time.time() - self.started,
            clients=last.get("clients", 0),
            desired=autoscaling.get("desiredReplicas"),
            replicas=deployment.spec.replicas,
            ready=deployment.status.ready_replicas or 0,
            queue_p50_ms=p50,
            queue_mean_ms=mean,
            latency_p50_ms=last.get("latency_ms_p50"),
            reason=autoscaling.get("reason", ""),
            served={pod: served for pod, (_, served) in waits.items()},
        )
        self.samples.append(sample)
        return sample

    def phases(self) -> list[tuple[int, float]]:
        """When each phase of the demand began, in seconds after it started: (clients, at)."""
        return [(line["phase"], line["at"] - self.started) for line in self.demand_lines() if "phase" in line]

    def failures(self) -> dict[str, dict[str, Any]]:
        """Each protocol's answers and failures over the whole demand, as the load pod last printed them."""
        lines = [line for line in self.demand_lines() if "clients" in line]
        return {protocol: lines[-1][protocol] for protocol in demand.PROTOCOLS} if lines else {}


@contextlib.contextmanager
def demand_pod(
    cluster: Cluster,
    image: str,
    name: str,
    namespace: str,
    pod: str,
    schedule: str,
    *,
    host: str | None = None,
    model: str = MODEL,
) -> Iterator[Timeline]:
    """`e2e/demand.py` in a Pod, following `schedule` against the model's Service (or `host`: the name
    of its pods, whose clients balance each request); the timeline, whose clock starts when the demand
    does."""
    host = host or f"{name}.{namespace}.svc"
    source = Path(demand.__file__).read_text()
    urls = [f"http://{host}:{podenv.HTTP_PORT}", f"grpc://{host}:{podenv.GRPC_PORT}"]
    cluster.run_pod(pod, namespace, image, ["python", "-c", source, *urls, model, schedule])
    timeline = Timeline(cluster, name, namespace, pod, model=model)
    try:
        started = wait_for(
            lambda: next((line["started"] for line in timeline.demand_lines() if "started" in line), None),
            600,
            "the demand to start",
            interval_s=0.5,
        )
        timeline.started = started
        yield timeline
    finally:
        cluster.delete_pod(pod, namespace)
