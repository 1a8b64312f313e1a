"""How the operator copes with many models at once: time to children and status, memory, requests.

Runs the real `kubetriton operator` as a child process, behind a small proxy of this script's that
counts every request the operator sends, creates N PyTritonModel objects at once in a namespace of
its own, and reports:

- how long until every model has all its children (Deployment, Service, a PodDisruptionBudget
  for more than one replica, a ServiceMonitor where that CRD exists) and a status;
- the operator's peak resident memory (VmHWM);
- the API requests per model while creating them, per model and minute afterwards, and after a
  restart of the operator (which should write nothing);
- on a real cluster, how long deleting the namespace takes and how many ERROR lines it logs.

Against the emulated API server of the operator tests by default; against a real cluster with
`--kubeconfig` or when $KUBECONFIG is set: there the operator uses `--operator-kubeconfig` (say, a service
account token with the chart's RBAC) and watches only the bench's namespace, which is deleted at
the end. The models' pods ask for a node label no node has, so they stay Pending and the node is
spared 200 models' worth of containers.

    python bench/operator_scale.py [--models 200] [--service-monitor-crd] [--kubeconfig PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import kmock
import yaml
from kubernetes import client as kubernetes_client
from kubernetes import config as kubernetes_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "operator"))

from emulator import SERVICE_MONITOR_CRD, ClusterEmulator  # noqa: E402

MANAGED = "app.kubernetes.io/managed-by=kubetriton-operator"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"
WRITES = ("POST", "PUT", "PATCH", "DELETE")


@dataclass(frozen=True)
class Write:
    """A write the operator sent, as the API server answered it."""

    at: float
    kind: str
    """Such as "PATCH deployments" or "PATCH pytritonmodels/status"."""
    name: str
    """The object's name ("" for a write to a collection)."""
    status: int
    took: float
    observed_generation: bool
    """Whether the write names an observedGeneration: a model's status once its spec has been acted on."""

    @property
    def target(self) -> tuple[str, str]:
        """The object and what of it was written: ("model-0001", "pytritonmodels/status")."""
        return self.name, self.kind.split()[1]


@dataclass
class Endpoint:
    """Where an API server is and how to talk to it."""

    url: str
    ssl: ssl.SSLContext | bool = False
    headers: dict[str, str] = field(default_factory=dict)

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            base_url=self.url,
            headers=self.headers,
            connector=aiohttp.TCPConnector(ssl=self.ssl, limit=32),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )


def endpoint_from_kubeconfig(path: str) -> Endpoint:
    """The server and credentials of a kubeconfig's current context."""
    configuration = kubernetes_client.Configuration()
    kubernetes_config.load_kube_config(config_file=path, client_configuration=configuration)
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    token = configuration.get_api_key_with_prefix("BearerToken")
    return Endpoint(configuration.host, context, {"Authorization": token} if token else {})


class CountingProxy:
    """Forwards the operator's requests to the API server with its own credentials, counting them."""

    def __init__(self, upstream: Endpoint) -> None:
        self.upstream = upstream
        self.counts: collections.Counter[str] = collections.Counter()
        self.answered: list[Write] = []
        self._session: aiohttp.ClientSession | None = None
        self._runner: aiohttp.web.AppRunner | None = None
        self.url = ""

    @staticmethod
    def classify(request: aiohttp.web.Request) -> tuple[str, str]:
        """GET, WATCH, or a write with what it writes, such as "PATCH deployments"; and the name of the
        object a write is sent to ("" for a collection)."""
        if request.method == "GET":
            return ("WATCH" if request.query.get("watch") in ("true", "1") else "GET"), ""
        parts = request.path.strip("/").split("/")
        if "namespaces" in parts[:-1] and parts.index("namespaces") + 2 < len(parts):
            parts = parts[parts.index("namespaces") + 2 :]
        else:
            parts = parts[-2:] if len(parts) > 3 else parts[-1:]
        resource = parts[0] + (f"/{parts[2]}" if len(parts) > 2 else "")
        return f"{request.method} {resource}", parts[1] if len(parts) > 1 else ""

    async def _forward(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        assert self._session is not None
        kind, name = self.classify(request)
        self.counts[kind] += 1
        headers = {key: value for key, value in request.headers.items() if key in ("Content-Type", "Accept")}
        body = await request.read()
        sent = time.monotonic()
        async with self._session.request(
            request.method, request.rel_url.path_qs, headers=headers, data=body or None
        ) as upstream:
            if kind.split()[0] in WRITES:
                at = time.monotonic()
                observed = b'"observedGeneration"' in body
                self.answered.append(Write(at, kind, name, upstream.status, at - sent, observed))
            response = aiohttp.web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            with contextlib.suppress(ConnectionResetError):  # the operator closed a watch
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            return response

    async def __aenter__(self) -> CountingProxy:
        self._session = self.upstream.session()
        app = aiohttp.web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._forward)
        # At the end the operator is gone; what is left is watches relayed to nobody.
        self._runner = aiohttp.web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        port = free_port()
        await aiohttp.web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def kubeconfig(server: str) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bench", "cluster": {"server": server}}],
        "users": [{"name": "bench", "user": {"token": "counted-by-the-proxy"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        "current-context": "bench",
    }
    return yaml.safe_dump(config)


def model(index: int, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubetriton.dev/v1alpha1",
        "kind": "PyTritonModel",
        "metadata": {"name": f"model-{index:04d}", "namespace": namespace},
        "spec": {
            "worker": {"image": "localhost/kubetriton/worker:dev"},
            "models": ["Identity"],
            "replicas": 1 + index % 3,
            "gpus": {"count": index % 2},
            "scheduling": {"nodeSelector": {"kubetriton.dev/bench": "no-such-node"}},
        },
    }


def wanted_children(index: int, service_monitor: bool) -> set[str]:
    kinds = {"deployments", "services"}
    if 1 + index % 3 > 1:
        kinds.add("poddisruptionbudgets")
    if service_monitor:
        kinds.add("servicemonitors")
    return kinds


CHILD_PATHS = {
    "deployments": "/apis/apps/v1/namespaces/{ns}/deployments",
    "services": "/api/v1/namespaces/{ns}/services",
    "poddisruptionbudgets": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "servicemonitors": "/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors",
}


class Api:
    """The bench's own requests, with the bench's credentials."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def call(self, method: str, path: str, body: Any = None, **params: str) -> tuple[int, Any]:
        headers = {"Accept": METADATA_ONLY} if params.pop("metadata_only", "") else {}
        async with self.session.request(method, path, json=body, params=params, headers=headers) as response:
            return response.status, await response.json(content_type=None)

    async def names(self, path: str, **params: str) -> set[str]:
        status, listing = await self.call("GET", path, labelSelector=MANAGED, metadata_only="yes", **params)
        return {item["metadata"]["name"] for item in listing.get("items") or []} if status == 200 else set()


async def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> float:
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(interval)
    return time.monotonic()


def cpu_seconds(pid: int) -> float:
    """User and system time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc")


class Operator:
    """`kubetriton operator` as a child process, its log in a file."""

    def __init__(self, config: Path, namespace: str, log: Path) -> None:
        self.config, self.namespace, self.log = config, namespace, log
        self.health = f"http://127.0.0.1:{free_port()}/healthz"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "kubetriton.cli", "operator", "-n", self.namespace]
        self.process = subprocess.Popen(
            [*command, f"--liveness={self.health}"],
            env={**os.environ, "KUBECONFIG": str(self.config)},
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("a"),
        )

    async def serving(self) -> bool:
        with contextlib.suppress(aiohttp.ClientError):
            async with aiohttp.ClientSession() as session, session.get(self.health) as response:
                return response.status == 200
        return False

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def lines(self, since: int = 0) -> list[str]:
        return self.log.read_text().splitlines()[since:]


@contextlib.asynccontextmanager
async def api_server(kubeconfig_path: str | None) -> AsyncIterator[tuple[Endpoint, str]]:
    """The API server to bench against, and what it is; an emulated one without a kubeconfig."""
    if kubeconfig_path:
        endpoint = endpoint_from_kubeconfig(kubeconfig_path)
        yield endpoint, endpoint.url
        return
    async with (
        ClusterEmulator(record_requests=False, model_crd=True, established_crds=True) as emulator,
        kmock.Server(emulator) as server,
    ):
        yield Endpoint(str(server.url).rstrip("/")), "the emulated API server of the operator tests"


def per_model(counts: collections.Counter[str], models: int, minutes: float = 1.0) -> str:
    writes = {kind: value for kind, value in sorted(counts.items()) if kind.split()[0] in WRITES and value}
    total = sum(writes.values())
    detail = ", ".join(f"{kind} {value / models / minutes:.2f}" for kind, value in writes.items())
    return (
        f"writes {total / models / minutes:.2f} ({detail or 'none'}), "
        f"reads {counts['GET'] / models / minutes:.2f}, watches opened {counts['WATCH']}"
    )


async def bench(args: argparse.Namespace) -> None:
    namespace = args.namespace
    log = args.operator_log or Path(tempfile.mkstemp(prefix="operator-scale-", suffix=".log")[1])
    async with api_server(args.kubeconfig) as (endpoint, where), endpoint.session() as session:
        api = Api(session)
        upstream = (
            endpoint_from_kubeconfig(args.operator_kubeconfig) if args.operator_kubeconfig else endpoint
        )
        status, _ = await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        assert status in (200, 201), f"creating namespace {namespace}: HTTP {status}"
        created_crd = False
        if args.service_monitor_crd:
            status, _ = await api.call("POST", CRDS, SERVICE_MONITOR_CRD)
            created_crd = status == 201
        try:
            report("API server", where)
            report("ServiceMonitor CRD", "present" if args.service_monitor_crd else "absent")
            async with CountingProxy(upstream) as proxy:
                await run(args, api, proxy, namespace, log)
        finally:
            if args.kubeconfig:  # the run deletes its namespace, unless it failed before
                await api.call("DELETE", f"/api/v1/namespaces/{namespace}")
            if created_crd and args.kubeconfig:
                await api.call("DELETE", f"{CRDS}/{SERVICE_MONITOR_CRD['metadata']['name']}")
    report("operator log", str(log))


def report(label: str, value: str) -> None:
    print(f"{label + ':':<31}{value}", flush=True)


class Run:
    """One bench run: the operator behind the proxy, the models of one namespace."""

    def __init__(self, args: argparse.Namespace, api: Api, proxy: CountingProxy, operator: Operator) -> None:
        self.args, self.api, self.proxy, self.operator = args, api, proxy, operator
        self.namespace = operator.namespace
        self.models_path = f"/apis/kubetriton.dev/v1alpha1/namespaces/{self.namespace}/pytritonmodels"

    async def create(self) -> None:
        """Create every model at once; report the time until all have their children and status.

        The times are those of the API server's answers to the operator's last child apply and last
        status write, as the proxy saw them, so the bench adds no requests of its own while the
        operator works; once they are in, the children and statuses are checked to exist."""
        models, monitor = self.args.models, self.args.service_monitor_crd
        limit = asyncio.Semaphore(20)

        async def create(index: int) -> None:
            async with limit:
                status, answer = await self.api.call("POST", self.models_path, model(index, self.namespace))
                assert status == 201, answer

        wanted = {f"model-{i:04d}": wanted_children(i, monitor) for i in range(models)}
        child_targets = {(name, kind) for name, kinds in wanted.items() for kind in kinds}
        status_targets = {(name, "pytritonmodels/status") for name in wanted}

        def written(targets: set[tuple[str, str]]) -> float | None:
            """When the last of `targets` was first written (a status: with an observedGeneration),
            None while one has not been."""
            first: dict[tuple[str, str], float] = {}
            for write in self.proxy.answered:
                if write.status < 300 and (write.observed_generation or not write.kind.endswith("/status")):
                    first.setdefault(write.target, write.at)
            return max(first[target] for target in targets) if targets <= first.keys() else None

        async def all_written() -> bool:
            return written(child_targets) is not None and written(status_targets) is not None

        async def all_children() -> bool:
            present = {
                kind: await self.api.names(path.format(ns=self.namespace))
                for kind, path in CHILD_PATHS.items()
                if kind != "servicemonitors" or monitor
            }
            return all(name in present[kind] for name, kinds in wanted.items() for kind in kinds)

        async def all_statuses() -> bool:
            _, listing = await self.api.call("GET", self.models_path)
            done = [m for m in listing.get("items") or [] if "observedGeneration" in (m.get("status") or {})]
            return len(done) >= models

        before = self.proxy.counts.copy()
        started = time.monotonic()
        await asyncio.gather(*(create(index) for index in range(models)))
        report("models created", f"{models} in {time.monotonic() - started:.2f} s")
        await wait_until(all_written, self.args.timeout, "every child and status written", interval=0.05)
        children, statuses = written(child_targets), written(status_targets)
        assert children is not None and statuses is not None
        assert await all_children(), "a child the operator applied is missing"
        assert await all_statuses(), "a status the operator wrote is missing"
        report("all children", f"{children - started:.2f} s after the first create")
        report("all statuses written", f"{statuses - started:.2f} s after the first create")
        pid = self.operator.pid
        report("operator CPU until then", f"{cpu_seconds(pid):.1f} s (start-up included)")
        report("operator peak RSS (VmHWM)", f"{peak_rss_mib(pid):.0f} MiB")
        report("requests per model, creation", per_model(self.proxy.counts - before, models))
        answered = [write for write in self.proxy.answered if write.at >= started]
        by_kind: dict[str, list[float]] = collections.defaultdict(list)
        for write in answered:
            by_kind[write.kind].append(write.took)
        latency = ", ".join(
            f"{kind} {1000 * sum(took) / len(took):.0f}/{1000 * max(took):.0f}"
            for kind, took in sorted(by_kind.items())
        )
        report("API answer ms, mean/max", latency)
        buckets = collections.Counter(
            int((write.at - started) // 2) * 2 for write in answered if write.at <= max(children, statuses)
        )
        report(
            "writes answered per 2 s",
            " ".join(f"{second}s:{count}" for second, count in sorted(buckets.items())),
        )

    def writes(self) -> int:
        return sum(value for kind, value in self.proxy.counts.items() if kind.split()[0] in WRITES)

    async def steady(self, quiet: float = 10) -> None:
        """Wait until the cluster settles (the pods of every model scheduled or refused, so the
        operator writes nothing for `quiet` seconds), then count the requests of a quiet spell."""
        started, last, last_change = time.monotonic(), self.writes(), time.monotonic()

        async def settled() -> bool:
            nonlocal last, last_change
            if self.writes() != last:
                last, last_change = self.writes(), time.monotonic()
            return time.monotonic() - last_change >= quiet

        await wait_until(settled, self.args.timeout, "the operator to stop writing")
        report("settled", f"{last_change - started:.1f} s after the last status")
        before = self.proxy.counts.copy()
        await asyncio.sleep(self.args.steady)
        steady = self.proxy.counts - before
        report("per model and minute, steady", per_model(steady, self.args.models, self.args.steady / 60))

    async def restart(self) -> None:
        """Stop and start the operator: resuming unchanged models should write nothing."""
        self.operator.stop()
        before, lines = self.proxy.counts.copy(), len(self.operator.lines())
        self.operator.start()
        await wait_until(self.operator.serving, 60, "the restarted operator to serve models")

        async def resumed() -> bool:
            done = sum("reconciled: no change needed" in line for line in self.operator.lines(lines))
            return done >= self.args.models

        await wait_until(resumed, self.args.timeout, "every model resumed")
        await asyncio.sleep(5)
        report("per model, restart (resume)", per_model(self.proxy.counts - before, self.args.models))
        report("peak RSS after the restart", f"{peak_rss_mib(self.operator.pid):.0f} MiB")

    async def delete_namespace(self) -> None:
        """Delete the namespace with its models; count what the operator logs meanwhile."""
        lines = len(self.operator.lines())
        started = time.monotonic()
        await self.api.call("DELETE", f"/api/v1/namespaces/{self.namespace}")

        async def gone() -> bool:
            return (await self.api.call("GET", f"/api/v1/namespaces/{self.namespace}"))[0] == 404

        deleted = await wait_until(gone, self.args.timeout, "the namespace to go", interval=1)
        await asyncio.sleep(5)
        logged = self.operator.lines(lines)
        errors = sum("[ERROR" in line for line in logged)
        warnings = sum("[WARNING" in line for line in logged)
        report(
            "namespace deletion",
            f"{deleted - started:.1f} s; operator log: {errors} ERROR, {warnings} WARNING lines",
        )


async def run(args: argparse.Namespace, api: Api, proxy: CountingProxy, namespace: str, log: Path) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:
        config.write(kubeconfig(proxy.url))
        config.flush()
        operator = Operator(Path(config.name), namespace, log)
        operator.start()
        try:
            await wait_until(operator.serving, 60, "the operator to serve models")
            bench_run = Run(args, api, proxy, operator)
            await bench_run.create()
            await bench_run.steady()
            await bench_run.restart()
            if args.kubeconfig:
                await bench_run.delete_namespace()
        finally:
            report("operator exit code", str(operator.stop()))


def thread_cpu_seconds(native_id: int) -> float:
    """User and system time one thread of this process has used so far."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def autoscaled_model(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubetriton.dev/v1alpha1",
        "kind": "PyTritonModel",
        "metadata": {"name": f"model-{index:04d}", "namespace": "default"},
        "spec": {
            "worker": {"image": "localhost/kubetriton/worker:dev"},
            "models": ["Identity"],
            "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetQueueMilliseconds": 10},
        },
    }


def ready_pod(index: int, address: str) -> dict[str, Any]:
    name = f"model-{index:04d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-0",
            "namespace": "default",
            "labels": {
                "app.kubernetes.io/name": "pytriton-model",
                "app.kubernetes.io/instance": name,
                "app.kubernetes.io/managed-by": "kubetriton-operator",
            },
        },
        "spec": {"containers": [{"name": "worker", "image": "w"}]},
        "status": {"phase": "Running", "podIP": address, "conditions": [{"type": "Ready", "status": "True"}]},
    }


async def idle_autoscaled(args: argparse.Namespace) -> None:
    """The operator's CPU while it scales idle models on their own signals, against the emulated API
    server: each model has one Ready pod, and every pod's address leads to one real local Triton
    serving the model, whose page the autoscaler reads every interval. The operator runs on its own
    thread (as in the operator tests); its thread's CPU time is the figure."""
    import numpy as np
    from emulator import OperatorThread
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    http, grpc, metrics = (free_port() for _ in range(3))
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)
    with Triton(config=config) as triton:
        tensor = [Tensor(name="x", dtype=np.float32, shape=(1,))]
        triton.bind(
            "Identity", lambda requests: requests, tensor, tensor, config=ModelConfig(max_batch_size=8)
        )
        triton.run()
        async with (
            ClusterEmulator(record_requests=False, model_crd=True, established_crds=True) as emulator,
            kmock.Server(emulator) as server,
            Endpoint(str(server.url).rstrip("/")).session() as session,
        ):
            api = Api(session)
            options = {"interval": args.autoscale_interval, "metrics_port": metrics}
            operator = OperatorThread(str(server.url).rstrip("/"), autoscaler_options=options).start()
            await asyncio.to_thread(operator.ready.wait, 60)
            models = "/apis/kubetriton.dev/v1alpha1/namespaces/default/pytritonmodels"
            for index in range(args.idle_autoscaled):
                for path, body in (
                    (models, autoscaled_model(index)),
                    ("/api/v1/namespaces/default/pods", ready_pod(index, "127.0.0.1")),
                ):
                    status, answer = await api.call("POST", path, body)
                    assert status == 201, answer

            async def decided() -> bool:
                _, listing = await api.call("GET", models)
                items = listing.get("items") or []
                return (
                    sum("autoscaling" in (item.get("status") or {}) for item in items) == args.idle_autoscaled
                )

            await wait_until(decided, args.timeout, "every model's first decision")
            await asyncio.sleep(2 * args.autoscale_interval)
            thread = operator._thread.native_id
            assert thread is not None
            writes_before = sum(v for k, v in emulator.request_counts.items() if k.split()[0] in WRITES)
            cpu, started = thread_cpu_seconds(thread), time.monotonic()
            await asyncio.sleep(args.steady)
            cpu, took = thread_cpu_seconds(thread) - cpu, time.monotonic() - started
            writes = (
                sum(v for k, v in emulator.request_counts.items() if k.split()[0] in WRITES) - writes_before
            )
            await asyncio.to_thread(operator.stop)
    report("idle autoscaled models", f"{args.idle_autoscaled}, read every {args.autoscale_interval:g} s")
    report("operator CPU", f"{cpu / took:.3f} cores over {took:.0f} s")
    report(
        "API writes meanwhile",
        f"{writes} ({writes / took * 60 / args.idle_autoscaled:.2f} per model and minute)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--steady", type=float, default=30, help="seconds of steady state to count")
    parser.add_argument(
        "--service-monitor-crd", action="store_true", help="install a ServiceMonitor CRD first"
    )
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="a real cluster (default: $KUBECONFIG; without one, the emulated API server)",
    )
    parser.add_argument(
        "--operator-kubeconfig", default=None, help="the operator's identity (default: the same)"
    )
    parser.add_argument("--namespace", default=f"op-bench-{os.getpid()}")
    parser.add_argument("--operator-log", type=Path, default=None, help="write the operator's log here")
    parser.add_argument(
        "--idle-autoscaled",
        type=int,
        default=0,
        metavar="N",
        help="instead: the operator's CPU while it scales N idle models on their queue time (emulated API "
        "server, one real local Triton behind every pod)",
    )
    parser.add_argument("--autoscale-interval", type=float, default=5.0, metavar="SECONDS")
    args = parser.parse_args()
    asyncio.run(idle_autoscaled(args) if args.idle_autoscaled else bench(args))


if __name__ == "__main__":
    main()
