"""values.schema.json: Helm refuses bad values before it touches the cluster, and takes good ones."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import pytest
import yaml
from chart_files import CHART
from helm_cluster import HelmFailed, install, requires_helm

pytestmark = requires_helm

SCHEMA = json.loads((CHART / "values.schema.json").read_text())

BAD_VALUES: dict[str, dict[str, Any]] = {
    "glob namespace": {"watchNamespaces": ["team-*"]},
    "namespace with capitals": {"watchNamespaces": ["Team-A"]},
    "repeated namespace": {"watchNamespaces": ["a", "a"]},
    "namespaces as a string": {"watchNamespaces": "team-a"},
    "unknown top-level key": {"replicas": 2},
    "misspelt nested key": {"crds": {"instal": False}},
    "crds.keep not a boolean": {"crds": {"keep": "yes"}},
    "unknown pull policy": {"image": {"pullPolicy": "Sometimes"}},
    "empty image repository": {"image": {"repository": ""}},
    "privileged health port": {"health": {"port": 80}},
    "health port as a string": {"health": {"port": "8080"}},
    "root operator": {"podSecurityContext": {"runAsNonRoot": False}},
    "privilege escalation": {"securityContext": {"allowPrivilegeEscalation": True}},
    "non-root taken out with a null": {"podSecurityContext": {"runAsNonRoot": None}},
    "privilege escalation taken out with a null": {"securityContext": {"allowPrivilegeEscalation": None}},
    "existing account without a name": {"serviceAccount": {"create": False}},
    "test timeout too short": {"test": {"readyTimeoutSeconds": 5}},
    "resources with an unknown section": {"resources": {"request": {"cpu": "1"}}},
    "router on by default as a string": {"router": {"enabledByDefault": "yes"}},
    "router image without a repository": {"router": {"image": {"repository": "", "tag": "2.8"}}},
    "cluster domain with a trailing dot": {"clusterDomain": "cluster.local."},
    "router pull secret as a string": {"router": {"imagePullSecrets": ["regcred"]}},
    "router node label as a number": {"router": {"nodeSelector": {"zone": 1}}},
    "router toleration with a misspelt field": {
        "router": {"tolerations": [{"key": "a", "efect": "NoSchedule"}]}
    },
    "toleration with an unknown effect": {"tolerations": [{"key": "a", "effect": "Sometimes"}]},
}

GOOD_VALUES: dict[str, dict[str, Any]] = {
    "single namespace": {"watchNamespaces": ["ml-serving"]},
    "existing account": {"serviceAccount": {"create": False, "name": "operator"}},
    "integer cpu": {"resources": {"requests": {"cpu": 2}}},
    "no test hook": {"test": {"enabled": False}},
    "routers for every model": {"router": {"enabledByDefault": True}},
    "routers on tainted nodes": {
        "router": {
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
        }
    },
}


def test_values_yaml_satisfies_its_schema() -> None:
    jsonschema.Draft7Validator(SCHEMA).validate(yaml.safe_load((CHART / "values.yaml").read_text()))


@pytest.mark.parametrize("values", BAD_VALUES.values(), ids=BAD_VALUES)
def test_helm_refuses_bad_values(values: dict[str, Any]) -> None:
    with pytest.raises(HelmFailed, match="schema"):
        asyncio.run(install(values))


@pytest.mark.parametrize("values", GOOD_VALUES.values(), ids=GOOD_VALUES)
def test_helm_takes_good_values(values: dict[str, Any]) -> None:
    assert asyncio.run(install(values)).one("Deployment")
