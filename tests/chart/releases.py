"""The values the chart tests install with, and each install done once per test session."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from helm_cluster import Installed, install

RELEASE = "kubetriton"
NAMESPACE = "kubetriton-system"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "two-namespaces": {"watchNamespaces": ["team-a", "team-b"]},
    "release-namespace-only": {"watchNamespaces": [NAMESPACE]},
    "customized": {
        "fullnameOverride": "triton-operator",
        "image": {
            "repository": "registry.internal/ml/kubetriton-operator",
            "tag": "0.2.0",
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "crds": {"install": False},
        "rbac": {"aggregateToUserRoles": False},
        "serviceAccount": {"name": "triton-operator-sa", "annotations": {"example.com/role": "operator"}},
        "health": {"port": 9090},
        "verbose": True,
        "resources": {"requests": {"cpu": 1, "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "podLabels": {"team": "ml"},
        "podAnnotations": {"example.com/scrape": "false"},
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "watchNamespaces": ["models"],
        "workerImage": {"repository": "registry.internal/ml/worker", "tag": "0.2.0"},
        "router": {
            "enabledByDefault": True,
            "image": {"repository": "registry.internal/mirror/haproxy", "tag": "2.8.5"},
            "resources": {"requests": {"cpu": "50m"}},
            "imagePullSecrets": [{"name": "mirror-pull"}],
            "nodeSelector": {"node-role.example.com/edge": "true"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "clusterDomain": "corp.example",
    },
    "crd-not-kept": {"crds": {"keep": False}, "test": {"enabled": False}, "rbac": {"restrictWrites": False}},
}


@functools.cache
def installed(name: str) -> Installed:
    """The chart installed with VALUE_SETS[name] into a fresh emulator (once per session)."""
    return asyncio.run(install(VALUE_SETS[name], release=RELEASE, namespace=NAMESPACE))


def lease_name(release: Installed) -> str:
    """The Lease the release's operator is told to hold (its `--lease-name`)."""
    (operator,) = release.one("Deployment")["spec"]["template"]["spec"]["containers"]
    (lease,) = [arg.split("=", 1)[1] for arg in operator["args"] if arg.startswith("--lease-name=")]
    return lease
