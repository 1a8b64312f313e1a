"""Triton: bind inference callables to a Triton server and serve them.

`Triton()` launches a local `tritonserver` by default. Inside a pod rendered by the kubetriton operator
(`KUBETRITON_MODE=attach`), it attaches to the Triton sidecar instead, and `RemoteTriton` attaches to any
Triton prepared the same way. The same script runs unchanged in all places: `bind()` writes the model into
the repository Triton reads, starts the worker instances that execute the callable, and loads the model
through Triton's repository API.

This module is PyTriton's API and no more: its classes keep PyTriton's signatures, check the arguments,
settle what PyTriton settles before anything runs (the configuration from the environment, the lifecycle
policy) and hand the work to kubetriton's runtime, `kubetriton.triton_serving.TritonServing` and
`kubetriton.remote_serving.RemoteServing`. The settings are `pytriton.settings`'s, exported here under
PyTriton's names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubetriton import podenv
from kubetriton.model_repository import check_model_name, checked_config, name_tensors
from kubetriton.remote_serving import RemoteServing
from kubetriton.serving import Serving
from kubetriton.triton_serving import TritonServing

from pytriton.client._url import parse_url
from pytriton.exceptions import PyTritonModelConfigError, PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.settings import (
    DEFAULT_PROTECTED_ENDPOINTS,
    ENV_CONFIG_PREFIX,
    VALID_TRITON_ENDPOINTS,
    DefaultTritonLifecyclePolicy,
    TritonConfig,
    TritonLifecyclePolicy,
    TritonSecurityConfig,
    VertextAILifecyclePolicy,
)

__all__ = [
    "DEFAULT_PROTECTED_ENDPOINTS",
    "ENV_CONFIG_PREFIX",
    "TRITON_ACCESS_HEADER",
    "VALID_TRITON_ENDPOINTS",
    "DefaultTritonLifecyclePolicy",
    "RemoteTriton",
    "Triton",
    "TritonConfig",
    "TritonLifecyclePolicy",
    "TritonSecurityConfig",
    "VertextAILifecyclePolicy",
]

TRITON_ACCESS_HEADER = podenv.ACCESS_TOKEN_HEADER


def _is_generator_callable(func: Callable[..., Any]) -> bool:
    target = func if inspect.isfunction(func) or inspect.ismethod(func) else getattr(func, "__call__", func)  # noqa: B004
    target = inspect.unwrap(target)
    return inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target)


class _TritonBase:
    """What Triton and RemoteTriton share: PyTriton's methods, each handed to the runtime's `Serving`."""

    _serving: Serving
    _lifecycle: TritonLifecyclePolicy

    def __enter__(self) -> Any:
        if self._lifecycle.launch_triton_on_startup:
            try:
                self.connect()
            except BaseException:
                self.stop()
                raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: ModelConfig | None = None,
        strict: bool = False,
        trace_config: list[str] | None = None,
    ) -> None:
        """Serve `infer_func` as version `model_version` of `model_name`. A list of callables gives one
        Triton instance each. `trace_config` sets Triton's trace settings for this model."""
        try:
            check_model_name(model_name)
            named_inputs = name_tensors(inputs, "INPUT")
            named_outputs = name_tensors(outputs, "OUTPUT")
        except ValueError as error:
            raise PyTritonValidationError(str(error)) from None
        if isinstance(model_version, bool) or not isinstance(model_version, int) or model_version < 1:
            raise PyTritonValidationError(
                f"Model '{model_name}': model_version must be a positive integer, not {model_version!r}"
            )
        if any(tensor.optional for tensor in named_outputs):
            raise PyTritonValidationError(
                f"Model '{model_name}': output tensors cannot be optional (a callable returns every output)"
            )
        config = checked_config(model_name, config or ModelConfig())
        funcs = list(infer_func) if isinstance(infer_func, (list, tuple)) else [infer_func]
        if not funcs or not all(callable(func) for func in funcs):
            raise PyTritonValidationError(
                f"infer_func of model '{model_name}' must be a callable or a list of callables"
            )
        if not config.decoupled and any(_is_generator_callable(func) for func in funcs):
            raise PyTritonModelConfigError(
                f"Model '{model_name}' callable is a generator; "
                "bind it with ModelConfig(decoupled=True) to stream"
            )
        self._serving.bind(
            model_name,
            funcs,
            named_inputs,
            named_outputs,
            version=model_version,
            config=config,
            strict=strict,
            trace_config=trace_config or (),
        )

    def connect(self) -> None:
        """Reach Triton (launching it in local mode) and load every bound model."""
        self._serving.connect()

    def is_connected(self) -> bool:
        return self._serving.is_connected()

    def serve(self, monitoring_period_s: float = 1.0) -> None:
        """Serve until SIGINT or SIGTERM, then drain and stop. Exits non-zero after an unrecoverable error."""
        self._serving.serve(monitoring_period_s)

    def is_alive(self) -> bool:
        return self._serving.is_alive()

    def stop(self) -> bool:
        """Drain in-flight requests, leave Triton, stop the workers and free shared memory. True when this
        call stopped serving, False when it was stopped already."""
        return self._serving.stop()


class Triton(_TritonBase):
    """Serves bound callables through Triton: a local `tritonserver` it launches, or in a pod the sidecar.
    Use as a context manager, or call run() and stop()."""

    _serving: TritonServing

    def __init__(
        self,
        *,
        config: TritonConfig | None = None,
        workspace: str | Path | None = None,
        triton_lifecycle_policy: TritonLifecyclePolicy | None = None,
        security_config: TritonSecurityConfig | None = None,
    ) -> None:
        config = (config or TritonConfig()).merged_over(TritonConfig.from_env())
        self._lifecycle = triton_lifecycle_policy or (
            VertextAILifecyclePolicy if config.allow_vertex_ai else DefaultTritonLifecyclePolicy
        )
        self._serving = TritonServing(
            config=config, workspace=workspace, lifecycle=self._lifecycle, security=security_config
        )

    def get_access_token(self) -> str | None:
        """The token of the protected endpoints: the TritonSecurityConfig's, or in a pod the pod's."""
        return self._serving.get_access_token()

    def run(self) -> None:
        """Start serving in the background: launch or attach to Triton and load every bound model."""
        self.connect()


class RemoteTriton(_TritonBase):
    """Binds callables to a Triton that runs already: one that a `Triton()` of this user serves on this
    machine (PyTriton's remote mode between two scripts), or any Triton prepared like the pod's sidecar
    (kubetriton's attach mode, which `Triton()` uses inside a pod).

    Without a `workspace` (nor `KUBETRITON_WORKSPACE`), a local `Triton()` listening at `url` is looked up
    among the servers this user's processes publish (see `kubetriton.server`): its repository, sockets,
    arenas and tokens are used. Otherwise the Triton must run with kubetriton's arguments (explicit model
    control, its model repository in `<workspace>/models`, the repository token from
    `<workspace>/repository-token` on the model-repository API) and find the proxy's runtime, all of which
    `kubetriton bootstrap --workspace <workspace>` prepares (default workspace: /workspace, the pod's). The
    workspace must be the same directory for both, and the shared-memory directory (`KUBETRITON_SHM_DIR`,
    default /dev/shm) too: sockets and tensors pass through them, so the two run on one machine (in one pod,
    or containers sharing both volumes). `url` is how this process reaches Triton's HTTP or gRPC endpoint,
    and `access_token` what its protected endpoints demand.
    """

    def __init__(
        self, url: str, workspace: str | Path | None = None, access_token: str | None = None
    ) -> None:
        self._lifecycle = DefaultTritonLifecyclePolicy
        self._serving = RemoteServing(parse_url(url), workspace, access_token)
