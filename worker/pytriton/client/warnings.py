"""Warnings of the PyTriton clients, with PyTriton's names so that callers' warning filters keep working."""


class PyTritonWarning(UserWarning):
    """Base class of the warnings of the `pytriton` package."""


class NotSupportedTimeoutWarning(PyTritonWarning):
    """A timeout was given to a client that cannot apply it (tritonclient's gRPC client bounds inferences
    only, not the other calls)."""
