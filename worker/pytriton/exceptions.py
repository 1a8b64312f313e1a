"""Exceptions raised by the server side of the API, with PyTriton's names and hierarchy."""

from __future__ import annotations


class PyTritonError(Exception):
    """Base class of the server-side errors."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    @property
    def message(self) -> str:
        return self._message


class PyTritonValidationError(PyTritonError):
    """A value given to the API is invalid."""


class PyTritonInvalidOperationError(PyTritonError):
    """The operation is not allowed in the current state."""


class PyTritonBadParameterError(PyTritonError):
    """A parameter is invalid."""


class PyTritonModelConfigError(PyTritonError):
    """A model configuration is invalid."""


class PyTritonUnrecoverableError(PyTritonError):
    """Raised by a callable when no further inference is possible.

    The client gets an error, serving stops, and the process exits non-zero so that an orchestrator
    restarts it."""


class PyTritonRuntimeError(PyTritonError):
    """A runtime failure of the server, such as Triton exiting unexpectedly."""
