"""Leader election on a Lease: one leader at a time, a leader that cannot renew stops before anyone
can take over, and two real operator processes of which only the Lease's holder writes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import aiohttp
import kmock
import kopf
import pytest
from conftest import eventually
from emulator import ALL_VERBS, ClusterEmulator
from kubetriton.operator import leader, runtime
from kubetriton.operator.kube import KubeApi, KubeError
from test_operator_cli import health, write_kubeconfig
from test_operator_reconciler import MODELS, create_model, model_document, patch, stored

from tests.conftest import free_ports

pytestmark = pytest.mark.asyncio

LEASES = "coordination.k8s.io/v1/leases"
FAST = leader.Timings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.2)


def serve_leases(cluster: ClusterEmulator) -> None:
    cluster.resources[LEASES] = kmock.ResourceInfo(
        kind="Lease", singular="lease", namespaced=True, verbs=set(ALL_VERBS)
    )


def lease(cluster: ClusterEmulator, name: str = "operator") -> dict:
    found = stored(cluster, LEASES, name, "kubetriton")
    assert found is not None
    return found


class Candidate:
    """An elector against the emulator that records when it lost the Lease."""

    def __init__(self, cluster: ClusterEmulator, identity: str) -> None:
        self.api = KubeApi(timeout=FAST.renew_deadline)
        self.url = str(cluster.servers[0].url).rstrip("/")
        self.lost_at: float | None = None
        self.elector = leader.Elector(
            self.api, "kubetriton", "operator", identity=identity, timings=FAST, on_lost=self._lost
        )

    def _lost(self) -> None:
        self.lost_at = time.monotonic()

    async def __aenter__(self) -> Candidate:
        await self.api.connect(kopf.ConnectionInfo(server=self.url, insecure=True))
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.api.close()


async def test_one_candidate_leads_and_the_other_takes_over_only_after_the_leader_stopped(
    cluster: ClusterEmulator,
) -> None:
    serve_leases(cluster)
    async with Candidate(cluster, "a") as a, Candidate(cluster, "b") as b:
        await a.elector.acquire()
        renewing = asyncio.create_task(a.elector.renew())
        waiting = asyncio.create_task(b.elector.acquire())
        both = False
        for _ in range(30):  # three lease durations: a renews, b keeps waiting
            await asyncio.sleep(0.05 * FAST.lease_duration)
            both |= a.elector.leading() and b.elector.leading()
        assert a.elector.leading() and not waiting.done() and lease(cluster)["spec"]["holderIdentity"] == "a"

        renewing.cancel()  # the leader's renewals stop, as when its process is frozen
        renewed_last = time.monotonic()
        while not waiting.done():
            both |= a.elector.leading() and b.elector.leading()
            await asyncio.sleep(0.01)
        acquired_at = time.monotonic()
        assert not both, "two candidates led at once"
        assert a.lost_at is not None and a.lost_at - renewed_last <= FAST.renew_deadline + 0.1
        assert acquired_at - a.lost_at >= FAST.lease_duration - FAST.renew_deadline - 0.1
        spec = lease(cluster)["spec"]
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
        await b.elector.release()


async def test_a_leader_whose_renewals_hang_stops_leading_at_its_deadline(cluster: ClusterEmulator) -> None:
    serve_leases(cluster)
    async with Candidate(cluster, "a") as a:
        await a.elector.acquire()
        renewing = asyncio.create_task(a.elector.renew())
        await asyncio.sleep(3 * FAST.retry_period)
        cluster.held.add("leases")  # writes of the Lease get no answer
        held_at = time.monotonic()
        await eventually(lambda: a.lost_at, timeout=5, message="the leader stops")
        assert not a.elector.leading()
        assert a.lost_at is not None and a.lost_at - held_at <= FAST.renew_deadline + 0.1
        await eventually(renewing.done, timeout=5, message="the renewals end")
        cluster.held.clear()
        guarded = KubeApi(may_write=a.elector.leading)
        await guarded.connect(kopf.ConnectionInfo(server=a.url, insecure=True))
        seen = len(list(cluster))
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "m", "namespace": "default"},
        }
        with pytest.raises(KubeError, match="not the leader"):
            await guarded.apply(deployment, "deployments")
        await guarded.close()
        assert list(cluster)[seen:] == [], "a write was sent after the deadline"


async def test_two_candidates_racing_for_a_free_lease_never_both_win(cluster: ClusterEmulator) -> None:
    serve_leases(cluster)
    async with contextlib.AsyncExitStack() as stack:
        candidates = [await stack.enter_async_context(Candidate(cluster, name)) for name in "abcd"]
        for round_ in range(3):
            tasks = [asyncio.create_task(c.elector.acquire()) for c in candidates]
            done, pending = await asyncio.wait(tasks, timeout=FAST.lease_duration / 2)
            assert len(done) == 1, f"round {round_}: {len(done)} candidates took the Lease"
            (winner,) = [c for c, t in zip(candidates, tasks, strict=True) if t in done]
            assert lease(cluster)["spec"]["holderIdentity"] == winner.elector.identity
            for task in pending:
                task.cancel()
            await winner.elector.release()
            assert lease(cluster)["spec"]["holderIdentity"] == ""


# Two real operator processes.


class Replica:
    """`kubetriton operator --leader-elect` as a process with a token of its own, which tells its
    requests apart from the other replica's."""

    def __init__(self, cluster: ClusterEmulator, tmp_path: Path, name: str) -> None:
        self.cluster, self.name = cluster, name
        self.config = write_kubeconfig(
            tmp_path / f"kubeconfig-{name}", str(cluster.servers[0].url).rstrip("/")
        )
        self.config.write_text(self.config.read_text().replace("test-token", f"token-{name}"))
        self.health_url = f"http://127.0.0.1:{free_ports(1)[0]}/healthz"
        self.process: asyncio.subprocess.Process | None = None
        self.log = ""

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kubetriton.cli",
            "operator",
            "--leader-elect",
            "--lease-namespace=kubetriton",
            "--lease-duration=3",
            "--renew-deadline=2",
            "--retry-period=0.5",
            f"--liveness={self.health_url}",
            env={**os.environ, "KUBECONFIG": str(self.config)},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )

    def writes(self, seen: int = 0) -> list[str]:
        """What this replica wrote (method and path), other than the Lease, since the `seen`-th
        request the cluster got."""
        return [
            f"{r.method.value.upper()} {r.url.path}"
            for r in list(self.cluster)[seen:]
            if r.headers.get("Authorization") == f"Bearer token-{self.name}"
            and r.method.value.upper() != "GET"
            and (r.resource is None or r.resource.plural != "leases")
        ]

    async def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.process.send_signal(signal.SIGTERM)
        _, errors = await asyncio.wait_for(self.process.communicate(), 30)
        self.log = errors.decode()
        print(f"--- replica {self.name}\n{self.log}")  # shown by pytest when the test fails


@contextlib.asynccontextmanager
async def replicas(cluster: ClusterEmulator, tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    pair = (Replica(cluster, tmp_path, "a"), Replica(cluster, tmp_path, "b"))
    try:
        for replica in pair:
            await replica.start()
        yield pair
    finally:
        for replica in pair:
            if replica.process is not None:
                await replica.stop()


async def answer(url: str) -> tuple[int, dict] | None:
    try:
        return await health(url)
    except aiohttp.ClientError:
        return None


async def _equal(awaitable: Awaitable[object], expected: object) -> bool:
    return await awaitable == expected


async def test_only_the_leader_writes_and_a_frozen_leader_steps_down_without_writing(
    cluster: ClusterEmulator, tmp_path: Path
) -> None:
    serve_leases(cluster)
    async with replicas(cluster, tmp_path) as (a, b):
        await eventually(lambda: stored(cluster, LEASES, "kubetriton-operator", "kubetriton"), timeout=30)
        holder = stored(cluster, LEASES, "kubetriton-operator", "kubetriton")["spec"]["holderIdentity"]
        # Which replica holds the Lease shows in its health answer.
        answers = {r.name: await eventually(lambda r=r: answer(r.health_url), timeout=30) for r in (a, b)}
        leading = [r for r in (a, b) if answers[r.name][1].get("standby") is not True]
        assert len(leading) == 1, answers
        leader_ = leading[0]
        standby = b if leader_ is a else a
        expected = (200, {"serving": False, "standby": True, "leader": holder})
        await eventually(lambda: _equal(answer(standby.health_url), expected), timeout=5, message="standby")

        await create_model(cluster, model_document("identity"))
        await eventually(lambda: stored(cluster, "apps/v1/deployments", "identity"), timeout=30)
        await asyncio.sleep(1)
        assert leader_.writes() and standby.writes() == []

        assert leader_.process is not None
        leader_.process.send_signal(signal.SIGSTOP)  # its renewals stop, its connections stay open
        stopped_at = time.monotonic()
        await patch(cluster, MODELS.format(ns="default") + "/identity", {"spec": {"replicas": 2}})

        def scaled() -> bool:
            deployment = stored(cluster, "apps/v1/deployments", "identity")
            return deployment is not None and deployment["spec"].get("replicas") == 2

        await eventually(scaled, timeout=30, message="the standby takes over and applies the change")
        took_over = time.monotonic() - stopped_at
        assert standby.writes(), "the new leader wrote the change"

        thawed_at = len(list(cluster))
        leader_.process.send_signal(signal.SIGCONT)
        await eventually(
            lambda: answer(leader_.health_url), timeout=30, message="the old leader is back as a standby"
        )
        await asyncio.sleep(2)
        assert leader_.writes(thawed_at) == [], "the old leader wrote after losing the Lease"
        status, body = await answer(leader_.health_url)  # type: ignore[misc]
        assert status == 200 and body["standby"] is True
    assert "lost the Lease" in leader_.log and "stepping down" in leader_.log
    assert took_over < 20


async def test_a_leader_started_again_under_its_identity_takes_its_lease_back_at_once(
    cluster: ClusterEmulator,
) -> None:
    serve_leases(cluster)
    async with Candidate(cluster, "a") as a, Candidate(cluster, "b") as b:
        await a.elector.acquire()
        waiting = asyncio.create_task(b.elector.acquire())
        await asyncio.sleep(FAST.retry_period)  # b has seen the Lease; a stops, as when it steps down
        async with Candidate(cluster, "a") as again:
            started = time.monotonic()
            await again.elector.acquire()
            assert time.monotonic() - started < FAST.lease_duration / 2
            assert again.elector.leading() and not waiting.done()
            spec = lease(cluster)["spec"]
            assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("a", 0)
            await again.elector.release()
        await asyncio.wait_for(waiting, FAST.lease_duration)
        await b.elector.release()


async def test_a_leader_steps_down_into_a_process_with_its_identity_and_its_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: started.append((path, argv, dict(os.environ))))
    for name in (runtime.IDENTITY_ENV, runtime.OUTAGE_ENV):  # what step_down sets is undone afterwards
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    outages = runtime.ApiOutages(verbose=False)
    assert outages.failed("no answer") is not None
    runtime.step_down("pod-0_1234abcd", outages)
    ((path, argv, env),) = started
    assert (path, argv) == (sys.executable, [sys.executable, *sys.orig_argv[1:]])
    assert env[runtime.IDENTITY_ENV] == "pod-0_1234abcd"
    inherited = runtime.ApiOutages(verbose=False, since=float(env[runtime.OUTAGE_ENV]))
    assert inherited.failed("no answer") is None, "the outage was already reported"
    assert outages.since is not None
    lasted = time.monotonic() - outages.since
    assert inherited.answered() == f"the API server answers again, after {lasted:.0f} s"
