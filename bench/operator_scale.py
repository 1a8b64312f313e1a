"""How the operator copes with many models at once: time to children, and its peak memory.

Starts the emulated API server of the operator tests in this process, runs the real
`kubetriton operator --all-namespaces` as a child process pointed at it through a kubeconfig,
creates N PyTritonModel objects at once, and reports how long it took until every model had its
Deployment and Service and a status, and the operator process's peak resident memory (VmHWM).

    python bench/operator_scale.py [--models 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kmock
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "operator"))

from emulator import ClusterEmulator  # noqa: E402

MODELS_PATH = "/apis/kubetriton.dev/v1alpha1/namespaces/bench/pytritonmodels"


def kubeconfig(server: str) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "bench"}}],
        "current-context": "emulator",
    }
    return yaml.safe_dump(config)


def model(index: int) -> dict:
    return {
        "apiVersion": "kubetriton.dev/v1alpha1",
        "kind": "PyTritonModel",
        "metadata": {"name": f"model-{index:04d}", "namespace": "bench"},
        "spec": {
            "worker": {"image": "registry.example.com/bench:1"},
            "models": ["Identity"],
            "replicas": 1 + index % 3,
            "gpus": {"count": index % 2},
        },
    }


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc")


def count(cluster: ClusterEmulator, plural: str) -> int:
    return sum(
        1
        for (resource, _, _), obj in cluster.objects.items()
        if resource.plural == plural and not obj.deleted
    )


def with_status(cluster: ClusterEmulator) -> int:
    return sum(
        1
        for (resource, _, _), obj in cluster.objects.items()
        if resource.plural == "pytritonmodels"
        and not obj.deleted
        and "observedGeneration" in obj.raw.get("status", {})
    )


async def create(cluster: ClusterEmulator, index: int) -> None:
    async with cluster.post(MODELS_PATH, json=model(index)) as response:
        response.raise_for_status()


async def wait_until(check, timeout: float, progress=None) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"gave up after {timeout:.0f} s" + (f": {progress()}" if progress else ""))
        await asyncio.sleep(0.1)
    return time.monotonic()


async def bench(models: int, timeout: float, log: Path | None) -> None:
    async with ClusterEmulator(record_requests=False) as cluster, kmock.Server(cluster) as server:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:
            config.write(kubeconfig(str(server.url).rstrip("/")))
            config.flush()
            env = {**os.environ, "KUBECONFIG": config.name}
            operator = subprocess.Popen(
                [sys.executable, "-m", "kubetriton.cli", "operator", "--all-namespaces"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log.open("w") if log else subprocess.DEVNULL,
            )
            try:
                await wait_until(
                    lambda: any(
                        r.resource is not None and r.resource.plural == "pytritonmodels" for r in cluster
                    ),
                    timeout=30,
                )
                started = time.monotonic()
                await asyncio.gather(*(create(cluster, index) for index in range(models)))
                created = time.monotonic()

                def progress() -> str:
                    deployments, services = count(cluster, "deployments"), count(cluster, "services")
                    return f"{deployments} Deployments, {services} Services, {with_status(cluster)} statuses"

                children = await wait_until(
                    lambda: count(cluster, "deployments") >= models and count(cluster, "services") >= models,
                    timeout,
                    progress,
                )
                statuses = await wait_until(lambda: with_status(cluster) >= models, timeout, progress)
                rss = peak_rss_mib(operator.pid)
            finally:
                operator.send_signal(signal.SIGTERM)
                operator.wait(timeout=30)
    print(f"models created:                 {models} in {created - started:.2f} s")
    print(f"all Deployments and Services:   {children - started:.2f} s after the first create")
    print(f"all statuses written:           {statuses - started:.2f} s after the first create")
    print(f"operator peak RSS (VmHWM):      {rss:.0f} MiB")
    print(f"operator exit code:             {operator.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--operator-log", type=Path, default=None, help="write the operator's log here")
    args = parser.parse_args()
    asyncio.run(bench(args.models, args.timeout, args.operator_log))


if __name__ == "__main__":
    main()
