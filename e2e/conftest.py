"""Runs e2e only against a real cluster: with $KUBECONFIG set and the images named, else every test
here is skipped with the reason. Installs the chart once for the session and uninstalls it at the end,
checking that what the release created is gone and that the CRD was kept, as the chart promises."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import config

from e2e.cluster import CHART, CRD_NAME, Cluster, Settings, kubectl, split_image, wait_for

RELEASE = "kubetriton-e2e"
REQUIRED = ("KUBECONFIG", "KUBETRITON_E2E_OPERATOR_IMAGE", "KUBETRITON_E2E_WORKER_IMAGE")


def _missing() -> str | None:
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        return f"e2e needs a cluster: set {', '.join(missing)} (docs/e2e.md)"
    if importlib.util.find_spec("helm_sdkpy") is None:
        return "e2e installs the chart with helm-sdkpy (Python >= 3.12): pip install -e '.[test]'"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every e2e test, saying why, without a cluster; with one, give each the time its waits add up to
    (the suite's default limit is for tests that run in CI)."""
    reason = _missing()
    marker = (
        pytest.mark.skip(reason=reason)
        if reason
        else pytest.mark.timeout(Settings.from_environment().test_timeout_s)
    )
    for item in items:
        if item.nodeid.startswith("e2e/"):
            item.add_marker(marker)


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.from_environment()


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return Cluster(config.new_client_from_config())


def _helm_values(settings: Settings) -> dict[str, Any]:
    return {
        "image": {**split_image(settings.operator_image), "pullPolicy": "IfNotPresent"},
        "workerImage": split_image(settings.worker_image),
    }


def upgrade(settings: Settings, values: dict[str, Any]) -> None:
    """`helm upgrade --wait` of the e2e release, with a configuration of its own: helm learns the cluster's
    APIs when its configuration is made, and an API may have been added since."""
    import helm_sdkpy  # see helm_config

    config = helm_sdkpy.Configuration(namespace=settings.namespace)
    asyncio.run(helm_sdkpy.Upgrade(config).run(RELEASE, str(CHART), values=values, wait=True, timeout=600))


@pytest.fixture(scope="session")
def helm_config(settings: Settings) -> Any:
    import helm_sdkpy  # here, not at the top: collection must work where it cannot be installed

    return helm_sdkpy.Configuration(namespace=settings.namespace)


@pytest.fixture(scope="session")
def release(settings: Settings, cluster: Cluster, helm_config: Any) -> Iterator[dict[str, Any]]:
    """The chart, installed and available; uninstalled afterwards, and checked gone."""
    import helm_sdkpy  # see helm_config

    crd_existed = cluster.crd() is not None
    uninstall = helm_sdkpy.Uninstall(helm_config)
    with contextlib.suppress(helm_sdkpy.HelmError):  # left by a run that was killed before its teardown
        asyncio.run(uninstall.run(RELEASE, wait=True, timeout=300))
    try:
        installed = asyncio.run(
            helm_sdkpy.Install(helm_config).run(
                RELEASE,
                str(CHART),
                values=_helm_values(settings),
                create_namespace=True,
                wait=True,
                timeout=300,
                take_ownership=crd_existed,  # a CRD kept by an earlier release, or applied with kubectl
            )
        )
    except helm_sdkpy.HelmError:
        with contextlib.suppress(helm_sdkpy.HelmError):  # so that the next run can use the name again
            asyncio.run(uninstall.run(RELEASE, wait=True, timeout=300))
        raise
    cluster.ensure_namespace(settings.models_namespace)
    yield installed

    asyncio.run(uninstall.run(RELEASE, wait=True, timeout=300))
    left = kubectl(
        "get",
        "deployments,serviceaccounts,roles,rolebindings",
        "--all-namespaces",
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "-o",
        "name",
    ) + kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name"
    )
    assert left.strip() == "", f"left behind by helm uninstall:\n{left}"
    crd = cluster.crd()
    assert crd is not None, "helm uninstall deleted the CRD although crds.keep is true"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    if not crd_existed:
        kubectl("delete", "crd", CRD_NAME, "--wait=true")
        wait_for(lambda: cluster.crd() is None, 120, f"{CRD_NAME} to be deleted")
    for namespace in (settings.models_namespace, settings.namespace):
        kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
