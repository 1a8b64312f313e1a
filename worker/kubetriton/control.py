"""How kubetriton talks to the Triton it serves through: liveness, model readiness, loading and unloading
models, log and trace settings.

One object per Triton, over HTTP, or over gRPC when the server's HTTP endpoint is off (`allow_http=False`)
or when a remote Triton was given by a gRPC URL. Only gRPC needs tritonclient (kubetriton's client extra),
imported on first use: a worker in a pod talks HTTP to its sidecar, and its image need not have it. Every
request carries two secrets: the repository token that opens Triton's model-repository API, which only
kubetriton holds, and the access token of the user's `TritonSecurityConfig`, which opens the other
restricted endpoints (health, logging, trace, ...). Over gRPC, Triton reads a restricted key from
metadata named `triton-grpc-protocol-<key>`. HTTP requests go straight to the server, never through a
proxy that $http_proxy names: the Triton that kubetriton manages shares its machine (and /dev/shm).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from pytriton.exceptions import PyTritonModelConfigError, PyTritonRuntimeError

from kubetriton.endpoint import parse_url
from kubetriton.extras import CLIENT, needed
from kubetriton.podenv import ACCESS_TOKEN_HEADER, GRPC_RESTRICTED_PREFIX, REPOSITORY_TOKEN_HEADER

LIVENESS_POLL_S = 0.05
PROBE_TIMEOUT_S = 2.0
REPOSITORY_TIMEOUT_S = 300.0
"""Loading a model starts a Python-backend stub per instance, which a busy machine can make slow."""
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _is_server_error(error: Exception) -> bool:
    """Whether a gRPC call's error is tritonclient's, which is imported only once gRPC is used."""
    utils = sys.modules.get("tritonclient.utils")
    return utils is not None and isinstance(error, utils.InferenceServerException)


class TritonControl:
    """The management side of one Triton server at `url`, written as clients write it (`parse_url`).
    Over TLS the system's certificate authorities are trusted, or those in the file that $SSL_CERT_FILE
    (HTTPS) or $GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (gRPC) names."""

    def __init__(self, url: str, *, repository_token: str = "", access_token: str | None = None) -> None:
        self._endpoint = parse_url(url)
        self.url = self._endpoint.url
        self.repository_token = repository_token
        self.access_token = access_token
        self._grpc = self._endpoint.protocol == "grpc"
        self._grpc_client: Any = None

    def _headers(self) -> dict[str, str]:
        secrets = {REPOSITORY_TOKEN_HEADER: self.repository_token}
        if self.access_token:
            secrets[ACCESS_TOKEN_HEADER] = self.access_token
        prefix = GRPC_RESTRICTED_PREFIX if self._grpc else ""
        return {prefix + key: value for key, value in secrets.items() if value}

    def _client(self) -> Any:
        if self._grpc_client is None:
            with needed(CLIENT, f"Managing Triton over gRPC ({self.url})"):
                import tritonclient.grpc  # the client extra's, needed over gRPC only

            self._grpc_client = tritonclient.grpc.InferenceServerClient(
                self._endpoint.address, ssl=self._endpoint.ssl
            )
        return self._grpc_client

    def close(self) -> None:
        if self._grpc_client is not None:
            with contextlib.suppress(Exception):
                self._grpc_client.close()
            self._grpc_client = None

    def _http(self, method: str, path: str, body: Mapping[str, Any] | None, timeout_s: float) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={**self._headers(), "Content-Type": "application/json"},
        )
        with _DIRECT.open(request, timeout=timeout_s) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    def _ok(self, http_path: str, grpc_call: Callable[[Any], bool]) -> bool:
        try:
            if self._grpc:
                return bool(grpc_call(self._client()))
            self._http("GET", http_path, None, PROBE_TIMEOUT_S)
            return True
        except OSError:  # refused, reset or timed out
            return False
        except Exception as error:
            if _is_server_error(error):  # an error status over gRPC
                return False
            raise

    def is_live(self) -> bool:
        return self._ok(
            "/v2/health/live",
            lambda client: client.is_server_live(headers=self._headers(), client_timeout=PROBE_TIMEOUT_S),
        )

    def is_model_ready(self, name: str) -> bool:
        return self._ok(
            f"/v2/models/{name}/ready",
            lambda client: client.is_model_ready(
                name, headers=self._headers(), client_timeout=PROBE_TIMEOUT_S
            ),
        )

    def wait_until_live(self, timeout_s: float, is_running: Callable[[], bool] = lambda: True) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not is_running():
                raise PyTritonRuntimeError("tritonserver exited during start-up")
            if self.is_live():
                return
            time.sleep(LIVENESS_POLL_S)
        raise PyTritonRuntimeError(f"Triton at {self.url} did not become live within {timeout_s:.0f} s")

    def _call(
        self, what: str, http: tuple[str, str, Mapping[str, Any] | None], grpc: Callable[[Any], Any]
    ) -> Any:
        """One management request; Triton's refusal raises PyTritonModelConfigError with its reason, no
        answer at all raises PyTritonRuntimeError."""
        try:
            if self._grpc:
                return grpc(self._client())
            return self._http(*http, REPOSITORY_TIMEOUT_S)
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("error", detail)
            raise PyTritonModelConfigError(f"Triton refused {what}: {detail}") from None
        except OSError as error:  # connection refused or reset, timeout
            reason = getattr(error, "reason", error)
            raise PyTritonRuntimeError(f"Triton at {self.url} did not answer {what}: {reason}") from None
        except Exception as error:
            if not _is_server_error(error):
                raise
            if "UNAVAILABLE" in str(error.status() or ""):
                raise PyTritonRuntimeError(
                    f"Triton at {self.url} did not answer {what}: {error.message()}"
                ) from None
            raise PyTritonModelConfigError(f"Triton refused {what}: {error.message()}") from None

    def load(self, name: str) -> None:
        self._repository("load", name)

    def unload(self, name: str) -> None:
        self._repository("unload", name)

    def _repository(self, action: str, name: str) -> None:
        """Load or unload a model through Triton's model-repository API."""
        path = f"/v2/repository/models/{name}/{action}"
        self._call(
            path,
            ("POST", path, {}),
            lambda client: getattr(client, f"{action}_model")(
                name, headers=self._headers(), client_timeout=REPOSITORY_TIMEOUT_S
            ),
        )

    def log_verbose_level(self) -> int:
        settings = self._call(
            "the log settings",
            ("GET", "/v2/logging", None),
            lambda client: client.get_log_settings(headers=self._headers(), as_json=True)["settings"],
        )
        level = settings.get("log_verbose_level", 0)
        # gRPC's JSON leaves a zero out of its one-of: {"uint32_param": 1}, or {} for 0
        return int(level.get("uint32_param", 0) if isinstance(level, Mapping) else level)

    def set_log_verbose_level(self, level: int) -> None:
        self._call(
            "the log settings",
            ("POST", "/v2/logging", {"log_verbose_level": level}),
            lambda client: client.update_log_settings({"log_verbose_level": level}, headers=self._headers()),
        )

    def update_trace_settings(self, name: str, settings: Mapping[str, Any]) -> None:
        self._call(
            f"the trace settings of model {name}",
            ("POST", f"/v2/models/{name}/trace/setting", settings),
            lambda client: client.update_trace_settings(name, dict(settings), headers=self._headers()),
        )
