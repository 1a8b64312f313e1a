"""A real workload's needs on a real cluster: weights on a shared read-only volume, a token from a Secret, a
ServiceAccount of its own, and a load that outlasts the readiness checks.

The model is examples/weights-on-pvc/model.yaml in the worker image, with a test script in the ConfigMap it
names: the script sleeps longer than liveness would allow before it creates `Triton()` (as a script loading
multi-GB weights does), then serves what it read from the volume and the length of the token it got from
the Secret, and who the API server says its worker is, asked with the ServiceAccount's token (the
Triton container has none). The volume is a claim on a hostPath PersistentVolume (a one-node cluster
such as the kit or kind), or on KUBETRITON_E2E_STORAGE_CLASS where the cluster provisions volumes. It
must become Ready without a restart, its status saying Loading meanwhile.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import numpy as np
from pytriton.client import ModelClient

from e2e.cluster import (
    Cluster,
    Settings,
    kubectl,
    kubectl_path,
    load_example,
    port_forward,
    script_config_map,
    wait_for,
)

NAME = "embedder"
CLAIM, SECRET, TOKEN = "hf-cache", "hf-token", "not-a-real-token"
ACCOUNT = "embedder-reader"
API_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount"
FILL = "fill-weights"
WEIGHTS = "the weights, written once"
LOAD_S = 90
SERVE = f"""
import json
import os
import ssl
import time
import urllib.request

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

time.sleep({LOAD_S})  # loading weights before Triton() exists: only the startup probe's budget applies
weights = open(os.path.join(os.environ["HF_HOME"], "weights.txt"), "rb").read()
token_length = len(os.environ["HF_TOKEN"])
review = urllib.request.Request(
    "https://kubernetes.default.svc/apis/authentication.k8s.io/v1/selfsubjectreviews",
    data=json.dumps({{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}}).encode(),
    headers={{"Authorization": "Bearer " + open("{API_TOKEN}/token").read(),
             "Content-Type": "application/json"}},
)
cluster_ca = ssl.create_default_context(cafile="{API_TOKEN}/ca.crt")
with urllib.request.urlopen(review, context=cluster_ca) as answer:
    account = json.load(answer)["status"]["userInfo"]["username"]


@batch
def describe(x):
    return {{"weights": np.full((len(x), 1), weights, dtype=object),
             "token_length": np.full((len(x), 1), token_length, dtype=np.int64),
             "account": np.full((len(x), 1), account.encode(), dtype=object)}}


with Triton() as triton:
    triton.bind("Embedder", describe, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="weights", dtype=bytes, shape=(1,)),
                 Tensor(name="token_length", dtype=np.int64, shape=(1,)),
                 Tensor(name="account", dtype=bytes, shape=(1,))],
                config=ModelConfig(max_batch_size=4))
    triton.serve()
"""


def _volume(cluster: Cluster, namespace: str, storage_class: str | None) -> list[tuple[str, str]]:
    """The claim, on a hostPath volume unless a storage class is given; what to delete afterwards."""
    created = []
    if storage_class is None:
        storage_class = "kubetriton-e2e-hostpath"
        volume = f"{namespace}-{CLAIM}"
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": "10Mi"},
                    "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                    "storageClassName": storage_class,
                    "persistentVolumeReclaimPolicy": "Delete",
                    "hostPath": {"path": f"/tmp/{volume}", "type": "DirectoryOrCreate"},
                },
            }
        )
        created.append(("persistentvolume", volume))
    claim_spec = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": storage_class,
        "resources": {"requests": {"storage": "10Mi"}},
    }
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM}}
    cluster.apply({**claim, "spec": claim_spec}, namespace)
    created.append(("persistentvolumeclaim", CLAIM))
    return created


def _fill(cluster: Cluster, namespace: str, image: str) -> None:
    """Write the weights onto the claim once (as root: a hostPath directory belongs to root)."""
    writer = {
        "name": "fill",
        "image": image,
        "command": ["sh", "-c", f"mkdir -p /models/hf && printf '{WEIGHTS}' > /models/hf/weights.txt"],
        "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": False},
        "volumeMounts": [{"name": "weights", "mountPath": "/models"}],
    }
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [writer],
        "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": CLAIM}}],
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": FILL}}
    cluster.apply({**pod, "spec": pod_spec}, namespace)
    wait_for(lambda: cluster.pod_phase(FILL, namespace) in ("Succeeded", "Failed"), 300, "the fill")
    assert cluster.pod_phase(FILL, namespace) == "Succeeded", cluster.pod_log(FILL, namespace)
    cluster.delete_pod(FILL, namespace)


def test_weights_on_a_volume_a_secret_and_a_slow_load(
    release: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    namespace = settings.models_namespace
    storage_class = settings.storage_class
    created = _volume(cluster, namespace, storage_class)
    kubectl("create", "secret", "generic", SECRET, "-n", namespace, f"--from-literal=token={TOKEN}")
    created.append(("secret", SECRET))
    kubectl("create", "serviceaccount", ACCOUNT, "-n", namespace)
    created.append(("serviceaccount", ACCOUNT))
    model = load_example("weights-on-pvc", settings.worker_image)
    script = script_config_map("weights-on-pvc", model)
    script["data"] = {"serve.py": SERVE}
    cluster.apply(script, namespace)
    created.append(("configmap", script["metadata"]["name"]))
    model["spec"]["worker"]["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    model["spec"]["replicas"] = 1
    model["spec"]["serviceAccountName"] = ACCOUNT
    try:
        _fill(cluster, namespace, settings.worker_image)
        started = time.monotonic()
        cluster.apply(model, namespace)
        reasons: set[str] = set()

        def ready() -> dict[str, Any] | None:
            current = cluster.model(NAME, namespace) or {}
            for condition in (current.get("status") or {}).get("conditions", []):
                if condition["type"] == "Ready":
                    reasons.add(condition["reason"])
            return cluster.ready_model(NAME, namespace)

        wait_for(ready, settings.ready_timeout_s, f"{NAME} Ready", interval_s=1)
        assert time.monotonic() - started > LOAD_S
        assert "Loading" in reasons, reasons
        (pod,) = cluster.model_pods(NAME, namespace).values()
        restarts = {status.name: status.restart_count for status in pod.status.container_statuses}
        assert restarts == {"worker": 0}, restarts
        in_triton = ["exec", "-n", namespace, pod.metadata.name, "-c", "triton", "--", "ls", API_TOKEN]
        no_token = subprocess.run([kubectl_path(), *in_triton], capture_output=True, text=True, timeout=60)
        assert no_token.returncode != 0 and "No such file" in no_token.stderr, no_token
        with (
            port_forward(namespace, f"service/{NAME}", 8000) as local,
            ModelClient(f"http://127.0.0.1:{local}", "Embedder", init_timeout_s=60) as client,
        ):
            answer = client.infer_sample(np.ones(1, np.float32))
        assert answer["weights"][0] == WEIGHTS.encode()
        assert int(answer["token_length"][0]) == len(TOKEN)
        assert answer["account"][0] == f"system:serviceaccount:{namespace}:{ACCOUNT}".encode()
    finally:
        kubectl("delete", "pytritonmodel", NAME, "-n", namespace, "--ignore-not-found", "--wait=true")
        cluster.delete_pod(FILL, namespace)
        for kind, name in reversed(created):
            scope = [] if kind == "persistentvolume" else ["-n", namespace]
            kubectl("delete", kind, name, *scope, "--ignore-not-found", "--wait=false")
