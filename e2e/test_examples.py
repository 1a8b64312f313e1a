"""Each example's model.yaml, applied as a user would: its script's ConfigMap created from the example's
folder, then the model; Ready, answering over HTTP and gRPC through a port-forward to its Service, with
the children its spec calls for; deleted, and nothing left behind.

An example runs when the cluster has a node with the GPUs it asks for. A CPU example runs in the
kubetriton worker image (any image with Python and NumPy would do) unless KUBETRITON_E2E_IMAGE_<EXAMPLE>
names another; a GPU example needs that image (its model code needs more than NumPy). Otherwise it is
skipped, saying which.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kubetriton.operator import naming
from pytriton.client import ModelClient

from e2e import loadgen
from e2e.cluster import (
    Cluster,
    Settings,
    example_image,
    examples,
    kubectl,
    load_example,
    port_forward,
    script_config_map,
    wait_for,
)

PORTS = {"http": 8000, "grpc": 8001}


def _runnable(example: str, cluster: Cluster, settings: Settings) -> dict[str, Any]:
    """The example with its image, or a skip that says what is missing: first a node with its GPUs, then
    the image built for it."""
    gpus = load_example(example, "")["spec"].get("gpus") or {}
    model = load_example(
        example, example_image(example) or ("" if gpus.get("count") else settings.worker_image)
    )
    resource = gpus.get("resourceName", "nvidia.com/gpu")
    node_selector = (model["spec"].get("scheduling") or {}).get("nodeSelector")
    if gpus.get("count", 0) > cluster.allocatable(resource, node_selector):
        where = f" labelled {node_selector}" if node_selector else ""
        pytest.skip(f"{example} needs a node{where} with {gpus['count']} allocatable {resource}")
    if not model["spec"]["worker"]["image"]:
        pytest.skip(
            f"set KUBETRITON_E2E_IMAGE_{example.upper().replace('-', '_')} to the image built for {example}"
        )
    return model


def _check_answers(url: str, model_name: str) -> None:
    with ModelClient(url, model_name, init_timeout_s=60) as client:
        config = client.model_config
        inputs = loadgen.sample_inputs(config)
        outputs = loadgen.infer(client, inputs)
    assert set(outputs) == {spec.name for spec in config.outputs}
    if config.batching:
        assert all(np.shape(value)[0] == 1 for value in outputs.values()), {
            k: v.shape for k, v in outputs.items()
        }


@pytest.mark.parametrize("example", examples())
def test_example_serves_and_goes_away(
    example: str, release: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    model = _runnable(example, cluster, settings)
    name, namespace = model["metadata"]["name"], settings.models_namespace
    cluster.apply(script_config_map(example, model), namespace)
    cluster.apply(model, namespace)
    try:
        ready = wait_for(
            lambda: cluster.ready_model(name, namespace), settings.ready_timeout_s, f"{name} Ready"
        )
        spec = model["spec"]
        wanted = spec.get("replicas") or (spec.get("autoscaling") or {}).get("minReplicas", 1)
        assert ready["status"]["readyReplicas"] >= wanted

        children = cluster.children(name, namespace)
        services = sorted([name, naming.child_name(name, naming.PODS_SUFFIX)])  # the Service and the pods'
        assert children.get("Deployment") == [name], children
        assert sorted(children.get("Service", [])) == services, children
        assert ("PodDisruptionBudget" in children) == (wanted > 1)
        assert ("HorizontalPodAutoscaler" in children) == ("autoscaling" in spec)

        for protocol, port in PORTS.items():
            with port_forward(namespace, f"service/{name}", port) as local:
                for model_name in spec["models"]:
                    _check_answers(f"{protocol}://127.0.0.1:{local}", model_name)
    finally:
        kubectl("delete", "pytritonmodel", name, "-n", namespace, "--ignore-not-found", "--wait=true")
        kubectl("delete", "configmap", model["spec"]["worker"]["script"]["configMap"], "-n", namespace)
    wait_for(lambda: not cluster.children(name, namespace), 300, f"{name}'s children to be deleted")
