"""Fixtures: an emulated cluster served over HTTP, and the real operator running against it."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kmock
import pytest
import pytest_asyncio
from emulator import ClusterEmulator, OperatorThread


@pytest_asyncio.fixture()
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[ClusterEmulator]:
    """An emulated cluster with the PyTritonModel CRD, established; parametrize it indirectly with
    ClusterEmulator's options."""
    options = {"model_crd": True, "established_crds": True, **getattr(request, "param", {})}
    async with ClusterEmulator(**options) as emulator, kmock.Server(emulator):
        yield emulator


@pytest_asyncio.fixture()
async def start_operator(cluster: ClusterEmulator) -> AsyncIterator[Callable[..., Awaitable[OperatorThread]]]:
    """Start the operator (again, after a stop) with `build_operator`'s options; every operator
    still running is stopped at teardown."""
    started: list[OperatorThread] = []

    async def start(**options: Any) -> OperatorThread:
        operator = OperatorThread(str(cluster.servers[0].url).rstrip("/"), **options).start()
        started.append(operator)
        assert await asyncio.to_thread(operator.ready.wait, 20), "the operator did not get ready"
        return operator

    yield start
    for operator in started:
        if operator.alive:
            await asyncio.to_thread(operator.stop)


async def eventually(check: Callable[[], Any], timeout: float = 10, message: str = "") -> Any:
    """Poll until `check` returns something truthy (and return it), or fail after `timeout` seconds.

    `check` may be a coroutine function; it is awaited then."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s: {message}")
        await asyncio.sleep(0.05)
