"""How `RemoteTriton` serves: through a Triton that runs already, found by its URL.

A `Triton()` of this user on this machine publishes where it serves from (`server.publish`), and
`RemoteServing` uses its repository, sockets, arenas and tokens; any other Triton must have been prepared
like the pod's sidecar (`kubetriton bootstrap`), and `RemoteServing` attaches through its workspace as the
pod's worker does. Leaving unloads the models, since nothing is left in that Triton to serve them.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pytriton.exceptions import PyTritonError, PyTritonRuntimeError
from pytriton.settings import DefaultTritonLifecyclePolicy

from kubetriton import podenv
from kubetriton.control import TritonControl
from kubetriton.endpoint import Endpoint
from kubetriton.server import PublishedServer, find_published, is_this_machine
from kubetriton.serving import LEAVE_DRAIN_S, Serving, debug_requested

REMOTE_WAIT_S = 120.0
"""How long RemoteTriton waits for its Triton to become live and, when it is a local `Triton()`, for that
one to publish its record."""

LOGGER = logging.getLogger(__name__)

PUBLISHED_POLL_S = 0.05
"""How often RemoteTriton looks for the record of a local `Triton()` that answers already."""


class RemoteServing(Serving):
    """`RemoteTriton`'s runtime: binds callables to a Triton that runs already, as
    `pytriton.triton.RemoteTriton` describes it (what that Triton must be, and what both must share).

    `endpoint` is how this process reaches Triton's HTTP or gRPC endpoint, and `access_token` what its
    protected endpoints demand. Without a `workspace` (nor `KUBETRITON_WORKSPACE`), the local `Triton()`
    at `endpoint` is looked up with `server.find_published`; `REMOTE_WAIT_S` bounds the waits for Triton to
    become live and for such a `Triton()`, which may answer already, to publish its record.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        workspace: str | Path | None,
        access_token: str | None,
    ) -> None:
        self._endpoint = endpoint
        self._url = endpoint.url
        self._workspace_given = workspace or os.environ.get(podenv.ENV_WORKSPACE)
        super().__init__(
            workspace=Path(self._workspace_given or podenv.WORKSPACE_MOUNT),
            lifecycle=DefaultTritonLifecyclePolicy,
            debug=debug_requested(),
        )
        self._access_token = access_token
        self._published: PublishedServer | None = None
        """The local `Triton()` bound to, where it is one."""

    def _start_triton(self) -> None:
        self._control = TritonControl(self._url, access_token=self._access_token)
        needs_a_local_triton = not self._workspace_given and not self._bootstrapped()
        if needs_a_local_triton and not is_this_machine(self._endpoint.host):
            raise self._no_local_triton()  # at once: no Triton() of this machine can answer there
        deadline = time.monotonic() + REMOTE_WAIT_S
        LOGGER.info("Waiting for Triton at %s", self._url)
        self._control.wait_until_live(REMOTE_WAIT_S)
        local = None if self._workspace_given else self._published_server(deadline)
        if local is None:
            if needs_a_local_triton:
                raise self._no_local_triton()
            self._attach(Path(os.environ.get(podenv.ENV_SHM_DIR, podenv.SHM_MOUNT)))
            return
        LOGGER.info("Binding to the Triton() of this user at %s", self._url)
        self._published = local
        self._model_repository = Path(local.model_repository)
        self._runtime = Path(local.runtime)
        self._control.access_token = local.access_token
        self._serve_through(local.repository_token, Path(local.sockets), Path(local.arena_dir))

    def _no_local_triton(self) -> PyTritonRuntimeError:
        return PyTritonRuntimeError(
            f"No Triton() of this user on this machine listens at {self._url}, and {self._workspace} "
            "is no workspace prepared by `kubetriton bootstrap`; for such a Triton elsewhere, give "
            "RemoteTriton(url, workspace=...)"
        )

    def _published_server(self, deadline: float) -> PublishedServer | None:
        """The Triton() of this user that listens at the URL. One started at the same moment as this process
        answers before it has published its record: unless there is a workspace prepared by `kubetriton
        bootstrap` to attach to instead, wait for the record until `deadline` (a URL of another machine
        was refused before Triton was asked)."""
        local = find_published(self._endpoint)
        if local is not None or self._bootstrapped():
            return local
        LOGGER.info("Waiting for the Triton() at %s to publish where it serves from", self._url)
        while local is None and time.monotonic() < deadline:
            time.sleep(PUBLISHED_POLL_S)
            local = find_published(self._endpoint)
        return local

    def _check_triton(self) -> None:
        """A local `Triton()` that stopped takes its server along for good (one started again has another
        workspace and tokens): serve() ends with an error, where it would serve nothing."""
        if self._published is not None and find_published(self._endpoint) != self._published:
            raise PyTritonRuntimeError(
                f"The Triton() at {self._url} that this RemoteTriton bound to has stopped, and its models"
                " with it"
            )

    def _bootstrapped(self) -> bool:
        return (self._workspace / podenv.REPOSITORY_TOKEN_FILE).is_file()

    def _leave_triton(self) -> None:
        """Finish what is in flight, then unload the models: nothing is left in Triton to serve them."""
        assert self._control is not None
        self._wait_until_idle(LEAVE_DRAIN_S)
        if not self._group.loads_models:
            return
        for name in self._workers:
            try:
                self._control.unload(name)
            except PyTritonError as error:
                LOGGER.warning("Unloading model '%s' failed: %s", name, error)
