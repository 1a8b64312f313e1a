"""The few Kubernetes API calls the reconciler makes itself, over kopf's own credentials.

kopf watches and patches the PyTritonModel objects; children are written here. Children are
applied with server-side apply under one field manager, so one request creates or updates a child,
fields the model no longer sets are removed, and fields other controllers own (an autoscaler's
replica count) are left alone. kopf's login handlers supply the connection; nothing here knows
whether it came from a service account or a kubeconfig.

An operator that may lose its leadership gives its session a `may_write` check: every write is
refused, without being sent, once the check says no (see `leader`).

Every failure, an answer that is not a success as much as no answer at all, comes out as a
`KubeError` that says whether trying again soon may help. A bounded number of requests is in flight
at once: hundreds of models reconciled together queue here rather than at a busy API server, where
they would run into the request timeout.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import kopf

FIELD_MANAGER = "kubetriton-operator"
HANDOVER_FIELD_MANAGER = "kubetriton-operator-handover"
"""Co-owns a Deployment's replica count while the autoscaler takes it over (see `children`)."""
AUTOSCALER_FIELD_MANAGER = "kubetriton-autoscaler"
"""Owns the replica count of a Deployment the operator scales on the model's own signals."""
REQUEST_TIMEOUT_SECONDS = 30
MAX_REQUESTS_IN_FLIGHT = 16
NO_ANSWER = 0
"""The status of a request that got no HTTP answer: a timeout or a broken connection."""
NOT_SENT = -1
"""The status of a write refused before it was sent: the operator is not the leader (any more)."""
CONFLICT, TOO_MANY_REQUESTS = 409, 429
UNMERGEABLE = "failed to create typed patch object"


class KubeError(Exception):
    """A Kubernetes API call that failed, with the API server's own message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message if status in (NO_ANSWER, NOT_SENT) else f"HTTP {status}: {message}")
        self.status = status
        self.message = message

    @property
    def temporary(self) -> bool:
        """Whether the same request may succeed soon: no answer, a conflict, throttling, a server
        error; but not an object that server-side apply cannot merge (say, two Service ports or two
        env vars with the same key), which the API server also answers with a 500."""
        if self.message.startswith(UNMERGEABLE):
            return False
        return self.status in (NO_ANSWER, CONFLICT, TOO_MANY_REQUESTS) or self.status >= 500

    @property
    def namespace_terminating(self) -> bool:
        """The namespace is being deleted, so nothing new may be created in it."""
        return self.status == 403 and "because it is being terminated" in self.message


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The URL path of a collection, an object or an object's subresource."""
    group, _, version = api_version.rpartition("/")
    parts = [f"/apis/{group}/{version}" if group else f"/api/{version}"]
    if namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _pem(data: str | bytes) -> str:
    """kopf keeps kubeconfig data either base64-encoded or as PEM text; ssl wants PEM text."""
    raw = _as_bytes(data)
    return (raw if raw.lstrip().startswith(b"-----") else base64.b64decode(raw)).decode()


def ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    """TLS for the API server: its CA and our client certificate, or False when told not to verify."""
    if info.insecure:
        return False
    context = ssl.create_default_context(
        cafile=str(info.ca_path) if info.ca_path else None,
        cadata=_pem(info.ca_data) if info.ca_data else None,
    )
    certificate, key = info.certificate_path, info.private_key_path
    with tempfile.NamedTemporaryFile("w") as cert_file, tempfile.NamedTemporaryFile("w") as key_file:
        if info.certificate_data:
            cert_file.write(_pem(info.certificate_data))
            cert_file.flush()
            certificate = cert_file.name
        if info.private_key_data:
            key_file.write(_pem(info.private_key_data))
            key_file.flush()
            key = key_file.name
        if certificate:
            context.load_cert_chain(str(certificate), str(key) if key else None)
    return context


class KubeApi:
    """An aiohttp session to the API server, reconnected whenever kopf logs in again."""

    def __init__(
        self, timeout: float = REQUEST_TIMEOUT_SECONDS, may_write: Callable[[], bool] | None = None
    ) -> None:
        self._timeout = timeout
        self._may_write = may_write
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None
        self._in_flight = asyncio.Semaphore(MAX_REQUESTS_IN_FLIGHT)

    async def connect(self, info: kopf.ConnectionInfo) -> None:
        """Use these credentials from now on."""
        await self.close()
        self._info = info

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._info is None:
            raise KubeError(401, "the operator has not logged in to the API server yet")
        if self._session is None:
            info = self._info
            headers = {"User-Agent": FIELD_MANAGER}
            if info.token:
                headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
            auth = aiohttp.BasicAuth(info.username, info.password or "") if info.username else None
            self._session = aiohttp.ClientSession(
                base_url=info.server.rstrip("/"),
                headers=headers,
                auth=auth,
                connector=aiohttp.TCPConnector(ssl=ssl_context(info), limit=MAX_REQUESTS_IN_FLIGHT),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        return self._session

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        session = self._open()
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._in_flight:
            if method != "GET" and self._may_write is not None and not self._may_write():
                raise KubeError(NOT_SENT, f"{method} {path} not sent: this operator is not the leader")
            try:
                async with session.request(
                    method, path, data=data, headers=headers, params=params
                ) as response:
                    text = await response.text()
            except TimeoutError as error:
                raise KubeError(
                    NO_ANSWER, f"no answer from the API server within {self._timeout:g} s"
                ) from error
            except aiohttp.ClientError as error:
                raise KubeError(NO_ANSWER, f"no answer from the API server: {error}") from error
        if response.status >= 400:
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise KubeError(response.status, message)
        return json.loads(text) if text else {}

    async def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An object, or None when it does not exist."""
        try:
            return await self._request("GET", resource_path(api_version, plural, namespace, name))
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    async def create(self, obj: Mapping[str, Any], plural: str) -> dict[str, Any]:
        """Create an object; 409 when it exists."""
        path = resource_path(obj["apiVersion"], plural, obj["metadata"].get("namespace"))
        return await self._request("POST", path, body=obj)

    async def json_patch(
        self, api_version: str, plural: str, namespace: str, name: str, operations: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Apply a JSON patch; its `test` operations make it conditional (a failed one is a 422)."""
        path = resource_path(api_version, plural, namespace, name)
        return await self._request("PATCH", path, body=operations, content_type="application/json-patch+json")

    async def apply(
        self, obj: Mapping[str, Any], plural: str, field_manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        """Create or update an object by server-side apply."""
        metadata = obj["metadata"]
        path = resource_path(obj["apiVersion"], plural, metadata.get("namespace"), metadata["name"])
        return await self._request(
            "PATCH",
            path,
            body=obj,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": field_manager, "force": "true"},
        )

    async def delete(self, api_version: str, plural: str, namespace: str, name: str) -> bool:
        """Delete an object; False when it was not there."""
        try:
            await self._request("DELETE", resource_path(api_version, plural, namespace, name))
        except KubeError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def patch_status(
        self, api_version: str, plural: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge-patch the status subresource."""
        path = resource_path(api_version, plural, namespace, name, "status")
        await self._request(
            "PATCH", path, body={"status": status}, content_type="application/merge-patch+json"
        )
