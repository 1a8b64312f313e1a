"""Batching, queueing and warm-up settings of a model, mirroring the fields of Triton's model config."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config.tensor import normalize_dtype


class DeviceKind(enum.Enum):
    """Where Triton places a model instance.

    Proxy instances always run on the CPU: the worker, which runs the callable, owns the GPUs."""

    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


class TimeoutAction(enum.Enum):
    """What the batcher does with a request that waited past its queue timeout."""

    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclass
class QueuePolicy:
    """Limits of a request queue (Triton's ModelQueuePolicy)."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass
class DynamicBatcher:
    """Settings of Triton's dynamic batcher."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: list[int] | None = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: dict[int, QueuePolicy] | None = None


@dataclass
class WarmupInput:
    """One input of a warm-up request: its dtype, its shape without the batch axis, and where its values come
    from: zeros (empty strings for bytes), random values, or a `.npy` file holding one sample of `shape`."""

    dtype: Any
    shape: Sequence[int]
    zero_data: bool | None = False
    random_data: bool | None = False
    input_data_file: str | None = None

    def __post_init__(self) -> None:
        if not (self.zero_data or self.random_data or self.input_data_file):
            raise PyTritonBadParameterError(
                "WarmupInput needs one of zero_data=True, random_data=True or input_data_file"
            )
        if not list(self.shape):
            raise PyTritonBadParameterError("WarmupInput needs a shape with at least one dimension")
        if not all(isinstance(dim, int) and dim > 0 for dim in self.shape):
            raise PyTritonBadParameterError(
                f"WarmupInput shape {tuple(self.shape)}: a sample has a fixed shape, every dimension positive"
            )
        try:
            normalize_dtype(self.dtype)
        except ValueError as error:
            raise PyTritonBadParameterError(f"WarmupInput: {error}") from None


@dataclass
class ModelWarmup:
    """Warm-up requests each instance's callable answers before Triton loads the model: `count` executions
    of `batch_size` requests of one sample each, with `inputs` keyed by the model's input names."""

    name: str
    batch_size: int
    inputs: dict[str, WarmupInput]
    count: int
