"""Errors of the PyTriton clients, with PyTriton's names so that callers' `except` clauses keep working."""

from __future__ import annotations


class PyTritonClientError(Exception):
    """Base class of every client error; `message` holds the text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    @property
    def message(self) -> str:
        return self._message


class PyTritonClientValueError(PyTritonClientError):
    """An argument is invalid: wrong inputs, mixed positional and named inputs, or the wrong client kind."""


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    """The server URL cannot be parsed or uses an unsupported scheme."""


class PyTritonClientTimeoutError(PyTritonClientError):
    """The server, the model or an inference did not answer in time."""


class PyTritonClientModelUnavailableError(PyTritonClientError):
    """The model is known to the server but cannot serve (for example it failed to load)."""


class PyTritonClientClosedError(PyTritonClientError):
    """The client was closed and cannot be used any more."""


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError):
    """infer_batch was called on a model served without a batch axis (max_batch_size 0)."""


class PyTritonClientInferenceServerError(PyTritonClientError):
    """The server reported an error, or could not be reached (the message then says "connection refused")."""


class PyTritonClientTransactionPolicyError(PyTritonClientValueError, PyTritonClientInferenceServerError):
    """The client kind does not fit the model: a request-response client of a decoupled model, or a
    streaming client of a model that is not decoupled. Raised before anything is sent; it is also a
    PyTritonClientInferenceServerError, which PyTriton raises once the server refused the request."""


class PyTritonClientInputError(PyTritonClientValueError, PyTritonClientInferenceServerError):
    """Inputs the model does not take: a name it has no input of, or more inputs than it has. Raised before
    anything is sent; it is also a PyTritonClientInferenceServerError, which PyTriton raises once the server
    refused the request."""


class PyTritonClientQueueFullError(PyTritonClientError):
    """A FuturesModelClient in non-blocking mode had no room left in its queue."""
