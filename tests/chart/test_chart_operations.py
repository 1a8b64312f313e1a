"""The chart's production defaults (two replicas behind a Lease, spread over nodes, a disruption
budget, rolling updates) and its opt-in observability: a Grafana dashboard and Prometheus alerts whose
every query Prometheus parses (`promtool`)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_cluster import HelmFailed, Installed, install, problems, requires_helm
from kubetriton.operator import main as operator_main
from kubetriton.operator import rbac
from releases import NAMESPACE, RELEASE, installed, lease_name

pytestmark = requires_helm

PROMETHEUS_RULES = {"monitoring.coreos.com/v1/prometheusrules": ("PrometheusRule", True)}
OBSERVED = {
    "dashboards": {"enabled": True},
    "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
}


@functools.cache
def observed(with_prometheus_operator: bool) -> Installed:
    kinds = PROMETHEUS_RULES if with_prometheus_operator else None
    return asyncio.run(install(OBSERVED, release=RELEASE, namespace=NAMESPACE, extra_kinds=kinds))


def _args(release: Installed) -> argparse.Namespace:
    (container,) = release.one("Deployment")["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser()
    operator_main.add_arguments(parser)
    return parser.parse_args(container["args"])


def test_two_replicas_share_a_lease_and_roll_without_downtime() -> None:
    release = installed("defaults")
    deployment = release.one("Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    args = _args(release)
    assert args.leader_elect and (args.lease_name, args.lease_namespace) == (RELEASE, NAMESPACE)
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (15, 10, 2)
    assert args.max_concurrent_rollouts == 3


def test_replicas_prefer_different_nodes_and_drains_take_one_at_a_time() -> None:
    release = installed("defaults")
    template = release.one("Deployment")["spec"]["template"]
    (preference,) = template["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    term = preference["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution"
        not in template["spec"]["affinity"]["podAntiAffinity"]
    )
    budget = release.one("PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow", "a broken operator pod may go"
    assert budget["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()


def test_the_lease_role_grants_the_leader_election_rules_in_the_release_namespace_only() -> None:
    release = installed("two-namespaces")
    account = release.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    roles = [r for r in release.find("Role") if any("leases" in rule["resources"] for rule in r["rules"])]
    (role,) = roles
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == rbac.leader_election_rules(lease_name(release))
    (binding,) = [b for b in release.find("RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


def test_one_replica_has_no_disruption_budget_and_timings_are_settable() -> None:
    values = {
        "replicaCount": 1,
        "leaderElection": {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 4},
    }
    release = asyncio.run(install(values, release=RELEASE, namespace=NAMESPACE))
    assert release.find("PodDisruptionBudget") == []
    args = _args(release)
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (30, 20, 4)


def test_a_renew_deadline_as_long_as_the_lease_is_refused() -> None:
    values = {
        "leaderElection": {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10, "retryPeriodSeconds": 2}
    }
    with pytest.raises(HelmFailed, match="renewDeadlineSeconds"):
        asyncio.run(install(values, release=RELEASE, namespace=NAMESPACE))


def test_dashboards_and_alerts_are_off_by_default() -> None:
    release = installed("defaults")
    assert release.find("ConfigMap") == [] and release.find("PrometheusRule") == []


def dashboard() -> dict[str, Any]:
    (config_map,) = observed(False).find("ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    return json.loads(config_map["data"]["kubetriton.json"])


def test_the_dashboard_shows_each_figure_per_model_and_per_pod() -> None:
    titles = [panel["title"] for panel in dashboard()["panels"]]
    figures = [
        "Requests per second",
        "Failures per second",
        "Latency p50 / p99",
        "Queue time per request",
        "Compute time per request",
        "In-flight requests",
        "Worker busy fraction",
        "Replicas ready",
    ]
    assert titles == [f"{figure}, per {scope}" for scope in ("model", "pod") for figure in figures]
    for panel in dashboard()["panels"]:
        scope = "service" if panel["title"].endswith("model") else "pod"
        assert all(f"by (namespace, {scope}, model)" in target["expr"] for target in panel["targets"])


def test_the_alerts_exist_only_where_the_prometheus_operator_does() -> None:
    assert observed(False).find("PrometheusRule") == []
    rule = observed(True).one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(alerts) == {
        "KubetritonModelNotReady",
        "KubetritonHighFailureRatio",
        "KubetritonSlowQueue",
        "KubetritonWorkerRestarting",
    }
    assert all(alert["annotations"]["summary"] for alert in alerts.values())
    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    for name in alerts:
        assert f"### {name}" in docs, f"no runbook for {name} in docs/operations.md"
    assert "> 0.05" in alerts["KubetritonHighFailureRatio"]["expr"]
    assert [
        problem
        for obj in observed(True).objects
        if obj["kind"] != "PrometheusRule"
        for problem in problems(obj)
    ] == []


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not on PATH (Debian's prometheus package, which make does not install)")
    return found


def _check_rules(tmp_path: Path, groups: list[dict[str, Any]]) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_rendered_alerts(tmp_path: Path) -> None:
    _check_rules(tmp_path, observed(True).one("PrometheusRule")["spec"]["groups"])


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    expressions = [target["expr"] for panel in dashboard()["panels"] for target in panel["targets"]]
    rules = [{"record": f"kubetriton:panel_{i}", "expr": expr} for i, expr in enumerate(expressions)]
    _check_rules(tmp_path, [{"name": "dashboard", "rules": rules}])


def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="parse error"):
        _check_rules(tmp_path, [{"name": "broken", "rules": [{"record": "x:y", "expr": "sum by (a (up)"}]}])
