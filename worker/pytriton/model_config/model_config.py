"""ModelConfig: how Triton batches and serves a bound callable."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytriton.model_config.common import DynamicBatcher, ModelWarmup


@dataclass
class ModelConfig:
    """Serving options of one model.

    `batching=False` serves the model without a batch axis (`max_batch_size: 0`). `decoupled=True` lets a
    generator callable stream any number of responses per request. `model_warmup` lists the requests each
    instance's callable answers before Triton loads the model.
    """

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: list[ModelWarmup] | None = None
