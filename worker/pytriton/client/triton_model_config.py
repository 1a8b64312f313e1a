"""The parts of a Triton model configuration a client needs, read from the JSON any Triton server returns.

HTTP and gRPC render the same configuration differently (gRPC omits default values and writes int64
dims as strings); `TritonModelConfig.from_triton_json` accepts both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

from pytriton.model_config import triton_model_config as written
from pytriton.model_config.tensor import normalize_dtype


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of the model; `shape` excludes the batch axis, -1 marks a dynamic dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    triton_dtype: str
    optional: bool = False


@dataclass(frozen=True)
class TritonModelConfig:
    """What the server says about a model: its tensors, its batch limit and whether it streams."""

    model_name: str
    model_version: str | None = None
    max_batch_size: int = 0
    decoupled: bool = False
    inputs: tuple[TensorSpec, ...] = field(default_factory=tuple)
    outputs: tuple[TensorSpec, ...] = field(default_factory=tuple)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @classmethod
    def from_triton_json(
        cls, config: Mapping[str, Any], model_version: str | None = None
    ) -> TritonModelConfig:
        """Build from the configuration JSON: the HTTP body, or gRPC's `as_json` answer."""
        if "config" in config and isinstance(config["config"], Mapping):
            config = config["config"]
        policy = config.get("model_transaction_policy") or {}
        return cls(
            model_name=str(config.get("name", "")),
            model_version=model_version,
            max_batch_size=int(config.get("max_batch_size", 0)),
            decoupled=bool(policy.get("decoupled", False)),
            inputs=tuple(_tensor_spec(tensor) for tensor in config.get("input", ())),
            outputs=tuple(_tensor_spec(tensor) for tensor in config.get("output", ())),
        )

    @classmethod
    def of(cls, config: TritonModelConfig | written.TritonModelConfig | None) -> TritonModelConfig | None:
        """The configuration a client was given: this class, or PyTriton's `TritonModelConfig` (from
        `pytriton.model_config.triton_model_config`), read as a server would serve it."""
        if not isinstance(config, written.TritonModelConfig):
            return config
        return cls(
            model_name=config.model_name,
            model_version=str(config.model_version),
            max_batch_size=config.max_batch_size if config.batching else 0,
            decoupled=config.decoupled,
            inputs=tuple(_written_tensor(tensor) for tensor in config.inputs or ()),
            outputs=tuple(_written_tensor(tensor) for tensor in config.outputs or ()),
        )


def _written_tensor(tensor: written.TensorSpec) -> TensorSpec:
    dtype = normalize_dtype(tensor.dtype)
    return TensorSpec(
        name=tensor.name,
        shape=tuple(int(dim) for dim in tensor.shape),
        dtype=dtype,
        triton_dtype=np_to_triton_dtype(dtype),
        optional=bool(tensor.optional),
    )


def _tensor_spec(tensor: Mapping[str, Any]) -> TensorSpec:
    triton_dtype = str(tensor.get("data_type", "TYPE_INVALID")).removeprefix("TYPE_")
    if triton_dtype == "STRING":
        triton_dtype = "BYTES"
    np_dtype = triton_to_np_dtype(triton_dtype)
    return TensorSpec(
        name=str(tensor["name"]),
        shape=tuple(int(dim) for dim in tensor.get("dims", ())),
        dtype=np.dtype(np_dtype) if np_dtype is not None else np.dtype(object),
        triton_dtype=triton_dtype,
        optional=bool(tensor.get("optional", False)),
    )
