"""Leader election on a coordination.k8s.io/v1 Lease, so that two operator replicas never both write.

kopf's peering is not a Lease and does not fence a leader that stops hearing from the API server;
this is the scheme every Kubernetes controller uses. One Lease in the operator's namespace names
its holder. A candidate takes it when it is free, or when its record has not changed for the
lease's duration as measured on the candidate's own clock (never by comparing timestamps written
by another machine). The holder renews it every retry period.

The holder counts itself the leader only until its renew deadline: that long after it *sent* its
last successful renewal. The deadline is shorter than the lease, so a holder that cannot renew
(the API server gone, its own connection hanging, its process paused) stops before any candidate
can take the Lease over. From the deadline on, `leading()` is false and the operator's API session
refuses every write; a watchdog thread, which needs neither the event loop nor the network, then
calls `on_lost` at once (the operator steps down by starting its process again as a standby).

Every write to the Lease is a JSON patch that first tests the resourceVersion it read, so two
candidates racing for a free Lease cannot both win: the API server refuses the second (422).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubetriton.operator.kube import NO_ANSWER, KubeApi, KubeError

API_VERSION = "coordination.k8s.io/v1"
PLURAL = "leases"
LOST_RACE = (409, 422)
"""A create that found the Lease already there, or a patch whose resourceVersion test failed."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timings:
    """How long a Lease lasts unrenewed, how long its holder keeps trying to renew it before it
    stops, and how often candidates and the holder try (seconds)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                "leader election needs lease duration > renew deadline > retry period > 0, got "
                f"{self.lease_duration:g} s, {self.renew_deadline:g} s, {self.retry_period:g} s"
            )


def default_identity() -> str:
    """The pod's name (its hostname) and a random suffix, unique to this process."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _micro_time() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """One candidate for one Lease."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        *,
        identity: str | None = None,
        timings: Timings = Timings(),
        on_lost: Callable[[], None],
        on_failure: Callable[[str], None] = lambda reason: None,
        on_answer: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_lost` is called (from a thread of its own) when leadership ends; `on_failure` with
        the reason when a request gets no answer or a server error, `on_answer` when one succeeds."""
        self.api = api
        self.namespace, self.name = namespace, name
        self.identity = identity or default_identity()
        self.timings = timings
        self._on_lost = on_lost
        self._on_failure, self._on_answer = on_failure, on_answer
        self._clock = clock
        self._lease: dict[str, Any] | None = None
        """The Lease as last read or written."""
        self._observed: tuple[str, float] | None = None
        """The Lease's resourceVersion when it was last seen to change, and when (on our clock)."""
        self._deadline: float | None = None
        """While holding the Lease: when leadership ends unless renewed (on our clock)."""
        self._changed = threading.Condition()
        self._watchdog: threading.Thread | None = None
        self._stopped = False

    @property
    def holder(self) -> str:
        """Who holds the Lease as last seen ("" when free or unknown)."""
        return ((self._lease or {}).get("spec") or {}).get("holderIdentity") or ""

    def leading(self) -> bool:
        """Whether this candidate may write: it holds the Lease and its renew deadline is ahead."""
        deadline = self._deadline
        return deadline is not None and self._clock() < deadline

    # Taking the Lease.

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease, trying every retry period."""
        while not await self._try_acquire():
            await asyncio.sleep(self.timings.retry_period)
        logger.info(f"leading: holds the Lease {self.namespace}/{self.name} as {self.identity}")

    async def _try_acquire(self) -> bool:
        sent = self._clock()
        try:
            lease = await self._bounded(self.api.get(API_VERSION, PLURAL, self.namespace, self.name))
            if lease is None:
                self._lease = await self._bounded(self.api.create(self._new_lease(), PLURAL))
                self._leading_since(sent)
                return True
            self._observe(lease)
            if self.holder not in ("", self.identity) and not self._expired():
                return False
            await self._write_spec(self._spec(taking_over=self.holder != self.identity))
        except KubeError as error:
            if error.status not in LOST_RACE:
                logger.debug(f"could not read or take the Lease: {error}")
            return False
        self._leading_since(sent)
        return True

    def _observe(self, lease: dict[str, Any]) -> None:
        self._lease = lease
        version = lease["metadata"].get("resourceVersion", "")
        if self._observed is None or self._observed[0] != version:
            self._observed = (version, self._clock())

    def _expired(self) -> bool:
        assert self._observed is not None
        duration = float((self._lease or {}).get("spec", {}).get("leaseDurationSeconds") or 0)
        return self._clock() >= self._observed[1] + duration

    def _new_lease(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self._spec(taking_over=True),
        }

    def _spec(self, *, taking_over: bool) -> dict[str, Any]:
        spec = dict((self._lease or {}).get("spec") or {})
        now = _micro_time()
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.timings.lease_duration)),
            renewTime=now,
        )
        if taking_over:
            spec.update(acquireTime=now, leaseTransitions=spec.get("leaseTransitions", -1) + 1)
        return spec

    async def _write_spec(self, spec: dict[str, Any]) -> None:
        """Replace the Lease's spec, provided nobody wrote it since it was read."""
        assert self._lease is not None
        version = self._lease["metadata"]["resourceVersion"]
        operations = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            {"op": "add", "path": "/spec", "value": spec},
        ]
        self._lease = await self._bounded(
            self.api.json_patch(API_VERSION, PLURAL, self.namespace, self.name, operations)
        )

    async def _bounded(self, request: Any) -> Any:
        """A request that gives up when the renew deadline would pass (or after a renew deadline)."""
        deadline = self._deadline
        limit = self.timings.renew_deadline if deadline is None else deadline - self._clock()
        try:
            async with asyncio.timeout(max(limit, 0)):
                answer = await request
        except TimeoutError as error:
            self._on_failure("no answer before the renew deadline")
            raise KubeError(NO_ANSWER, "no answer from the API server before the renew deadline") from error
        except KubeError as error:
            if error.status == NO_ANSWER or error.status >= 500:
                self._on_failure(str(error))
            else:
                self._on_answer()
            raise
        self._on_answer()
        return answer

    # Holding it.

    def _leading_since(self, sent: float) -> None:
        """A write sent at `sent` succeeded: lead until the renew deadline counted from then."""
        with self._changed:
            self._deadline = sent + self.timings.renew_deadline
            self._changed.notify_all()
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch_deadline, name="lease-deadline", daemon=True)
            self._watchdog.start()

    def _watch_deadline(self) -> None:
        """Call on_lost once the deadline passes without a renewal (or another holder is seen)."""
        with self._changed:
            while not self._stopped:
                assert self._deadline is not None
                remaining = self._deadline - self._clock()
                if remaining <= 0:
                    self._stopped = True
                    break
                self._changed.wait(remaining)
            else:
                return
        logger.warning(
            f"lost the Lease {self.namespace}/{self.name}: not renewed within "
            f"{self.timings.renew_deadline:g} s (last seen holder: {self.holder or 'none'})"
        )
        self._on_lost()

    def _lose_now(self) -> None:
        with self._changed:
            self._deadline = self._clock()
            self._changed.notify_all()

    async def renew(self) -> None:
        """Renew the Lease every retry period, for as long as this candidate leads.

        A failed renewal is tried again at the next period; the watchdog ends leadership at the
        deadline. Seeing another holder ends it at once.
        """
        while self.leading():
            await asyncio.sleep(self.timings.retry_period)
            sent = self._clock()
            try:
                await self._write_spec(self._spec(taking_over=False))
            except KubeError as error:
                if error.status in LOST_RACE:
                    await self._reread()
                else:
                    logger.debug(f"renewing the Lease failed: {error}")
                continue
            self._leading_since(sent)

    async def _reread(self) -> None:
        """After a refused renewal: carry on if the Lease is still ours, otherwise stop leading."""
        try:
            lease = await self._bounded(self.api.get(API_VERSION, PLURAL, self.namespace, self.name))
        except KubeError as error:
            logger.debug(f"reading the Lease failed: {error}")
            return
        if lease is not None:
            self._observe(lease)
        if lease is None or self.holder != self.identity:
            self._lose_now()

    async def release(self) -> None:
        """Stop leading and free the Lease, so that a standby takes over at its next try.

        Called once the operator has stopped writing; nothing is released if the deadline passed.
        """
        was_leading = self.leading()
        with self._changed:
            self._stopped = True
            self._deadline = None
            self._changed.notify_all()
        if not was_leading or self._lease is None:
            return
        spec = dict(self._lease.get("spec") or {}) | {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "renewTime": _micro_time(),
        }
        try:
            await self._write_spec(spec)
        except KubeError as error:
            logger.warning(f"could not release the Lease, a standby takes over when it expires: {error}")
            return
        logger.info(f"released the Lease {self.namespace}/{self.name}")
