"""The PyTriton decorators, called directly with the read-only requests the runtime hands a callable."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from kubetriton.transport import RequestBatch
from pytriton.decorators import (
    ConstantPadder,
    InferenceRequests,
    InferenceResults,
    TritonContext,
    batch,
    fill_optionals,
    first_value,
    get_inference_request_batch_size,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
    use_triton_context,
)
from pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request


def frozen(value: Any, dtype: Any = None) -> np.ndarray:
    """A read-only array, as the runtime decodes inputs."""
    array = np.array(value, dtype=dtype)
    array.flags.writeable = False
    return array


def request(parameters: dict[str, Any] | None = None, **inputs: Any) -> Request:
    return Request(data={name: frozen(value) for name, value in inputs.items()}, parameters=parameters or {})


def context(
    *outputs: str, inputs: tuple[Tensor, ...] = (), max_batch_size: int = 8, **config: Any
) -> TritonContext:
    return TritonContext(
        model_name="model",
        model_config=ModelConfig(max_batch_size=max_batch_size, **config),
        inputs=inputs,
        outputs=tuple(Tensor(name=name, shape=(-1,), dtype=np.float32) for name in outputs),
    )


def values(responses: list[Any], name: str) -> list[Any]:
    return [response[name].tolist() for response in responses]


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


def test_a_custom_decorator_finds_the_batch_size_of_each_request() -> None:
    """A decorator written with PyTriton's helper and type names."""

    def sizes(func):
        def wrapper(requests: InferenceRequests) -> InferenceResults:
            return [{"size": np.array([get_inference_request_batch_size(r)])} for r in func(requests)]

        return wrapper

    counted = sizes(lambda requests: requests)
    assert [r["size"].tolist() for r in counted([request(a=[[1.0]]), request(a=[[1.0], [2.0], [3.0]])])] == [
        [1],
        [3],
    ]
    with pytest.raises(PyTritonValidationError, match="no batch axis"):
        get_inference_request_batch_size({"a": np.float32(1.0)})


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


def test_batch_joins_inputs_that_lie_one_after_another_without_copying() -> None:
    """As the images of a batch lie in the arena: `@batch` sees them as one array over the same memory."""
    memory = frozen(np.arange(12, dtype=np.float16).reshape(6, 2))
    seen: dict[str, np.ndarray] = {}

    @batch
    def identity(x: np.ndarray) -> dict[str, np.ndarray]:
        seen["x"] = x
        return {"y": x * 2}

    requests = [
        Request(data={"x": memory[:1]}, parameters={}),
        Request(data={"x": memory[1:4]}, parameters={}),
    ]
    responses = identity(requests)
    assert np.shares_memory(seen["x"], memory) and np.array_equal(seen["x"], memory[:4])
    assert [response["y"].tolist() for response in responses] == [[[0, 2]], [[4, 6], [8, 10], [12, 14]]]
    scattered = identity([requests[0], Request(data={"x": memory[5:]}, parameters={})])
    assert not np.shares_memory(seen["x"], memory) and scattered[1]["y"].tolist() == [[20, 22]]


def test_batch_takes_the_workers_whole_input_only_while_the_requests_hold_its_parts() -> None:
    """A `RequestBatch` knows each input of the batch as one array: `@batch` takes it as it is, and
    concatenates what the requests hold instead once a decorator above it replaced an input."""
    whole = frozen(np.arange(8, dtype=np.float32).reshape(4, 2))
    parts = [whole[:1], whole[1:4]]
    seen: dict[str, np.ndarray] = {}

    @batch
    def identity(x: np.ndarray) -> dict[str, np.ndarray]:
        seen["x"] = x
        return {"y": x + 1}

    requests = RequestBatch([Request(data={"x": part}) for part in parts], {"x": (whole, parts)}, [1, 3])
    assert [response["y"].tolist() for response in identity(requests)] == [[[1, 2]], [[3, 4], [5, 6], [7, 8]]]
    assert seen["x"] is whole
    requests[1]["x"] = frozen(np.zeros((1, 2), np.float32))
    assert [response["y"].tolist() for response in identity(requests)] == [[[1, 2]], [[1, 1]]]
    assert seen["x"].tolist() == [[0, 1], [0, 0]]


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

    @batch
    def no_outputs(x: np.ndarray) -> list[np.ndarray]:
        return []

    responses = no_outputs([request(x=[1.0]), request(x=[2.0])])
    assert len(responses) == 2 and all(len(response) == 0 for response in responses)


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


# --- @sample --------------------------------------------------------------------------------------


def test_sample_calls_once_per_request_with_its_inputs_and_parameters() -> None:
    calls: list[tuple[list[Any], dict[str, Any]]] = []

    @sample
    @triton_context
    def scale(x: np.ndarray, triton_context: TritonContext) -> dict[str, np.ndarray]:
        calls.append((x.tolist(), dict(triton_context.parameters)))
        return {"y": x * triton_context.parameters["factor"]}

    responses = scale([request({"factor": 2}, x=[1, 2]), request({"factor": 10}, x=[3])])
    assert values(responses, "y") == [[2, 4], [30]]
    assert calls == [([1, 2], {"factor": 2}), ([3], {"factor": 10})]


def test_sample_maps_lists_to_declared_outputs_on_methods_and_coroutines() -> None:
    class Model:
        @sample
        async def __call__(self, x: np.ndarray) -> list[np.ndarray]:
            await asyncio.sleep(0)
            return [x + 1, x - 1]

    with use_triton_context(context("up", "down")):
        result = Model()([request(x=[5]), request(x=[7])])
    responses = run(result)
    assert values(responses, "up") == [[6], [8]]
    assert values(responses, "down") == [[4], [6]]


def test_sample_streams_a_generator_for_one_request_and_refuses_several() -> None:
    @sample
    def tokens(text: np.ndarray):
        for token in text[0].split():
            yield {"token": np.array([token], dtype=object)}

    stream = tokens([Request(data={"text": frozen([b"a b c"], dtype=object)})])
    assert [item[0]["token"].tolist() for item in stream] == [[b"a"], [b"b"], [b"c"]]
    with pytest.raises(PyTritonValidationError, match="generator callable cannot answer"):
        tokens([request(text=[b"a"]), request(text=[b"b"])])


# --- @group_by_keys -------------------------------------------------------------------------------


def test_group_by_keys_batches_each_set_of_inputs_and_keeps_the_response_order() -> None:
    calls: list[list[str]] = []

    @group_by_keys
    @batch
    def infer(x: np.ndarray, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
        calls.append(sorted(["x"] + (["bias"] if bias is not None else [])))
        return {"y": x if bias is None else x + bias}

    requests = [request(x=[1]), request(x=[2], bias=[100]), request(x=[3, 4]), request(x=[5], bias=[200])]
    assert values(infer(requests), "y") == [[1], [102], [3, 4], [205]]
    assert calls == [["x"], ["bias", "x"]]


def test_group_by_keys_hands_the_requests_through_unchanged() -> None:
    seen: list[list[Request]] = []

    @group_by_keys
    def infer(requests: list[Request]) -> list[dict[str, np.ndarray]]:
        seen.append(requests)
        return [{"y": next(iter(request.values()))} for request in requests]

    same = [request({"h": "1"}, x=[1]), request({"h": "2"}, x=[2])]
    infer(same)
    assert seen[0] is same
    mixed = [request({"h": "1"}, x=[1]), request({"h": "2"}, z=[2])]
    infer(mixed)
    assert [group[0] for group in seen[1:]] == mixed
    assert [group[0].parameters for group in seen[1:]] == [{"h": "1"}, {"h": "2"}]


def test_group_by_keys_awaits_coroutine_groups() -> None:
    @group_by_keys
    @batch
    async def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        await asyncio.sleep(0)
        return {"n": np.full(len(inputs["x"]), len(inputs))}

    responses = run(infer([request(x=[1]), request(x=[2], b=[0]), request(x=[3])]))
    assert values(responses, "n") == [[1], [2], [1]]


def test_group_by_keys_rejects_a_group_answered_with_the_wrong_number_of_responses() -> None:
    infer = group_by_keys(lambda requests: [{"y": np.zeros(1)}])
    with pytest.raises(PyTritonValidationError, match="group of 2 requests with 1 responses"):
        infer([request(x=[1]), request(x=[2]), request(z=[3])])


# --- @group_by_values -----------------------------------------------------------------------------


def test_group_by_values_calls_once_per_value_and_puts_samples_back_in_order() -> None:
    calls: list[tuple[float, int]] = []

    @batch
    @group_by_values("temperature")
    def infer(x: np.ndarray, temperature: np.ndarray) -> dict[str, np.ndarray]:
        calls.append((float(temperature[0, 0]), len(x)))
        assert x.flags.writeable is False
        return {"y": x * temperature}

    requests = [
        request(x=[[1.0], [2.0]], temperature=[[0.5], [2.0]]),
        request(x=[[3.0]], temperature=[[0.5]]),
    ]
    assert values(infer(requests), "y") == [[[0.5], [4.0]], [[1.5]]]
    assert calls == [(0.5, 2), (2.0, 1)]


def test_group_by_values_groups_strings_and_skips_absent_keys() -> None:
    calls: list[list[bytes]] = []

    @group_by_values("model", "missing")
    def infer(model: np.ndarray, x: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(model.tolist())
        return {"tag": np.array([name + b"!" for name in model], dtype=object)}

    result = infer(model=frozen([b"small", b"big", b"small"], dtype=object), x=frozen([1, 2, 3]))
    assert result["tag"].tolist() == [b"small!", b"big!", b"small!"]
    assert calls == [[b"small", b"small"], [b"big"]]


def test_group_by_values_passes_a_uniform_batch_through_without_copying() -> None:
    seen: dict[str, np.ndarray] = {}

    @group_by_values("t")
    def infer(x: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
        seen["x"] = x
        return {"y": x}

    x = frozen([1, 2])
    infer(x=x, t=frozen([7, 7]))
    assert seen["x"] is x


def test_group_by_values_merges_list_outputs_and_methods() -> None:
    class Model:
        @batch
        @group_by_values("t")
        def __call__(self, x: np.ndarray, t: np.ndarray) -> list[np.ndarray]:
            return [x + t, x * 0 + len(x)]

    with use_triton_context(context("sum", "size")):
        responses = Model()([request(x=[1, 2, 3], t=[10, 20, 10])])
    assert values(responses, "sum") == [[11, 22, 13]]
    assert values(responses, "size") == [[2, 1, 2]]


def test_group_by_values_pads_outputs_of_different_shapes_with_a_padder() -> None:
    def by_length(n: np.ndarray) -> dict[str, np.ndarray]:
        width = int(n[0])
        return {
            "ids": np.ones((len(n), width), dtype=np.int32),
            "text": np.full((len(n), width), b"w", dtype=object),
        }

    inputs = {"n": frozen([1, 3, 1])}
    with pytest.raises(PyTritonValidationError, match=r"cannot merge output 'ids'.*ConstantPadder"):
        group_by_values("n")(by_length)(**inputs)
    result = group_by_values("n", pad_fn=ConstantPadder(-1))(by_length)(**inputs)
    assert result["ids"].tolist() == [[1, -1, -1], [1, 1, 1], [1, -1, -1]]
    assert result["text"].tolist() == [[b"w", b"", b""], [b"w", b"w", b"w"], [b"w", b"", b""]]


def test_constant_padder_pads_fixed_width_strings() -> None:
    padded = ConstantPadder()([{"s": np.array([[b"a"]])}, {"s": np.array([[b"bb", b"cc"]])}])
    assert padded[0]["s"].tolist() == [[b"a", b""]]
    assert padded[1]["s"].tolist() == [[b"bb", b"cc"]]


def test_group_by_values_awaits_coroutine_groups() -> None:
    @group_by_values("t")
    async def infer(x: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
        await asyncio.sleep(0)
        return {"y": x + t}

    result = run(infer(x=frozen([1, 2, 3]), t=frozen([100, 200, 100])))
    assert result["y"].tolist() == [101, 202, 103]


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: group_by_values("triton_context"), PyTritonBadParameterError, "names the context"),
        (lambda: group_by_values(3), PyTritonBadParameterError, "must be strings"),
    ],
)
def test_group_by_values_rejects_bad_keys(build: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build()


def test_group_by_values_and_first_value_without_keys_change_nothing() -> None:
    calls: list[int] = []

    @group_by_values()
    @first_value()
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(len(x))
        return {"y": x * 2}

    assert infer(x=frozen([[1], [2], [3]]))["y"].tolist() == [[2], [4], [6]]
    assert calls == [3], "one group, the inputs as they came"


def test_group_by_values_refuses_an_output_that_some_groups_do_not_return() -> None:
    @group_by_values("p")
    def infer(x: np.ndarray, p: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": x, "z": x * 10} if p[0, 0] == 2 else {"y": x}

    for order in ([[1], [2]], [[2], [1]]):
        with pytest.raises(PyTritonValidationError, match="'z' is returned for some groups only"):
            infer(x=frozen([[1.0], [2.0]]), p=frozen(order))


def test_group_by_values_rejects_misuse_at_call_time() -> None:
    infer = group_by_values("t")(lambda **inputs: {"y": inputs["x"]})
    with pytest.raises(PyTritonValidationError, match="put it below @batch"):
        infer([request(x=[1], t=[1])])
    declared = context("y", inputs=(Tensor(name="x", shape=(1,), dtype=np.int64),))
    with use_triton_context(declared), pytest.raises(PyTritonBadParameterError, match=r"inputs \['t'\]"):
        infer(x=frozen([1]), t=frozen([1]))
    with pytest.raises(PyTritonValidationError, match="output 'y' has shape"):
        group_by_values("t")(lambda **inputs: {"y": np.zeros(5)})(x=frozen([1, 2]), t=frozen([1, 2]))


# --- @fill_optionals ------------------------------------------------------------------------------


def test_fill_optionals_repeats_defaults_over_each_requests_batch() -> None:
    seen: list[Request] = []

    @fill_optionals(temperature=np.array([0.7], dtype=np.float32), prompt=np.array([b"hi"], dtype=object))
    def infer(requests: list[Request]) -> list[dict[str, np.ndarray]]:
        seen.extend(requests)
        return [{"n": np.zeros(1)} for _ in requests]

    given = request(
        {"h": "v"},
        x=[[1], [2], [3]],
        temperature=frozen([[0.1], [0.2], [0.3]], np.float32),
        prompt=frozen([[b"x"], [b"y"], [b"z"]], dtype=object),
    )
    lacking = request({"h": "w"}, x=[[4], [5]])
    infer([given, lacking])
    assert seen[0] is given
    assert seen[1]["temperature"].tolist() == [[np.float32(0.7)], [np.float32(0.7)]]
    assert seen[1]["prompt"].tolist() == [[b"hi"], [b"hi"]]
    assert seen[1]["x"] is lacking["x"]
    assert seen[1].parameters == {"h": "w"}
    assert seen[1]["temperature"].flags.writeable is False
    assert "temperature" not in lacking


def test_fill_optionals_groups_better_with_batch_and_group_by_values() -> None:
    @fill_optionals(t=np.array([1]))
    @batch
    @group_by_values("t")
    @first_value("t")
    def infer(x: np.ndarray, t: np.integer) -> dict[str, np.ndarray]:
        return {"y": x * int(t)}

    responses = infer([request(x=[1, 2]), request(x=[3], t=[[5]]), request(x=[4])])
    assert values(responses, "y") == [[1, 2], [15], [4]]


def test_fill_optionals_leaves_out_the_batch_axis_when_the_model_does_not_batch() -> None:
    seen: list[Request] = []
    infer = fill_optionals(t=np.array([0.5]))(lambda requests: seen.extend(requests) or [{}])
    with use_triton_context(context(batching=False)):
        infer([request(x=[1, 2])])
    assert seen[0]["t"].tolist() == [0.5]


@pytest.mark.parametrize(
    ("default", "message"),
    [
        (np.array([1.0], dtype=np.float64), "dtype float64, the input declares float32"),
        (np.array([[1.0]], dtype=np.float32), r"shape \(1, 1\), the input declares \(1,\)"),
    ],
)
def test_fill_optionals_checks_defaults_against_the_declared_inputs(
    default: np.ndarray, message: str
) -> None:
    declared = context(inputs=(Tensor(name="t", shape=(1,), dtype=np.float32),))
    infer = fill_optionals(t=default)(lambda requests: [{}])
    with use_triton_context(declared), pytest.raises(PyTritonBadParameterError, match=message):
        infer([request(x=[1])])


def test_fill_optionals_rejects_unknown_inputs_and_non_arrays() -> None:
    with pytest.raises(PyTritonBadParameterError, match="must be numpy arrays: t are not"):
        fill_optionals(t=0.7, u=np.array([1]))
    declared = context(inputs=(Tensor(name="x", shape=(1,), dtype=np.int64),))
    with use_triton_context(declared), pytest.raises(PyTritonBadParameterError, match=r"inputs \['t'\]"):
        fill_optionals(t=np.array([1]))(lambda requests: [{}])([request(x=[1])])


def test_fill_optionals_accepts_byte_defaults_for_string_inputs() -> None:
    declared = context(inputs=(Tensor(name="s", shape=(-1,), dtype=bytes),))
    infer = fill_optionals(s=np.array([b"a", b"b"]))(lambda requests: [{"s": requests[0]["s"]}])
    with use_triton_context(declared):
        assert infer([request(x=[1])])[0]["s"].tolist() == [[b"a", b"b"]]


# --- @pad_batch -----------------------------------------------------------------------------------


def padded_model(**batcher: Any) -> TritonContext:
    from pytriton.model_config import DynamicBatcher

    return context("y", max_batch_size=8, batcher=DynamicBatcher(**batcher))


@pytest.mark.parametrize(
    ("samples", "preferred", "padded_to"),
    [(3, [2, 4], 4), (5, [2, 4], 8), (1, None, 8), (2, [2, 4], 2), (8, [2, 4], 8), (3, [4, 16], 4)],
)
def test_pad_batch_repeats_the_last_sample_up_to_the_nearest_batch_size(
    samples: int, preferred: list[int] | None, padded_to: int
) -> None:
    seen: list[np.ndarray] = []

    @batch
    @pad_batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        seen.append(x)
        return {"y": x * 10}

    rows = list(range(1, samples + 1))
    with use_triton_context(padded_model(preferred_batch_size=preferred)):
        responses = infer([request(x=rows[:1]), request(x=rows[1:])] if samples > 1 else [request(x=rows)])
    assert seen[0].tolist() == rows + [rows[-1]] * (padded_to - samples)
    assert seen[0].flags.writeable is False
    assert [row for rows_out in values(responses, "y") for row in rows_out] == [row * 10 for row in rows]


def test_pad_batch_without_the_dynamic_batcher_pads_to_the_max_batch_size() -> None:
    @batch
    @pad_batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        assert x.tolist() == [1, 2, 2, 2, 2, 2, 2, 2]
        return {"y": x * 10}

    with use_triton_context(context("y", max_batch_size=8, batcher=None)):
        assert values(infer([request(x=[1, 2])]), "y") == [[10, 20]]


def test_pad_batch_hands_a_full_batch_through_and_trims_streamed_outputs() -> None:
    x = frozen([1, 2])

    @pad_batch
    def same(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"x": x}

    @pad_batch
    def stream(x: np.ndarray):
        yield [x, x + 1]

    with use_triton_context(padded_model(preferred_batch_size=[2])):
        assert same(x=x)["x"] is x
        assert [[value.tolist() for value in item] for item in stream(x=frozen([5]))] == [[[5], [6]]]


@pytest.mark.parametrize(
    ("active", "message"),
    [
        (None, "needs the batch sizes"),
        (context(batching=False), "needs the batch sizes"),
        (context(max_batch_size=2), "batch of 3 samples, more than max_batch_size 2"),
    ],
)
def test_pad_batch_rejects_batches_it_cannot_pad(active: TritonContext | None, message: str) -> None:
    infer = pad_batch(lambda **inputs: inputs)
    with pytest.raises(PyTritonValidationError, match=message):
        if active is None:
            infer(x=frozen([1, 2, 3]))
        else:
            with use_triton_context(active):
                infer(x=frozen([1, 2, 3]))


# --- @first_value ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values_in", "options", "expected"),
    [
        (frozen([[0.5], [0.5]], np.float32), {}, np.float32(0.5)),
        (frozen([[0.5], [0.5]], np.float32), {"squeeze_single_values": False}, [0.5]),
        (frozen([3, 3, 3]), {}, np.int64(3)),
        (frozen([[b"greedy"], [b"greedy"]], dtype=object), {}, b"greedy"),
        (frozen([[1, 2], [1, 2]]), {}, [1, 2]),
        (frozen([[1], [2]]), {"strict": False}, np.int64(1)),
    ],
)
def test_first_value_replaces_an_input_by_its_first_sample(
    values_in: np.ndarray, options: dict[str, Any], expected: Any
) -> None:
    @first_value("param", **options)
    def infer(x: np.ndarray, param: Any) -> Any:
        return param

    got = infer(x=frozen([1, 2]), param=values_in)
    if isinstance(got, np.ndarray):
        assert got.tolist() == expected
    else:
        assert got == expected
        assert type(got) is type(expected)


def test_first_value_works_on_request_lists_and_keeps_parameters() -> None:
    @first_value("t")
    def infer(requests: list[Request]) -> list[Any]:
        return [(request.data.get("t"), request) for request in requests]

    with_t = request({"p": 1}, x=[1], t=[[2], [2]])
    without = request({"p": 2}, x=[1])
    (first, first_request), (second, second_request) = infer([with_t, without])
    assert first == 2 and first_request.parameters == {"p": 1}
    assert second is None and second_request is without


def test_first_value_under_batch_on_a_method() -> None:
    class Model:
        @batch
        @first_value("scale")
        def __call__(self, x: np.ndarray, scale: np.integer) -> dict[str, np.ndarray]:
            return {"y": x * scale}

    assert values(Model()([request(x=[1], scale=[3]), request(x=[2, 3], scale=[3, 3])]), "y") == [[3], [6, 9]]


def test_first_value_rejects_unequal_values_and_bad_keys() -> None:
    infer = first_value("t")(lambda **inputs: inputs)
    with pytest.raises(PyTritonRuntimeError, match="input 't' has different values"):  # as PyTriton's
        infer(x=frozen([1, 2]), t=frozen([[0.1], [0.2]]))
    with pytest.raises(PyTritonValidationError, match="Input 't' must be a numpy array with a batch axis"):
        infer(x=frozen([1]), t=5)
    with (
        use_triton_context(context(batching=False)),
        pytest.raises(PyTritonRuntimeError, match="batching"),
    ):
        infer(x=frozen([1]), t=frozen([1]))
    with pytest.raises(PyTritonBadParameterError, match="names the context"):
        first_value("triton_context")


# --- @triton_context and composition --------------------------------------------------------------


def test_triton_context_passes_the_model_config_or_an_empty_context() -> None:
    @triton_context
    def infer(requests: list[Request], triton_context: TritonContext) -> TritonContext:
        return triton_context

    active = context("y", max_batch_size=16)
    with use_triton_context(active):
        assert infer([]) is active
    assert infer([]).model_config is None
    assert infer([]).output_names == []
    with pytest.raises(PyTritonValidationError, match="already has an argument"):
        infer([], triton_context=active)


def test_the_documented_decorator_stack_composes() -> None:
    calls: list[tuple[float, list[str], int]] = []

    @fill_optionals(temperature=np.array([0.7], dtype=np.float32))
    @group_by_keys
    @batch
    @group_by_values("temperature")
    @first_value("temperature")
    @triton_context
    def infer(
        triton_context: TritonContext,
        prompt: np.ndarray,
        temperature: np.float32,
        top_k: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        calls.append((round(float(temperature), 2), triton_context.output_names, len(prompt)))
        suffix = b"" if top_k is None else b"+k"
        return {"text": np.array([[row[0] + suffix] for row in prompt], dtype=object)}

    requests = [
        Request(data={"prompt": frozen([[b"a"], [b"b"]], dtype=object)}),
        Request(data={"prompt": frozen([[b"c"]], dtype=object), "temperature": frozen([[0.2]], np.float32)}),
        Request(data={"prompt": frozen([[b"d"]], dtype=object), "top_k": frozen([[5]])}),
    ]
    with use_triton_context(context("text")):
        responses = infer(requests)
    assert values(responses, "text") == [[[b"a"], [b"b"]], [[b"c"]], [[b"d+k"]]]
    assert sorted(calls) == [(0.2, ["text"], 1), (0.7, ["text"], 1), (0.7, ["text"], 2)]
