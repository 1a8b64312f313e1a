"""The operator's process: kopf running the reconciler, a health endpoint, and logs worth reading.

kopf watches CRDs and namespaces as they come and go, so an operator started before its CRD serves
models as soon as the CRD is installed; until kopf watches the models, the health endpoint answers
503 and says why (were kopf to miss the CRD, the liveness probe restarts the operator). Log lines
about a model start with its `[namespace/name]`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import urllib.parse
from collections.abc import Callable, Iterable

import aiohttp.web
import kopf
from kubetriton.operator.reconciler import WATCH_HANDLERS, Insights, build_operator, operator_settings


def health_app(path: str, not_serving_because: Callable[[], str | None]) -> aiohttp.web.Application:
    """One endpoint that says whether models are being served, and why not."""

    async def health(_: aiohttp.web.Request) -> aiohttp.web.Response:
        reason = not_serving_because()
        if reason is None:
            return aiohttp.web.json_response({"serving": True})
        return aiohttp.web.json_response({"serving": False, "reason": reason}, status=503)

    app = aiohttp.web.Application()
    app.router.add_get(path, health)
    return app


async def serve(args: argparse.Namespace) -> None:
    """The operator, and its health endpoint when asked for one."""
    operator = build_operator(worker_image=args.worker_image)
    insights = Insights()
    runner = None
    if args.liveness:
        url = urllib.parse.urlsplit(args.liveness)
        app = health_app(url.path or "/", lambda: operator.reconciler.not_serving_because(insights))
        runner = aiohttp.web.AppRunner(app, access_log=None)
        await runner.setup()
        await aiohttp.web.TCPSite(runner, url.hostname or "0.0.0.0", url.port or 80).start()
    try:
        await kopf.operator(
            registry=operator.registry,
            settings=operator_settings(),
            insights=insights,
            clusterwide=not args.namespaces,
            namespaces=args.namespaces or (),
            standalone=args.peering is None,
            peering_name=args.peering,
        )
    finally:
        if runner is not None:
            await runner.cleanup()


class QuietWatchHandlers(logging.Filter):
    """Drops kopf's line for each watch-event handler that succeeded: children and pods change many
    times a minute, and a line per event would bury the ones that matter."""

    def __init__(self, handler_ids: Iterable[str]) -> None:
        super().__init__()
        self._lines = {f"Handler {handler_id!r} succeeded." for handler_id in handler_ids}

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno != logging.INFO or record.getMessage() not in self._lines


def run(args: argparse.Namespace) -> None:
    kopf.configure(verbose=args.verbose, log_prefix=True)
    if not args.verbose:
        logging.getLogger("kopf.objects").addFilter(QuietWatchHandlers(WATCH_HANDLERS))
    asyncio.run(serve(args))
