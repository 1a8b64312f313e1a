"""The router's children: HAProxy's configuration, pods that are not the model's, and its Service."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
from kubetriton.operator import children, naming, reconciler, router
from kubetriton.operator import main as operator_main
from kubetriton.operator.router import RouterSettings
from test_operator_builders import KUBERNETES_VERSION, model_with

SETTINGS = RouterSettings(image="registry.example.com/haproxy:2.8", cluster_domain="corp.example")


def _label_selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_router_pods_are_not_the_models_pods() -> None:
    model = model_with(replicas=3, router=True)
    deployment = children.build_router_deployment(model, SETTINGS)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert not _label_selector_matches(naming.selector_labels("esm1"), pod_labels), "the model's Service"
    assert not _label_selector_matches(reconciler.MODEL_POD_LABELS, pod_labels), "the operator's count"
    assert _label_selector_matches(reconciler.ROUTER_POD_LABELS, pod_labels), "the operator reads them"
    assert _label_selector_matches(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    service = children.build_router_service(model, SETTINGS)
    budget = children.build_router_disruption_budget(model, SETTINGS)
    assert _label_selector_matches(service["spec"]["selector"], pod_labels)
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    for obj in (deployment, service, budget, children.build_router_config(model, SETTINGS)):
        assert obj["metadata"]["name"] == "esm1-router"
        assert obj["metadata"]["labels"] == naming.labels("esm1")


def test_two_non_root_haproxy_pods_read_the_config_map_and_roll_when_it_changes() -> None:
    model = model_with(router=True)
    deployment = children.build_router_deployment(model, SETTINGS)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/haproxy:2.8"
    assert container["resources"] == dict(router.DEFAULT_RESOURCES)
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    config = children.build_router_config(model, SETTINGS)["data"]["haproxy.cfg"]
    readiness = (
        "monitor-uri /readyz\n    monitor fail if { nbsrv(pods-http) lt 1 } || { nbsrv(pods-grpc) lt 1 }\n"
    )
    assert readiness in config, "ready only while each backend has a pod to send to"
    (volume,) = pod["volumes"]
    assert volume["configMap"]["name"] == "esm1-router"
    assert container["command"][-1] == f"{container['volumeMounts'][0]['mountPath']}/haproxy.cfg"

    def checksum(**changes: object) -> str:
        built = children.build_router_deployment(model_with(router=True, **changes), SETTINGS)
        return built["spec"]["template"]["metadata"]["annotations"][router.CONFIG_CHECKSUM_ANNOTATION]

    assert checksum() == checksum(replicas=5), "scaling does not roll the router"
    assert checksum() != checksum(drainSeconds=90)
    assert checksum() != checksum(autoscaling={"maxReplicas": 200})


def test_router_pods_run_where_the_operator_places_them() -> None:
    """The operator's pull secrets, nodeSelector and tolerations reach every router pod, which passes the
    Kubernetes schema; without them the pod names none."""
    placed = RouterSettings(
        image_pull_secrets=[{"name": "mirror-pull"}],
        node_selector={"node-role.example.com/edge": "true"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    )
    deployment = children.build_router_deployment(model_with(router=True), placed)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "mirror-pull"}]
    assert pod["nodeSelector"] == {"node-role.example.com/edge": "true"}
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ]
    kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    plain = children.build_router_deployment(model_with(router=True), SETTINGS)["spec"]["template"]["spec"]
    assert not {"imagePullSecrets", "nodeSelector", "tolerations"} & plain.keys()


@pytest.mark.parametrize(
    ("flag", "text", "message"),
    [
        ("--router-image-pull-secrets", '["regcred"]', '{"name": SECRET}'),
        ("--router-node-selector", '{"zone": 1}', "values (strings)"),
        ("--router-tolerations", '[{"key": "a", "efect": "NoSchedule"}]', "tolerationSeconds"),
        ("--router-tolerations", "[{", "not JSON"),
    ],
)
def test_the_operator_refuses_router_placement_it_cannot_use(
    flag: str, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    operator_main.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([f"{flag}={text}"])
    assert message in capsys.readouterr().err


def test_the_service_has_the_models_ports_and_the_routers_metrics() -> None:
    model = model_with(router=True, service={"type": "LoadBalancer", "ports": {"http": 80, "grpc": 81}})
    service = children.build_router_service(model, SETTINGS)
    assert service["spec"]["type"] == "ClusterIP"
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("http", 80, "http"),
        ("grpc", 81, "grpc"),
        ("metrics", router.METRICS_PORT, "metrics"),
    ]


def test_the_config_finds_the_pods_by_their_fully_qualified_name() -> None:
    text = children.build_router_config(model_with(router=True), SETTINGS)["data"]["haproxy.cfg"]
    assert "server-template pod 1-64 esm1-pods.models.svc.corp.example:8000\n" in text
    assert "server-template pod 1-64 esm1-pods.models.svc.corp.example:8001 proto h2" in text
    assert "bind :8001 proto h2" in text
    assert text.count("balance leastconn") == 2
    assert "parse-resolv-conf" in text
    assert "hard-stop-after 30s" in text
    many = router.config(model_with(autoscaling={"maxReplicas": 100}, router=True), SETTINGS)
    assert "server-template pod 1-100 " in many


@pytest.mark.skipif(
    shutil.which("haproxy") is None, reason="haproxy is not installed (apt-get install haproxy)"
)
def test_haproxy_accepts_the_config(tmp_path: Path) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text(router.config(model_with(router=True), SETTINGS))
    checked = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
