"""An operator whose generator changed (a new version) rolls at most --max-concurrent-rollouts
serving models at a time; one whose generator did not change writes nothing; a user's spec change
is never held back."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from conftest import eventually
from emulator import ClusterEmulator
from kubetriton.operator import children
from test_operator_reconciler import (
    CHILD_APIS,
    MODELS,
    StartOperator,
    create_model,
    handled_models,
    model_document,
    patch,
    requests_since,
    set_deployment_status,
    status_of,
    stored,
    writes_since,
)

pytestmark = pytest.mark.asyncio

NAMES = ["m0", "m1", "m2", "m3"]
MARK = "example.com/generator"


def regenerated(cluster: ClusterEmulator, name: str) -> bool:
    """Whether the model's Deployment has the changed generator's pod template."""
    deployment = stored(cluster, CHILD_APIS["Deployment"], name) or {}
    annotations = deployment["spec"]["template"].get("metadata", {}).get("annotations") or {}
    return annotations.get(MARK) == "2"


def new_generator(build: Any) -> Any:
    def build_deployment(model: Any) -> dict[str, Any]:
        deployment = build(model)
        template = deployment["spec"]["template"].setdefault("metadata", {})
        template.setdefault("annotations", {})[MARK] = "2"
        return deployment

    return build_deployment


async def serving_models(cluster: ClusterEmulator, start_operator: StartOperator) -> None:
    """Models with one available pod each, converged by an operator that is then stopped."""
    operator = await start_operator()
    for name in NAMES:
        await create_model(cluster, model_document(name))
    for name in NAMES:
        await eventually(lambda n=name: stored(cluster, CHILD_APIS["Deployment"], n))
        await set_deployment_status(cluster, name, ready=1, replicas=1)
    for name in NAMES:
        await eventually(lambda n=name: status_of(cluster, n).get("readyReplicas") == 1, message=name)
    await asyncio.to_thread(operator.stop)  # the emulator keeps answering while the operator stops


async def test_an_unchanged_generator_writes_nothing_after_a_restart(
    cluster: ClusterEmulator, start_operator: StartOperator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await serving_models(cluster, start_operator)
    seen = len(list(cluster))
    caplog.clear()
    restarted = await start_operator()
    await eventually(lambda: handled_models(caplog) == set(NAMES), message="every model handled")
    assert requests_since(cluster, seen, by=restarted), "the restarted operator's requests are told apart"
    assert writes_since(cluster, seen, by=restarted) == []


async def test_a_changed_generator_rolls_a_few_models_at_a_time(
    cluster: ClusterEmulator, start_operator: StartOperator, monkeypatch: pytest.MonkeyPatch
) -> None:
    await serving_models(cluster, start_operator)
    build = children._BUILDERS[children.MODEL_DEPLOYMENT]
    monkeypatch.setitem(children._BUILDERS, children.MODEL_DEPLOYMENT, new_generator(build))
    await start_operator(max_concurrent_rollouts=2)

    def rolled() -> list[str]:
        return [name for name in NAMES if regenerated(cluster, name)]

    await eventually(lambda: len(rolled()) >= 2, message="two models roll")
    await asyncio.sleep(1)
    first = rolled()
    waiting = [name for name in NAMES if name not in first]
    assert len(first) == 2, first

    # Mid-surge (the new pod not ready, the old one still serving), a rollout still holds its slot.
    for name in first:
        await set_deployment_status(cluster, name, ready=1, replicas=2, updated=1)
    await asyncio.sleep(1)
    assert rolled() == first

    # A user's change is applied at once, slots or not.
    await patch(cluster, MODELS.format(ns="default") + f"/{waiting[0]}", {"spec": {"replicas": 2}})
    await eventually(lambda: stored(cluster, CHILD_APIS["Deployment"], waiting[0])["spec"]["replicas"] == 2)
    assert regenerated(cluster, waiting[0]) and not regenerated(cluster, waiting[1])

    # Rollouts complete: the last model waiting rolls.
    for name in [*first, waiting[0]]:
        replicas = stored(cluster, CHILD_APIS["Deployment"], name)["spec"]["replicas"]
        await set_deployment_status(cluster, name, ready=replicas, replicas=replicas)
    await eventually(
        lambda: regenerated(cluster, waiting[1]), message="the waiting model rolls once slots are free"
    )
