"""A model's own load, as its pods report it: what the operator's autoscaler scales on.

Every pod exports Triton's metrics on its metrics port and the worker's on its health port, in
Prometheus' text format. Two numbers come out of them, for the models a PyTritonModel declares:

- **queue time**: how long a request waits in Triton's queue before the model runs it, on average.
  Triton counts it cumulatively (`nv_inference_queue_duration_us`, over the successful requests that
  `nv_inference_request_success` counts), so it is the difference between two readings of a pod,
  divided by the requests in between; a pod that served nothing in between waited for nothing;
- **requests in flight** per pod: the requests waiting in Triton's queue
  (`nv_inference_pending_request_count`) and those in the worker's callable (`kubetriton_in_flight`).

A page lists one series per label set (a model's versions, a worker's processes); each model's
series are summed, whatever other labels they carry. Only the lines of the wanted metrics are read,
which keeps a page of a busy Triton cheap to scan. Everything here is pure: the autoscaler fetches the
pages and keeps the previous readings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

QUEUE_DURATION = "nv_inference_queue_duration_us"
REQUESTS = "nv_inference_request_success"
PENDING = "nv_inference_pending_request_count"
RUNNING = "kubetriton_in_flight"
QUEUE_TIME_METRICS = (QUEUE_DURATION, REQUESTS)
"""What queue time needs, all from Triton's page."""
TRITON_IN_FLIGHT_METRICS = (PENDING,)
WORKER_IN_FLIGHT_METRICS = (RUNNING,)

_MODEL_LABEL = re.compile(r'(?:^|,)\s*model="((?:[^"\\]|\\.)*)"')

Samples = dict[str, dict[str, float]]
"""metric name → model → the sum of its series."""


def parse(page: str, metrics: Iterable[str]) -> Samples:
    """The sum of each wanted metric's series per model label; series without one are left out."""
    wanted = tuple(f"{name}{{" for name in metrics)
    found: Samples = {prefix[:-1]: {} for prefix in wanted}
    for line in page.splitlines():
        if not line.startswith(wanted):
            continue
        name, _, rest = line.partition("{")
        labels, _, value = rest.rpartition("}")
        model = _MODEL_LABEL.search(labels)
        fields = value.split()
        if model is None or not fields:
            continue
        try:
            amount = float(fields[0])
        except ValueError:
            continue
        by_model = found[name]
        by_model[model[1]] = by_model.get(model[1], 0.0) + amount
    return found


@dataclass(frozen=True)
class PodReading:
    """One pod's samples at one moment: every metric the signal needs, per declared model."""

    samples: Samples

    def of(self, metric: str, model: str) -> float | None:
        return self.samples.get(metric, {}).get(model)

    def complete(self, metrics: Iterable[str], models: Iterable[str]) -> bool:
        """Whether every model has every metric: a pod's page lacks a model it has not loaded yet."""
        return all(self.of(metric, model) is not None for metric in metrics for model in models)


@dataclass(frozen=True)
class Measurement:
    """The signal over a model's pods, or None when no pod gave one; and how many pods did."""

    value: float | None
    pods: int


def pod_waits(
    before: PodReading, after: PodReading, models: tuple[str, ...]
) -> list[tuple[float, float]] | None:
    """Each model's queue time (µs) and requests between two readings of one pod; None when either
    reading lacks a model, or a counter went back (a restarted Triton)."""
    if not (before.complete(QUEUE_TIME_METRICS, models) and after.complete(QUEUE_TIME_METRICS, models)):
        return None
    waits = []
    for model in models:
        waited = after.samples[QUEUE_DURATION][model] - before.samples[QUEUE_DURATION][model]
        served = after.samples[REQUESTS][model] - before.samples[REQUESTS][model]
        if waited < 0 or served < 0:
            return None
        waits.append((waited, served))
    return waits


def queue_time(
    previous: Mapping[str, PodReading], current: Mapping[str, PodReading], models: Iterable[str]
) -> Measurement:
    """Average queue time per request in milliseconds, of the model that waited longest, over the
    pods read twice."""
    models = tuple(models)
    waited, served = [0.0] * len(models), [0.0] * len(models)
    pods = 0
    for pod, reading in current.items():
        before = previous.get(pod)
        waits = pod_waits(before, reading, models) if before is not None else None
        if waits is None:
            continue
        pods += 1
        for index, (wait, count) in enumerate(waits):
            waited[index] += wait
            served[index] += count
    if pods == 0:
        return Measurement(None, 0)
    per_model = [wait / count / 1000 if count else 0.0 for wait, count in zip(waited, served, strict=True)]
    return Measurement(max(per_model, default=0.0), pods)


def in_flight(readings: Mapping[str, PodReading], models: Iterable[str]) -> Measurement:
    """Requests queued in Triton or running in the callable, summed over the models, averaged over
    the pods whose pages have every model."""
    models = tuple(models)
    metrics = (*TRITON_IN_FLIGHT_METRICS, *WORKER_IN_FLIGHT_METRICS)
    totals = [
        sum(reading.of(metric, model) or 0.0 for metric in metrics for model in models)
        for reading in readings.values()
        if reading.complete(metrics, models)
    ]
    if not totals:
        return Measurement(None, 0)
    return Measurement(sum(totals) / len(totals), len(totals))
