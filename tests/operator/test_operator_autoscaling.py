"""The operator's own autoscaler, running for real against the emulated API server.

The emulator has no controllers: a stand-in for the Deployment's and the ReplicaSet's controllers here
keeps as many Ready pods as the Deployment asks for, and reports them in the Deployment's status a moment
after its spec changed, as they do. Every pod's address leads to one real local Triton serving a model
that takes 20 ms per batch, so the signal the autoscaler reads is real: closed-loop clients make
requests wait about one batch in Triton's queue, and without clients nothing waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
from conftest import eventually
from emulator import ClusterEmulator
from kubetriton.operator import autoscaler, naming
from prometheus_client import CollectorRegistry, generate_latest
from pytriton.client import ModelClient
from test_operator_reconciler import (
    CHILD_APIS,
    MODELS,
    StartOperator,
    create,
    create_model,
    delete,
    events,
    model_document,
    patch,
    set_deployment_status,
    status_of,
    stored,
)
from test_signals import slow_triton  # noqa: F401 (a fixture)

pytestmark = pytest.mark.asyncio

INTERVAL = 0.3
POD_IP = "127.0.0.1"
SILENT_IP = "198.51.100.7"
"""An address nothing answers from (TEST-NET-2)."""
GPU_SHORT = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
PODS = "/api/v1/namespaces/default/pods"


def scaled(name: str = "slow", **autoscaling: Any) -> dict[str, Any]:
    spec = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "targetQueueMilliseconds": 5,
        "scaleDown": {"stabilizationSeconds": 2},
        **autoscaling,
    }
    document = model_document(name, autoscaling=spec)
    document["spec"]["models"] = ["Slow"]
    return document


def replicas(cluster: ClusterEmulator, name: str = "slow") -> int | None:
    deployment = stored(cluster, CHILD_APIS["Deployment"], name)
    return None if deployment is None else deployment["spec"].get("replicas")


def autoscaling_status(cluster: ClusterEmulator, name: str = "slow") -> dict[str, Any]:
    return status_of(cluster, name).get("autoscaling") or {}


async def decision(cluster: ClusterEmulator, reason: str, timeout: float = 10) -> dict[str, Any]:
    """status.autoscaling once it gives `reason`."""
    return await eventually(
        lambda: autoscaling_status(cluster).get("reason") == reason and autoscaling_status(cluster),
        timeout,
        message=f"a decision: {reason}",
    )


def pod(name: str, model_name: str, ip: str, *, ready: bool = True, pending: str = "") -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if pending:
        conditions = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": pending}
        ]
    status = {"phase": "Pending" if pending else "Running", "conditions": conditions}
    if not pending:
        status["podIP"] = ip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": naming.labels(model_name)},
        "spec": {"containers": [{"name": "worker", "image": "w"}]},
        "status": status,
    }


class ReplicaSets:
    """Keeps `Ready` pods of a model in line with its Deployment's replicas, `ip` their address, and the
    Deployment's status in line with them; with `schedulable` set, pods beyond it stay Pending for want
    of a GPU."""

    def __init__(self, cluster: ClusterEmulator, model_name: str, ip: str = POD_IP) -> None:
        self.cluster, self.model_name, self.ip = cluster, model_name, ip
        self.schedulable: int | None = None
        self.pods: list[str] = []
        self.pending: set[str] = set()

    async def run(self) -> None:
        reported = None
        while True:
            wanted = replicas(self.cluster, self.model_name) or 0
            while len(self.pods) < wanted:
                name = f"{self.model_name}-{len(self.pods)}"
                short = self.schedulable is not None and len(self.pods) >= self.schedulable
                await create(
                    self.cluster,
                    PODS,
                    pod(name, self.model_name, self.ip, pending=GPU_SHORT if short else ""),
                )
                self.pods.append(name)
                if short:
                    self.pending.add(name)
            while len(self.pods) > wanted:
                await delete(self.cluster, f"{PODS}/{self.pods.pop()}")
            deployment = stored(self.cluster, CHILD_APIS["Deployment"], self.model_name)
            ready = len(set(self.pods) - self.pending)
            now = (deployment["metadata"]["generation"], len(self.pods), ready) if deployment else None
            if now is not None and now != reported:
                await set_deployment_status(
                    self.cluster, self.model_name, ready=ready, replicas=len(self.pods)
                )
                reported = now
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def replica_sets(
    cluster: ClusterEmulator, model_name: str = "slow", ip: str = POD_IP
) -> AsyncIterator[ReplicaSets]:
    controller = ReplicaSets(cluster, model_name, ip)
    task = asyncio.create_task(controller.run())
    try:
        yield controller
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.contextmanager
def load(http_port: int, clients: int = 4) -> Iterator[None]:
    """Closed-loop clients of the slow model: each request waits about one batch in the queue."""
    stop = threading.Event()

    def client() -> None:
        with ModelClient(f"localhost:{http_port}", "Slow") as model:
            while not stop.is_set():
                model.infer_sample(x=np.ones(1, np.float32))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


@pytest.fixture
def options(slow_triton: tuple[int, int]) -> dict[str, Any]:  # noqa: F811 (the fixture above)
    return {"autoscaler_options": {"interval": INTERVAL, "metrics_port": slow_triton[1]}}


async def test_replicas_follow_the_queue_time_without_an_hpa(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    slow_triton: tuple[int, int],  # noqa: F811
    options: dict[str, Any],
):
    operator = await start_operator(**options)
    await create_model(cluster, scaled())
    await eventually(lambda: replicas(cluster) == 1, message="the Deployment at minReplicas")
    async with replica_sets(cluster):
        steady = await decision(cluster, autoscaler.AT_MINIMUM)
        assert steady["currentValue"] == 0 and steady["targets"] == "queue 0ms/5ms"
        assert stored(cluster, CHILD_APIS["HorizontalPodAutoscaler"], "slow") is None
        with load(slow_triton[0]):
            await eventually(lambda: replicas(cluster) == 4, timeout=30, message="a scale-up to maxReplicas")
            up = await eventually(lambda: events(cluster, autoscaler.SCALED_UP), message="an event")
            assert up[0]["type"] == "Normal" and "1 → 4 replicas" in up[0]["message"]
            managers = {
                entry["manager"]
                for entry in stored(cluster, CHILD_APIS["Deployment"], "slow")["metadata"]["managedFields"]
                if "f:replicas" in str(entry["fieldsV1"])
            }
            assert "kubetriton-autoscaler" in managers
            at_max = await decision(cluster, autoscaler.AT_MAXIMUM, timeout=30)
            assert at_max["desiredReplicas"] == 4 and at_max["currentValue"] > 5
            scaler = operator.reconciler.autoscaler.scalers[("default", "slow")]
            await eventually(
                lambda: scaler.observation.measured == 4, message="every pod read twice, and measured"
            )
        await eventually(lambda: replicas(cluster) == 1, timeout=30, message="a scale-down after the window")
        down = await eventually(lambda: events(cluster, autoscaler.SCALED_DOWN), message="an event")
        assert "4 → 1 replicas" in down[0]["message"]
        await eventually(
            lambda: status_of(cluster, "slow").get("readyReplicas") == 1, message="the scale-down reported"
        )
        # Every pod was Ready all along: the model became Ready once, and no event said otherwise.
        said = sorted(
            (event["reason"], event["message"])
            for event in events(cluster)
            if event["involvedObject"]["kind"] == "PyTritonModel"
            and event["reason"] not in (autoscaler.SCALED_UP, autoscaler.SCALED_DOWN)
        )
        assert [reason for reason, _ in said] == ["AllReplicasReady"], said
        registry = CollectorRegistry()
        registry.register(operator.reconciler.autoscaler.collector())
        exposition = generate_latest(registry).decode()
        assert (
            'kubetriton_autoscaler_desired_replicas{namespace="default",pytritonmodel="slow"} 1.0'
            in exposition
        )
        scalings = (
            'kubetriton_autoscaler_scalings_total{direction="%s",namespace="default",pytritonmodel="slow"}'
        )
        assert f"{scalings % 'up'} 1.0" in exposition and f"{scalings % 'down'} 1.0" in exposition


async def test_the_reconciler_leaves_the_autoscalers_replicas_alone(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    slow_triton: tuple[int, int],  # noqa: F811
    options: dict[str, Any],
):
    await start_operator(**options)
    await create_model(cluster, scaled(scaleDown={"stabilizationSeconds": 600}))
    async with replica_sets(cluster):
        with load(slow_triton[0]):
            await eventually(lambda: replicas(cluster) == 4, timeout=30, message="a scale-up")
        generation = stored(cluster, CHILD_APIS["Deployment"], "slow")["metadata"]["generation"]
        await patch(
            cluster,
            MODELS.format(ns="default") + "/slow",
            {"spec": {"worker": {"image": "registry.example.com/slow:2"}}},
        )
        await eventually(
            lambda: (
                stored(cluster, CHILD_APIS["Deployment"], "slow")["spec"]["template"]["spec"]["containers"][
                    0
                ]["image"]
                == "registry.example.com/slow:2"
            ),
            message="the new image applied",
        )
        assert replicas(cluster) == 4
        await patch(
            cluster, MODELS.format(ns="default") + "/slow", {"spec": {"autoscaling": {"maxReplicas": 3}}}
        )
        await eventually(lambda: replicas(cluster) == 3, message="lowered to the new maxReplicas")
        assert stored(cluster, CHILD_APIS["Deployment"], "slow")["metadata"]["generation"] > generation


async def test_a_new_operator_continues_from_the_replicas_as_they_are(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    slow_triton: tuple[int, int],  # noqa: F811
    options: dict[str, Any],
):
    first = await start_operator(**options)
    await create_model(cluster, scaled(scaleDown={"stabilizationSeconds": 4}))
    async with replica_sets(cluster):
        with load(slow_triton[0]):
            await eventually(lambda: replicas(cluster) == 4, timeout=30, message="a scale-up")
        await asyncio.to_thread(first.stop)
        # Under the load, the first operator may have found the model at its maximum after the step.
        left = autoscaling_status(cluster)
        assert left["reason"] in (autoscaler.SCALED_UP, autoscaler.AT_MAXIMUM)
        assert left["desiredReplicas"] == 4 and "lastScaleTime" in left
        restarted = time.monotonic()
        await start_operator(**options)
        stabilizing = await eventually(
            lambda: autoscaling_status(cluster) != left and autoscaling_status(cluster),
            timeout=20,
            message="the new operator's first decision",
        )
        assert stabilizing["reason"] == autoscaler.STABILIZING and replicas(cluster) == 4
        await eventually(
            lambda: replicas(cluster) == 1, timeout=30, message="a scale-down once its window passed"
        )
        assert time.monotonic() - restarted >= 4


async def test_pods_that_cannot_be_scheduled_hold_the_scale_up(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    slow_triton: tuple[int, int],  # noqa: F811
    options: dict[str, Any],
):
    await start_operator(**options)
    document = scaled(maxReplicas=8, scaleUp={"maxPods": 2})
    document["spec"]["gpus"] = {"count": 1}
    await create_model(cluster, document)
    async with replica_sets(cluster) as controller:
        controller.schedulable = 2
        with load(slow_triton[0]):
            held = await decision(cluster, autoscaler.UNSCHEDULABLE, timeout=30)
            assert "cannot be scheduled, no nvidia.com/gpu free" in held["message"]
            assert replicas(cluster) == 3, "one step of two pods, one of which is Pending"
            warning = await eventually(lambda: events(cluster, autoscaler.UNSCHEDULABLE), message="a warning")
            assert warning[0]["type"] == "Warning"
            await asyncio.sleep(10 * INTERVAL)
            assert replicas(cluster) == 3
            assert len(events(cluster, autoscaler.SCALED_UP)) == 1
            assert len(events(cluster, autoscaler.UNSCHEDULABLE)) == 1


async def test_pods_that_do_not_answer_leave_the_replicas_alone(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    options: dict[str, Any],
):
    await start_operator(**options)
    await create_model(cluster, scaled(minReplicas=2))
    async with replica_sets(cluster, ip=SILENT_IP):
        silent = await decision(cluster, autoscaler.NO_METRICS, timeout=20)
        assert silent["targets"] == "queue ?/5ms" and "currentValue" not in silent
        await asyncio.sleep(5 * INTERVAL)
        assert replicas(cluster) == 2 and not events(cluster, autoscaler.SCALED_DOWN)


async def test_a_model_whose_apply_hangs_holds_up_no_other_models_scaling(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    slow_triton: tuple[int, int],  # noqa: F811
    options: dict[str, Any],
):
    """The stuck model's new spec waits for an API server that does not answer, under the model's lock,
    which its autoscaler step waits for; the other model scales all the same."""
    await start_operator(request_timeout=600, **options)
    await create_model(cluster, scaled())
    await create_model(cluster, scaled("stuck"))
    await eventually(lambda: replicas(cluster) == replicas(cluster, "stuck") == 1, message="both Deployments")
    cluster.held.add("deployments/stuck")
    try:
        image = {"spec": {"worker": {"image": "registry.example.com/stuck:2"}}}
        await patch(cluster, MODELS.format(ns="default") + "/stuck", image)
        async with replica_sets(cluster), replica_sets(cluster, "stuck", ip=SILENT_IP):
            with load(slow_triton[0]):
                await eventually(lambda: replicas(cluster) == 4, timeout=30, message="a scale-up")
        assert replicas(cluster, "stuck") == 1
    finally:
        cluster.held.clear()


async def test_switching_between_the_hpa_and_the_operator(
    cluster: ClusterEmulator,
    start_operator: StartOperator,
    options: dict[str, Any],
):
    await start_operator(**options)
    await create_model(cluster, model_document("slow", autoscaling={"minReplicas": 2, "maxReplicas": 4}))
    await eventually(lambda: stored(cluster, CHILD_APIS["HorizontalPodAutoscaler"], "slow"), message="an HPA")
    async with replica_sets(cluster):
        own = {"minReplicas": 2, "maxReplicas": 4, "targetQueueMilliseconds": 5}
        await patch(
            cluster, MODELS.format(ns="default") + "/slow", {"spec": {"autoscaling": own, "models": ["Slow"]}}
        )
        await eventually(
            lambda: stored(cluster, CHILD_APIS["HorizontalPodAutoscaler"], "slow") is None,
            message="the HPA deleted",
        )
        await eventually(
            lambda: autoscaling_status(cluster).get("reason"), timeout=20, message="the operator's decision"
        )
        cpu = {"targetQueueMilliseconds": None, "targetCPUUtilization": 70}
        await patch(cluster, MODELS.format(ns="default") + "/slow", {"spec": {"autoscaling": cpu}})
        await eventually(
            lambda: stored(cluster, CHILD_APIS["HorizontalPodAutoscaler"], "slow"), message="the HPA again"
        )
        await eventually(
            lambda: "autoscaling" not in status_of(cluster, "slow"), message="status.autoscaling gone"
        )
