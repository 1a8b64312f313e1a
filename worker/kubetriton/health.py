"""The worker's HTTP endpoint in a pod: /livez, /readyz and Prometheus /metrics.

Readiness is what Kubernetes routes traffic by, so it is strict: every declared model is loaded in
Triton *and* a worker instance is attached to each of its proxy instances, and the worker is not
draining. Server liveness alone is never readiness. The request counters are plain integers kept by
the instance threads and read only when Prometheus scrapes, so the data path pays nothing for them.

Where several worker processes serve the models, each has this endpoint on loopback and the supervisor
serves the pod's from theirs: ready when every process is, and every process's metrics with its index.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kubetriton import podenv
from kubetriton.worker import ModelWorker

PROCESS_PROBE_TIMEOUT_S = 1.5
"""How long the pod's endpoint waits for the worker processes' answers (the kubelet waits 2 s in all)."""


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


Probe = Callable[[], tuple[bool, str]]
"""A probe's answer: whether all is well, and the body that says why not."""


class ProbeServer:
    """Serves /livez, /readyz and /metrics on a port of its own, in a daemon thread."""

    def __init__(
        self, address: tuple[str, int], *, live: Probe, ready: Probe, metrics: Callable[[], str]
    ) -> None:
        routes = {"/livez": live, "/readyz": ready, "/metrics": lambda: (True, metrics())}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path)
                ok, body = route() if route else (False, "not found\n")
                self.send_response(200 if ok else 503 if route else 404)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(address, Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kubetriton-health", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class HealthServer(ProbeServer):
    """The probes and metrics of one worker process. `address` is all interfaces for a pod's worker, and
    loopback for one of several worker processes, whose supervisor serves the pod's (`ProcessesHealth`)."""

    def __init__(
        self,
        port: int,
        *,
        model_ready: Callable[[str], bool],
        declared_models: Iterable[str],
        workers: Callable[[], dict[str, ModelWorker]],
        draining: Callable[[], bool],
        address: str = "0.0.0.0",
    ) -> None:
        self._model_ready = model_ready
        self._declared = tuple(declared_models)
        self._workers = workers
        self._draining = draining
        registry = CollectorRegistry()
        registry.register(WorkerCollector(lambda: list(workers().values())))
        ProcessCollector(registry=registry)  # process_start_time_seconds: restarts show in alerts
        super().__init__(
            (address, port),
            live=self.live,
            ready=self.ready,
            metrics=lambda: generate_latest(registry).decode(),
        )

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


class ProcessesHealth(ProbeServer):
    """The pod's probes and metrics when several worker processes serve its models. Each process serves
    its own on loopback (`podenv.process_health_port`); the pod is ready when every process is, and its
    metrics are every process's, labelled with the process's index, beside the restarts of each.

    The pod is live, as a single worker is, once every process's endpoint has answered (its script
    reached `Triton()`: the startup probe bounds the load before it) and while none says its instance
    threads stopped. A process that stops answering after that is the supervisor's to restart, and
    keeps the pod live meanwhile, for `restart_bound_s` at most (the model's `startupSeconds`): one that
    does not answer again by then (a restarted script that hangs before `Triton()`) makes the pod not
    live, and the kubelet restarts the container."""

    def __init__(
        self,
        port: int,
        *,
        processes: int,
        draining: Callable[[], bool],
        restarts: Callable[[], Sequence[int]],
        restart_bound_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ports = [podenv.process_health_port(port, index) for index in range(processes)]
        self._draining = draining
        self._restarts = restarts
        self._restart_bound_s = restart_bound_s
        self._clock = clock
        self._started: set[int] = set()
        self._silent_since: dict[int, float] = {}
        super().__init__(("0.0.0.0", port), live=self.live, ready=self.ready, metrics=self.metrics)

    def live(self) -> tuple[bool, str]:
        problems = []
        now = self._clock()
        for index, (ok, body) in enumerate(self._ask_each("/livez")):
            if ok:
                self._started.add(index)
                self._silent_since.pop(index, None)
            elif body:
                problems += [f"process {index}: {line}" for line in body.splitlines()]
            elif index not in self._started:
                problems.append(f"process {index}: not started yet")
            else:
                silent_s = now - self._silent_since.setdefault(index, now)
                if self._restart_bound_s is not None and silent_s > self._restart_bound_s:
                    problems.append(
                        f"process {index}: not back {silent_s:.0f} s after it stopped answering "
                        f"(startupSeconds: {self._restart_bound_s:g})"
                    )
        return (False, "\n".join(problems) + "\n") if problems else (True, "ok\n")

    def not_started(self) -> list[int]:
        """The processes whose endpoint does not answer now: their scripts have not reached `Triton()`
        (yet, or again after a restart)."""
        return [index for index, (ok, body) in enumerate(self._ask_each("/livez")) if not ok and not body]

    def ready(self) -> tuple[bool, str]:
        if self._draining():
            return False, "draining\n"
        problems = []
        for index, (ok, body) in enumerate(self._ask_each("/readyz")):
            if not ok:
                problems += [f"process {index}: {line}" for line in (body or "not answering").splitlines()]
        return (False, "\n".join(problems) + "\n") if problems else (True, "ok\n")

    def metrics(self) -> str:
        families: dict[str, Metric] = {}
        for index, (ok, text) in enumerate(self._ask_each("/metrics")):
            if not ok:
                continue
            for family in text_string_to_metric_families(text):
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type, family.unit)
                )
                merged.samples += [
                    sample._replace(labels={**sample.labels, "process": str(index)})
                    for sample in family.samples
                ]
        restarts = CounterMetricFamily(
            "kubetriton_process_restarts",
            "Times the supervisor restarted a worker process",
            labels=["process"],
        )
        for index, count in enumerate(self._restarts()):
            restarts.add_metric([str(index)], count)
        registry = CollectorRegistry()
        registry.register(_Families([*families.values(), restarts]))
        return generate_latest(registry).decode()

    def _ask_each(self, path: str) -> list[tuple[bool, str]]:
        """Every process's answer to `path`, asked all at once: one that hangs delays the pod's probe by
        `PROCESS_PROBE_TIMEOUT_S` at most."""
        with ThreadPoolExecutor(len(self._ports)) as pool:
            return list(pool.map(lambda port: _fetch(port, path), self._ports))


class _Families(Collector):
    """Metric families gathered already, for one rendering."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _fetch(port: int, path: str) -> tuple[bool, str]:
    """GET a path of a worker process's probe endpoint: whether it answered 200, and its body ("" when it
    did not answer at all)."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}{path}", timeout=PROCESS_PROBE_TIMEOUT_S
        ) as reply:
            return True, reply.read().decode()
    except urllib.error.HTTPError as error:
        return False, error.read().decode()
    except OSError:
        return False, ""
