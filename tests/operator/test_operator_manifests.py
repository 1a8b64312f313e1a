"""Generated files stay current, examples render valid objects, and `kubetriton render` behaves as a CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from crd_acceptance import schema_nodes
from kubetriton.cli import main as kubetriton
from kubetriton.operator import manifests, rbac

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*/model.yaml"))


@pytest.mark.parametrize("path", sorted(manifests.generated()), ids=str)
def test_generated_files_are_current(path: Path) -> None:
    assert (ROOT / path).read_text() == manifests.generated()[path], (
        f"{path} is stale: run `python -m kubetriton.operator.manifests` from the repository root"
    )


def test_crd_and_rbac_pass_the_kubernetes_schemas() -> None:
    documents = [yaml.safe_load((ROOT / manifests.CRD_PATH).read_text()), *rbac.manifests()]
    for document in documents:
        kubernetes_validate.validate(document, "1.37.0", strict=True)


def test_crd_objects_keep_their_fields_and_subresources_are_set() -> None:
    """No object in the schema has every field pruned unless metadata (the API server's own)."""
    crd = yaml.safe_load((ROOT / manifests.CRD_PATH).read_text())
    version = crd["spec"]["versions"][0]
    for where, node in schema_nodes(version["schema"]["openAPIV3Schema"]):
        if node.get("type") == "object" and where != ".metadata":
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields")
            ), f"{where} is an untyped object"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c.get("priority", 0) for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Ready": 0,
        "Replicas": 0,
        "Available": 0,
        "Desired": 0,
        "Targets": 0,
        "Models": 0,
        "GPUs": 0,
        "Age": 0,
        "Reason": 1,
        "Processes": 1,
        "URL": 1,
    }


def test_rbac_grants_only_what_the_operator_uses() -> None:
    grants = {
        (rule["apiGroups"][0], resource): set(rule["verbs"])
        for rule in rbac.RULES
        for resource in rule["resources"]
    }
    assert grants[("", "pods")] == {"list", "watch"}
    assert grants[("", "events")] == {"list", "watch", "create"}  # read: pods' warnings; kopf only posts
    assert grants[("kubetriton.dev", "pytritonmodels")] == {"list", "watch"}  # never read one by one
    # every child is deleted once its model no longer wants it: a router's Deployment and ConfigMap too;
    # and read before the model's first apply, so that an object of its name that is not the model's is
    # not taken over
    assert grants[("apps", "deployments")] == {"get", "list", "watch", "create", "patch", "delete"}
    assert grants[("", "configmaps")] == {"get", "list", "watch", "create", "patch", "delete"}
    assert grants[("kubetriton.dev", "pytritonmodels/status")] == {"patch"}
    assert all("*" not in verbs and "update" not in verbs for verbs in grants.values())
    assert ("", "secrets") not in grants


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_examples_render(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kubetriton(["render", str(path), "-n", "demo"]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert documents[0]["kind"] == "Deployment"
    for document in documents:
        assert document["metadata"]["namespace"] == "demo"
        kubernetes_validate.validate(document, "1.37.0", strict=True)


def test_examples_cover_cpu_one_gpu_two_gpus_and_weights_on_a_volume() -> None:
    specs = {path.parent.name: yaml.safe_load(path.read_text())["spec"] for path in EXAMPLES}
    gpus = {name: spec.get("gpus", {}).get("count", 0) for name, spec in specs.items()}
    assert gpus == {"identity": 0, "esm1": 1, "multi-instance": 2, "weights-on-pvc": 0}
    (claim,) = specs["weights-on-pvc"]["volumes"]
    assert claim["persistentVolumeClaim"]["readOnly"] is True


def test_render_rejects_a_bad_spec_readably(tmp_path: Path) -> None:
    bad = tmp_path / "model.yaml"
    bad.write_text(
        "apiVersion: kubetriton.dev/v1alpha1\nkind: PyTritonModel\nmetadata: {name: bad}\n"
        "spec:\n  worker: {image: w}\n  models: [ok, -not-ok]\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "render", str(bad)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert "spec.models: '-not-ok': each model name must be" in result.stderr
    assert "Traceback" not in result.stderr
    not_text = tmp_path / "weights.bin"
    not_text.write_bytes(b"\xff\xfe")
    result = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "render", str(not_text)], capture_output=True, text=True
    )
    assert result.returncode == 1 and f"cannot read {not_text}: 'utf-8' codec" in result.stderr, result.stderr
    missing = tmp_path / "missing.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "render", str(missing)], capture_output=True, text=True
    )
    assert (result.returncode, result.stderr) == (
        1,
        f"kubetriton render: cannot read {missing}: No such file or directory\n",
    )


def test_render_takes_the_model_from_what_deploy_prints(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text("triton.bind(model_name='Lengths', infer_func=f)\n")
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetriton.cli",
            "deploy",
            str(script),
            "--image",
            "x",
            "--dry-run=client",
            "-o",
            "yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "KUBECONFIG": str(tmp_path / "none")},
    ).stdout
    rendered = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "render", "-"], input=printed, capture_output=True, text=True
    )
    assert rendered.returncode == 0, rendered.stderr
    assert [d["kind"] for d in yaml.safe_load_all(rendered.stdout)] == ["Deployment", "Service", "Service"]
    twice = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "render", "-"],
        input=printed + "---\n" + printed,
        capture_output=True,
        text=True,
    )
    assert twice.returncode == 1 and "holds 2 PyTritonModels in 4 documents" in twice.stderr


def test_render_reads_standard_input_and_adds_the_service_monitor_on_request() -> None:
    text = (ROOT / "examples/identity/model.yaml").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "render", "-", "--service-monitor"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout)]
    assert kinds == ["Deployment", "Service", "Service", "ServiceMonitor"]
    assert all(d["metadata"]["namespace"] == "default" for d in yaml.safe_load_all(result.stdout))
