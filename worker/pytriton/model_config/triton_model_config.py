"""PyTriton 0.7's `TritonModelConfig`: a whole model configuration as one mutable dataclass, with its
`TensorSpec` and `ResponseCache`.

kubetriton renders `config.pbtxt` from `ModelConfig` and the bound tensors without it; it exists for code
written against PyTriton that builds one, above all to hand it to a client (`ModelClient(...,
model_config=...)`, which then reads no configuration from the server). What a client reads from a server
is `pytriton.client.TritonModelConfig`, which this one converts into.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pytriton.model_config.common import DeviceKind, DynamicBatcher, ModelWarmup


@dataclasses.dataclass
class ResponseCache:
    """Whether Triton caches the model's responses."""

    enable: bool


@dataclasses.dataclass
class TensorSpec:
    """One input or output: its name, its shape without the batch axis (-1 for a dynamic dimension), its
    dtype (a numpy dtype or scalar type; `bytes` or `object` for strings) and whether it may be left out."""

    name: str
    shape: tuple[int, ...]
    dtype: Any
    optional: bool | None = False


@dataclasses.dataclass
class TritonModelConfig:
    """A model's configuration in PyTriton's terms: `batching` with `max_batch_size`, the dynamic `batcher`,
    instance counts per device kind, streaming (`decoupled`), the Python backend's parameters, the tensors,
    the response cache and warm-ups."""

    model_name: str
    model_version: int = 1
    max_batch_size: int = 4
    batching: bool = True
    batcher: DynamicBatcher | None = None
    instance_group: dict[DeviceKind, int | None] = dataclasses.field(default_factory=dict)
    decoupled: bool = False
    backend_parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: Sequence[TensorSpec] | None = None
    outputs: Sequence[TensorSpec] | None = None
    response_cache: ResponseCache | None = None
    model_warmup: list[ModelWarmup] | None = None

    @property
    def backend(self) -> str:
        """The backend that serves the model: always Triton's Python backend."""
        return "python"
