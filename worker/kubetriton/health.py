"""The worker's HTTP endpoint in a pod: /livez, /readyz and Prometheus /metrics.

Readiness is what Kubernetes routes traffic by, so it is strict: every declared model is loaded in
Triton *and* a worker instance is attached to each of its proxy instances, and the worker is not
draining. Server liveness alone is never readiness. The request counters are plain integers kept by
the instance threads and read only when Prometheus scrapes, so the data path pays nothing for them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kubetriton.worker import ModelWorker


class WorkerCollector(Collector):
    """Per-model request counts, failures, busy time and in-flight requests, read at scrape time."""

    def __init__(self, workers: Callable[[], Iterable[ModelWorker]]) -> None:
        self._workers = workers

    def collect(self):
        requests = CounterMetricFamily("kubetriton_requests", "Inference requests handled", labels=["model"])
        failures = CounterMetricFamily(
            "kubetriton_request_failures", "Inference requests that failed", labels=["model"]
        )
        busy = CounterMetricFamily("kubetriton_busy_seconds", "Time spent serving requests", labels=["model"])
        in_flight = GaugeMetricFamily("kubetriton_in_flight", "Requests being served now", labels=["model"])
        attached = GaugeMetricFamily(
            "kubetriton_attached", "1 when every proxy instance is attached", labels=["model"]
        )
        for worker in self._workers():
            name = [worker.spec.name]
            requests.add_metric(name, sum(instance.requests for instance in worker.instances))
            failures.add_metric(name, sum(instance.failures for instance in worker.instances))
            busy.add_metric(name, sum(instance.busy_seconds for instance in worker.instances))
            in_flight.add_metric(name, worker.in_flight)
            attached.add_metric(name, 1 if worker.attached else 0)
        yield from (requests, failures, busy, in_flight, attached)


class HealthServer:
    """Serves the probes and metrics on a port of its own, in a daemon thread."""

    def __init__(
        self,
        port: int,
        *,
        model_ready: Callable[[str], bool],
        declared_models: Iterable[str],
        workers: Callable[[], dict[str, ModelWorker]],
        draining: Callable[[], bool],
    ) -> None:
        self._model_ready = model_ready
        self._declared = tuple(declared_models)
        self._workers = workers
        self._draining = draining
        self._registry = CollectorRegistry()
        self._registry.register(WorkerCollector(lambda: list(workers().values())))
        ProcessCollector(registry=self._registry)  # process_start_time_seconds: restarts show in alerts
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/livez":
                    ok, body = health.live()
                elif self.path == "/readyz":
                    ok, body = health.ready()
                elif self.path == "/metrics":
                    ok, body = True, generate_latest(health._registry).decode()
                else:
                    ok, body = False, "not found\n"
                self.send_response(200 if ok else 503 if self.path in ("/livez", "/readyz") else 404)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kubetriton-health", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def live(self) -> tuple[bool, str]:
        dead = [
            f"{worker.spec.name}/{instance.instance}"
            for worker in self._workers().values()
            for instance in worker.instances
            if not instance.is_alive()
        ]
        return (False, f"instance threads stopped: {', '.join(dead)}\n") if dead else (True, "ok\n")

    def ready(self) -> tuple[bool, str]:
        if self._draining():
            return False, "draining\n"
        workers = self._workers()
        declared = self._declared or tuple(workers)
        if not declared:
            return False, "no model bound yet\n"
        problems = []
        for model in declared:
            worker = workers.get(model)
            if worker is None:
                problems.append(f"{model}: not bound yet")
            elif not self._model_ready(model):
                problems.append(f"{model}: not loaded in Triton")
            elif not worker.attached:
                problems.append(f"{model}: proxy instances not attached")
        return (False, "\n".join(problems) + "\n") if problems else (True, "ok\n")
