"""`kubetriton operator` as a user starts it: a process, a kubeconfig, the namespaces to watch."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from conftest import eventually
from emulator import MODEL_CRD, ClusterEmulator
from test_operator_reconciler import (
    CRDS,
    create,
    create_model,
    create_namespace,
    model_document,
    stored,
    watching_crds,
)

from tests.conftest import free_ports

pytestmark = pytest.mark.asyncio


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


class OperatorProcess:
    """A running `kubetriton operator`; its log is in `log` once it has stopped."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.log = ""


@contextlib.asynccontextmanager
async def operator_process(
    cluster: ClusterEmulator, tmp_path: Path, *args: str
) -> AsyncIterator[OperatorProcess]:
    """The operator as a child process against the emulator; stopped with SIGTERM, as by Kubernetes."""
    config = write_kubeconfig(tmp_path / "kubeconfig", str(cluster.servers[0].url).rstrip("/"))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubetriton.cli",
        "operator",
        *args,
        env={**os.environ, "KUBECONFIG": str(config)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    running = OperatorProcess(process)
    try:
        yield running
    finally:
        process.send_signal(signal.SIGTERM)
        _, errors = await asyncio.wait_for(process.communicate(), 30)
        running.log = errors.decode()
        print(running.log)  # shown by pytest when the test fails
    assert process.returncode == 0, running.log[-2000:]


def watches_models(cluster: ClusterEmulator) -> bool:
    return any(r.resource is not None and r.resource.plural == "pytritonmodels" for r in cluster)


async def test_operator_command_watches_only_its_namespaces(cluster: ClusterEmulator, tmp_path: Path) -> None:
    for namespace in ("team-a", "team-b"):
        await create_namespace(cluster, namespace)
    cluster.rejections["services"] = lambda service: (
        "no Services here" if service["metadata"]["name"] == "refused" else None
    )
    async with operator_process(cluster, tmp_path, "--namespace", "team-a") as operator:
        await eventually(lambda: watches_models(cluster), timeout=30, message="the operator watches models")
        for namespace, name in (("team-b", "identity"), ("team-a", "identity"), ("team-a", "refused")):
            await create_model(cluster, model_document(name, namespace), namespace=namespace)
        await eventually(lambda: stored(cluster, "v1/services", "identity", "team-a"), timeout=20)
        await eventually(lambda: stored(cluster, "apps/v1/deployments", "refused", "team-a"), timeout=20)
        from_operator = [r for r in cluster if not r.headers.get("User-Agent", "").startswith("kmock")]
        assert {r.headers.get("Authorization") for r in from_operator} == {"Bearer test-token"}
        assert any(r.headers.get("User-Agent") == "kubetriton-operator" for r in from_operator)
        assert stored(cluster, "apps/v1/deployments", "identity", "team-b") is None
    lines = operator.log.splitlines()
    applied = [line for line in lines if "applied Deployment, Service" in line]
    refused = [line for line in lines if "no Services here" in line]
    assert applied and all("[team-a/identity] " in line or "[team-a/refused] " in line for line in applied)
    assert refused and all("[team-a/refused] " in line for line in refused)
    assert "ERROR" not in operator.log and "Traceback" not in operator.log


async def test_operator_command_watches_every_namespace_by_default(
    cluster: ClusterEmulator, tmp_path: Path
) -> None:
    for namespace in ("team-a", "team-b"):
        await create_namespace(cluster, namespace)
    async with operator_process(cluster, tmp_path):
        await eventually(lambda: watches_models(cluster), timeout=30, message="the operator watches models")
        for namespace in ("team-a", "team-b"):
            await create_model(cluster, model_document("identity", namespace), namespace=namespace)
        for namespace in ("team-a", "team-b"):
            await eventually(
                lambda ns=namespace: stored(cluster, "apps/v1/deployments", "identity", ns), timeout=20
            )


async def health(url: str) -> tuple[int, dict] | None:
    """The health endpoint's status and answer; None until it listens."""
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status, await response.json()
    except aiohttp.ClientConnectionError:
        return None


@pytest.mark.parametrize("cluster", [{"model_crd": False}], indirect=True)
async def test_health_says_whether_models_are_served(cluster: ClusterEmulator, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_ports(1)[0]}/healthz"
    async with operator_process(cluster, tmp_path, f"--liveness={url}"):
        await eventually(lambda: watching_crds(cluster), timeout=30, message="the operator watches CRDs")
        status, waiting = await eventually(lambda: health(url), timeout=30, message="the health endpoint")
        assert status == 503 and not waiting["serving"]
        assert "pytritonmodels.kubetriton.dev is not installed" in waiting["reason"]

        await create(cluster, CRDS, MODEL_CRD)

        async def serving() -> dict | None:
            answer = await health(url)
            return answer[1] if answer and answer[0] == 200 else None

        assert await eventually(serving, timeout=20, message="serving") == {"serving": True}
        await create_model(cluster, model_document("identity"))
        await eventually(lambda: stored(cluster, "v1/services", "identity"), timeout=20, message="children")
