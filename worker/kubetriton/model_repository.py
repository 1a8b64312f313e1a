"""The model repository that Triton loads bound models from: `config.pbtxt` and the proxy `model.py`.

The configuration is generated from `ModelConfig` and the declared tensors as PyTriton generates it:
the Python backend, a dynamic batcher when batching is on (`max_batch_size: 0` when it is off), one CPU
instance per bound callable, and the parameters that tell each proxy instance how to reach its worker.
Warm-up samples are not written as Triton's `model_warmup`: the worker runs them (see `warmup`).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor
from pytriton.model_config.common import TimeoutAction

from kubetriton import podenv
from kubetriton.private_files import private_folder, write_private_file
from kubetriton.warmup import WarmupSample

MODEL_NAME_PATTERN = re.compile(podenv.MODEL_NAME_PATTERN)
PROXY_MODEL_MARKER = "from kubetriton.sidecar.proxy_model import TritonPythonModel"
"""The line of a proxy model's `model.py` that tells kubetriton's model folders from others."""
PROXY_MODEL_SOURCE = (
    '''"""Triton's entry point for this model: the kubetriton proxy model.

The stub's Python has numpy only (the stock Triton image's in a pod, the one `kubetriton install-triton`
provisions locally): kubetriton and pyzmq come from the runtime folder that `kubetriton bootstrap`, or
the local server, filled in the workspace. The Python-backend stub ignores PYTHONPATH.
"""

import sys

_runtime = {runtime!r}
if _runtime not in sys.path:
    sys.path.insert(0, _runtime)

'''
    + PROXY_MODEL_MARKER
    + "  # noqa: E402,F401\n"
)

_TRITON_DTYPES = {
    np.dtype(bool): "TYPE_BOOL",
    np.dtype(np.uint8): "TYPE_UINT8",
    np.dtype(np.uint16): "TYPE_UINT16",
    np.dtype(np.uint32): "TYPE_UINT32",
    np.dtype(np.uint64): "TYPE_UINT64",
    np.dtype(np.int8): "TYPE_INT8",
    np.dtype(np.int16): "TYPE_INT16",
    np.dtype(np.int32): "TYPE_INT32",
    np.dtype(np.int64): "TYPE_INT64",
    np.dtype(np.float16): "TYPE_FP16",
    np.dtype(np.float32): "TYPE_FP32",
    np.dtype(np.float64): "TYPE_FP64",
    np.dtype(object): "TYPE_STRING",
}


def check_model_name(name: str) -> None:
    if not isinstance(name, str) or not MODEL_NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"Invalid model name {name!r}: use 1-128 letters, digits, '_', '.' or '-', "
            "starting with a letter, digit or '_'"
        )


def name_tensors(tensors: Sequence[Tensor], prefix: str) -> tuple[Tensor, ...]:
    """Give unnamed tensors PyTriton's default names, INPUT_1, INPUT_2, ... and reject duplicates."""
    named = tuple(
        tensor
        if tensor.name
        else Tensor(
            shape=tensor.shape, dtype=tensor.dtype, name=f"{prefix}_{index}", optional=tensor.optional
        )
        for index, tensor in enumerate(tensors, start=1)
    )
    names = [tensor.name for tensor in named]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"Duplicate {prefix.lower()} tensor names: {', '.join(duplicates)}")
    return named


def checked_config(model_name: str, config: ModelConfig) -> ModelConfig:
    """A copy of `config` with every count and duration a whole number (PyTriton takes `1e4` for 10000), or
    PyTritonBadParameterError for what Triton would refuse at load time, or ignore without a word."""

    def whole(value: Any, field: str, minimum: int = 0) -> int:
        integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        if integral or (isinstance(value, (float, np.floating)) and float(value).is_integer()):
            number = int(value)
        else:
            raise PyTritonBadParameterError(
                f"Model '{model_name}': {field} must be a whole number, not {value!r}"
            )
        if number < minimum:
            raise PyTritonBadParameterError(
                f"Model '{model_name}': {field} must be at least {minimum}, not {number}"
            )
        return number

    def policy(queue: QueuePolicy, field: str) -> QueuePolicy:
        try:
            action = TimeoutAction(queue.timeout_action)
        except ValueError:
            raise PyTritonBadParameterError(
                f"Model '{model_name}': {field}.timeout_action must be a TimeoutAction, "
                f"not {queue.timeout_action!r}"
            ) from None
        return dataclasses.replace(
            queue,
            timeout_action=action,
            default_timeout_microseconds=whole(
                queue.default_timeout_microseconds, f"{field}.default_timeout_microseconds"
            ),
            max_queue_size=whole(queue.max_queue_size, f"{field}.max_queue_size"),
        )

    if not config.batching:
        return config  # Triton gets neither the batch size nor the batcher
    max_batch_size = whole(config.max_batch_size, "max_batch_size")
    if max_batch_size < 1:
        raise PyTritonBadParameterError(
            f"Model '{model_name}': max_batch_size must be at least 1 when batching is on "
            "(use batching=False)"
        )
    batcher = config.batcher
    if batcher is not None:
        levels = whole(batcher.priority_levels, "batcher.priority_levels")
        default_level = whole(batcher.default_priority_level, "batcher.default_priority_level")
        if levels and not 1 <= default_level <= levels:
            raise PyTritonBadParameterError(
                f"Model '{model_name}': batcher.default_priority_level must be between 1 and {levels} "
                f"(priority_levels), not {default_level}"
            )
        if not levels and default_level:
            raise PyTritonBadParameterError(
                f"Model '{model_name}': batcher.default_priority_level needs batcher.priority_levels"
            )
        policies = {}
        for level, queue in (batcher.priority_queue_policy or {}).items():
            level = whole(level, "a batcher.priority_queue_policy level")
            if not 1 <= level <= levels:
                raise PyTritonBadParameterError(
                    f"Model '{model_name}': batcher.priority_queue_policy has level {level}, "
                    + (
                        f"but the levels are 1 to {levels}"
                        if levels
                        else "but batcher.priority_levels is not set"
                    )
                )
            policies[level] = policy(queue, f"batcher.priority_queue_policy[{level}]")
        batcher = dataclasses.replace(
            batcher,
            max_queue_delay_microseconds=whole(
                batcher.max_queue_delay_microseconds, "batcher.max_queue_delay_microseconds"
            ),
            preferred_batch_size=[
                whole(size, "each of batcher.preferred_batch_size", minimum=1)
                for size in (() if batcher.preferred_batch_size is None else batcher.preferred_batch_size)
            ]
            or None,
            priority_levels=levels,
            default_priority_level=default_level,
            default_queue_policy=policy(batcher.default_queue_policy, "batcher.default_queue_policy")
            if batcher.default_queue_policy
            else None,
            priority_queue_policy=policies or None,
        )
    return dataclasses.replace(config, max_batch_size=max_batch_size, batcher=batcher)


@dataclass(frozen=True)
class ModelSpec:
    """Everything Triton and the worker need to know about one bound model."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    config: ModelConfig
    instances: int
    strict: bool = False
    version: int = 1
    warmups: tuple[WarmupSample, ...] = ()
    """The warm-up samples each instance answers before Triton loads the model."""

    @property
    def max_batch_size(self) -> int:
        return self.config.max_batch_size if self.config.batching else 0


def render_config(spec: ModelSpec, parameters: Mapping[str, str]) -> str:
    """The model's `config.pbtxt` in protobuf text format."""
    lines = [f'name: "{spec.name}"', 'backend: "python"', f"max_batch_size: {spec.max_batch_size}"]
    if spec.config.batching and spec.config.batcher is not None:
        lines += _render_batcher(spec.config.batcher)
    if spec.config.decoupled:
        lines.append("model_transaction_policy { decoupled: true }")
    if spec.config.response_cache:
        lines.append("response_cache { enable: true }")
    lines.append(f"instance_group [ {{ count: {spec.instances} kind: KIND_CPU }} ]")
    lines.append("input [")
    lines.append(",\n".join(_render_tensor(tensor, optional=tensor.optional) for tensor in spec.inputs))
    lines.append("]")
    lines.append("output [")
    lines.append(",\n".join(_render_tensor(tensor, optional=False) for tensor in spec.outputs))
    lines.append("]")
    for key, value in parameters.items():
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{_escape(value)}" }} }}')
    return "\n".join(lines) + "\n"


def _render_tensor(tensor: Tensor, *, optional: bool) -> str:
    dims = ", ".join(str(dim) for dim in tensor.shape)
    text = f'  {{ name: "{_escape(tensor.name)}" data_type: {_TRITON_DTYPES[tensor.dtype]} dims: [ {dims} ]'
    return text + (" optional: true }" if optional else " }")


def _render_batcher(batcher: DynamicBatcher) -> list[str]:
    body = [f"  max_queue_delay_microseconds: {batcher.max_queue_delay_microseconds}"]
    if batcher.preferred_batch_size:
        body.append(
            f"  preferred_batch_size: [ {', '.join(str(size) for size in batcher.preferred_batch_size)} ]"
        )
    body.append(f"  preserve_ordering: {str(batcher.preserve_ordering).lower()}")
    if batcher.priority_levels:
        body.append(f"  priority_levels: {batcher.priority_levels}")
        body.append(f"  default_priority_level: {batcher.default_priority_level}")
    if batcher.default_queue_policy:
        body.append(f"  default_queue_policy {{ {_render_queue_policy(batcher.default_queue_policy)} }}")
    for level, policy in sorted((batcher.priority_queue_policy or {}).items()):
        body.append(f"  priority_queue_policy {{ key: {level} value {{ {_render_queue_policy(policy)} }} }}")
    return ["dynamic_batching {", *body, "}"]


def _render_queue_policy(policy: QueuePolicy) -> str:
    return (
        f"timeout_action: {policy.timeout_action.value} "
        f"default_timeout_microseconds: {policy.default_timeout_microseconds} "
        f"allow_timeout_override: {str(policy.allow_timeout_override).lower()} "
        f"max_queue_size: {policy.max_queue_size}"
    )


def _escape(value: str) -> str:
    """`value` as the inside of a protobuf text-format string: backslashes, quotes and control characters
    escaped, the rest (UTF-8) as it is."""
    return "".join(
        "\\" + char
        if char in '\\"'
        else f"\\{ord(char):03o}"
        if ord(char) < 0x20 or ord(char) == 0x7F
        else char
        for char in value
    )


def write_model(repository: Path, spec: ModelSpec, parameters: Mapping[str, str], runtime: Path) -> bool:
    """Write the model's directory into the repository, replacing any earlier version of it; False when it
    holds these very files already (a restarted worker's), which are then left as they are, so that Triton
    need not load the model again. The proxy imports its modules from `runtime`, a path that is the same
    for Triton as for the worker. The model's folder and files are for this user alone: Triton runs its
    `model.py`."""
    model_dir = repository / spec.name
    files = {
        model_dir / str(spec.version) / "model.py": PROXY_MODEL_SOURCE.format(runtime=str(runtime)),
        model_dir / "config.pbtxt": render_config(spec, parameters),
    }
    if _holds(model_dir, files, spec.version):
        return False
    if model_dir.exists():
        shutil.rmtree(model_dir)
    for path, text in files.items():
        private_folder(path.parent)
        write_private_file(path, text)
    return True


def _holds(model_dir: Path, files: Mapping[Path, str], version: int) -> bool:
    """Whether `model_dir` has `files` with these texts and no version but `version`."""
    try:
        versions = [entry.name for entry in model_dir.iterdir() if entry.is_dir()]
        return versions == [str(version)] and all(path.read_text() == text for path, text in files.items())
    except (FileNotFoundError, NotADirectoryError):
        return False
