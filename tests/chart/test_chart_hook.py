"""`helm test`: a CPU identity model in a watched namespace, and a restricted Pod that queries it
through the model's Service with the configured worker image. Both inline scripts also run here, in
local mode against a real tritonserver, so a script that cannot serve or query fails before a cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_cluster import requires_helm
from kubetriton.operator import children, naming, render
from releases import NAMESPACE, installed

from tests.conftest import free_ports

pytestmark = requires_helm


def _hooks(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    hooks = {obj["kind"]: obj for obj in installed(name).hooks}
    assert set(hooks) == {"PyTritonModel", "Pod"}
    return hooks["PyTritonModel"], hooks["Pod"]


def _script(command: list[str]) -> str:
    assert command[:2] == ["python", "-c"]
    return command[2]


TEST_NAMES = {"defaults": "kubetriton-test", "customized": "triton-operator-test"}


@pytest.mark.parametrize(
    ("name", "namespace", "image"),
    [
        ("defaults", NAMESPACE, "registry.example.com/kubetriton/worker:0.1.0"),
        ("two-namespaces", "team-a", "registry.example.com/kubetriton/worker:0.1.0"),
        ("customized", "models", "registry.internal/ml/worker:0.2.0"),
    ],
)
def test_the_test_queries_its_model_through_the_service(name: str, namespace: str, image: str) -> None:
    model, pod = _hooks(name)
    (container,) = pod["spec"]["containers"]
    assert model["metadata"]["namespace"] == pod["metadata"]["namespace"] == namespace
    assert model["spec"]["worker"]["image"] == container["image"] == image
    url = naming.http_url(model["metadata"]["name"], namespace)
    client = _script(container["command"])
    assert f'url = "{url}"' in client
    assert re.search(r'ModelClient\(url, "Identity"', client)
    assert model["spec"]["models"] == ["Identity"]
    assert 'model_name="Identity"' in _script(model["spec"]["worker"]["command"])


@pytest.mark.parametrize("name", ["defaults", "customized"])
def test_the_hook_scripts_are_python(name: str) -> None:
    model, pod = _hooks(name)
    compile(_script(model["spec"]["worker"]["command"]), "serve", "exec")
    compile(_script(pod["spec"]["containers"][0]["command"]), "client", "exec")


def test_the_operator_accepts_the_test_model() -> None:
    model, _ = _hooks("defaults")
    parsed = render.load_model(yaml.safe_dump(model))
    built = {obj["kind"]: obj for obj in children.desired(parsed, service_monitor=False)}
    assert set(built) == {"Deployment", "Service"}
    assert "nvidia.com" not in yaml.safe_dump(built["Deployment"]), "the test model must run on CPU"


def test_the_model_comes_first_and_the_pod_stays_for_its_logs() -> None:
    model, pod = _hooks("defaults")
    weight = int(model["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert weight < int(pod["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))
    assert (
        model["metadata"]["annotations"]["helm.sh/hook"]
        == pod["metadata"]["annotations"]["helm.sh/hook"]
        == "test"
    )
    assert "hook-succeeded" in model["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"


def test_the_test_pod_is_restricted() -> None:
    _, pod = _hooks("defaults")
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["restartPolicy"] == "Never"
    assert spec["serviceAccountName"] == "kubetriton-test"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_test_can_be_turned_off() -> None:
    assert installed("crd-not-kept").hooks == []


def test_the_hook_model_answers_the_hook_client(tmp_path: Path) -> None:
    """Both scripts for real, in local mode: the model's on a local Triton, the Pod's against it."""
    model, pod = _hooks("defaults")
    http, grpc, metrics = free_ports(3)
    ports = {"HTTP_PORT": http, "GRPC_PORT": grpc, "METRICS_PORT": metrics}
    environment = {
        **os.environ,
        **{f"PYTRITON_TRITON_CONFIG_{key}": str(port) for key, port in ports.items()},
    }
    cluster_url = naming.http_url(model["metadata"]["name"], model["metadata"]["namespace"])
    command = pod["spec"]["containers"][0]["command"]
    assert command[3:] == ["adopt", "query", "clean"]
    client = _script(command).replace(cluster_url, f"http://127.0.0.1:{http}")
    server = subprocess.Popen(
        [sys.executable, "-c", _script(model["spec"]["worker"]["command"])], env=environment, cwd=tmp_path
    )
    try:
        answer = subprocess.run(
            [sys.executable, "-c", client, "query"], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
    finally:
        server.terminate()
        server.wait(30)
    assert answer.returncode == 0, answer.stderr[-2000:]
    assert "identity holds" in answer.stdout


@pytest.mark.parametrize(("name", "namespace"), [("defaults", NAMESPACE), ("customized", "models")])
def test_the_test_may_touch_only_its_own_objects_which_uninstall_removes(name: str, namespace: str) -> None:
    """The test's ServiceAccount, Role and binding are release objects (uninstall deletes them, and with
    the ServiceAccount everything the test Pod made depend on it); each rule names one object."""
    release = installed(name)
    model, pod = _hooks(name)
    test_name = TEST_NAMES[name]
    manifest = {(obj["kind"], obj["metadata"]["name"]) for obj in release.manifest()}
    assert {("ServiceAccount", test_name), ("Role", test_name), ("RoleBinding", test_name)} <= manifest
    role = release.one("Role", test_name)
    assert role["metadata"]["namespace"] == namespace == pod["metadata"]["namespace"]
    assert pod["spec"]["serviceAccountName"] == test_name
    granted = {
        (resource, name_, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for name_ in rule["resourceNames"]
        for verb in rule["verbs"]
    }
    model_name = model["metadata"]["name"]
    assert granted == {
        ("pytritonmodels", model_name, "get"),
        ("pytritonmodels", model_name, "patch"),
        ("pytritonmodels", model_name, "delete"),
        ("pods", test_name, "get"),
        ("pods", test_name, "patch"),
        ("serviceaccounts", test_name, "get"),
    }
    (binding,) = [b for b in release.find("RoleBinding", test_name)]
    assert binding["roleRef"]["name"] == test_name
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": test_name, "namespace": namespace}]
    for obj in (model, pod, role, binding):
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "test"
