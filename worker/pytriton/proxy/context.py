"""The model context: what a callable may know about the model it serves and the call it is in.

The runtime makes a model's `TritonContext` active with `use_triton_context` on the thread that calls the
model's callable, and PyTriton's decorators read it (`pytriton.decorators` exports both names, as in
PyTriton). Both sides need it, so it lives here beside the request type and imports nothing of the project
but the model configuration types.
"""

from __future__ import annotations

import contextvars
import dataclasses
import types
from collections.abc import Mapping
from typing import Any

from pytriton.model_config import ModelConfig, Tensor


@dataclasses.dataclass(frozen=True)
class TritonContext:
    """What a callable may know about the model it serves and the call it is in.

    `model_config` is None when the callable runs outside a bound model (a direct call without
    `use_triton_context`). `parameters` holds the request parameters of the current call.
    """

    model_name: str = ""
    model_config: ModelConfig | None = None
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def output_names(self) -> list[str]:
        return [str(tensor.name) for tensor in self.outputs]


ACTIVE_CONTEXT: contextvars.ContextVar[TritonContext | None] = contextvars.ContextVar(
    "pytriton_context", default=None
)
"""The context of the current call, None outside any."""


class use_triton_context:
    """Make `context` the model context of the decorated callables called inside the block.

    A class (named as PyTriton's function) rather than a generator-based context manager, so that entering
    it costs little."""

    __slots__ = ("_context", "_token")

    def __init__(self, context: TritonContext) -> None:
        self._context = context

    def __enter__(self) -> TritonContext:
        self._token = ACTIVE_CONTEXT.set(self._context)
        return self._context

    def __exit__(self, *exc_info: object) -> None:
        ACTIVE_CONTEXT.reset(self._token)


_NO_CONTEXT = TritonContext(parameters=types.MappingProxyType({}))


def active_context() -> TritonContext:
    """The active context, or an empty one (no model, no parameters) outside a bound model."""
    return ACTIVE_CONTEXT.get() or _NO_CONTEXT
