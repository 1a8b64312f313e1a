"""The autoscaler's rule, table by table: the proportional rule and its tolerance, the stabilization
windows, the step limit, the bounds, the hold for pods that cannot be scheduled, and no decision
without data. Each case is a sequence of observations at given times, with the decision expected
after each; a decided change is taken as applied before the next observation."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from kubetriton.operator import autoscaler
from kubetriton.operator.autoscaler import Observation, Policy
from kubetriton.operator.spec import AutoscalingSpec

GPU_SHORT = (
    "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: "
    "1 No preemption victims found for incoming pod."
)


def policy(**fields: Any) -> Policy:
    return Policy.of(
        AutoscalingSpec.model_validate({"maxReplicas": 6, "targetQueueMilliseconds": 10, **fields})
    )


@dataclass(frozen=True)
class Step:
    """At `at` seconds: the signal over `measured` of `ready` Ready pods; expected: `replicas`, `reason`."""

    at: float
    value: float | None
    replicas: int
    reason: str
    measured: int | None = None
    ready: int | None = None
    unschedulable: str = ""


def run(rule: Policy, start: int, steps: list[Step]) -> list[tuple[int, str]]:
    """The decisions, each from the replicas the previous one left (the pods measured are the
    replicas unless a step says otherwise)."""
    scaler = autoscaler.ModelScaler()
    current, decided = start, []
    for step in steps:
        measured = current if step.measured is None else step.measured
        observation = Observation(
            current,
            step.value,
            measured if step.value is not None else 0,
            measured if step.ready is None else step.ready,
            step.unschedulable,
        )
        decision = scaler.decide(rule, observation, step.at)
        scaler.settle(rule, observation, decision, step.at)
        decided.append((decision.replicas, decision.reason))
        current = decision.replicas
    return decided


CASES = [
    (
        "proportional: three times the target on two pods asks for six",
        policy(),
        2,
        [Step(0, 30, 6, autoscaler.SCALED_UP)],
    ),
    (
        "within the tolerance nothing moves, just outside it does",
        policy(),
        3,
        [
            Step(0, 10.9, 3, autoscaler.WITHIN_TOLERANCE),
            Step(5, 9.1, 3, autoscaler.WITHIN_TOLERANCE),
            Step(10, 11.5, 4, autoscaler.SCALED_UP),
        ],
    ),
    (
        "a wider tolerance holds more",
        policy(tolerance=0.3, scaleDown={"stabilizationSeconds": 0}),
        3,
        [Step(0, 12.5, 3, autoscaler.WITHIN_TOLERANCE), Step(5, 7.5, 3, autoscaler.WITHIN_TOLERANCE)],
    ),
    (
        "at most 4 pods per 15 s: 1 -> 5, held, then 5 -> 6 (maxReplicas) once the period passed",
        policy(),
        1,
        [
            Step(0, 200, 5, autoscaler.SCALED_UP),
            Step(5, 60, 5, autoscaler.STEP_LIMITED, measured=1),
            Step(10, 60, 5, autoscaler.STEP_LIMITED, measured=1),
            Step(15.5, 60, 6, autoscaler.SCALED_UP),
        ],
    ),
    (
        "a step limit of one pod per 10 s",
        policy(scaleUp={"maxPods": 1, "periodSeconds": 10}),
        1,
        [
            Step(0, 40, 2, autoscaler.SCALED_UP),
            Step(5, 40, 2, autoscaler.STEP_LIMITED),
            Step(10.5, 40, 3, autoscaler.SCALED_UP),
        ],
    ),
    (
        "maxReplicas and minReplicas bound the recommendation",
        policy(minReplicas=2, scaleDown={"stabilizationSeconds": 0}),
        6,
        [Step(0, 100, 6, autoscaler.AT_MAXIMUM), Step(5, 0, 2, autoscaler.SCALED_DOWN)],
    ),
    (
        "the scale-down window keeps the highest recommendation of its 300 s",
        policy(),
        4,
        [
            Step(0, 10, 4, autoscaler.WITHIN_TOLERANCE),
            Step(100, 5, 4, autoscaler.STABILIZING),
            Step(299, 0, 4, autoscaler.STABILIZING),
            Step(301, 0, 2, autoscaler.SCALED_DOWN),
            Step(350, 0, 2, autoscaler.STABILIZING),
            Step(401, 0, 1, autoscaler.SCALED_DOWN),
        ],
    ),
    (
        "a burst shorter than the scale-up window moves nothing",
        policy(scaleUp={"stabilizationSeconds": 20}),
        2,
        [
            Step(0, 10, 2, autoscaler.WITHIN_TOLERANCE),
            Step(5, 40, 2, autoscaler.STABILIZING),
            Step(10, 10, 2, autoscaler.WITHIN_TOLERANCE),
            Step(15, 40, 2, autoscaler.STABILIZING),
            Step(31, 40, 6, autoscaler.SCALED_UP),
        ],
    ),
    (
        "no signal, no decision",
        policy(),
        3,
        [Step(0, None, 3, autoscaler.NO_METRICS), Step(5, None, 3, autoscaler.NO_METRICS)],
    ),
    (
        "no signal, yet a count below minReplicas is raised (a spec change)",
        policy(minReplicas=3),
        1,
        [Step(0, None, 3, autoscaler.SCALED_UP)],
    ),
    (
        "a Ready pod that did not answer holds a scale-down, not a scale-up",
        policy(scaleDown={"stabilizationSeconds": 0}),
        3,
        [
            Step(0, 1, 3, autoscaler.INCOMPLETE_METRICS, measured=2, ready=3),
            Step(5, 40, 6, autoscaler.SCALED_UP, measured=2, ready=3),
            Step(10, 1, 1, autoscaler.SCALED_DOWN),
        ],
    ),
    (
        "pods that cannot be scheduled hold scale-ups, with the resource named, and never scale-downs",
        policy(maxReplicas=8, scaleDown={"stabilizationSeconds": 0}),
        5,
        [
            Step(0, 40, 5, autoscaler.UNSCHEDULABLE, measured=4, unschedulable=GPU_SHORT),
            Step(5, 15, 5, autoscaler.UNSCHEDULABLE, measured=4, unschedulable=GPU_SHORT),
            Step(10, 1, 1, autoscaler.SCALED_DOWN, measured=4, unschedulable=GPU_SHORT),
        ],
    ),
    (
        "while pods cannot be scheduled, that is the reason a count is kept, whatever the recommendation",
        policy(maxReplicas=8),
        5,
        [
            Step(0, 40, 5, autoscaler.UNSCHEDULABLE, measured=4, unschedulable=GPU_SHORT),
            Step(5, 5, 5, autoscaler.UNSCHEDULABLE, measured=4, unschedulable=GPU_SHORT),
            Step(10, 5, 5, autoscaler.STABILIZING, measured=4),
        ],
    ),
]


@pytest.mark.parametrize(
    ("rule", "start", "steps"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_decisions(rule: Policy, start: int, steps: list[Step]) -> None:
    assert run(rule, start, steps) == [(step.replicas, step.reason) for step in steps]


def test_in_flight_is_averaged_per_pod() -> None:
    rule = Policy.of(AutoscalingSpec.model_validate({"maxReplicas": 10, "targetInFlightPerPod": 4}))
    assert rule.describe(12) == "in-flight 12/4"
    assert autoscaler.recommend(rule, Observation(2, 12, 2, 2)) == 6
    assert autoscaler.recommend(rule, Observation(2, 4.3, 2, 2)) == 2


def test_a_new_leader_starts_from_the_replicas_as_they_are() -> None:
    """The Deployment's count is the first recommendation of the windows: no scale-down before a whole
    scale-down window, but a scale-up at once."""
    rule = policy()
    assert run(rule, 5, [Step(0, 0, 5, autoscaler.STABILIZING), Step(299, 0, 5, autoscaler.STABILIZING)]) == [
        (5, autoscaler.STABILIZING),
        (5, autoscaler.STABILIZING),
    ]
    assert run(rule, 5, [Step(0, 0, 5, autoscaler.STABILIZING), Step(301, 0, 1, autoscaler.SCALED_DOWN)])[
        -1
    ] == (
        1,
        autoscaler.SCALED_DOWN,
    )
    assert run(rule, 5, [Step(0, 20, 6, autoscaler.SCALED_UP)]) == [(6, autoscaler.SCALED_UP)]


def test_the_decision_says_what_shaped_it() -> None:
    rule = policy(minReplicas=2)
    scaler = autoscaler.ModelScaler()
    decision = scaler.decide(rule, Observation(1, 200, 1, 1), 0)
    assert decision.message == (
        "queue 200ms/10ms over 1 pods: 1 → 5 replicas, recommended 20 (at most 4 pods per 15 s)"
    )
    held = scaler.decide(
        rule, Observation(5, 40, 4, 4, autoscaler.scheduling_hold([_pending()], "nvidia.com/gpu")), 20
    )
    assert held.reason == autoscaler.UNSCHEDULABLE
    assert held.message.startswith(
        "queue 40ms/10ms over 4 pods: recommended 16, 5 kept: "
        "1 pod cannot be scheduled, no nvidia.com/gpu free"
    )


def _pending(name: str = "model-abc") -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": GPU_SHORT}
    return {"metadata": {"name": name}, "status": {"conditions": [condition]}}


def test_scheduling_hold_names_the_short_resources_and_ignores_stopping_pods() -> None:
    stopping = {**_pending("old"), "metadata": {"name": "old", "deletionTimestamp": True}}
    assert autoscaler.scheduling_hold([stopping], "nvidia.com/gpu") == ""
    two = autoscaler.scheduling_hold([_pending("a"), _pending("b")], "nvidia.com/gpu")
    assert two.startswith("2 pods cannot be scheduled, no nvidia.com/gpu free (0/1 nodes are available")
    taint = {
        "type": "PodScheduled",
        "status": "False",
        "message": "0/1 nodes are available: 1 node(s) had taint",
    }
    other = autoscaler.scheduling_hold(
        [{"metadata": {"name": "c"}, "status": {"conditions": [taint]}}], "nvidia.com/gpu"
    )
    assert other == "1 pod cannot be scheduled (0/1 nodes are available: 1 node(s) had taint)"


def test_status_is_written_for_a_new_decision_at_once_and_for_a_moving_signal_every_15_s() -> None:
    rule = policy()
    scaler = autoscaler.ModelScaler()

    def settle(at: float, value: float, replicas: int = 2) -> dict[str, Any]:
        observation = Observation(replicas, value, replicas, replicas)
        return scaler.settle(rule, observation, scaler.decide(rule, observation, at), at)

    first = settle(0, 10)
    assert first["reason"] == autoscaler.WITHIN_TOLERANCE and first["currentValue"] == 10
    assert settle(5, 10.2) is first, "the same decision 5 s later writes nothing"
    assert settle(16, 10.2)["currentValue"] == 10.2
    assert settle(30, 10.2) is settle(90, 10.2), "nothing changed: nothing to write, however long"
    scaled = settle(95, 40)
    assert (scaled["reason"], scaled["desiredReplicas"], scaled["targets"]) == (
        autoscaler.SCALED_UP,
        6,
        "queue 40ms/10ms",
    )
    assert "lastScaleTime" in scaled and scaler.scalings == {"up": 1, "down": 0}
    failed = scaler.settle(
        rule, Observation(6, 40, 2, 2), replace(scaler.decision, replicas=8), 96, "HTTP 500"
    )
    assert failed["message"].endswith("applying it failed: HTTP 500")
    assert scaler.scalings == {"up": 1, "down": 0}, "a change that failed is not counted"


def test_a_hold_is_announced_once_until_every_pod_can_be_scheduled() -> None:
    rule = policy(maxReplicas=8)
    scaler = autoscaler.ModelScaler()
    announced = []
    for at, value, unschedulable in [
        (0, 40, GPU_SHORT),
        (5, 14, GPU_SHORT),
        (10, 40, GPU_SHORT),
        (15, 40, ""),
        (20, 40, GPU_SHORT),
    ]:
        observation = Observation(5, value, 4, 4, unschedulable)
        decision = scaler.decide(rule, observation, at)
        announced.append(scaler.announcement(observation, decision))
        scaler.settle(
            rule, observation, replace(decision, replicas=5), at, failure="not applied in this test"
        )
    assert announced == [
        ("Warning", autoscaler.UNSCHEDULABLE),
        None,
        None,
        ("Normal", autoscaler.SCALED_UP),
        ("Warning", autoscaler.UNSCHEDULABLE),
    ]
