"""A rollout under load loses no request: while a Pod in the cluster queries the identity model through
its Service without pause, the model's worker image changes (KUBETRITON_E2E_IMAGE_IDENTITY_NEXT; without
it, an environment variable changes, which rolls the pods the same way). Every request must succeed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from e2e import loadgen
from e2e.cluster import Cluster, Settings, example_image, kubectl, load_example, wait_for

LOAD_POD = "kubetriton-e2e-load"


def _summary(log: str) -> dict[str, Any]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return lines[-1]


def test_rollout_under_load_fails_no_request(
    release: dict[str, Any], cluster: Cluster, settings: Settings
) -> None:
    image = example_image("identity")
    if image is None:
        pytest.skip("set KUBETRITON_E2E_IMAGE_IDENTITY to the image built for examples/identity")
    load_seconds = float(os.environ.get("KUBETRITON_E2E_LOAD_SECONDS", "300"))
    namespace = settings.models_namespace
    model = load_example("identity", image)
    name = model["metadata"]["name"] = "identity-rollout"
    model_name = model["spec"]["models"][0]
    cluster.apply_model(model, namespace)
    try:
        wait_for(lambda: cluster.ready_model(name, namespace), settings.ready_timeout_s, f"{name} Ready")
        url = f"http://{name}.{namespace}.svc:8000"
        source = Path(loadgen.__file__).read_text()
        cluster.run_pod(
            LOAD_POD,
            namespace,
            settings.worker_image,
            ["python", "-c", source, url, model_name, str(load_seconds)],
        )
        wait_for(lambda: '"started"' in cluster.pod_log(LOAD_POD, namespace), 300, "the load to start")

        next_image = example_image("identity_next")
        worker = model["spec"]["worker"]
        if next_image:
            worker["image"] = next_image
        else:
            worker["env"] = [
                *worker.get("env", []),
                {"name": "KUBETRITON_E2E_ROLL", "value": str(time.time())},
            ]
        cluster.apply_model(model, namespace)
        kubectl(
            "rollout",
            "status",
            f"deployment/{name}",
            "-n",
            namespace,
            f"--timeout={settings.ready_timeout_s:.0f}s",
        )
        wait_for(
            lambda: cluster.ready_model(name, namespace), settings.ready_timeout_s, f"{name} Ready again"
        )
        assert cluster.pod_phase(LOAD_POD, namespace) == "Running", (
            "the rollout outlasted the load: raise KUBETRITON_E2E_LOAD_SECONDS"
        )

        wait_for(
            lambda: cluster.pod_phase(LOAD_POD, namespace) in ("Succeeded", "Failed"),
            load_seconds + 120,
            "the load to finish",
        )
        summary = _summary(cluster.pod_log(LOAD_POD, namespace))
        assert summary["ok"] > 0
        assert summary["failed"] == 0, summary["failures"]
    finally:
        cluster.delete_pod(LOAD_POD, namespace)
        kubectl("delete", "pytritonmodel", name, "-n", namespace, "--ignore-not-found", "--wait=true")
