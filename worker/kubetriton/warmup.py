"""Warm-up samples: the requests each instance's callable answers before Triton loads the model.

`ModelConfig(model_warmup=[...])` is run by the worker rather than written into `config.pbtxt` as Triton's
`model_warmup`. When a warm-up fails, Triton (2.51) tears the failed instance down while the instance's
backend thread is still finishing with it, and about one such load in ten ends in a segmentation fault
that leaves the load request hanging. Answered by the worker, a failing warm-up fails `bind()` before
Triton sees the model.

A warm-up is built as Triton builds one: `batch_size` requests that each hold one sample (with a batch axis
of 1 when the model batches), its values zeros, random values or a `.npy` file's samples. A file may hold one
sample, which every request gets, or a batch of them, which the requests take in turn. Strings are empty for
zero and random data alike, as in Triton. A warm-up may give only some of the model's inputs, as PyTriton
lets it (a callable taking `**inputs` gets those given). The data is made, and the files read, once, at
bind().
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pytriton.exceptions import PyTritonBadParameterError, PyTritonModelConfigError
from pytriton.model_config import Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.model_config.tensor import normalize_dtype, shape_fits
from pytriton.proxy.types import Request

from kubetriton.transport import is_bytes_dtype


@dataclass(frozen=True)
class WarmupSample:
    """One `ModelWarmup`, ready to run: `count` executions of `batch_size` requests with `inputs`."""

    name: str
    batch_size: int
    count: int
    inputs: dict[str, tuple[np.ndarray, ...]]
    """Per input, the read-only arrays the requests take in turn, each shaped as a client's request of one
    sample."""

    def requests(self) -> list[Request]:
        return [
            Request({name: samples[index % len(samples)] for name, samples in self.inputs.items()})
            for index in range(self.batch_size)
        ]


def warmup_samples(
    model: str, inputs: Sequence[Tensor], warmups: Sequence[ModelWarmup], *, batching: bool
) -> tuple[WarmupSample, ...]:
    """Check `warmups` against the model's inputs and make their data. PyTritonModelConfigError for a
    warm-up that names an input the model lacks or disagrees with one's dtype or shape;
    PyTritonBadParameterError for a data file that cannot be read or holds neither a sample nor a batch of
    them. A warm-up of batch size 0 is skipped, as Triton skips it."""
    declared = {tensor.name: tensor for tensor in inputs}
    samples = []
    for warmup in warmups:
        if warmup.batch_size < 0 or warmup.count < 0:
            raise PyTritonBadParameterError(
                f"Model '{model}' warm-up '{warmup.name}': batch_size and count must not be negative"
            )
        unknown = sorted(set(warmup.inputs) - set(declared))
        if unknown:
            raise PyTritonModelConfigError(
                f"Model '{model}' warm-up '{warmup.name}' gives inputs the model lacks: {', '.join(unknown)} "
                f"(its inputs: {', '.join(declared)})"
            )
        if warmup.batch_size == 0:
            continue
        data = {}
        for name, item in warmup.inputs.items():
            _check_matches(model, warmup.name, declared[name], item)
            arrays = []
            for sample in _samples(item)[: warmup.batch_size]:
                array = sample[np.newaxis] if batching else sample
                array.flags.writeable = False
                arrays.append(array)
            data[name] = tuple(arrays)
        samples.append(WarmupSample(warmup.name, warmup.batch_size, warmup.count, data))
    return tuple(samples)


def _check_matches(model: str, warmup: str, tensor: Tensor, item: WarmupInput) -> None:
    dtype = normalize_dtype(item.dtype)
    shape = tuple(item.shape)
    if dtype != tensor.dtype or not shape_fits(shape, tensor.shape):
        raise PyTritonModelConfigError(
            f"Model '{model}' warm-up '{warmup}' gives input '{tensor.name}' as {_kind(dtype)} of shape "
            f"{shape}; the model declares {_kind(tensor.dtype)} of shape {tuple(tensor.shape)}"
        )


def _kind(dtype: np.dtype) -> str:
    return "bytes" if is_bytes_dtype(dtype) else str(dtype)


def _samples(item: WarmupInput) -> list[np.ndarray]:
    """The samples of `item`, without a batch axis: one, or the batch a data file holds."""
    dtype = normalize_dtype(item.dtype)
    shape = tuple(item.shape)
    strings = is_bytes_dtype(dtype)
    if item.zero_data or (item.random_data and strings):
        return [np.full(shape, b"", dtype=dtype) if strings else np.zeros(shape, dtype)]
    if item.random_data:
        return [_random(dtype, shape)]
    try:
        data = np.load(item.input_data_file)
    except (OSError, ValueError) as error:
        raise PyTritonBadParameterError(f"Warm-up data file {item.input_data_file}: {error}") from None
    if data.shape == shape:
        data = data[np.newaxis]
    elif data.shape[1:] != shape or len(data) == 0:
        raise PyTritonBadParameterError(
            f"Warm-up data file {item.input_data_file} holds shape {data.shape}; it must hold one sample "
            f"of shape {shape}, or a batch of them (shape (n, {', '.join(map(str, shape))}))"
        )
    if not strings:
        return list(np.ascontiguousarray(data, dtype=dtype))
    if data.dtype.kind not in "SU":
        raise PyTritonBadParameterError(
            f"Warm-up data file {item.input_data_file} holds {data.dtype} values; a bytes input needs strings"
        )
    values = [value.encode() if isinstance(value, str) else value for value in data.ravel().tolist()]
    return list(np.array(values, dtype=dtype).reshape(data.shape))


def _random(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Random values: uniform in [0, 1) for floats, any value for integers, either value for bool."""
    generator = np.random.default_rng()
    if dtype.kind == "f":
        return generator.random(shape).astype(dtype)
    if dtype.kind == "b":
        return generator.integers(0, 2, shape).astype(bool)
    limits = np.iinfo(dtype)
    return generator.integers(limits.min, limits.max, shape, dtype=dtype, endpoint=True)
