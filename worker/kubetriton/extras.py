"""The optional parts of kubetriton, and the error that names the extra a missing one comes with.

`pip install kubetriton` brings what serving a callable imports (NumPy, pyzmq, prometheus-client) and
nothing else, so that installing it into a model's image changes none of the image's packages. Two
extras bring the rest, each with the pins of its own requirements:

- `client`: `pytriton.client` (`ModelClient` and its siblings) and a worker that talks gRPC to its
  Triton, through tritonclient's HTTP and gRPC clients;
- `cluster`: the operator and the commands that render for or talk to a cluster (`deploy`, `status`,
  `delete`, `render`, `operator`), through kopf, kubernetes, pydantic and PyYAML.

`all` installs both. An import that fails inside `needed(...)` for a module that is not kubetriton's own
becomes a `MissingExtraError` that says what to install.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

CLIENT = "client"
CLUSTER = "cluster"
OWN_PACKAGES = ("kubetriton", "pytriton")


class MissingExtraError(ImportError):
    """A feature's requirement is not installed; the message names the extra that installs it."""


def install_command(extra: str | None) -> str:
    return f"pip install 'kubetriton[{extra}]'" if extra else "pip install kubetriton"


@contextlib.contextmanager
def needed(extra: str | None, feature: str) -> Iterator[None]:
    """The imports in this block are `feature`'s, which `extra` installs (None: kubetriton itself)."""
    try:
        yield
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if not missing or missing in OWN_PACKAGES:
            raise
        where = f"kubetriton's {extra} extra" if extra else "kubetriton"
        raise MissingExtraError(
            f"{feature} needs {missing}, which {where} installs: {install_command(extra)}", name=error.name
        ) from error
