"""ModelConfig in full: the generated config.pbtxt, and what a real tritonserver makes of it; and the
server defaults of TritonConfig (no header forwarding unless asked, a response cache unless turned off).

Each configuration is bound to one server and read back from `/v2/models/<name>/config`, so a field
that the generator drops or Triton rejects fails here.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from kubetriton.model_repository import ModelSpec, render_config
from pytriton.exceptions import PyTritonBadParameterError, PyTritonModelConfigError, PyTritonValidationError
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from pytriton.triton import Triton, TritonConfig

from tests.conftest import free_ports

X = (Tensor(name="x", shape=(-1,), dtype=np.float32),)
Y = (Tensor(name="y", shape=(-1,), dtype=np.float32),)

FULL_BATCHER = DynamicBatcher(
    max_queue_delay_microseconds=250,
    preferred_batch_size=[2, 4],
    priority_levels=3,
    default_priority_level=2,
    default_queue_policy=QueuePolicy(
        timeout_action=TimeoutAction.DELAY,
        default_timeout_microseconds=1000,
        allow_timeout_override=True,
        max_queue_size=10,
    ),
    priority_queue_policy={1: QueuePolicy(max_queue_size=3), 3: QueuePolicy(default_timeout_microseconds=50)},
)

CONFIGS = {
    "defaults": ModelConfig(),
    "full_batcher": ModelConfig(max_batch_size=16, batcher=FULL_BATCHER),
    "ordered": ModelConfig(
        max_batch_size=8,
        batcher=DynamicBatcher(
            max_queue_delay_microseconds=500, preferred_batch_size=[4], preserve_ordering=True
        ),
    ),
    "no_batching": ModelConfig(batching=False),
    "decoupled": ModelConfig(decoupled=True),
    "cached": ModelConfig(response_cache=True),
    # PyTriton takes whole numbers written as floats, and numpy's, for its counts and durations
    "whole_floats": ModelConfig(
        max_batch_size=8.0,
        batcher=DynamicBatcher(
            max_queue_delay_microseconds=1e4,
            preferred_batch_size=np.array([2.0, 4.0]),
            default_queue_policy=QueuePolicy(default_timeout_microseconds=1e3, max_queue_size=np.int64(5)),
        ),
    ),
    "no_batcher": ModelConfig(batcher=None),
}


def identity(requests):
    return [{"y": request["x"]} for request in requests]


def parameters_as_text(requests):
    return [
        {"y": np.array([[json.dumps(request.parameters, sort_keys=True).encode()]], object)}
        for request in requests
    ]


def spec(config: ModelConfig, inputs: tuple[Tensor, ...] = X, outputs: tuple[Tensor, ...] = Y) -> ModelSpec:
    return ModelSpec("m", inputs, outputs, config, instances=2)


def test_batching_off_renders_max_batch_size_zero_without_a_batcher():
    text = render_config(spec(ModelConfig(batching=False)), {})
    assert "max_batch_size: 0" in text
    assert "dynamic_batching" not in text


def test_full_batcher_renders_every_field():
    text = render_config(spec(ModelConfig(max_batch_size=16, batcher=FULL_BATCHER)), {})
    for line in [
        "max_batch_size: 16",
        "max_queue_delay_microseconds: 250",
        "preferred_batch_size: [ 2, 4 ]",
        "preserve_ordering: false",
        "priority_levels: 3",
        "default_priority_level: 2",
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 "
        "allow_timeout_override: true max_queue_size: 10 }",
        "priority_queue_policy { key: 1 value { timeout_action: REJECT default_timeout_microseconds: 0 "
        "allow_timeout_override: false max_queue_size: 3 } }",
    ]:
        assert line in text


def test_decoupled_cache_instances_and_tensors_render():
    inputs = (
        Tensor(name="text", shape=(1,), dtype=bytes),
        Tensor(name="flag", shape=(2, -1), dtype=bool, optional=True),
    )
    outputs = (Tensor(name="score", shape=(1,), dtype="float16"),)
    text = render_config(
        spec(ModelConfig(decoupled=True, response_cache=True), inputs, outputs), {"k": 'a"b'}
    )
    assert "model_transaction_policy { decoupled: true }" in text
    assert "response_cache { enable: true }" in text
    assert "instance_group [ { count: 2 kind: KIND_CPU } ]" in text
    assert '{ name: "text" data_type: TYPE_STRING dims: [ 1 ] }' in text
    assert '{ name: "flag" data_type: TYPE_BOOL dims: [ 2, -1 ] optional: true }' in text
    assert '{ name: "score" data_type: TYPE_FP16 dims: [ 1 ] }' in text
    assert 'parameters { key: "k" value { string_value: "a\\"b" } }' in text


ODD_NAME = 'x "quoted" \\ name'


@pytest.fixture(scope="module")
def loaded() -> Iterator[dict[str, Any]]:
    http, grpc, metrics = free_ports(3)
    with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
        for name, config in CONFIGS.items():
            triton.bind(name, identity, X, Y, config=config)
        triton.bind("parameters", parameters_as_text, X, [Tensor(name="y", shape=(1,), dtype=bytes)])
        odd_input = (Tensor(name=ODD_NAME, shape=(-1,), dtype=">f4"),)
        triton.bind("odd_names", lambda requests: [{"y": r[ODD_NAME] * 2} for r in requests], odd_input, Y)
        configs = {}
        for name in CONFIGS:
            with urllib.request.urlopen(f"http://localhost:{http}/v2/models/{name}/config") as response:
                configs[name] = json.load(response)
        yield {"triton": triton, "configs": configs, "http": f"localhost:{http}"}


def test_defaults_as_triton_reads_them(loaded):
    config = loaded["configs"]["defaults"]
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert not config.get("model_transaction_policy", {}).get("decoupled", False)
    assert "response_cache" not in config or config["response_cache"]["enable"] is False


def test_full_batcher_as_triton_reads_it(loaded):
    batcher = loaded["configs"]["full_batcher"]["dynamic_batching"]
    assert loaded["configs"]["full_batcher"]["max_batch_size"] == 16
    assert batcher["max_queue_delay_microseconds"] == 250
    assert batcher["preferred_batch_size"] == [2, 4]
    assert batcher["priority_levels"] == 3
    assert batcher["default_priority_level"] == 2
    assert batcher["default_queue_policy"] == {
        "timeout_action": "DELAY",
        "default_timeout_microseconds": 1000,
        "allow_timeout_override": True,
        "max_queue_size": 10,
    }
    assert batcher["priority_queue_policy"]["1"]["max_queue_size"] == 3
    assert batcher["priority_queue_policy"]["3"]["default_timeout_microseconds"] == 50


def test_preserve_ordering_as_triton_reads_it(loaded):
    batcher = loaded["configs"]["ordered"]["dynamic_batching"]
    assert batcher["preserve_ordering"] is True
    assert batcher["preferred_batch_size"] == [4]
    assert batcher["max_queue_delay_microseconds"] == 500


def test_batching_off_as_triton_reads_it(loaded):
    config = loaded["configs"]["no_batching"]
    assert config["max_batch_size"] == 0
    assert "dynamic_batching" not in config


def test_whole_numbers_given_as_floats_as_triton_reads_them(loaded):
    config = loaded["configs"]["whole_floats"]
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 10000
    assert config["dynamic_batching"]["preferred_batch_size"] == [2, 4]
    assert config["dynamic_batching"]["default_queue_policy"]["default_timeout_microseconds"] == 1000
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 5


def test_no_batcher_batches_without_the_dynamic_batcher(loaded):
    config = loaded["configs"]["no_batcher"]
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" not in config


BAD_CONFIGS = {
    "fraction": (ModelConfig(batcher=DynamicBatcher(max_queue_delay_microseconds=1.5)), "whole number"),
    "negative": (ModelConfig(batcher=DynamicBatcher(max_queue_delay_microseconds=-1)), "at least 0"),
    "bool": (ModelConfig(max_batch_size=True), "whole number"),
    "zero_preferred": (ModelConfig(batcher=DynamicBatcher(preferred_batch_size=[0])), "at least 1"),
    "default_above_levels": (
        ModelConfig(batcher=DynamicBatcher(priority_levels=2, default_priority_level=3)),
        "between 1 and 2",
    ),
    "levels_without_default": (ModelConfig(batcher=DynamicBatcher(priority_levels=2)), "between 1 and 2"),
    "default_without_levels": (
        ModelConfig(batcher=DynamicBatcher(default_priority_level=1)),
        "needs batcher.priority_levels",
    ),
    "policy_without_levels": (
        ModelConfig(batcher=DynamicBatcher(priority_queue_policy={1: QueuePolicy()})),
        "priority_levels is not set",
    ),
    "policy_above_levels": (
        ModelConfig(
            batcher=DynamicBatcher(
                priority_levels=2, default_priority_level=1, priority_queue_policy={3: QueuePolicy()}
            )
        ),
        "the levels are 1 to 2",
    ),
    "policy_level_zero": (
        ModelConfig(
            batcher=DynamicBatcher(
                priority_levels=2, default_priority_level=1, priority_queue_policy={0: QueuePolicy()}
            )
        ),
        "level 0",
    ),
    "timeout_action": (
        ModelConfig(batcher=DynamicBatcher(default_queue_policy=QueuePolicy(timeout_action="DROP"))),
        "TimeoutAction",
    ),
}


def test_without_batching_the_batcher_is_not_checked():
    """Triton gets neither the batch size nor the batcher of a model that does not batch."""
    triton = Triton()
    try:
        unused = DynamicBatcher(priority_levels=2, max_queue_delay_microseconds=0.5)
        triton.bind("m", identity, X, Y, config=ModelConfig(batching=False, max_batch_size=0, batcher=unused))
    finally:
        triton.stop()


@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_model_config_is_checked_at_bind(name):
    config, message = BAD_CONFIGS[name]
    triton = Triton()
    try:
        with pytest.raises(PyTritonBadParameterError, match=message):
            triton.bind("m", identity, X, Y, config=config)
    finally:
        triton.stop()


def test_an_optional_output_is_refused_at_bind():
    triton = Triton()
    try:
        with pytest.raises(PyTritonValidationError, match="output tensors cannot be optional"):
            triton.bind("m", identity, X, [Tensor(name="y", shape=(-1,), dtype=np.float32, optional=True)])
    finally:
        triton.stop()


def test_tensor_names_are_escaped_and_byte_order_is_not_a_type():
    inputs = (Tensor(name='a"b\\c\nd', shape=(-1,), dtype=">f4"),)
    text = render_config(spec(ModelConfig(), inputs), {})
    assert '{ name: "a\\"b\\\\c\\012d" data_type: TYPE_FP32 dims: [ -1 ] }' in text
    with pytest.raises(ValueError, match="no Triton equivalent"):
        Tensor(name="x", shape=(1,), dtype=np.longdouble)


def test_a_tensor_name_with_quotes_and_backslashes_serves(loaded):
    client = httpclient.InferenceServerClient(loaded["http"])
    try:
        tensor = httpclient.InferInput(ODD_NAME, [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1.5, 2.5]], np.float32))
        result = client.infer("odd_names", [tensor])
        metadata = client.get_model_metadata("odd_names")
    finally:
        client.close()
    assert result.as_numpy("y").tolist() == [[3.0, 5.0]]
    assert metadata["inputs"] == [{"name": ODD_NAME, "datatype": "FP32", "shape": [-1, -1]}]


def test_decoupled_and_cache_as_triton_reads_them(loaded):
    assert loaded["configs"]["decoupled"]["model_transaction_policy"]["decoupled"] is True
    assert loaded["configs"]["cached"]["response_cache"]["enable"] is True


def test_triton_rejection_is_reported_with_its_reason(loaded):
    invalid = ModelConfig(
        batcher=DynamicBatcher(preserve_ordering=True, priority_levels=2, default_priority_level=1)
    )
    with pytest.raises(PyTritonModelConfigError, match="Only one priority level is allowed"):
        loaded["triton"].bind("invalid", identity, X, Y, config=invalid)


def test_cache_turned_off_refuses_models_that_ask_for_it():
    triton = Triton(config=TritonConfig(cache_config=[]))
    try:
        with pytest.raises(PyTritonModelConfigError, match="cache_config"):
            triton.bind("cached", identity, X, Y, config=ModelConfig(response_cache=True))
    finally:
        triton.stop()


def test_headers_are_not_forwarded_without_a_pattern(loaded):
    client = httpclient.InferenceServerClient(loaded["http"])
    try:
        tensor = httpclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
        result = client.infer("parameters", [tensor], parameters={"p": 1}, headers={"x-tenant": "blue"})
    finally:
        client.close()
    assert json.loads(result.as_numpy("y")[0][0]) == {"p": 1}


def test_model_names_as_bind_takes_them():
    triton = Triton()
    try:
        triton.bind("_private", identity, X, Y)
        triton.bind("M" * 128, identity, X, Y)
        for name in ("-m", ".m", "..", "M" * 129, "a,b", "a/b", ""):
            with pytest.raises(PyTritonValidationError, match="Invalid model name"):
                triton.bind(name, identity, X, Y)
    finally:
        triton.stop()
