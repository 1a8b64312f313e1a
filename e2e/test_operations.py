"""The operator in production, on the kit's node: a killed leader replaced, an upgrade that leaves models
alone and one that rolls them a few at a time, a frozen API server, and Prometheus reading the dashboard's
and the alerts' queries.

These tests act on the node itself: they kill the operator's process and stop the API server's with
signals, and scrape pods from this machine. They need the kit's state directory (KT_CLUSTER_DIR, with the
API server's PID and the `cri` tool) and are skipped without it. The upgrade test also needs two more
operator images (KUBETRITON_E2E_OPERATOR_IMAGE_NEXT, _CHANGED; docs/e2e.md), and the Prometheus test the
`prometheus` and `promtool` binaries. Every figure is printed, and collected in docs/operations.md.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
import urllib3
import yaml
from kubernetes import client

from e2e import loadgen
from e2e.cluster import (
    GROUP,
    PLURAL,
    VERSION,
    Cluster,
    Poller,
    Settings,
    kubectl,
    pytriton_model,
    split_image,
    wait_for,
)
from e2e.conftest import RELEASE, upgrade
from e2e.test_rollout import MODEL, SERVE, STREAM_MODEL

KIT = Path(os.environ.get("KT_CLUSTER_DIR", "/nonexistent"))
on_the_node = pytest.mark.skipif(
    not (KIT / "run" / "kube-apiserver.pid").exists() or shutil.which("cri") is None,
    reason="needs the kit's node: KT_CLUSTER_DIR and `cri` on PATH (its env.sh)",
)
pytestmark = on_the_node

OPERATOR = "app.kubernetes.io/component=operator"
NOWHERE = {"kubetriton.dev/e2e-no-such-node": "true"}
"""A nodeSelector that no node matches: the model's pods stay Pending."""
SERVING = "ops-serving"
LOAD_LIMIT_S = 3600
PLAIN_HTTP = "tritonclient http keep-alive"
KILLS = 10


def _model(
    name: str, replicas: int = 1, *, image: str, pending: bool = False, command: list[str] | None = None
):
    spec: dict[str, Any] = {
        "worker": {
            "image": image,
            "command": command or ["python", "-c", SERVE],
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        },
        "models": [MODEL, STREAM_MODEL],
        "replicas": replicas,
    }
    if pending:
        spec["scheduling"] = {"nodeSelector": NOWHERE}
    return pytriton_model(name, spec)


def _set_replicas(cluster: Cluster, name: str, namespace: str, replicas: int, timeout_s: float = 30) -> None:
    cluster.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"replicas": replicas}}, _request_timeout=timeout_s
    )


def _deployment_replicas(cluster: Cluster, name: str, namespace: str) -> int | None:
    try:
        return cluster.apps.read_namespaced_deployment(name, namespace, _request_timeout=5).spec.replicas
    except Exception:  # not there yet, or no answer: the caller polls again
        return None


def _wait_replicas(cluster: Cluster, name: str, namespace: str, replicas: int, timeout_s: float) -> float:
    """Seconds until the model's Deployment asks for `replicas`."""
    start = time.monotonic()
    wait_for(
        lambda: _deployment_replicas(cluster, name, namespace) == replicas,
        timeout_s,
        f"{name}'s Deployment to ask for {replicas} replicas",
        interval_s=0.1,
    )
    return time.monotonic() - start


def _load_counts(cluster: Cluster, pod: str, namespace: str) -> dict[str, Any]:
    lines = [
        json.loads(line) for line in cluster.pod_log(pod, namespace).splitlines() if line.startswith('{"at"')
    ]
    return lines[-1]["clients"] if lines else {}


def _failed_since(before: dict[str, Any], after: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Per client: (answers, failures) between two readings of the load's counts."""
    return {
        name: (counts["ok"] - before[name]["ok"], counts["failed"] - before[name]["failed"])
        for name, counts in after.items()
    }


@contextlib.contextmanager
def _load(cluster: Cluster, settings: Settings, model: str, pod: str) -> Iterator[None]:
    """`e2e/loadgen.py` in a Pod, querying the model through its Service until the block ends."""
    namespace = settings.models_namespace
    service = f"{model}.{namespace}.svc"
    source = Path(loadgen.__file__).read_text()
    command = ["python", "-c", source, f"http://{service}:8000", f"grpc://{service}:8001"]
    cluster.run_pod(pod, namespace, settings.worker_image, [*command, MODEL, STREAM_MODEL, str(LOAD_LIMIT_S)])
    try:
        wait_for(lambda: '"at"' in cluster.pod_log(pod, namespace), 600, f"the load on {model} to start")
        time.sleep(3)
        yield
        assert cluster.pod_phase(pod, namespace) == "Running", cluster.pod_log(pod, namespace)[-2000:]
    finally:
        cluster.delete_pod(pod, namespace)


@pytest.fixture(scope="module")
def serving(release: dict[str, Any], cluster: Cluster, settings: Settings) -> Iterator[str]:
    """A Ready CPU model (one replica) with an in-cluster load on it: the load pod's name."""
    namespace = settings.models_namespace
    cluster.apply(_model(SERVING, image=settings.worker_image), namespace)
    try:
        cluster.wait_until_serving(SERVING, namespace, 1, settings.ready_timeout_s)
        with _load(cluster, settings, SERVING, "ops-load"):
            yield "ops-load"
    finally:
        kubectl("delete", "pytritonmodel", SERVING, "-n", namespace, "--ignore-not-found", "--wait=true")


# The operator's replicas and their Lease.


def _lease(cluster: Cluster, settings: Settings) -> client.V1Lease:
    return client.CoordinationV1Api(cluster.core.api_client).read_namespaced_lease(
        RELEASE, settings.namespace, _request_timeout=2
    )


def _operator_pods(cluster: Cluster, settings: Settings) -> dict[str, client.V1Pod]:
    listed = cluster.core.list_namespaced_pod(settings.namespace, label_selector=OPERATOR, _request_timeout=5)
    return {pod.metadata.name: pod for pod in listed.items if not pod.metadata.deletion_timestamp}


def _restarts(pod: client.V1Pod) -> int:
    return sum(status.restart_count for status in pod.status.container_statuses or [])


def _both_ready(cluster: Cluster, settings: Settings) -> dict[str, client.V1Pod] | None:
    """Both operator pods running and ready, and the Lease held by a process of one of them."""
    pods = _operator_pods(cluster, settings)
    ready = [
        pod
        for pod in pods.values()
        if all(status.ready for status in pod.status.container_statuses or [])
        and pod.status.container_statuses
    ]
    holder = _lease(cluster, settings).spec.holder_identity or ""
    return pods if len(ready) == 2 and holder.rsplit("_", 1)[0] in pods else None


class LeaseHistory(Poller):
    """Reads the Lease every 0.2 s in a thread: every distinct (holder, transitions) with when it was first
    and last seen, and the renewTime last seen."""

    interval_s = 0.2

    def __init__(self, cluster: Cluster, settings: Settings) -> None:
        super().__init__()
        self.cluster, self.settings = cluster, settings
        self.records: list[dict[str, Any]] = []

    def read(self) -> None:
        spec = _lease(self.cluster, self.settings).spec
        key = (spec.holder_identity or "", spec.lease_transitions)
        now = time.time()
        if not self.records or self.records[-1]["key"] != key:
            self.records.append({"key": key, "first": now, "last": now, "renew": spec.renew_time})
        else:
            self.records[-1].update(last=now, renew=spec.renew_time)

    def holders(self) -> list[tuple[str, int]]:
        return [record["key"] for record in self.records]


def _kill_container(namespace: str, pod: str, container: str) -> float:
    """SIGKILL the container's main process on the node; the time it was sent."""
    found = subprocess.run(["cri", "find", f"{namespace}/{pod}", container], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    pid = int(found.stdout.split()[1])
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    return killed_at


LOG_TIME = re.compile(r"^(\S+) ")
LEADING = "leading: holds the Lease"
WRITES = ("reconciled", "applied", "created", "patched")


def _stamped(line: str) -> float:
    """The time `kubectl logs --timestamps` put before a line."""
    stamp = LOG_TIME.match(line).group(1)  # type: ignore[union-attr]
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return (
        time.mktime(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) - time.timezone + float(f"0.{fraction or 0}")
    )


def test_a_killed_leader_is_replaced_and_two_replicas_never_write_at_once(
    release: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    namespace = settings.models_namespace
    name = "ops-lease"
    cluster.apply(_model(name, image=settings.worker_image, pending=True), namespace)
    takeovers, applied, processes = [], [], []
    try:
        _wait_replicas(cluster, name, namespace, 1, 120)
        with LeaseHistory(cluster, settings) as history:
            for kill in range(KILLS):
                pods = wait_for(
                    lambda: _both_ready(cluster, settings), 600, "two ready operators and a leader"
                )
                holder = _lease(cluster, settings).spec.holder_identity
                leader_pod = holder.rsplit("_", 1)[0]
                restarts = _restarts(pods[leader_pod])
                killed_at = _kill_container(settings.namespace, leader_pod, "operator")
                replicas = 2 if kill % 2 == 0 else 1
                _set_replicas(cluster, name, namespace, replicas)
                applied.append(_wait_replicas(cluster, name, namespace, replicas, 60))
                new_holder = wait_for(
                    lambda holder=holder: (
                        (h := _lease(cluster, settings).spec.holder_identity) != holder and h
                    ),
                    60,
                    "a new holder",
                    interval_s=0.1,
                )
                takeovers.append(time.time() - killed_at)
                wait_for(
                    lambda pod=leader_pod, before=restarts: (
                        _restarts(_operator_pods(cluster, settings)[pod]) > before
                    ),
                    600,
                    f"{leader_pod} to restart",
                )
                # The killed process's whole log, while kubelet still keeps it.
                log = kubectl("logs", "-n", settings.namespace, leader_pod, "--previous", "--timestamps")
                processes.append({"identity": holder, "killed_at": killed_at, "log": log, "next": new_holder})
                print(
                    f"kill {kill + 1}: {holder} killed; replicas {replicas} reached the Deployment after "
                    f"{applied[-1]:.1f} s; {new_holder} leads {takeovers[-1]:.1f} s after the kill"
                )
        records = history.records
    finally:
        kubectl("delete", "pytritonmodel", name, "-n", namespace, "--ignore-not-found", "--wait=true")
    print(
        "Lease history:",
        json.dumps(
            [
                {
                    "holder": r["key"][0],
                    "transitions": r["key"][1],
                    "first": round(r["first"], 1),
                    "last": round(r["last"], 1),
                }
                for r in records
            ],
            indent=1,
        ),
    )
    print(
        f"replicas changes applied after {min(applied):.1f}-{max(applied):.1f} s; "
        f"takeovers {min(takeovers):.1f}-{max(takeovers):.1f} s after the kill"
    )
    assert max(applied) <= 30, applied
    # One holder at a time, each new one counted once: holders never come back, and leaseTransitions
    # grows by one at each change of holder.
    holders = [key for key in (r["key"] for r in records) if key[0]]
    assert len({h for h, _ in holders}) == len(holders), holders
    assert all(b[1] == a[1] + 1 for a, b in itertools.pairwise(holders)), holders
    # Every killed process wrote only while it held the Lease: nothing before its "leading" line, nothing
    # after its kill; and the next leader began after the kill.
    by_identity = {p["identity"]: p for p in processes}
    for process in processes:
        lines = process["log"].splitlines()
        (leading,) = [_stamped(line) for line in lines if LEADING in line and process["identity"] in line]
        writes = [_stamped(line) for line in lines if any(word in line for word in WRITES)]
        assert all(leading <= at <= process["killed_at"] for at in writes), process["identity"]
        following = by_identity.get(process["next"])
        if following is not None:
            (next_leading,) = [
                _stamped(line)
                for line in following["log"].splitlines()
                if LEADING in line and following["identity"] in line
            ]
            assert next_leading > process["killed_at"], (process["identity"], following["identity"])
            print(
                f"{following['identity']} began leading {next_leading - process['killed_at']:.1f} s "
                f"after {process['identity']} was killed ({len(writes)} logged writes, all while it led)"
            )


# A frozen API server.


def _operator_log_lines(cluster: Cluster, settings: Settings, since: float) -> list[str]:
    """Every operator pod's log lines since `since` (the current container's and, where one ended since,
    the one before)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    lines = []
    for name, pod in _operator_pods(cluster, settings).items():
        lines += kubectl("logs", "-n", settings.namespace, name, f"--since-time={stamp}").splitlines()
        if _restarts(pod):
            with contextlib.suppress(AssertionError):
                previous = kubectl(
                    "logs", "-n", settings.namespace, name, "--previous", f"--since-time={stamp}"
                )
                lines += previous.splitlines()
    return lines


def _node_ready_since(cluster: Cluster) -> float:
    (node,) = cluster.core.list_node().items
    (ready,) = [c for c in node.status.conditions if c.type == "Ready"]
    assert ready.status == "True", ready
    return ready.last_transition_time.timestamp()


@contextlib.contextmanager
def _kept_on_failure(cluster: Cluster, settings: Settings, what: str) -> Iterator[None]:
    """On a failure, keep what says why, before the release goes: every operator pod's log (its current
    container's and the one before, with timestamps), the Leases, and the models' namespace's
    PyTritonModels, Deployments and events; in $KUBETRITON_E2E_LOG_DIR (the temporary directory by
    default)."""
    try:
        yield
    except BaseException:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        directory = Path(os.environ.get("KUBETRITON_E2E_LOG_DIR", tempfile.gettempdir())) / f"{what}-{stamp}"
        directory.mkdir(parents=True, exist_ok=True)
        wanted = [
            (f"{pod}{suffix}.log", ["logs", "-n", settings.namespace, pod, "--timestamps", *flags])
            for pod in _operator_pods(cluster, settings)
            for suffix, flags in (("", []), (".previous", ["--previous"]))
        ]
        wanted += [
            ("leases.yaml", ["get", "leases", "-n", settings.namespace, "-o", "yaml"]),
            (
                "models.yaml",
                ["get", "pytritonmodels,deployments", "-n", settings.models_namespace, "-o", "yaml"],
            ),
            ("events.txt", ["get", "events", "-n", settings.models_namespace, "-o", "wide"]),
        ]
        for file, arguments in wanted:
            with contextlib.suppress(AssertionError):  # a container with no previous one, say
                (directory / file).write_text(kubectl(*arguments))
        print(f"kept for the failure: {directory}")
        raise


@pytest.mark.parametrize("freeze_s", [60, 300])
def test_the_api_server_frozen_costs_no_request_and_a_few_log_lines(
    serving: str, cluster: Cluster, settings: Settings, freeze_s: int
) -> None:
    with _kept_on_failure(cluster, settings, f"api-server-frozen-{freeze_s}s"):
        _api_server_frozen(serving, cluster, settings, freeze_s)


def _api_server_frozen(serving: str, cluster: Cluster, settings: Settings, freeze_s: int) -> None:
    namespace = settings.models_namespace
    name = f"ops-outage-{freeze_s}"
    cluster.apply(_model(name, image=settings.worker_image, pending=True), namespace)
    try:
        _wait_replicas(cluster, name, namespace, 1, 120)
        wait_for(lambda: _both_ready(cluster, settings), 600, "two ready operators and a leader")
        restarts = {pod: _restarts(p) for pod, p in _operator_pods(cluster, settings).items()}
        ready_since = _node_ready_since(cluster)
        before = _load_counts(cluster, serving, namespace)
        started = time.time()
        api_server = int((KIT / "run" / "kube-apiserver.pid").read_text())
        change_failed: list[BaseException] = []
        change_taken: list[float] = []

        def change_replicas() -> None:
            """Send the change until the API server takes it: a connection that the thaw drops ("Remote
            end closed connection without response") is sent again, as a user would."""
            deadline = time.monotonic() + freeze_s + 120
            while True:
                try:
                    _set_replicas(cluster, name, namespace, 2, freeze_s + 60)
                except (urllib3.exceptions.HTTPError, OSError) as error:
                    if time.monotonic() > deadline:
                        change_failed.append(error)
                        return
                    time.sleep(1)
                    continue
                except BaseException as error:  # said below: a change that was lost is not the operator's
                    change_failed.append(error)
                    return
                change_taken.append(time.monotonic())
                return

        change = threading.Thread(target=change_replicas, daemon=True)
        os.kill(api_server, signal.SIGSTOP)
        try:
            time.sleep(freeze_s / 2)
            change.start()  # sent during the freeze; the API server takes it when it thaws
            time.sleep(freeze_s / 2)
        finally:
            os.kill(api_server, signal.SIGCONT)
        thawed = time.monotonic()
        change.join(60)
        model = cluster.model(name, namespace) or {}
        assert not change.is_alive() and not change_failed, (
            f"the replicas change sent during the freeze got no answer 60 s after the thaw, or failed: "
            f"{change_failed}; the model's spec.replicas is {model.get('spec', {}).get('replicas')}"
        )
        _wait_replicas(cluster, name, namespace, 2, 120)
        taken_after = max(change_taken[0] - thawed, 0.0)
        applied_after = time.monotonic() - thawed - taken_after
        time.sleep(60)  # what the thaw does to the node and its endpoints shows within this
        after = _load_counts(cluster, serving, namespace)
        lines = _operator_log_lines(cluster, settings, started)
        now_restarts = {pod: _restarts(p) for pod, p in _operator_pods(cluster, settings).items()}
        node_flapped = _node_ready_since(cluster) > ready_since
    finally:
        kubectl("delete", "pytritonmodel", name, "-n", namespace, "--ignore-not-found", "--wait=true")
    counts = _failed_since(before, after)
    levels = {
        level: [line for line in lines if f" {level} " in line or f"[{level}" in line]
        for level in ("ERROR", "WARNING")
    }
    print(
        f"{freeze_s} s freeze: requests (answered, failed) {json.dumps(counts)}; the replicas change, taken "
        f"by the API server {taken_after:.1f} s after the thaw, reached the Deployment {applied_after:.1f} s "
        f"after that; operator restarts {restarts} -> "
        f"{now_restarts}; node marked NotReady after the thaw: {node_flapped}"
    )
    print("operator log, WARNING and ERROR:\n" + "\n".join(levels["WARNING"] + levels["ERROR"]))
    for client_name, (_answered, failed) in counts.items():
        if failed:  # the load keeps its first failures: those since `before`, if it kept them
            print(f"{client_name} failed: {after[client_name]['failures'][before[client_name]['failed'] :]}")
    assert levels["ERROR"] == []
    assert now_restarts == restarts, "an operator container restarted"
    assert applied_after <= 30
    for client_name, (answered, failed) in counts.items():
        assert answered > 0, client_name
        if not node_flapped and client_name != PLAIN_HTTP:
            assert failed == 0, (client_name, counts)


# Prometheus, the dashboard and the alerts.

RULES_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "prometheusrules.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {
            "kind": "PrometheusRule",
            "listKind": "PrometheusRuleList",
            "plural": "prometheusrules",
            "singular": "prometheusrule",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}
"""The Prometheus Operator's PrometheusRule API, only so that the chart renders its rules into the cluster."""
FAILING = "ops-fails-at-start"
COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)\s*(?=[-+]?[\d.])")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ScrapeTargets(Poller):
    """The models' pods as Prometheus targets, written every 2 s from their Services' EndpointSlices
    to a file Prometheus watches (`file_sd_configs`: Debian's Prometheus is built without Kubernetes
    discovery). Like a ServiceMonitor, it takes the `metrics` (Triton) and `worker` ports of every
    endpoint, ready or not, with the labels namespace, service, pod and endpoint (the port's name)."""

    PORTS = ("metrics", "worker")
    interval_s = 2.0

    def __init__(self, cluster: Cluster, namespace: str, path: Path) -> None:
        super().__init__()
        self.cluster, self.namespace, self.path = cluster, namespace, path

    def targets(self) -> list[dict[str, Any]]:
        discovery = client.DiscoveryV1Api(self.cluster.core.api_client)
        listed = discovery.list_namespaced_endpoint_slice(self.namespace, _request_timeout=5).items
        found = []
        for endpoint_slice in listed:
            service = (endpoint_slice.metadata.labels or {}).get("kubernetes.io/service-name", "")
            ports = [port for port in endpoint_slice.ports or [] if port.name in self.PORTS]
            for port, endpoint in itertools.product(ports, endpoint_slice.endpoints or []):
                pod = endpoint.target_ref.name if endpoint.target_ref else ""
                labels = {"namespace": self.namespace, "service": service, "pod": pod, "endpoint": port.name}
                found += [{"targets": [f"{ip}:{port.port}"], "labels": labels} for ip in endpoint.addresses]
        return found

    def read(self) -> None:
        """Write the targets (a read that fails leaves the file with the last ones)."""
        written = self.path.with_suffix(".new")
        written.write_text(json.dumps(self.targets()))
        written.replace(self.path)

    def __enter__(self) -> Self:
        self.read()
        return super().__enter__()


def _prometheus_config(targets: Path, rules: Path) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "kubetriton-models", "file_sd_configs": [{"files": [str(targets)]}]},
        ],
    }


def _query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _scraped(port: int, promql: str) -> list[dict[str, Any]]:
    """The query's answer, or nothing while Prometheus is still starting."""
    try:
        return _query(port, promql)
    except OSError:  # refused: not listening yet
        return []


def _firing(port: int, alert: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=10) as answer:
        alerts = json.load(answer)["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == alert and a["state"] == "firing"]


@pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="needs prometheus and promtool (Debian's prometheus package)",
)
def test_prometheus_answers_every_panel_and_rule_and_the_not_ready_alert_fires(
    serving: str,
    release: dict[str, Any],
    cluster: Cluster,
    settings: Settings,
    tmp_path: Path,
) -> None:
    namespace = settings.models_namespace
    base = release["config"]
    created_crd = (
        cluster.extensions.list_custom_resource_definition(
            field_selector=f"metadata.name={RULES_CRD['metadata']['name']}"
        ).items
        == []
    )
    prometheus = None
    stack = contextlib.ExitStack()  # the scrape targets' writer
    try:
        if created_crd:
            cluster.apply(RULES_CRD)
            kubectl("wait", "--for=condition=Established", f"crd/{RULES_CRD['metadata']['name']}")
        observed = {
            "dashboards": {"enabled": True},
            "prometheusRule": {"enabled": True, "notReadyFor": "30s"},
        }
        upgrade(settings, {**base, **observed})
        rule = cluster.custom.get_namespaced_custom_object(
            "monitoring.coreos.com", "v1", settings.namespace, "prometheusrules", RELEASE
        )
        rules = tmp_path / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        checked = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        print(checked.stdout.strip())
        (dashboard,) = cluster.core.list_namespaced_config_map(
            settings.namespace, label_selector="grafana_dashboard=1"
        ).items
        panels = json.loads(next(iter(dashboard.data.values())))["panels"]

        cluster.apply(
            _model(
                FAILING,
                image=settings.worker_image,
                command=["python", "-c", "raise RuntimeError('this model fails before it binds')"],
            ),
            namespace,
        )
        targets = stack.enter_context(ScrapeTargets(cluster, namespace, tmp_path / "targets.json"))
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(_prometheus_config(targets.path, rules)))
        port = _free_port()
        prometheus = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("w"),
        )
        started = time.monotonic()
        wait_for(
            lambda: _scraped(port, f'nv_inference_request_success{{service="{SERVING}"}}'),
            120,
            "Prometheus to scrape the serving model",
        )
        time.sleep(30)  # a few scrapes under load, for the rates
        empty = []
        for panel in panels:
            for target in panel.get("targets", []):
                promql = target["expr"].replace("$namespace", ".*").replace("$model", ".*")
                if not _query(port, promql):
                    empty.append((panel["title"], promql))
        for group in rule["spec"]["groups"]:
            for each in group["rules"]:
                promql = COMPARISON.sub(r"\1 bool ", each["expr"])
                if not _query(port, promql):
                    empty.append((each["alert"], promql))
        print(
            f"{sum(len(p.get('targets', [])) for p in panels)} panel queries and "
            f"{sum(len(g['rules']) for g in rule['spec']['groups'])} rules answered with data; empty: {empty}"
        )
        assert empty == []
        firing = wait_for(
            lambda: [
                a for a in _firing(port, "KubetritonModelNotReady") if a["labels"].get("service") == FAILING
            ],
            300,
            "KubetritonModelNotReady to fire for the failing model",
        )
        print(
            f"KubetritonModelNotReady fired {time.monotonic() - started:.0f} s after Prometheus started "
            f"(for: 30s): {firing[0]['annotations']['summary']}"
        )
        assert not [
            a for a in _firing(port, "KubetritonModelNotReady") if a["labels"].get("service") == SERVING
        ]
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(30)
        stack.close()
        kubectl("delete", "pytritonmodel", FAILING, "-n", namespace, "--ignore-not-found", "--wait=true")
        upgrade(settings, base)
        if created_crd:
            kubectl("delete", "crd", RULES_CRD["metadata"]["name"], "--ignore-not-found")


# Upgrades of the operator.

NEXT_IMAGES = ("KUBETRITON_E2E_OPERATOR_IMAGE_NEXT", "KUBETRITON_E2E_OPERATOR_IMAGE_CHANGED")
MODELS = 20
READY = ("ops-ready-a", "ops-ready-b")
"""Two more Ready models besides SERVING; the load runs on SERVING and on the first of these."""
MAX_ROLLOUTS = 2


def _deployments(cluster: Cluster, namespace: str) -> dict[str, client.V1Deployment]:
    listed = cluster.apps.list_namespaced_deployment(
        namespace, label_selector="app.kubernetes.io/name=pytriton-model"
    )
    return {d.metadata.name: d for d in listed.items if d.metadata.name.startswith("ops-")}


def _rolling(deployment: client.V1Deployment, generation: int) -> bool:
    """Whether a Deployment has been changed since `generation` and its pods are not all new and available."""
    status = deployment.status
    wanted = deployment.spec.replicas
    done = (
        status.observed_generation == deployment.metadata.generation
        and (status.updated_replicas or 0) == wanted
        and (status.available_replicas or 0) == wanted
        and (status.replicas or 0) == wanted
    )
    return deployment.metadata.generation > generation and not done


def _applied(cluster: Cluster, deployment: client.V1Deployment) -> str:
    """What the operator applied to a Deployment, as YAML: its annotations and spec."""
    body = cluster.apps.api_client.sanitize_for_serialization(deployment)
    shown = {"annotations": body["metadata"].get("annotations"), "spec": body["spec"]}
    return yaml.safe_dump(shown, sort_keys=True)


def _what_changed(cluster: Cluster, before: dict[str, str], name: str, namespace: str) -> str:
    """A unified diff of a Deployment's annotations and spec, from what `before` holds of it to now."""
    if name not in before:
        return ""
    now = _applied(cluster, cluster.apps.read_namespaced_deployment(name, namespace))
    diff = difflib.unified_diff(before[name].splitlines(True), now.splitlines(True), name, f"{name} now")
    return "".join(diff)


@pytest.mark.skipif(
    any(not os.environ.get(name) for name in NEXT_IMAGES),
    reason=f"needs two more operator images: {', '.join(NEXT_IMAGES)} (docs/e2e.md)",
)
def test_upgrades_roll_models_only_when_the_generator_changes_and_a_few_at_a_time(
    serving: str, release: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    namespace = settings.models_namespace
    base = release["config"]
    same, changed = (os.environ[name] for name in NEXT_IMAGES)
    # images.sh names its last build in e2e.env: after `--tag changed`, the release would be installed with
    # the changed generator and "upgraded" to the original one, which rolls every model.
    assert settings.operator_image not in (same, changed), (
        f"the release runs {settings.operator_image}, one of the upgrade's images: set "
        "KUBETRITON_E2E_OPERATOR_IMAGE to the first image (docs/e2e.md)"
    )
    pending = [f"ops-pending-{index:02}" for index in range(MODELS - 1 - len(READY))]
    for name in READY:
        cluster.apply(_model(name, image=settings.worker_image), namespace)
    for name in pending:
        cluster.apply(_model(name, image=settings.worker_image, pending=True), namespace)
    try:
        for name in READY:
            cluster.wait_until_serving(name, namespace, 1, settings.ready_timeout_s)
        wait_for(lambda: len(_deployments(cluster, namespace)) == MODELS, 300, f"{MODELS} Deployments")
        serving_models = (SERVING, *READY)
        with _load(cluster, settings, READY[0], "ops-load-b"):
            before = {name: d.metadata.generation for name, d in _deployments(cluster, namespace).items()}
            templates = {name: _applied(cluster, d) for name, d in _deployments(cluster, namespace).items()}
            pods = {name: set(cluster.model_pods(name, namespace)) for name in serving_models}
            loads = {pod: _load_counts(cluster, pod, namespace) for pod in (serving, "ops-load-b")}

            upgrade(settings, {**base, "image": {**base["image"], **split_image(same)}})
            leader = wait_for(
                lambda: _leader_image(cluster, settings) == same, 300, "a leader of the rebuilt image"
            )
            time.sleep(30)  # the new leader lists every model and converges it
            after = {name: d.metadata.generation for name, d in _deployments(cluster, namespace).items()}
            changed_now = {
                name: (d.metadata.annotations or {}).get("kubetriton.dev/fingerprint")
                for name, d in _deployments(cluster, namespace).items()
                if d.metadata.generation != before[name]
            }
            assert after == before, (
                f"an upgrade with the same generator changed Deployments: {changed_now}\n"
                + _what_changed(cluster, templates, next(iter(changed_now), ""), namespace)
            )
            assert {name: set(cluster.model_pods(name, namespace)) for name in serving_models} == pods
            print(
                f"same generator: {MODELS} Deployments' generations and the Ready models' pods unchanged "
                f"({leader})"
            )

            upgrade(
                settings,
                {
                    **base,
                    "image": {**base["image"], **split_image(changed)},
                    "maxConcurrentRollouts": MAX_ROLLOUTS,
                },
            )
            started = time.monotonic()
            concurrent, most = [], 0
            while True:
                deployments = _deployments(cluster, namespace)
                rolling = [n for n in serving_models if _rolling(deployments[n], before[n])]
                most = max(most, len(rolling))
                concurrent.append((round(time.monotonic() - started, 1), rolling))
                if all(d.metadata.generation > before[n] for n, d in deployments.items()) and not rolling:
                    break
                assert time.monotonic() - started < 1200, concurrent[-1]
                time.sleep(0.5)
            rolled_in = time.monotonic() - started
            for name in serving_models:
                wait_for(
                    lambda name=name: cluster.settled(name, namespace, pods[name], 1),
                    300,
                    f"{name}'s new pod",
                )
            stopped = sum(
                len(pods[name] - set(cluster.model_pods(name, namespace))) for name in serving_models
            )
            time.sleep(3)
            counts = {pod: _failed_since(loads[pod], _load_counts(cluster, pod, namespace)) for pod in loads}
    finally:
        for name in (*READY, *pending):
            kubectl("delete", "pytritonmodel", name, "-n", namespace, "--ignore-not-found", "--wait=false")
        wait_for(lambda: len(_deployments(cluster, namespace)) <= 1, 300, "the upgrade test's models to go")
        upgrade(settings, base)
    changes = [
        (at, rolling)
        for (_, previous), (at, rolling) in itertools.pairwise([(0.0, []), *concurrent])
        if rolling != previous
    ]
    print(
        f"changed generator: all {MODELS} Deployments updated; the {len(serving_models)} Ready models rolled "
        f"in {rolled_in:.0f} s, at most {most} at a time (limit {MAX_ROLLOUTS}): {changes}"
    )
    print(f"load during the upgrades, (answered, failed): {json.dumps(counts)}")
    assert 0 < most <= MAX_ROLLOUTS
    for per_client in counts.values():
        for client_name, (answered, failed) in per_client.items():
            assert answered > 0, client_name
            assert failed <= (stopped if client_name == PLAIN_HTTP else 0), (client_name, per_client)


def _leader_image(cluster: Cluster, settings: Settings) -> str | None:
    """The operator image of the pod whose process holds the Lease."""
    holder = (_lease(cluster, settings).spec.holder_identity or "").rsplit("_", 1)[0]
    pod = _operator_pods(cluster, settings).get(holder)
    return pod.spec.containers[0].image if pod is not None else None
