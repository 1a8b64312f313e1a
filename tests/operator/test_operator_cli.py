"""`kubetriton operator` as a user starts it: a process, a kubeconfig, a namespace to watch."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import eventually
from emulator import ClusterEmulator
from test_operator_reconciler import create_model, model_document, stored


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server}}],
                "users": [{"name": "test", "user": {"token": "test-token"}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                "current-context": "test",
            }
        )
    )
    return path


@pytest.mark.asyncio
async def test_operator_command_watches_only_its_namespace(cluster: ClusterEmulator, tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", str(cluster.servers[0].url).rstrip("/"))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubetriton.cli",
        "operator",
        "--namespace",
        "team-a",
        env={**os.environ, "KUBECONFIG": str(config)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(
            lambda: any(r.resource is not None and r.resource.plural == "pytritonmodels" for r in cluster),
            timeout=30,
            message="the operator watches models",
        )
        for namespace in ("team-b", "team-a"):
            document = model_document("identity")
            document["metadata"]["namespace"] = namespace
            await create_model(cluster, document, namespace=namespace)
        await eventually(lambda: stored(cluster, "apps/v1/deployments", "identity", "team-a"), timeout=20)
        from_operator = [r for r in cluster if not r.headers.get("User-Agent", "").startswith("kmock")]
        assert {r.headers.get("Authorization") for r in from_operator} == {"Bearer test-token"}
        assert any(r.headers.get("User-Agent") == "kubetriton-operator" for r in from_operator)
        assert stored(cluster, "apps/v1/deployments", "identity", "team-b") is None
    finally:
        process.send_signal(signal.SIGTERM)
        _, errors = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, errors.decode()[-2000:]


def test_operator_command_needs_a_scope() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "operator"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "one of the arguments -n/--namespace -A/--all-namespaces is required" in result.stderr
