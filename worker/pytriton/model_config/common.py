"""Batching and queueing settings of a model, mirroring the fields of Triton's model configuration."""

from __future__ import annotations

import enum
from dataclasses import dataclass


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
