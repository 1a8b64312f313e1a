"""The operator's process: kopf running the reconciler, leader election, a health endpoint, and logs
worth reading.

kopf watches CRDs and namespaces as they come and go, so an operator started before its CRD serves
models as soon as the CRD is installed; until kopf watches the models, the health endpoint answers
503 and says why (were kopf to miss the CRD, the liveness probe restarts the operator). Log lines
about a model start with its `[namespace/name]`.

With leader election, a replica runs kopf only once it holds the Lease, and a standby's health
endpoint answers 200: readiness must not depend on leadership, or a PodDisruptionBudget would count
every standby as unavailable and block node drains. A leader that loses the Lease steps down by
starting its own process again (`exec`): every request it had begun ends with it, at once, which
stopping kopf from the inside could not promise while a connection hangs. The new process keeps the
old one's identity, so that once the API server answers it takes the Lease back at once if nobody
else took it (a frozen API server's backlog otherwise makes the Lease look renewed at the thaw, and
every candidate waits a whole lease duration), and it knows an outage was going on, so that the
outage stays one WARNING.

An API server that stops answering would otherwise cost a log line at ERROR for every retry of
every watch; `ApiOutages` turns that into one WARNING when it starts and one INFO when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp.web
import kopf
from kubetriton.operator import children, leader, main
from kubetriton.operator.kube import KubeApi
from kubetriton.operator.reconciler import (
    WATCH_HANDLERS,
    Insights,
    build_operator,
    login_from_environment,
    operator_settings,
)
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

logger = logging.getLogger(__name__)

IDENTITY_ENV = "KUBETRITON_LEASE_IDENTITY"
"""Set by a leader that steps down for the process it starts: its identity in the Lease."""
OUTAGE_ENV = "KUBETRITON_API_OUTAGE_SINCE"
"""Set by a leader that steps down during an outage: when the outage began (`time.monotonic()`, which
is the machine's clock since boot and carries over `exec`)."""

METRICS_PATH = "/metrics"
Health = Callable[[], tuple[int, dict[str, Any]]]
"""The health endpoint's HTTP status and answer, as of now."""


def health_app(
    path: str, health: Health, metrics: CollectorRegistry | None = None
) -> aiohttp.web.Application:
    """One endpoint that says whether models are being served, and why not; and the operator's
    Prometheus metrics at /metrics (its autoscaler's decisions)."""

    async def answer(_: aiohttp.web.Request) -> aiohttp.web.Response:
        status, body = health()
        return aiohttp.web.json_response(body, status=status)

    async def exposition(_: aiohttp.web.Request) -> aiohttp.web.Response:
        assert metrics is not None
        return aiohttp.web.Response(
            body=generate_latest(metrics), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = aiohttp.web.Application()
    app.router.add_get(path, answer)
    if metrics is not None:
        app.router.add_get(METRICS_PATH, exposition)
    return app


class ApiOutages(logging.Filter):
    """One WARNING when the API server stops answering, one INFO when it answers again.

    kopf logs each failed attempt of each request at ERROR ("Request attempt #2/9 failed; will
    retry"), which a minute-long outage turns into a hundred lines; the attempt that succeeds is
    logged at DEBUG only (`run` lets those through to this filter). The leader elector reports its
    own requests through `failed` and `answered`. Placed on the log handler, the filter drops every
    other DEBUG line unless the operator is verbose.
    """

    RETRYING = " failed; will retry: "
    SUCCEEDED = " succeeded: "

    def __init__(self, verbose: bool, since: float | None = None) -> None:
        """`since`: when an outage that is still going on began (one a previous process reported)."""
        super().__init__()
        self.verbose = verbose
        self.since = since

    def failed(self, reason: str) -> str | None:
        """A request got no answer or a server error: what to say when this starts an outage."""
        if self.since is not None:
            return None
        self.since = time.monotonic()
        return f"the API server does not answer, retrying until it does: {reason}"

    def answered(self) -> str | None:
        """A request succeeded: what to say when this ends an outage."""
        if self.since is None:
            return None
        lasted, self.since = time.monotonic() - self.since, None
        return f"the API server answers again, after {lasted:.0f} s"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Request attempt") and self.RETRYING in message:
            return self._reshaped(record, logging.WARNING, self.failed(message.partition(self.RETRYING)[2]))
        if message.startswith("Request attempt") and self.SUCCEEDED in message:
            return self._reshaped(record, logging.INFO, self.answered())
        return self.verbose or record.levelno >= logging.INFO

    def _reshaped(self, record: logging.LogRecord, level: int, message: str | None) -> bool:
        """Log `message` at `level` in place of kopf's line; kopf's own only when verbose."""
        if message is None:
            return self.verbose
        record.levelno, record.levelname = level, logging.getLevelName(level)
        record.msg, record.args = message, ()
        return True


class QuietWatchHandlers(logging.Filter):
    """Drops kopf's line for each watch-event handler that succeeded: children and pods change many
    times a minute, and a line per event would bury the ones that matter."""

    def __init__(self, handler_ids: Iterable[str]) -> None:
        super().__init__()
        self._lines = {f"Handler {handler_id!r} succeeded." for handler_id in handler_ids}

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno != logging.INFO or record.getMessage() not in self._lines


class OptionalMonitoring(logging.Filter):
    """kopf warns at each start about watched resources whose CRD is missing. The ServiceMonitor's is
    optional (the Prometheus Operator's): where it alone is missing, say so once at INFO, as a fact
    of the cluster rather than a fault; a missing PyTritonModel CRD stays a WARNING."""

    UNRESOLVED = "Unresolved resources cannot be served (try creating their CRDs): "

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(self.UNRESOLVED):
            return True
        unresolved = message.removeprefix(self.UNRESOLVED)
        monitors = f"any_name='{children.SERVICE_MONITOR.plural}'"
        if unresolved.count("Selector(") == 1 and monitors in unresolved:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = (
                f"{children.SERVICE_MONITOR_CRD} is not installed: models get no ServiceMonitor until it is",
                (),
            )
        return True


def step_down(identity: str, outages: ApiOutages) -> None:
    """Start this process again, as a standby under the same identity: nothing it had begun can still be
    written."""
    logger.warning("stepping down: starting again as a standby")
    os.environ[IDENTITY_ENV] = identity
    if outages.since is not None:
        os.environ[OUTAGE_ENV] = repr(outages.since)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


async def candidate(args: argparse.Namespace, outages: ApiOutages) -> leader.Elector:
    """A candidate for the operator's Lease, with a session of its own (never queued behind the
    reconciler's requests)."""
    info = login_from_environment(settings=operator_settings(), logger=logger)
    if info is None:
        raise SystemExit("leader election needs a service account or a kubeconfig")
    api = KubeApi(timeout=args.renew_deadline)
    await api.connect(info)
    identity = os.environ.pop(IDENTITY_ENV, None) or leader.default_identity()
    return leader.Elector(
        api,
        args.lease_namespace or info.default_namespace or "default",
        args.lease_name,
        identity=identity,
        timings=leader.Timings(args.lease_duration, args.renew_deadline, args.retry_period),
        on_lost=lambda: step_down(identity, outages),
        on_failure=lambda reason: _say(logging.WARNING, outages.failed(reason)),
        on_answer=lambda: _say(logging.INFO, outages.answered()),
    )


def _say(level: int, message: str | None) -> None:
    if message is not None:
        logger.log(level, message)


async def until_leading(elector: leader.Elector) -> bool:
    """Wait until the elector holds the Lease; False when told to stop first (SIGTERM or SIGINT,
    which kopf handles from then on)."""
    loop = asyncio.get_running_loop()
    acquiring = asyncio.ensure_future(elector.acquire())
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, acquiring.cancel)
    try:
        await acquiring
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise
        return False
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return True


async def serve(args: argparse.Namespace, outages: ApiOutages) -> None:
    """The operator, and its health endpoint when asked for one."""
    elector = await candidate(args, outages) if args.leader_elect else None
    operator = build_operator(
        worker_image=args.worker_image,
        may_write=elector.leading if elector is not None else None,
        max_concurrent_rollouts=args.max_concurrent_rollouts,
        autoscaler_options={"interval": args.autoscale_interval},
        router_settings=main.router_settings(args),
    )
    insights = Insights()
    metrics = CollectorRegistry()
    metrics.register(operator.reconciler.autoscaler.collector())

    def health() -> tuple[int, dict[str, Any]]:
        if elector is not None and not elector.leading():
            return 200, {"serving": False, "standby": True, "leader": elector.holder}
        reason = operator.reconciler.not_serving_because(insights)
        return (200, {"serving": True}) if reason is None else (503, {"serving": False, "reason": reason})

    runner = None
    if args.liveness:
        url = urllib.parse.urlsplit(args.liveness)
        runner = aiohttp.web.AppRunner(health_app(url.path or "/", health, metrics), access_log=None)
        await runner.setup()
        await aiohttp.web.TCPSite(runner, url.hostname or "0.0.0.0", url.port or 80).start()
    renewing = None
    try:
        if elector is not None:
            if not await until_leading(elector):
                return
            renewing = asyncio.create_task(elector.renew())
        await kopf.operator(
            registry=operator.registry,
            settings=operator_settings(),
            insights=insights,
            clusterwide=not args.namespaces,
            namespaces=args.namespaces or (),
            standalone=True,
        )
    finally:
        if renewing is not None:
            renewing.cancel()
        if elector is not None:
            await elector.release()
        if runner is not None:
            await runner.cleanup()


def run(args: argparse.Namespace) -> None:
    kopf.configure(verbose=args.verbose, log_prefix=True)
    inherited = os.environ.pop(OUTAGE_ENV, None)
    outages = ApiOutages(verbose=args.verbose, since=float(inherited) if inherited else None)
    for handler in logging.getLogger().handlers:
        handler.addFilter(outages)
    logging.getLogger("kopf._cogs.clients").setLevel(logging.DEBUG)
    logging.getLogger("kopf._core.reactor.observation").addFilter(OptionalMonitoring())
    if not args.verbose:
        logging.getLogger("kopf.objects").addFilter(QuietWatchHandlers(WATCH_HANDLERS))
    asyncio.run(serve(args, outages))
