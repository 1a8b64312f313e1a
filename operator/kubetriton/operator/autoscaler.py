"""The operator's own autoscaler: a model's replicas follow its queue time or its requests in flight.

A HorizontalPodAutoscaler scales on CPU, or on metrics that need Prometheus and an adapter in between;
a GPU model saturates while its pod's CPU idles, and a Python callable's CPU says nothing of how long
requests wait. A model whose `autoscaling` sets `targetQueueMilliseconds` or `targetInFlightPerPod` is
scaled by the operator instead, and gets no HorizontalPodAutoscaler (two controllers on one replica
count would fight). The leader reads the model's signals straight from each Ready pod (`signals`)
every few seconds, and sets the Deployment's replicas.

The rule is the HorizontalPodAutoscaler's, pure and apart from the I/O (`decide`, table-tested):

- proportional: ceil(pods measured * signal / target), and no change while the signal is within the
  tolerance of its target;
- stabilization: a scale-up goes to the lowest recommendation of its window, a scale-down to the
  highest of its own (300 s by default, so a lull has to last before pods go);
- a step limit: at most `maxPods` added (or removed) within `periodSeconds`;
- bounds: `minReplicas` and `maxReplicas` win over all of the above;
- no scale-up while pods of the model cannot be scheduled (no GPU free): pods that would not start
  are not added, and the ones waiting are kept (a cluster autoscaler adds nodes for them); while the
  count is kept, that is the reason given, naming the resource;
- no data, no decision: a signal that no pod gave changes nothing but a count outside the bounds, and
  a scale-down waits until every Ready pod answered.

A leader that takes over starts from the Deployment's replicas as they are, and counts them as the
first recommendation of its windows, so it scales down no sooner than its predecessor would have.
The windows and the step limit's record live in the leader's memory only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from kubetriton import podenv
from kubetriton.operator import signals, status
from kubetriton.operator.spec import (
    DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS,
    DEFAULT_SCALE_UP_MAX_PODS,
    DEFAULT_SCALE_UP_STABILIZATION_SECONDS,
    DEFAULT_SCALING_PERIOD_SECONDS,
    DEFAULT_TOLERANCE,
    QUEUE_TIME,
    AutoscalingSpec,
    PyTritonModel,
    ScalingRules,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

INTERVAL_SECONDS = 5.0
"""How often the leader reads every scaled model's pods and decides."""
READ_TIMEOUT_SECONDS = 2.0
"""A pod whose metrics take longer is left out of that reading."""
MAX_READS_IN_FLIGHT = 32
MAX_PAGE_BYTES = 2 * 1024 * 1024
"""The most of a pod's metrics page read: Triton's with a hundred models is under half of it. A pod's page
is its user's to fill, and the operator serves every namespace: a bigger page is no reading, not a page
held in memory 32 at a time and parsed on the event loop."""
STATUS_REFRESH_SECONDS = 15.0
"""A decision like the last one, on a signal that moved, is written at most this often (a new one at once)."""
_STAMPS = ("lastDecisionTime", "lastScaleTime")

SCALED_UP, SCALED_DOWN = "ScaledUp", "ScaledDown"
WITHIN_TOLERANCE, STEADY, STABILIZING, STEP_LIMITED = (
    "WithinTolerance",
    "Steady",
    "Stabilizing",
    "StepLimited",
)
AT_MAXIMUM, AT_MINIMUM = "AtMaximum", "AtMinimum"
UNSCHEDULABLE = "Unschedulable"
NO_METRICS, INCOMPLETE_METRICS = "NoMetrics", "IncompleteMetrics"

_INSUFFICIENT = re.compile(r"Insufficient ([\w./-]*\w)")


# The rule.


@dataclass(frozen=True)
class Direction:
    """How fast the replicas may move one way: the stabilization window, and at most `max_pods`
    (None: any number) within `period_seconds`."""

    stabilization_seconds: float
    max_pods: int | None
    period_seconds: float


@dataclass(frozen=True)
class Policy:
    """A model's autoscaling spec, with the defaults filled in."""

    signal: str
    target: float
    min_replicas: int
    max_replicas: int
    tolerance: float
    up: Direction
    down: Direction

    @classmethod
    def of(cls, spec: AutoscalingSpec) -> Policy:
        def direction(rules: ScalingRules | None, window: int, max_pods: int | None) -> Direction:
            rules = rules or ScalingRules()
            return Direction(
                window if rules.stabilization_seconds is None else rules.stabilization_seconds,
                max_pods if rules.max_pods is None else rules.max_pods,
                rules.period_seconds or DEFAULT_SCALING_PERIOD_SECONDS,
            )

        assert spec.signal is not None, "a HorizontalPodAutoscaler scales this model, not the operator"
        return cls(
            signal=spec.signal,
            target=spec.target,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            tolerance=DEFAULT_TOLERANCE if spec.tolerance is None else spec.tolerance,
            up=direction(spec.scale_up, DEFAULT_SCALE_UP_STABILIZATION_SECONDS, DEFAULT_SCALE_UP_MAX_PODS),
            down=direction(spec.scale_down, DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS, None),
        )

    def describe(self, value: float | None) -> str:
        """The signal against its target, as `kubectl get` shows it."""
        if self.signal == QUEUE_TIME:
            shown = "?" if value is None else f"{_amount(value)}ms"
            return f"queue {shown}/{_amount(self.target)}ms"
        return f"in-flight {'?' if value is None else _amount(value)}/{_amount(self.target)}"


def _amount(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


@dataclass(frozen=True)
class Observation:
    """What the autoscaler knows of a model at one moment."""

    replicas: int
    """The Deployment's replica count now."""
    value: float | None
    """The signal (milliseconds, or requests per pod), None when no pod gave it."""
    measured: int
    """Ready pods that gave it."""
    ready: int
    """Ready pods."""
    unschedulable: str = ""
    """Why some of the model's pods cannot be scheduled; empty when every one can."""


@dataclass
class History:
    """What the windows and the step limit remember: recommendations and changes, each with its time."""

    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    changes: deque[tuple[float, int]] = field(default_factory=deque)

    def recommend(self, now: float, replicas: int, keep_seconds: float) -> None:
        self.recommendations.append((now, replicas))
        while self.recommendations and self.recommendations[0][0] < now - keep_seconds:
            self.recommendations.popleft()

    def changed(self, now: float, by: int, keep_seconds: float) -> None:
        self.changes.append((now, by))
        while self.changes and self.changes[0][0] < now - keep_seconds:
            self.changes.popleft()

    def within(self, now: float, seconds: float) -> list[int]:
        return [replicas for when, replicas in self.recommendations if when > now - seconds]

    def moved(self, now: float, seconds: float) -> tuple[int, int]:
        """Pods added and pods removed within the last `seconds`."""
        recent = [by for when, by in self.changes if when > now - seconds]
        return sum(by for by in recent if by > 0), -sum(by for by in recent if by < 0)


@dataclass(frozen=True)
class Decision:
    """The replica count decided on, the recommendation it came from, and why."""

    replicas: int
    recommended: int | None
    reason: str
    message: str


def recommend(policy: Policy, observation: Observation) -> int | None:
    """The proportional rule: None without a signal; the replicas as they are within the tolerance."""
    if observation.value is None:
        return None
    ratio = observation.value / policy.target
    if abs(ratio - 1) <= policy.tolerance:
        return observation.replicas
    return math.ceil(observation.measured * ratio)


def decide(policy: Policy, observation: Observation, history: History, now: float) -> Decision:
    """The replica count for a model now; `history` gains the recommendation made."""
    current = observation.replicas
    signal = policy.describe(observation.value)
    recommended = recommend(policy, observation)
    if recommended is None:
        within_bounds = min(max(current, policy.min_replicas), policy.max_replicas)
        if within_bounds != current:
            return _bounds_decision(policy, current, within_bounds, signal)
        return Decision(current, None, NO_METRICS, f"{signal}: no Ready pod gave the signal; {current} kept")
    incomplete = recommended < current and observation.measured < observation.ready
    if incomplete:
        recommended = current
    keep = max(policy.up.stabilization_seconds, policy.down.stabilization_seconds)
    history.recommend(now, recommended, keep)
    lowest = min(history.within(now, policy.up.stabilization_seconds), default=recommended)
    highest = max(history.within(now, policy.down.stabilization_seconds), default=recommended)
    stabilized = lowest if current < lowest else highest if current > highest else current
    limited = _step_limited(policy, history, current, stabilized, now)
    bounded = min(max(limited, policy.min_replicas), policy.max_replicas)
    desired = bounded
    if observation.unschedulable and bounded > max(current, policy.min_replicas):
        desired = max(current, policy.min_replicas)
    hold = observation.unschedulable if desired == current else ""
    within = abs(observation.value / policy.target - 1) <= policy.tolerance
    steps = _Steps(recommended, stabilized, limited, bounded, desired, within, incomplete, hold)
    return Decision(desired, recommended, *_why(policy, observation, steps))


def _step_limited(policy: Policy, history: History, current: int, wanted: int, now: float) -> int:
    """`wanted`, within the step limit of its direction (HPA's: counted from the period's start)."""
    direction = policy.up if wanted > current else policy.down
    if wanted == current or direction.max_pods is None:
        return wanted
    added, removed = history.moved(now, direction.period_seconds)
    period_start = current - added + removed
    if wanted > current:
        return max(current, min(wanted, period_start + direction.max_pods))
    return min(current, max(wanted, period_start - direction.max_pods))


def _bounds_decision(policy: Policy, current: int, bounded: int, signal: str) -> Decision:
    if bounded > current:
        message = f"{signal}: {current} → {bounded} replicas, raised to minReplicas"
        return Decision(bounded, None, SCALED_UP, message)
    message = f"{signal}: {current} → {bounded} replicas, lowered to maxReplicas"
    return Decision(bounded, None, SCALED_DOWN, message)


@dataclass(frozen=True)
class _Steps:
    """How a decision came about, step by step."""

    recommended: int
    stabilized: int
    limited: int
    bounded: int
    desired: int
    within_tolerance: bool
    incomplete: bool
    held: str


def _why(policy: Policy, observation: Observation, steps: _Steps) -> tuple[str, str]:
    """The reason and message of a decision, naming what shaped it."""
    current, recommended = observation.replicas, steps.recommended
    signal = f"{policy.describe(observation.value)} over {observation.measured} pods"
    shaped = []
    if steps.stabilized != recommended:
        window = policy.up if steps.stabilized < recommended else policy.down
        shaped.append(f"stabilized to {steps.stabilized} over {window.stabilization_seconds:g} s")
    if steps.limited != steps.stabilized:
        direction = policy.up if steps.limited > current else policy.down
        shaped.append(f"at most {direction.max_pods} pods per {direction.period_seconds:g} s")
    if steps.bounded != steps.limited:
        shaped.append(f"between {policy.min_replicas} and {policy.max_replicas} replicas")
    how = f" ({'; '.join(shaped)})" if shaped else ""
    if steps.held:
        shaped_by = "" if steps.bounded > current else how  # a scale-up the hold stopped, or why none
        return UNSCHEDULABLE, f"{signal}: recommended {recommended}, {current} kept{shaped_by}: {steps.held}"
    if steps.desired != current:
        reason = SCALED_UP if steps.desired > current else SCALED_DOWN
        return reason, f"{signal}: {current} → {steps.desired} replicas, recommended {recommended}{how}"
    if steps.incomplete:
        return INCOMPLETE_METRICS, (
            f"{signal}: {current} kept until all {observation.ready} Ready pods answer"
            " (a scale-down needs them all)"
        )
    if recommended == current:
        return (WITHIN_TOLERANCE if steps.within_tolerance else STEADY), f"{signal}: {current} replicas"
    if steps.stabilized == current:
        return STABILIZING, f"{signal}: recommended {recommended}, {current} kept{how}"
    if steps.limited == current:
        return STEP_LIMITED, f"{signal}: recommended {recommended}, {current} kept{how}"
    reason = AT_MAXIMUM if recommended > current else AT_MINIMUM
    return reason, f"{signal}: recommended {recommended}, {current} kept{how}"


def scheduling_hold(pods: Iterable[Mapping[str, Any]], gpu_resource: str) -> str:
    """Why some of the pods cannot be scheduled, naming the resource that is short; empty when every
    pod can."""
    problems = [
        problem
        for pod in pods
        if not (pod.get("metadata") or {}).get("deletionTimestamp")
        and (problem := status.scheduling_problem(pod, gpu_resource)) is not None
    ]
    if not problems:
        return ""
    short = sorted({name for problem in problems for name in _INSUFFICIENT.findall(problem.message)})
    count = f"{len(problems)} pod{'s' if len(problems) > 1 else ''} cannot be scheduled"
    scarce = f", no {' or '.join(short)} free" if short else ""
    return f"{count}{scarce} ({problems[0].message})"


# The model's state in the leader, and the I/O.

Key = tuple[str, str]
"""A model's namespace and name; its children carry the name in their instance label."""


@dataclass
class ModelScaler:
    """What the leader keeps of one scaled model between its decisions."""

    history: History = field(default_factory=History)
    readings: dict[str, signals.PodReading] = field(default_factory=dict)
    """Each Ready pod's last reading, by pod name."""
    seeded: bool = False
    policy: Policy | None = None
    observation: Observation | None = None
    decision: Decision | None = None
    status: dict[str, Any] | None = None
    """What the model's status.autoscaling says, as last handed to the reconciler."""
    status_at: float = -math.inf
    scalings: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    hold_announced: bool = False

    def decide(self, policy: Policy, observation: Observation, now: float) -> Decision:
        """The decision for now; the Deployment's replicas are the first recommendation remembered."""
        if not self.seeded:
            keep = max(policy.up.stabilization_seconds, policy.down.stabilization_seconds)
            self.history.recommend(now, observation.replicas, keep)
            self.seeded = True
        return decide(policy, observation, self.history, now)

    def announcement(self, observation: Observation, decision: Decision) -> tuple[str, str] | None:
        """The Event a decision is worth, as (type, reason): every change of the replicas, and a hold for
        pods that cannot be scheduled, once until every pod can be again."""
        if not observation.unschedulable:
            self.hold_announced = False
        if decision.reason in (SCALED_UP, SCALED_DOWN):
            return "Normal", decision.reason
        if decision.reason == UNSCHEDULABLE and not self.hold_announced:
            self.hold_announced = True
            return "Warning", decision.reason
        return None

    def settle(
        self, policy: Policy, observation: Observation, decision: Decision, now: float, failure: str = ""
    ) -> dict[str, Any]:
        """Remember the decision (and the change, when it was applied) and return status.autoscaling: a
        new one for a new decision or a failure; for the same decision on a signal that moved, at most
        every STATUS_REFRESH_SECONDS; the last one when nothing changed (an idle model writes nothing)."""
        applied = decision.replicas != observation.replicas and not failure
        if applied:
            keep = max(policy.up.period_seconds, policy.down.period_seconds)
            self.history.changed(now, decision.replicas - observation.replicas, keep)
            self.scalings["up" if decision.replicas > observation.replicas else "down"] += 1
        self.policy, self.observation, self.decision = policy, observation, decision
        content: dict[str, Any] = {
            "signal": policy.signal,
            "targets": policy.describe(observation.value),
            "targetValue": policy.target,
            "measuredPods": observation.measured,
            "currentReplicas": observation.replicas,
            "desiredReplicas": decision.replicas,
            "reason": decision.reason,
            "message": f"{decision.message}; applying it failed: {failure}" if failure else decision.message,
        }
        if observation.value is not None:
            content["currentValue"] = round(observation.value, 3)
        before = {key: value for key, value in (self.status or {}).items() if key not in _STAMPS}
        alike = all(
            before.get(key) == content[key] for key in ("reason", "desiredReplicas", "currentReplicas")
        )
        if (
            self.status is not None
            and not failure
            and (content == before or (alike and now - self.status_at < STATUS_REFRESH_SECONDS))
        ):
            return self.status
        stamp = status.now()
        last_scale = stamp if applied else (self.status or {}).get("lastScaleTime")
        self.status = {
            **content,
            "lastDecisionTime": stamp,
            **({"lastScaleTime": last_scale} if last_scale else {}),
        }
        self.status_at = now
        return self.status


class Host(Protocol):
    """What the autoscaler needs of the reconciler: the models it scales, their pods, and a way to act
    on one model at a time."""

    def scaled_models(self) -> list[tuple[Key, PyTritonModel]]:
        """The models whose autoscaling names a target of the model's own."""

    def pods_of(self, key: Key) -> list[Mapping[str, Any]]:
        """The model's pods, as the reconciler's pod index summarises them."""

    async def autoscale(self, key: Key, scaler: ModelScaler, observe: Callable[[int], Observation]) -> None:
        """Under the model's lock: decide with `scaler` from `observe(the Deployment's replicas now)`,
        apply and announce the decision, publish the status."""


@dataclass(frozen=True)
class PodAddress:
    name: str
    ip: str


def ready_pods(pods: Iterable[Mapping[str, Any]]) -> list[PodAddress]:
    """The pods that serve (Ready, not stopping) and have an address."""
    return [
        PodAddress(pod["metadata"]["name"], pod["status"]["podIP"])
        for pod in pods
        if not (pod.get("metadata") or {}).get("deletionTimestamp")
        and status.pod_condition(pod, "Ready")
        and (pod.get("status") or {}).get("podIP")
    ]


async def read_page(
    session: aiohttp.ClientSession, url: str, pod: str, metrics: Sequence[str]
) -> signals.Samples | None:
    """The wanted metrics of a pod's metrics page, or None when the pod gave none (or one over
    MAX_PAGE_BYTES)."""
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return None
            page = bytearray()
            async for chunk in response.content.iter_chunked(64 * 1024):
                page += chunk
                if len(page) > MAX_PAGE_BYTES:
                    logger.warning(
                        f"pod {pod} serves a metrics page of more than {MAX_PAGE_BYTES} bytes; not read"
                    )
                    return None
            return signals.parse(page.decode("utf-8", "replace"), metrics)
    except (aiohttp.ClientError, TimeoutError) as error:
        logger.debug(f"pod {pod} gave no metrics: {error!r}")
        return None


class Autoscaler:
    """Every `interval` seconds, reads the pods of each model the operator scales, and decides."""

    def __init__(
        self,
        host: Host,
        interval: float = INTERVAL_SECONDS,
        *,
        metrics_port: int = podenv.METRICS_PORT,
        worker_port: int = podenv.HEALTH_PORT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.interval = interval
        self.metrics_port, self.worker_port = metrics_port, worker_port
        self.clock = clock
        self.scalers: dict[Key, ModelScaler] = {}
        self._session: aiohttp.ClientSession | None = None
        self._reads = asyncio.Semaphore(MAX_READS_IN_FLIGHT)
        self._steps: dict[Key, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Decide for every scaled model, then wait for the next round; until cancelled."""
        timeout = aiohttp.ClientTimeout(total=min(READ_TIMEOUT_SECONDS, self.interval))
        self._session = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=MAX_READS_IN_FLIGHT)
        )
        try:
            while True:
                started = self.clock()
                await self.round()
                await asyncio.sleep(max(0.0, self.interval - (self.clock() - started)))
        finally:
            for step in self._steps.values():
                step.cancel()
            await asyncio.gather(*self._steps.values(), return_exceptions=True)
            await self._session.close()

    async def round(self) -> None:
        """One decision for each model the operator scales, and forget the others; wait for them up to
        one interval.

        Each model's step is a task of its own, and a model whose last step is still running gets no
        new one: a step may wait for long (its apply for the API server, up to the request timeout, or
        for the model's lock, which a slow apply of its spec holds), and it then holds up no other
        model's decisions."""
        models = self.host.scaled_models()
        wanted = {key for key, _ in models}
        for key in set(self.scalers) - wanted:
            del self.scalers[key]
        self._steps = {key: step for key, step in self._steps.items() if not step.done()}
        started = []
        for key, model in models:
            if key not in self._steps:
                self._steps[key] = asyncio.create_task(self._step(key, model))
                started.append(self._steps[key])
        if started:
            await asyncio.wait(started, timeout=self.interval)

    async def _step(self, key: Key, model: PyTritonModel) -> None:
        try:
            await self._decide(key, model)
        except Exception:  # one model's failure must not stop the others' autoscaling
            logger.exception(f"[{key[0]}/{key[1]}] autoscaling failed")

    async def _decide(self, key: Key, model: PyTritonModel) -> None:
        autoscaling = model.spec.autoscaling
        assert autoscaling is not None and autoscaling.signal is not None
        first = key not in self.scalers
        scaler = self.scalers.setdefault(key, ModelScaler())
        pods = self.host.pods_of(key)
        ready = ready_pods(pods)
        readings = await self._read(ready, autoscaling.signal, model.spec.models)
        if autoscaling.signal == QUEUE_TIME:
            measured = signals.queue_time(scaler.readings, readings, model.spec.models)
        else:
            measured = signals.in_flight(readings, model.spec.models)
        names = {pod.name for pod in ready}
        scaler.readings = {
            name: reading for name, reading in {**scaler.readings, **readings}.items() if name in names
        }
        if first and autoscaling.signal == QUEUE_TIME:
            return  # queue time is a difference between two readings: decide at the next round
        hold = scheduling_hold(pods, model.spec.gpus.resource_name)

        def observe(replicas: int) -> Observation:
            return Observation(replicas, measured.value, measured.pods, len(ready), hold)

        await self.host.autoscale(key, scaler, observe)

    async def _read(
        self, pods: Sequence[PodAddress], signal: str, models: Sequence[str]
    ) -> dict[str, signals.PodReading]:
        """The readings of the pods that answered."""
        if signal == QUEUE_TIME:
            pages = [(self.metrics_port, signals.QUEUE_TIME_METRICS)]
        else:
            pages = [
                (self.metrics_port, signals.TRITON_IN_FLIGHT_METRICS),
                (self.worker_port, signals.WORKER_IN_FLIGHT_METRICS),
            ]

        async def read(pod: PodAddress) -> tuple[str, signals.PodReading | None]:
            samples: signals.Samples = {}
            for port, metrics in pages:
                found = await self._page(pod, port, metrics)
                if found is None:
                    return pod.name, None
                samples.update(found)
            return pod.name, signals.PodReading(samples)

        answers = await asyncio.gather(*(read(pod) for pod in pods))
        return {name: reading for name, reading in answers if reading is not None}

    async def _page(self, pod: PodAddress, port: int, metrics: Sequence[str]) -> signals.Samples | None:
        assert self._session is not None, "the autoscaler reads pods only while it runs"
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
        async with self._reads:
            return await read_page(
                self._session, f"http://{host}:{port}/metrics", f"{pod.name} ({pod.ip}:{port})", metrics
            )

    def collector(self) -> Collector:
        """Prometheus gauges of every scaled model's last decision, read when scraped."""
        return _DecisionCollector(self.scalers)


class _DecisionCollector(Collector):
    def __init__(self, scalers: Mapping[Key, ModelScaler]) -> None:
        self._scalers = scalers

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["namespace", "pytritonmodel"]
        value = GaugeMetricFamily(
            "kubetriton_autoscaler_signal",
            "The model's own signal as last measured (queue time in ms, or requests in flight per pod)",
            labels=[*labels, "signal"],
        )
        target = GaugeMetricFamily(
            "kubetriton_autoscaler_target", "The signal's target", labels=[*labels, "signal"]
        )
        desired = GaugeMetricFamily(
            "kubetriton_autoscaler_desired_replicas", "Replicas the autoscaler decided on", labels=labels
        )
        current = GaugeMetricFamily(
            "kubetriton_autoscaler_current_replicas",
            "The Deployment's replicas when it decided",
            labels=labels,
        )
        measured = GaugeMetricFamily(
            "kubetriton_autoscaler_measured_pods", "Ready pods whose metrics it read", labels=labels
        )
        scalings = CounterMetricFamily(
            "kubetriton_autoscaler_scalings", "Replica changes it made", labels=[*labels, "direction"]
        )
        for (namespace, name), scaler in list(self._scalers.items()):
            policy, observation, decision = scaler.policy, scaler.observation, scaler.decision
            if policy is None or observation is None or decision is None:
                continue
            if observation.value is not None:
                value.add_metric([namespace, name, policy.signal], observation.value)
            target.add_metric([namespace, name, policy.signal], policy.target)
            desired.add_metric([namespace, name], decision.replicas)
            current.add_metric([namespace, name], observation.replicas)
            measured.add_metric([namespace, name], observation.measured)
            for direction, count in scaler.scalings.items():
                scalings.add_metric([namespace, name, direction], count)
        yield from (value, target, desired, current, measured, scalings)
