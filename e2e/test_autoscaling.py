"""Replicas that follow demand: the operator's own autoscaler on a real cluster.

A model whose callable takes 20 ms per batch (one instance per pod) is scaled on its queue time
(target 10 ms, 1 to 12 replicas); closed-loop ModelClient clients step from 1 to 12 and then away
(`e2e/demand.py` in a Pod, through the name of the model's pods, so that each request goes to a free
pod). The timeline (`e2e/timeline.py`) is printed every 5 s; the desired replicas are also read every
second, for the reaction time. With the kit's fake
GPUs (`up.sh --gpus 4`), a one-GPU model may ask for 8 pods: 4 run, the status says why the others
cannot, and the count stays put under steady load. On the kit's node, the leading operator is killed
during a scale-up: the standby continues from the replicas as they are.
"""

from __future__ import annotations

import calendar
import itertools
import json
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubetriton.operator import naming

from e2e.cluster import Cluster, Poller, Settings, kubectl, wait_for
from e2e.timeline import Sample, Timeline, demand_pod, slow_model

TARGET_MS = 10
MAX_REPLICAS = 6
"""For the tests of the GPU hold and of the leader's handover."""
BALANCED_MAX_REPLICAS = 12
SCALE_DOWN_WINDOW_S = 60
"""Shorter than the default 300 s, to keep the run short; the rule is the same."""
SAMPLE_EVERY_S = 5
LOAD_POD = "kubetriton-e2e-demand"


def _desired(cluster: Cluster, name: str, namespace: str) -> int | None:
    model = cluster.model(name, namespace) or {}
    return ((model.get("status") or {}).get("autoscaling") or {}).get("desiredReplicas")


class Watch(Poller):
    """Reads the model's desired replicas and its Deployment's replicas every second in a thread."""

    def __init__(self, cluster: Cluster, name: str, namespace: str) -> None:
        super().__init__()
        self.cluster, self.name, self.namespace = cluster, name, namespace
        self.seen: list[tuple[float, int | None, int | None]] = []

    def read(self) -> None:
        desired = _desired(self.cluster, self.name, self.namespace)
        replicas = self.cluster.apps.read_namespaced_deployment(self.name, self.namespace).spec.replicas
        self.seen.append((time.time(), desired, replicas))

    def changes(self, since: float, until: float) -> int:
        """How often the Deployment's replicas changed between the two times."""
        counts = [replicas for at, _, replicas in self.seen if since <= at <= until]
        return sum(1 for before, after in itertools.pairwise(counts) if before != after)


READY_REASONS = ("AllReplicasReady", "MinReplicasReady")


def contradictions(name: str, namespace: str) -> tuple[list[tuple[str, str, str]], list[tuple]]:
    """The model's own events that announce it Ready or not (time, reason, message), oldest first, and
    each pair of them written in the same second that says opposite things."""
    listed = kubectl(
        "get", "events", "-n", namespace, "-o", "json",
        "--field-selector", f"involvedObject.kind=PyTritonModel,involvedObject.name={name}",
    )  # fmt: skip
    said = sorted(
        (event.get("lastTimestamp") or event.get("eventTime") or "", event["reason"], event["message"])
        for event in json.loads(listed)["items"]
        if event["reason"] not in ("ScaledUp", "ScaledDown")
    )
    opposite = [
        (before, after)
        for before, after in itertools.pairwise(said)
        if before[0][:19] == after[0][:19] and (before[1] in READY_REASONS) != (after[1] in READY_REASONS)
    ]
    return said, opposite


def _follow(timeline: Timeline, until: Any, limit_s: float) -> list[Sample]:
    """Sample every 5 s, printing each line, until `until(sample)` or the limit."""
    print("\n" + Sample.HEADER)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        sample = timeline.sample()
        print(sample.line(), flush=True)
        if until(sample):
            break
        time.sleep(SAMPLE_EVERY_S)
    return timeline.samples


@pytest.fixture
def model_name(request: pytest.FixtureRequest, settings: Settings) -> Iterator[str]:
    name = request.param
    yield name
    kubectl(
        "delete", "pytritonmodel", name, "-n", settings.models_namespace, "--ignore-not-found", "--wait=true"
    )


@pytest.mark.parametrize("model_name", ["as-queue"], indirect=True)
def test_replicas_follow_the_queue_time_up_and_down_without_a_failed_request(
    release: dict[str, Any], cluster: Cluster, settings: Settings, model_name: str
) -> None:
    namespace = settings.models_namespace
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": BALANCED_MAX_REPLICAS,
        "targetQueueMilliseconds": TARGET_MS,
        "scaleDown": {"stabilizationSeconds": SCALE_DOWN_WINDOW_S},
    }
    cluster.apply(slow_model(model_name, settings.worker_image, autoscaling), namespace)
    cluster.wait_until_serving(model_name, namespace, 1, settings.ready_timeout_s)
    schedule = f"30:1,150:12,{SCALE_DOWN_WINDOW_S + 240}:0"
    pods = naming.pods_host(model_name, namespace)
    with (
        Watch(cluster, model_name, namespace) as watch,
        demand_pod(
            cluster, settings.worker_image, model_name, namespace, LOAD_POD, schedule, host=pods
        ) as timeline,
    ):
        time.sleep(2)

        def down_again(sample: Sample) -> bool:
            return sample.at > 190 and sample.replicas == 1 and sample.ready == 1

        samples = _follow(timeline, down_again, 30 + 150 + SCALE_DOWN_WINDOW_S + 240)
        phases = dict(timeline.phases())
        failures = timeline.failures()
    step = timeline.started + phases[12]
    raised = next((at for at, desired, _ in watch.seen if at >= step and (desired or 0) > 1), None)
    loaded = [s for s in samples if phases[12] <= s.at < phases[0]]
    under = next((s.at for s in loaded if s.queue_p50_ms is not None and s.queue_p50_ms < TARGET_MS), None)
    settled = [s.queue_p50_ms for s in loaded if under is not None and s.at >= under and s.queue_p50_ms]
    one_pod = statistics.median(s.queue_p50_ms for s in loaded if s.ready == 1 and s.queue_p50_ms)
    print(f"demand phases (s after start): {phases}; answers and failures: {failures}")
    print(f"desired replicas raised {raised - step if raised else None} s after the step")
    print(f"queue time p50 under {TARGET_MS} ms {under - phases[12] if under else None} s after the step")
    print(f"queue time p50 under load: {one_pod:.1f} ms at one pod; from then on {settled}")
    print(f"back at minReplicas {samples[-1].at - phases[0]:.0f} s after the load was removed")
    assert raised is not None and raised - step <= 15
    assert under is not None and under - phases[12] <= 60, "the queue time is back under its target in 60 s"
    assert statistics.median(settled) < TARGET_MS, "and stays there"
    assert samples[-1].replicas == 1, "the replicas fell back to minReplicas once the load was removed"
    for protocol, counts in failures.items():
        assert counts["ok"] > 0 and counts["failed"] == 0, (protocol, counts)
    said, opposite = contradictions(model_name, namespace)
    print("the model's Ready events, through the scale-up to 12 and back to 1:", *said, sep="\n  ")
    assert not opposite, "no two events in one second say opposite things"


@pytest.mark.parametrize(
    ("model_name", "target"),
    [
        ("as-gpus-in-flight", {"targetInFlightPerPod": 2}),
        ("as-gpus-queue", {"targetQueueMilliseconds": TARGET_MS}),
    ],
    indirect=["model_name"],
)
def test_pods_without_a_gpu_free_are_named_and_the_count_holds(
    release: dict[str, Any], cluster: Cluster, settings: Settings, model_name: str, target: dict[str, float]
) -> None:
    """Requests in flight (12 per pod at first, for a target of 2) ask for 6 pods at once, and so does
    the queue time (12 clients on one pod wait two or three batches, 40-55 ms, for a target of 10): a step
    of 4 makes 5, one of which cannot start, and the count holds."""
    namespace = settings.models_namespace
    gpus = cluster.allocatable("nvidia.com/gpu")
    if gpus < 2:
        pytest.skip("needs a node with fake or real GPUs: the kit's up.sh --gpus 4")
    autoscaling = {"minReplicas": 1, "maxReplicas": 2 * gpus, **target}
    cluster.apply(slow_model(model_name, settings.worker_image, autoscaling, gpus=1), namespace)
    cluster.wait_until_serving(model_name, namespace, 1, settings.ready_timeout_s)
    steady_s = 180
    with (
        Watch(cluster, model_name, namespace) as watch,
        demand_pod(
            cluster, settings.worker_image, model_name, namespace, LOAD_POD, f"{steady_s + 60}:12"
        ) as timeline,
    ):
        samples = _follow(timeline, lambda sample: sample.at > steady_s + 30, steady_s + 60)
        started = timeline.started
    model = cluster.model(model_name, namespace) or {}
    status = model.get("status") or {}
    autoscaling_status = status.get("autoscaling") or {}
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    changes = watch.changes(started, started + steady_s)
    held_since = next(
        at for at, _, replicas in watch.seen if at >= started and replicas == samples[-1].replicas
    )
    print(f"status.autoscaling: {autoscaling_status}")
    print(f"Degraded: {degraded}")
    print(f"replica changes over the first {steady_s} s of load: {changes}")
    print(f"the replicas unchanged from {held_since - started:.0f} s on")
    assert samples[-1].ready == gpus, f"one pod per GPU: {gpus} Ready"
    assert autoscaling_status["reason"] == "Unschedulable", autoscaling_status
    assert "no nvidia.com/gpu free" in autoscaling_status["message"]
    assert degraded["reason"] == "InsufficientGPU"
    assert watch.changes(held_since, time.time()) == 0
    assert changes <= 2


KIT = os.environ.get("KT_CLUSTER_DIR", "")


@pytest.mark.skipif(not KIT, reason="kills the operator's process on the kit's node: KT_CLUSTER_DIR and cri")
@pytest.mark.parametrize("model_name", ["as-leader"], indirect=True)
def test_a_new_leader_continues_from_the_replicas_during_a_scale_up(
    release: dict[str, Any], cluster: Cluster, settings: Settings, model_name: str
) -> None:
    from e2e.test_operations import _both_ready, _kill_container, _lease

    namespace = settings.models_namespace
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": MAX_REPLICAS,
        "targetQueueMilliseconds": TARGET_MS,
        "scaleUp": {"maxPods": 1, "periodSeconds": 20},
    }
    cluster.apply(slow_model(model_name, settings.worker_image, autoscaling), namespace)
    cluster.wait_until_serving(model_name, namespace, 1, settings.ready_timeout_s)
    wait_for(lambda: _both_ready(cluster, settings), 600, "two ready operators and a leader")
    with (
        Watch(cluster, model_name, namespace) as watch,
        demand_pod(cluster, settings.worker_image, model_name, namespace, LOAD_POD, "300:12"),
    ):
        wait_for(lambda: (_desired(cluster, model_name, namespace) or 0) >= 2, 60, "a first step up", 0.5)
        holder = _lease(cluster, settings).spec.holder_identity
        replicas_at_kill = cluster.apps.read_namespaced_deployment(model_name, namespace).spec.replicas
        killed = _kill_container(settings.namespace, holder.rsplit("_", 1)[0], "operator")
        took_over = wait_for(
            lambda: _lease(cluster, settings).spec.holder_identity not in (None, holder) and time.time(),
            120,
            "another operator to hold the Lease",
            0.2,
        )
        decided = wait_for(
            lambda: _decided_after(cluster, model_name, namespace, took_over),
            60,
            "the new leader's first decision",
            0.5,
        )
        time.sleep(5)
    lowest_after = min(replicas for at, _, replicas in watch.seen if at >= killed and replicas is not None)
    print(
        f"killed the leader at {replicas_at_kill} replicas; the standby held the Lease "
        f"{took_over - killed:.1f} s later and decided {decided - took_over:.1f} s after that; the fewest "
        f"replicas since the kill: {lowest_after}"
    )
    assert lowest_after >= replicas_at_kill, "the new leader started from the replicas as they were"
    assert decided - took_over <= 20


def _decided_after(cluster: Cluster, name: str, namespace: str, since: float) -> float | None:
    """When status.autoscaling was last decided, if that was after `since` (its stamp has whole seconds)."""
    model = cluster.model(name, namespace) or {}
    stamp = ((model.get("status") or {}).get("autoscaling") or {}).get("lastDecisionTime")
    if not stamp:
        return None
    decided = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    return decided if decided >= int(since) else None
