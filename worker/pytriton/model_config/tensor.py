"""Tensor: the name, dtype and per-sample shape of a model input or output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def normalize_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a numpy dtype, a scalar type, Python `bytes`/`str`/`bool`/`object`, or a name.

    Strings travel as Triton BYTES; `bytes`, `str` and `object` all map to numpy's object dtype.
    """
    if dtype in (bytes, str, object, np.bytes_, np.str_, np.object_):
        return np.dtype(object)
    try:
        resolved = np.dtype(dtype)
    except TypeError as error:
        raise ValueError(f"{dtype!r} is not a dtype numpy understands") from error
    if resolved.kind in "SUO":
        return np.dtype(object)
    if resolved.kind not in "biuf" or resolved.itemsize > 8:
        raise ValueError(f"dtype {resolved} has no Triton equivalent (use bool, int, uint, float or bytes)")
    # Triton's types have no byte order of their own: '>f4' is TYPE_FP32, and arrays arrive in native order
    return resolved.newbyteorder("=")


def shape_fits(shape: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    """Whether an array of per-sample `shape` fits a tensor `declared` with that shape: the same rank, and
    each dimension equal or declared -1."""
    if len(shape) != len(declared):
        return False
    return all(want in (-1, have) for have, want in zip(shape, declared, strict=True))


@dataclass(frozen=True)
class Tensor:
    """A model input or output. The shape excludes the batch axis; -1 marks a dynamic dimension.

    Unnamed tensors are called INPUT_<n> and OUTPUT_<n> (1-based, in declaration order).
    """

    shape: tuple[int, ...]
    dtype: Any
    name: str | None = None
    optional: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        shape = tuple(int(dim) for dim in self.shape)
        if any(dim == 0 or dim < -1 for dim in shape):
            raise ValueError(f"Tensor {self.name or ''} shape {shape}: dimensions are positive or -1")
        object.__setattr__(self, "shape", shape)
