"""What `helm install` puts into a cluster, with default and non-default values: valid objects, an
operator Deployment that the operator's own command line accepts, and a lint that passes."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any
from urllib.parse import urlsplit

import pytest
from helm_cluster import HelmFailed, install, lint, problems, requires_helm
from kubetriton.operator import main as operator_main
from kubetriton.operator.router import RouterSettings
from releases import NAMESPACE, VALUE_SETS, installed

pytestmark = requires_helm


def test_lint_reports_no_warnings_or_errors() -> None:
    report = asyncio.run(lint())
    assert report["Errors"] is None
    assert [m for m in report["Messages"] if m["Severity"] >= 2] == []


def test_clusters_without_native_sidecars_are_refused() -> None:
    with pytest.raises(HelmFailed, match=r"incompatible with Kubernetes v1\.28"):
        asyncio.run(install(kubernetes_version=(1, 28)))


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_object_and_hook_is_valid(name: str) -> None:
    release = installed(name)
    for obj in release.objects + release.hooks:
        assert problems(obj) == [], f"{obj['kind']} {obj['metadata']['name']}"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_cluster_holds_exactly_what_helm_rendered(name: str) -> None:
    release = installed(name)

    def keys(objects: list[dict[str, Any]]) -> set[tuple[str, str | None, str]]:
        return {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects}

    assert keys(release.objects) == keys(release.manifest())
    assert release.release["info"]["status"] == "deployed"


def _operator(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = installed(name).one("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def _parsed_args(container: dict[str, Any]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    operator_main.add_arguments(parser)
    return parser.parse_args(container["args"])


@pytest.mark.parametrize(
    ("name", "namespaces"),
    [("defaults", None), ("two-namespaces", ["team-a", "team-b"]), ("customized", ["models"])],
)
def test_operator_watches_what_the_values_say(name: str, namespaces: list[str] | None) -> None:
    args = _parsed_args(_operator(name)[1])
    assert args.namespaces == namespaces
    assert args.all_namespaces is (namespaces is None)


@pytest.mark.parametrize(("name", "port"), [("defaults", 8080), ("customized", 9090)])
def test_probes_reach_the_operators_health_endpoint(name: str, port: int) -> None:
    _, container = _operator(name)
    liveness = urlsplit(_parsed_args(container).liveness)
    assert liveness.port == port
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert (ports[get["port"]], get["path"]) == (port, liveness.path)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_restricted_non_root_replicas_rolled_one_new_pod_at_a_time(name: str) -> None:
    deployment, container = _operator(name)
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    rolling = {"maxUnavailable": 0, "maxSurge": 1}
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": rolling}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    assert selector["app.kubernetes.io/component"] == "operator"


def test_image_defaults_to_the_charts_app_version() -> None:
    _, container = _operator("defaults")
    assert container["image"] == "registry.example.com/kubetriton/operator:0.1.0"
    assert container["env"] == [
        {"name": "KUBETRITON_WORKER_IMAGE", "value": "registry.example.com/kubetriton/worker:0.1.0"}
    ]
    assert "--verbose" not in container["args"]
    assert operator_main.router_settings(_parsed_args(container)) == RouterSettings()


def test_customized_values_reach_the_pod() -> None:
    deployment, container = _operator("customized")
    values = VALUE_SETS["customized"]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["metadata"]["name"] == "triton-operator"
    assert container["image"] == "registry.internal/ml/kubetriton-operator:0.2.0"
    assert container["imagePullPolicy"] == "Always"
    assert {"name": "KUBETRITON_WORKER_IMAGE", "value": "registry.internal/ml/worker:0.2.0"} in container[
        "env"
    ]
    assert "--verbose" in container["args"]
    assert operator_main.router_settings(_parsed_args(container)) == RouterSettings(
        image="registry.internal/mirror/haproxy:2.8.5",
        resources={"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},  # merged
        enabled_by_default=True,
        cluster_domain="corp.example",
        image_pull_secrets=[{"name": "mirror-pull"}],
        node_selector={"node-role.example.com/edge": "true"},
        tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    )
    assert container["resources"] == values["resources"]
    assert pod["serviceAccountName"] == "triton-operator-sa"
    assert pod["imagePullSecrets"] == values["imagePullSecrets"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["priorityClassName"] == values["priorityClassName"]
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    assert deployment["spec"]["template"]["metadata"]["annotations"] == values["podAnnotations"]
    account = installed("customized").one("ServiceAccount", "triton-operator-sa")
    assert account["metadata"]["name"] == "triton-operator-sa"
    assert account["metadata"]["annotations"]["example.com/role"] == "operator"


@pytest.mark.parametrize(
    ("name", "watched"), [("defaults", "every namespace"), ("two-namespaces", "team-a, team-b")]
)
def test_notes_say_what_is_watched_and_how_to_test(name: str, watched: str) -> None:
    notes = installed(name).release["info"]["notes"]
    assert watched in notes
    assert f"helm test kubetriton -n {NAMESPACE}" in notes
