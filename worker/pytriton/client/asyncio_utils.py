"""PyTriton 0.7's asyncio helpers around a plain tritonclient asyncio client: wait for the server or a model,
and read a model's state and configuration.

They are `pytriton.client.utils` awaited, for scripts written for PyTriton that import them; the asyncio
clients of this package need none of them. Every function takes a `tritonclient.http.aio` or
`tritonclient.grpc.aio` `InferenceServerClient`, and `headers` carries what restricted endpoints demand
(see `pytriton.client.auth.create_auth_headers`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import tritonclient.grpc.aio
import tritonclient.http.aio

from pytriton.client.exceptions import PyTritonClientTimeoutError
from pytriton.client.triton_model_config import TritonModelConfig
from pytriton.client.utils import _UNREACHABLE, LATEST_MODEL_VERSION, ModelState, _state_in_index

_TritonAsyncioClientType = (
    tritonclient.grpc.aio.InferenceServerClient | tritonclient.http.aio.InferenceServerClient
)

DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S = 60.0
SLEEP_FACTOR = 0.1
"""The waits bounded by a timeout poll every SLEEP_FACTOR of it, as PyTriton's do."""
_UNREACHABLE_ASYNC = (*_UNREACHABLE, aiohttp.ClientError)


async def asyncio_get_model_state(
    client: _TritonAsyncioClientType,
    model_name: str,
    model_version: str | None = None,
    headers: dict[str, str] | None = None,
) -> ModelState:
    """The state of a version of the model, or of its latest version (the greatest number) without one;
    UNAVAILABLE when the index does not list it."""
    return _state_in_index(
        await client.get_model_repository_index(headers=headers), model_name, model_version
    )


async def asyncio_get_model_config(
    client: _TritonAsyncioClientType,
    model_name: str,
    model_version: str | None = None,
    timeout_s: float = DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S,
    headers: dict[str, str] | None = None,
) -> TritonModelConfig:
    """Wait for the server and the model to be ready, then read its configuration, all within `timeout_s`;
    PyTritonClientTimeoutError when that takes longer."""
    deadline = time.monotonic() + timeout_s
    await asyncio_wait_for_model_ready(
        client, model_name, model_version, timeout_s=timeout_s, headers=headers
    )
    if isinstance(client, tritonclient.grpc.aio.InferenceServerClient):
        read = client.get_model_config(model_name, model_version or "", headers=headers, as_json=True)
    else:
        read = client.get_model_config(model_name, model_version or "", headers=headers)
    try:
        config = await asyncio.wait_for(read, max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError as error:
        raise PyTritonClientTimeoutError(
            f"Timeout while waiting for model {model_name} config (timeout={timeout_s:0.2f})"
        ) from error
    return TritonModelConfig.from_triton_json(config, model_version)


async def asyncio_wait_for_server_ready(
    asyncio_client: _TritonAsyncioClientType,
    sleep_time_s: float,
    headers: dict[str, str] | None = None,
) -> None:
    """Poll every `sleep_time_s` until the server is ready and live, without end (bound it with
    `asyncio.wait_for`). A server that cannot be reached yet is polled again."""

    async def ready() -> bool:
        return await asyncio_client.is_server_ready(headers=headers) and await asyncio_client.is_server_live(
            headers=headers
        )

    await _poll(ready, sleep_time_s)


async def asyncio_wait_for_model_status_loaded(
    asyncio_client: _TritonAsyncioClientType,
    model_name: str,
    sleep_time_s: float,
    model_version: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Poll every `sleep_time_s` until the model version (the latest without one) is ready, without end
    (bound it with `asyncio.wait_for`)."""
    await _poll(
        lambda: asyncio_client.is_model_ready(model_name, model_version or "", headers=headers), sleep_time_s
    )


async def asyncio_wait_for_model_ready(
    asyncio_client: _TritonAsyncioClientType,
    model_name: str,
    model_version: str | None = None,
    timeout_s: float = DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S,
    headers: dict[str, str] | None = None,
) -> None:
    """Wait for the server, then the model version (the latest without one), within `timeout_s` for both;
    PyTritonClientTimeoutError after that."""
    sleep_time_s = timeout_s * SLEEP_FACTOR

    async def wait() -> None:
        await asyncio_wait_for_server_ready(asyncio_client, sleep_time_s, headers=headers)
        await asyncio_wait_for_model_status_loaded(
            asyncio_client, model_name, sleep_time_s, model_version, headers=headers
        )

    try:
        await asyncio.wait_for(wait(), timeout_s)
    except asyncio.TimeoutError as error:
        raise PyTritonClientTimeoutError(
            f"Timeout while waiting for model {model_name}/{model_version or LATEST_MODEL_VERSION} to be "
            f"ready (timeout={timeout_s:0.2f})"
        ) from error


async def _poll(ready: Callable[[], Awaitable[Any]], sleep_time_s: float) -> None:
    """Until `ready()` is true; failures to reach the server count as not ready."""
    while True:
        try:
            if await ready():
                return
        except _UNREACHABLE_ASYNC:
            pass
        await asyncio.sleep(sleep_time_s)
