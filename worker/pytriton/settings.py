"""The settings a `Triton()` takes, as plain data: the server's (`TritonConfig`), when it starts and how it
gets its models (`TritonLifecyclePolicy`), and which endpoints need a token (`TritonSecurityConfig`).

They are the contract between the PyTriton API and kubetriton's runtime: users build them, `pytriton.triton`
hands them to the runtime, and the runtime reads them (a supervisor rebuilds a worker process's settings
from their fields to launch the server the processes share). So this module imports nothing of the project
but the exceptions; `pytriton.triton` exports every name here under PyTriton's module path.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytriton.exceptions import PyTritonValidationError

LOGGER = logging.getLogger(__name__)

ENV_CONFIG_PREFIX = "PYTRITON_TRITON_CONFIG_"
VALID_TRITON_ENDPOINTS = frozenset(
    {
        "health",
        "metadata",
        "inference",
        "shared-memory",
        "model-config",
        "model-repository",
        "statistics",
        "trace",
        "logging",
    }
)
"""The endpoint groups Triton can restrict (its `--http-restricted-api` and `--grpc-restricted-protocol`)."""
DEFAULT_PROTECTED_ENDPOINTS = ["shared-memory", "model-repository", "statistics", "trace", "logging"]
"""The Triton endpoints that need the access token unless a `TritonSecurityConfig` says otherwise, as in
PyTriton 0.7, in a pod's sidecar as on a local server. The model-repository API is always restricted, by
kubetriton's repository token alone where the access token does not open it."""


@dataclasses.dataclass(kw_only=True)
class TritonConfig:
    """Settings of the Triton server, PyTriton 0.7's fields with Triton's meanings; each reaches
    `tritonserver` as the argument of the same name (`grpc_use_ssl` is `--grpc-use-ssl`). A field left
    `None` keeps Triton's default, or kubetriton's where it has one (ports 8000-8002, strict readiness,
    a 16 MiB response cache). Keyword arguments only, as in PyTriton.

    Every field can also come from the environment (see `from_env`); a value given here wins. In a pod
    the server is the sidecar, whose arguments come from the PyTritonModel: there only `log_verbose` is
    accepted (kubetriton sets it through Triton's logging API), the other fields are refused.
    """

    model_repository: Path | None = None
    id: str | None = None
    log_verbose: int | None = None
    log_file: Path | None = None
    exit_timeout_secs: int | None = None
    exit_on_error: bool | None = None
    strict_readiness: bool | None = None
    allow_http: bool | None = None
    http_address: str | None = None
    http_port: int | None = None
    http_header_forward_pattern: str | None = None
    http_thread_count: int | None = None
    http_restricted_api: str | None = None
    allow_grpc: bool | None = None
    grpc_address: str | None = None
    grpc_port: int | None = None
    grpc_header_forward_pattern: str | None = None
    grpc_infer_allocation_pool_size: int | None = None
    grpc_use_ssl: bool | None = None
    grpc_use_ssl_mutual: bool | None = None
    grpc_server_cert: Path | None = None
    grpc_server_key: Path | None = None
    grpc_root_cert: Path | None = None
    grpc_infer_response_compression_level: str | None = None
    grpc_keepalive_time: int | None = None
    grpc_keepalive_timeout: int | None = None
    grpc_keepalive_permit_without_calls: bool | None = None
    grpc_http2_max_pings_without_data: int | None = None
    grpc_http2_min_recv_ping_interval_without_data: int | None = None
    grpc_http2_max_ping_strikes: int | None = None
    grpc_restricted_protocol: str | None = None
    allow_metrics: bool | None = None
    allow_gpu_metrics: bool | None = None
    allow_cpu_metrics: bool | None = None
    metrics_interval_ms: int | None = None
    metrics_port: int | None = None
    metrics_address: str | None = None
    allow_sagemaker: bool | None = None
    sagemaker_port: int | None = None
    sagemaker_safe_port_range: str | None = None
    sagemaker_thread_count: int | None = None
    allow_vertex_ai: bool | None = None
    vertex_ai_port: int | None = None
    vertex_ai_thread_count: int | None = None
    vertex_ai_default_model: str | None = None
    metrics_config: list[str] | None = None
    trace_config: list[str] | None = None
    cache_config: list[str] | None = None
    cache_directory: str | None = None
    buffer_manager_thread_count: int | None = None

    def __post_init__(self) -> None:
        """Values as PyTriton passes them on to tritonserver: text for a number or a flag (`"8010"`,
        `"false"`) is read as `from_env` reads it, 0 and 1 are flags, and a tuple is a list."""
        for field in dataclasses.fields(self):
            value, kind = getattr(self, field.name), _field_kind(field.name)
            if value is None:
                continue
            if isinstance(value, str) and kind in (int, bool):
                value = _parse_field(field.name, value)
            elif kind is bool and value in (0, 1):
                value = bool(value)
            elif kind is list and isinstance(value, tuple):
                value = list(value)
            elif kind is Path and not isinstance(value, Path):
                value = Path(value)
            setattr(self, field.name, value)
        if self.allow_http is False and self.allow_grpc is False:
            raise PyTritonValidationError(
                "TritonConfig: allow_http and allow_grpc cannot both be False; Triton must serve one of them"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> TritonConfig:
        """A TritonConfig from a mapping of field names to values. Strings are parsed into the field's type
        as `from_env` describes; names that are no field are logged and ignored, as in PyTriton."""
        values: dict[str, Any] = {}
        for name, value in config.items():
            if name not in _FIELD_KINDS:
                LOGGER.warning(
                    "Ignoring %s=%r: TritonConfig has no such field (fields: %s)",
                    name,
                    value,
                    ", ".join(_FIELD_KINDS),
                )
            elif isinstance(value, str):
                values[name] = _parse_field(name, value)
            else:
                values[name] = list(value) if value is not None and _field_kind(name) is list else value
        return cls(**values)

    @classmethod
    def from_env(cls) -> TritonConfig:
        """A TritonConfig from the `PYTRITON_TRITON_CONFIG_<FIELD>` variables that are set; the other
        fields stay None. Integers must parse as such (else ValueError); booleans are `1`, `true`, `yes`
        or `on`, and `0`, `false`, `no` or `off`, in any case (anything else is a ValueError); paths become
        `Path`s. A list field is given item by item, `PYTRITON_TRITON_CONFIG_CACHE_CONFIG_0`, `..._1`
        (in index order), or as one variable whose items are separated by `;` (empty: no items)."""
        plain: dict[str, str] = {}
        indexed: dict[str, dict[int, str]] = {}
        for variable, value in os.environ.items():
            if not variable.startswith(ENV_CONFIG_PREFIX):
                continue
            key = variable[len(ENV_CONFIG_PREFIX) :].lower()
            item = _INDEXED_ITEM.match(key)
            if item and _FIELD_KINDS.get(item.group(1)) is list:
                indexed.setdefault(item.group(1), {})[int(item.group(2))] = value
            else:
                plain[key] = value
        config: dict[str, Any] = dict(plain)
        for name, items in indexed.items():
            if name in plain:
                raise ValueError(
                    f"Set either {ENV_CONFIG_PREFIX}{name.upper()} or {ENV_CONFIG_PREFIX}{name.upper()}_<n>, "
                    "not both"
                )
            config[name] = [items[index] for index in sorted(items)]
        try:
            return cls.from_dict(config)
        except ValueError as error:
            raise ValueError(f"{error} (read from the {ENV_CONFIG_PREFIX}<FIELD> variables)") from None

    def merged_over(self, base: TritonConfig) -> TritonConfig:
        """A copy of `base` with this config's non-None fields laid over it."""
        return dataclasses.replace(
            base,
            **{
                f.name: getattr(self, f.name)
                for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None
            },
        )

    def extra_args(self) -> list[str]:
        """`tritonserver` arguments for every field set, except those kubetriton passes itself (the model
        repository, log settings, exit timeout and ports). They come after kubetriton's own arguments, so
        that `strict_readiness` and `allow_metrics` override kubetriton's defaults."""
        args = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None or field.name in _ARGS_OF_THE_LAUNCHER:
                continue
            flag = "--" + field.name.replace("_", "-")
            if isinstance(value, bool):
                args.append(f"{flag}={str(value).lower()}")
            elif isinstance(value, list):
                args += [f"{flag}={item}" for item in value]
            else:
                args.append(f"{flag}={value}")
        return args


_ARGS_OF_THE_LAUNCHER = frozenset(
    {
        "model_repository",
        "log_verbose",
        "log_file",
        "exit_timeout_secs",
        "http_port",
        "grpc_port",
        "metrics_port",
    }
)
_INDEXED_ITEM = re.compile(r"^(.+?)_(\d+)$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_flag(raw: str) -> bool | None:
    """A flag as a variable of the environment writes it (`1`, `true`, `yes`, `on`, and their opposites, in
    any case, blank for none); None when it is no flag."""
    word = raw.strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


def _field_kind(name: str) -> type:
    return _FIELD_KINDS[name]


def _parse_field(name: str, raw: str) -> Any:
    kind = _field_kind(name)
    if kind is bool:
        if (flag := parse_flag(raw)) is not None:
            return flag
        raise ValueError(f"TritonConfig.{name}: {raw!r} is not a boolean (true/false, 1/0, yes/no, on/off)")
    if kind is list:
        return [item for item in raw.split(";") if item]
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"TritonConfig.{name}: {raw!r} is not a whole number") from None
    return kind(raw)


def _kinds(cls: type) -> dict[str, type]:
    """Each field's type without its `None`: bool, int, str, Path or list."""
    kinds = {}
    for name, hint in typing.get_type_hints(cls).items():
        (kind,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
        kinds[name] = list if typing.get_origin(kind) is list else kind
    return kinds


_FIELD_KINDS = _kinds(TritonConfig)


@dataclasses.dataclass
class TritonLifecyclePolicy:
    """When Triton is launched, and how it gets the bound models.

    `launch_triton_on_startup=False`: entering `with Triton()` neither launches nor attaches; `run()`,
    `connect()` or `serve()` does. `local_model_store=True`: models bound before the launch are written into
    the repository first and Triton loads them as it starts (local mode only; Vertex AI needs its models at
    start-up); models bound later are loaded through the repository API as usual.
    """

    launch_triton_on_startup: bool = True
    local_model_store: bool = False


DefaultTritonLifecyclePolicy = TritonLifecyclePolicy()
VertextAILifecyclePolicy = TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True)
"""What `Triton()` uses when `TritonConfig(allow_vertex_ai=True)` and no policy is given (PyTriton's name)."""


@dataclasses.dataclass
class TritonSecurityConfig:
    """Which Triton endpoints need an access token, and the token.

    `restricted_endpoints=None` protects `DEFAULT_PROTECTED_ENDPOINTS`; `[]` protects none. Without an
    `access_token`, one is generated when something is protected. Clients send it in the
    `triton-access-token` header (`ModelClient(..., access_token=...)` does). The model-repository API is
    restricted in any case: on a local server protecting it, by the access token as well; otherwise (not
    protected here, or in a pod) by kubetriton's own token alone.

    A token given must be visible ASCII, no space (`carriable_token` says why); an empty one is refused,
    where PyTriton 0.7 took it and then protected nothing.
    """

    access_token: str | None = None
    restricted_endpoints: list[str] | None = None

    def __post_init__(self) -> None:
        if self.restricted_endpoints is None:
            self.restricted_endpoints = list(DEFAULT_PROTECTED_ENDPOINTS)
        unknown = sorted(set(self.restricted_endpoints) - VALID_TRITON_ENDPOINTS)
        if unknown:
            raise PyTritonValidationError(
                f"Invalid endpoint names: {', '.join(unknown)}. "
                f"Valid endpoints are: {', '.join(sorted(VALID_TRITON_ENDPOINTS))}"
            )
        if self.access_token is not None:
            _check_access_token(self.access_token)
        self._token_generated = self.access_token is None and bool(self.restricted_endpoints)
        if self._token_generated:
            self.access_token = secrets.token_urlsafe(32)


_VISIBLE_ASCII = re.compile(r"[!-~]+")


def carriable_token(token: object) -> bool:
    """Whether `token` can be an access token: visible ASCII, no space. Clients send it as an HTTP header's
    value and as gRPC metadata, which hold printable ASCII (a header's value loses its spaces at either
    end), and tritonserver takes it in the argument `<endpoints>:triton-access-token=<token>`, whose value
    is all that follows the first `=` after the first `:`, ':' and '=' included."""
    return isinstance(token, str) and _VISIBLE_ASCII.fullmatch(token) is not None


def _check_access_token(token: str) -> None:
    """PyTritonValidationError for a token that protects nothing or that a header cannot carry. The message
    never holds the token: a traceback must not show the secret (a header refused it with its value)."""
    if token == "":
        raise PyTritonValidationError(
            "TritonSecurityConfig(access_token=''): an empty token would leave the restricted endpoints open "
            "to anyone (PyTriton 0.7 then restricts nothing). To protect them, leave it None to get a "
            "generated one (Triton().get_access_token() returns it) or give a token; to leave them open, "
            "pass restricted_endpoints=[] and no token"
        )
    if not carriable_token(token):
        raise PyTritonValidationError(
            "TritonSecurityConfig(access_token=...): the token must be visible ASCII characters only "
            "(letters, digits and punctuation; no space, no control character such as a newline, nothing "
            "outside ASCII): clients send it in an HTTP header and in gRPC metadata"
        )


def is_default_security(config: TritonSecurityConfig) -> bool:
    """Whether `config` is `TritonSecurityConfig()`: the default endpoints and a generated token."""
    return config._token_generated and set(config.restricted_endpoints or ()) == set(
        DEFAULT_PROTECTED_ENDPOINTS
    )


def given_access_token(config: TritonSecurityConfig) -> str | None:
    """The access token the user gave, or None where `config` generated it."""
    return None if config._token_generated else config.access_token
