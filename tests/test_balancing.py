"""Per-request balancing over the addresses of one name (`kubetriton.replicas`), as a model's headless
Service gives them: the picking rule on its own, then the clients against real tritonservers that share
their ports on 127.0.0.1, 127.0.0.2 and 127.0.0.3 as pods share theirs. Only the name's look-up is the
test's (no DNS here answers with those three); everything else is real."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from kubetriton import replicas
from kubetriton.replicas import FORGET_HALF_LIFE_S, Replica, ReplicaSet, pick
from kubetriton.triton_home import locate
from pytriton.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)

from tests.conftest import free_ports, plain_triton

# The rule.


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def replica(
    host: str,
    *,
    latency_s: float | None = None,
    in_flight: int = 0,
    answered_at: float = 100.0,
    samples: int = 10,
) -> Replica:
    return Replica(host, in_flight=in_flight, latency_s=latency_s, samples=samples, answered_at=answered_at)


@pytest.mark.parametrize(
    ("members", "chosen"),
    [
        ([replica("a", latency_s=0.02), replica("b")], "b"),  # a replica never tried is tried at once
        ([replica("a", latency_s=0.04), replica("b", latency_s=0.02)], "b"),  # the faster one
        ([replica("a", latency_s=0.02, in_flight=1), replica("b", latency_s=0.03)], "b"),  # 0.04 against 0.03
        ([replica("a", latency_s=0.02, in_flight=1), replica("b", latency_s=0.05)], "a"),  # 0.04 against 0.05
        ([replica("a", in_flight=1), replica("b")], "b"),  # never tried: fewer in flight first
        ([replica("a", latency_s=0.02), replica("b", latency_s=0.09, samples=2)], "b"),  # b is still on trial
        # slow when last tried, long ago: its estimate has faded below the one in use
        (
            [
                replica("a", latency_s=0.02),
                replica("b", latency_s=0.06, answered_at=100.0 - 2 * FORGET_HALF_LIFE_S),
            ],
            "b",
        ),
    ],
)
def test_the_replica_expected_to_answer_first_takes_the_request(members: list[Replica], chosen: str) -> None:
    assert pick(members, 100.0, random.Random(0)).host == chosen


def test_a_few_requests_go_anywhere() -> None:
    members = [replica("fast", latency_s=0.02), replica("slow", latency_s=0.2)]
    rng = random.Random(7)
    chosen = Counter(pick(members, 100.0, rng).host for _ in range(10_000))
    expected = replicas.EXPLORE_SHARE / len(members)  # a request sent anywhere goes to either
    assert 0.5 * expected < chosen["slow"] / 10_000 < 1.5 * expected, chosen


def test_a_replica_that_refused_is_held_back_unless_none_other_is_left() -> None:
    refused = replica("a", latency_s=0.01)
    refused.unreachable_until = 105.0
    other = replica("b", latency_s=0.05)
    assert pick([refused, other], 100.0, random.Random(0)) is other
    assert pick([refused], 100.0, random.Random(0)) is refused
    assert pick([refused, other], 105.0, random.Random(0)) is refused


def fixed(answers: dict[str, list[str]]) -> Callable[[str, int], list[str]]:
    def resolve(host: str, port: int) -> list[str]:
        found = answers[host]
        if not found:
            raise OSError("no such name")
        return list(found)

    return resolve


def test_the_set_follows_the_names_answers() -> None:
    answers = {"m-pods": ["10.0.0.1", "10.0.0.2"]}
    pods = ReplicaSet("m-pods", 8000, resolve=fixed(answers), clock=Clock(), rng=random.Random(0))
    pods.acquire()
    assert pods.hosts() == {"10.0.0.1", "10.0.0.2"}
    for member in pods.members():
        for latency_s in (0.5, 0.02):  # the first answer, with the connection's set-up, is left out
            member.answered(latency_s, 100.0)
        assert member.latency_s == 0.02
    kept = {member.host: member for member in pods.members()}["10.0.0.2"]
    pods.refresh()
    assert kept.latency_s == 0.02, "no pod joined: the estimates stay"
    answers["m-pods"] = ["10.0.0.2", "10.0.0.3"]
    pods.refresh()
    assert pods.hosts() == {"10.0.0.2", "10.0.0.3"}
    assert {member.host: member for member in pods.members()}["10.0.0.2"] is kept, "a replica that stays"
    assert all(member.latency_s is None for member in pods.members()), "a pod joined: estimates forgotten"
    answers["m-pods"] = []
    pods.refresh()
    assert pods.hosts() == {"10.0.0.2", "10.0.0.3"}, "a failed look-up changes nothing"
    answers["m-pods"] = ["10.0.0.3"]
    pods.refresh()
    assert pods.hosts() == {"m-pods"}, "one address: the name stands for itself"


def test_an_estimate_is_the_fastest_trial_answer_then_a_moving_average() -> None:
    member = Replica("10.0.0.1")
    member.answered(1.0, 100.0)
    assert member.latency_s is None, "the connection's first answer is left out"
    for latency_s in (0.09, 0.03, 0.05):  # the model's first call was slow
        member.answered(latency_s, 100.0)
    assert member.latency_s == pytest.approx(0.03) and member.trusted
    member.answered(0.13, 101.0)
    assert member.latency_s == pytest.approx(0.03 + replicas.LATENCY_WEIGHT * 0.1)
    assert member.answered_at == 101.0
    member.forget()
    member.answered(0.05, 102.0)
    assert member.latency_s == 0.05, "after forgetting, the next answer counts alone"


def test_a_name_that_never_resolved_stands_for_itself() -> None:
    pods = ReplicaSet("nowhere", 8000, resolve=fixed({"nowhere": []}))
    assert pods.acquire().host == "nowhere"


def test_requests_in_flight_spread_over_replicas_never_tried() -> None:
    answers = {"m-pods": ["10.0.0.1", "10.0.0.2", "10.0.0.3"]}
    pods = ReplicaSet("m-pods", 8000, resolve=fixed(answers), rng=random.Random(1))
    taken = [pods.acquire().host for _ in range(6)]
    assert Counter(taken) == {"10.0.0.1": 2, "10.0.0.2": 2, "10.0.0.3": 2}


@pytest.mark.parametrize(
    ("host", "ssl", "expected"),
    [
        ("m-pods.models.svc", False, True),
        ("m-pods.models.svc", True, False),
        ("10.0.0.1", False, False),
        ("::1", False, False),
    ],
)
def test_names_without_tls_are_balanced(host: str, ssl: bool, expected: bool) -> None:
    assert replicas.balanced_host(host, ssl) is expected


# The clients against three real servers on one pair of ports.

ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""
WHO = """import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            time.sleep(0.02)
            y = np.full(x.shape, {server}, dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
"""
WHO_STREAM = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            sender = request.get_response_sender()
            for _ in range(2):
                y = np.full(x.shape, {server}, dtype=np.float32)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """Three servers of the `who` and `who_stream` models on the same HTTP and gRPC ports, one per loopback
    address; each answers with its index (1, 2, 3)."""
    http, grpc = free_ports(2)
    home = locate()
    with contextlib.ExitStack() as stack:
        for index, address in enumerate(ADDRESSES, start=1):
            workspace = tmp_path_factory.mktemp(f"pod{index}")
            triton = stack.enter_context(plain_triton(home, workspace, address=address, ports=(http, grpc)))
            triton.add_model("who", WHO.format(server=index), CONFIG.format(name="who", extra=""))
            triton.add_model(
                "who_stream",
                WHO_STREAM.format(server=index),
                CONFIG.format(name="who_stream", extra="model_transaction_policy { decoupled: true }"),
            )
            triton.load("who")
            triton.load("who_stream")
        yield http, grpc


@pytest.fixture
def name(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str]]]:
    """A name of the test's own (one per test, so that no client of another test shares its set) and the
    addresses it resolves to, which the test may change."""
    host = f"who-pods-{request.node.name.replace('[', '-').replace(']', '').replace('_', '-')}.test"[:60]
    answer = list(ADDRESSES[:2])
    real = replicas.resolve_addresses

    def resolve(asked: str, port: int) -> list[str]:
        return list(answer) if asked == host else real(asked, port)

    monkeypatch.setattr(replicas, "resolve_addresses", resolve)
    yield host, answer


def served_by(outputs: dict[str, np.ndarray]) -> int:
    return int(outputs["y"].reshape(-1)[0])


def closed_loop(client: ModelClient, seconds: float, seen: Counter[int], lock: threading.Lock) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        server = served_by(client.infer_sample(np.array([1.0], dtype=np.float32)))
        with lock:
            seen[server] += 1


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_closed_loop_clients_of_one_name_spread_over_its_addresses(pods, name, scheme: str) -> None:
    host, answer = name
    answer[:] = ADDRESSES
    port = pods[0] if scheme == "http" else pods[1]
    seen: Counter[int] = Counter()
    lock = threading.Lock()
    clients = [ModelClient(f"{scheme}://{host}:{port}", "who", init_timeout_s=30) for _ in range(3)]
    with contextlib.ExitStack() as stack:
        for client in clients:
            stack.enter_context(client)
        threads = [threading.Thread(target=closed_loop, args=(c, 3.0, seen, lock)) for c in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    total = sum(seen.values())
    assert set(seen) == {1, 2, 3}, seen
    assert all(count >= total / 6 for count in seen.values()), f"each server a fair share: {seen}"


def test_a_pod_that_joins_is_used_and_one_that_leaves_is_not(pods, name) -> None:
    host, answer = name
    with ModelClient(f"http://{host}:{pods[0]}", "who", init_timeout_s=30) as client:
        assert {served_by(client.infer_sample(np.array([1.0], dtype=np.float32))) for _ in range(6)} <= {1, 2}
        answer[:] = ADDRESSES
        deadline = time.monotonic() + 30
        seen: set[int] = set()
        while 3 not in seen and time.monotonic() < deadline:
            seen.add(served_by(client.infer_sample(np.array([1.0], dtype=np.float32))))
        assert 3 in seen, "the new address took a request within the deadline"
        answer[:] = ADDRESSES[1:]
        time.sleep(replicas.REFRESH_S)
        client.infer_sample(np.array([1.0], dtype=np.float32))  # starts the look-up that drops 127.0.0.1
        time.sleep(0.5)
        later = Counter(served_by(client.infer_sample(np.array([1.0], dtype=np.float32))) for _ in range(20))
        assert 1 not in later, later
        assert set(client._replica_transports) <= {"127.0.0.2", "127.0.0.3"}, "its connection was closed"


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_an_address_that_refuses_costs_no_request(pods, name, scheme: str) -> None:
    host, answer = name
    answer[:] = ["127.0.0.1", "127.0.0.9"]  # nothing listens on 127.0.0.9
    port = pods[0] if scheme == "http" else pods[1]
    with ModelClient(f"{scheme}://{host}:{port}", "who", init_timeout_s=30) as client:
        served = [served_by(client.infer_sample(np.array([1.0], dtype=np.float32))) for _ in range(8)]
    assert served == [1] * 8


def test_the_futures_client_shares_one_set_over_its_threads(pods, name) -> None:
    host, answer = name
    answer[:] = ADDRESSES
    with FuturesModelClient(f"grpc://{host}:{pods[1]}", "who", max_workers=3) as client:
        futures = [client.infer_sample(np.array([1.0], dtype=np.float32)) for _ in range(30)]
        seen = Counter(served_by(future.result()) for future in futures)
    assert set(seen) == {1, 2, 3}, seen


def test_the_asyncio_clients_spread_requests_and_streams(pods, name) -> None:
    host, answer = name
    answer[:] = ADDRESSES

    async def stream(client: AsyncioDecoupledModelClient) -> list[int]:
        return [
            served_by(outputs) async for outputs in client.infer_sample(np.array([1.0], dtype=np.float32))
        ]

    async def scenario() -> tuple[Counter[int], list[list[int]]]:
        async with AsyncioModelClient(f"http://{host}:{pods[0]}", "who", init_timeout_s=30) as client:
            results = await asyncio.gather(
                *(client.infer_sample(np.array([1.0], dtype=np.float32)) for _ in range(12))
            )
        url = f"grpc://{host}:{pods[1]}"
        async with AsyncioDecoupledModelClient(url, "who_stream", init_timeout_s=30) as client:
            streams = await asyncio.gather(*(stream(client) for _ in range(6)))
        return Counter(served_by(result) for result in results), streams

    requests, streams = asyncio.run(scenario())
    assert set(requests) == {1, 2, 3}, requests
    assert all(len(responses) == 2 and len(set(responses)) == 1 for responses in streams), streams
    assert len({responses[0] for responses in streams}) >= 2, streams


def test_a_stream_goes_to_one_pod_and_streams_spread(pods, name) -> None:
    host, answer = name
    answer[:] = ADDRESSES
    seen: Counter[int] = Counter()
    clients = [
        DecoupledModelClient(f"grpc://{host}:{pods[1]}", "who_stream", init_timeout_s=30) for _ in range(3)
    ]
    for _ in range(4):
        for client in clients:
            responses = [
                served_by(outputs) for outputs in client.infer_sample(np.array([1.0], dtype=np.float32))
            ]
            assert len(responses) == 2 and len(set(responses)) == 1, "one stream, one pod"
            seen[responses[0]] += 1
    for client in clients:
        client.close()
    assert len(seen) >= 2, seen
