"""The PyTriton decorators, called directly with the read-only requests the runtime hands a callable."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from pytriton.decorators import TritonContext, batch, triton_context, use_triton_context
from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request


def frozen(value: Any, dtype: Any = None) -> np.ndarray:
    """A read-only array, as the runtime decodes inputs."""
    array = np.array(value, dtype=dtype)
    array.flags.writeable = False
    return array


def request(parameters: dict[str, Any] | None = None, **inputs: Any) -> Request:
    return Request(data={name: frozen(value) for name, value in inputs.items()}, parameters=parameters or {})


def context(*outputs: str, max_batch_size: int = 8, **config: Any) -> TritonContext:
    return TritonContext(
        model_name="model",
        model_config=ModelConfig(max_batch_size=max_batch_size, **config),
        outputs=tuple(Tensor(name=name, shape=(-1,), dtype=np.float32) for name in outputs),
    )


def run(result: Any) -> Any:
    return asyncio.run(result) if asyncio.iscoroutine(result) else result


# --- @batch ---------------------------------------------------------------------------------------


@batch
def add(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    return {"sum": a + b, "a_rows": np.arange(len(a))}


def test_batch_concatenates_requests_of_different_sizes_and_splits_outputs_back() -> None:
    requests = [request(a=[[1.0]], b=[[10.0]]), request(a=[[2.0], [3.0], [4.0]], b=[[20.0], [30.0], [40.0]])]
    responses = add(requests)
    assert len(responses) == 2
    np.testing.assert_array_equal(responses[0]["sum"], [[11.0]])
    np.testing.assert_array_equal(responses[1]["sum"], [[22.0], [33.0], [44.0]])
    np.testing.assert_array_equal(responses[1]["a_rows"], [1, 2, 3])


def test_batch_hands_a_single_request_through_without_copying() -> None:
    seen: dict[str, np.ndarray] = {}

    @batch
    def identity(x: np.ndarray) -> dict[str, np.ndarray]:
        seen["x"] = x
        return {"y": x}

    only = request(x=[[1, 2]])
    (response,) = identity([only])
    assert seen["x"] is only["x"]
    assert response["y"] is only["x"]


def test_batch_inputs_are_read_only_whatever_the_batch() -> None:
    @batch
    def writes(x: np.ndarray) -> dict[str, np.ndarray]:
        x[0] = 0
        return {"y": x}

    for requests in ([request(x=[1])], [request(x=[1]), request(x=[2])]):
        with pytest.raises(ValueError, match="read-only"):
            writes(requests)


def test_batch_concatenates_string_inputs() -> None:
    @batch
    def upper(text: np.ndarray) -> dict[str, np.ndarray]:
        return {"out": np.array([[value.upper() for value in row] for row in text], dtype=object)}

    requests = [
        Request(data={"text": frozen([[b"ab"]], dtype=object)}),
        Request(data={"text": frozen([[b"cd"], [b"ef"]], dtype=object)}),
    ]
    responses = upper(requests)
    assert responses[0]["out"].tolist() == [[b"AB"]]
    assert responses[1]["out"].tolist() == [[b"CD"], [b"EF"]]


def test_batch_maps_a_returned_list_onto_the_declared_outputs() -> None:
    @batch
    def two_outputs(x: np.ndarray) -> list[np.ndarray]:
        return [x * 2, x * 3]

    with use_triton_context(context("double", "triple")):
        responses = two_outputs([request(x=[1.0]), request(x=[2.0, 3.0])])
    np.testing.assert_array_equal(responses[1]["double"], [4.0, 6.0])
    np.testing.assert_array_equal(responses[0]["triple"], [3.0])


def test_batch_without_model_context_returns_positional_responses_for_a_list() -> None:
    @batch
    def two_outputs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x * 2, x * 3

    responses = two_outputs([request(x=[1.0]), request(x=[2.0])])
    assert all(isinstance(response, Request) for response in responses)
    assert [value.tolist() for value in responses[1].values()] == [[4.0], [6.0]]


def test_batch_works_on_methods() -> None:
    class Model:
        def __init__(self) -> None:
            self.offset = 100

        @batch
        def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
            return {"y": x + self.offset}

    responses = Model()([request(x=[1]), request(x=[2, 3])])
    assert [response["y"].tolist() for response in responses] == [[101], [102, 103]]


def test_batch_awaits_async_callables() -> None:
    @batch
    async def slow_double(x: np.ndarray) -> dict[str, np.ndarray]:
        await asyncio.sleep(0)
        return {"y": x * 2}

    result = slow_double([request(x=[1]), request(x=[2])])
    assert asyncio.iscoroutine(result)
    assert [response["y"].tolist() for response in run(result)] == [[2], [4]]


def test_batch_splits_every_item_a_generator_yields() -> None:
    @batch
    def count_up(x: np.ndarray):
        for step in range(3):
            yield {"y": x + step}

    items = list(count_up([request(x=[10]), request(x=[20, 30])]))
    assert [[response["y"].tolist() for response in item] for item in items] == [
        [[10], [20, 30]],
        [[11], [21, 31]],
        [[12], [22, 32]],
    ]


def test_batch_splits_async_generator_items() -> None:
    @batch
    async def stream(x: np.ndarray):
        for step in range(2):
            yield {"y": x + step}

    async def collect() -> list[Any]:
        return [item async for item in stream([request(x=[1]), request(x=[5])])]

    items = asyncio.run(collect())
    assert [[response["y"].tolist() for response in item] for item in items] == [[[1], [5]], [[2], [6]]]


def test_batch_shows_the_parameters_the_requests_share_through_the_context() -> None:
    seen: list[dict[str, Any]] = []

    @batch
    @triton_context
    def check(x: np.ndarray, triton_context: TritonContext) -> dict[str, np.ndarray]:
        seen.append(dict(triton_context.parameters))
        return {"y": x}

    check([request({"t": 1, "u": "a"}, x=[1]), request({"t": 1, "u": "b"}, x=[2])])
    check([request({"t": 1, "header": "h"}, x=[1]), request({"t": 1, "header": "h"}, x=[2])])
    assert seen == [{"t": 1}, {"t": 1, "header": "h"}]


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([request(a=[1]), request(b=[1])], "different inputs"),
        ([request(a=[[1, 2]]), request(a=[[1, 2, 3]])], "Cannot batch input 'a'"),
        ([Request(data={})], "without inputs"),
    ],
)
def test_batch_rejects_requests_it_cannot_stack(requests: list[Request], message: str) -> None:
    with pytest.raises(PyTritonValidationError, match=message):
        batch(lambda **inputs: inputs)(requests)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"y": np.zeros(3)}, "output 'y' has shape \\(3,\\)"),
        ({"y": [1, 2]}, "output 'y' must be a numpy array"),
        ("text", "must return a dict"),
        ([np.zeros(2)], "returned 1 outputs, but the model declares 2"),
    ],
)
def test_batch_rejects_outputs_that_do_not_fit_the_requests(result: Any, message: str) -> None:
    with use_triton_context(context("y", "z")), pytest.raises(PyTritonValidationError, match=message):
        batch(lambda **inputs: result)([request(x=[1]), request(x=[2])])


def test_batch_of_no_requests_is_no_responses() -> None:
    assert add([]) == []
