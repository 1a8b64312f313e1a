"""A model's own signals, read from a real Triton's metrics page and from the worker's format."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from kubetriton.operator import autoscaler, signals
from kubetriton.operator.signals import PodReading
from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from tests.conftest import free_ports

BATCH_SECONDS = 0.02

WORKER_PAGE = """# HELP kubetriton_in_flight Requests being served now
# TYPE kubetriton_in_flight gauge
kubetriton_in_flight{model="Encoder",process="0"} 2.0
kubetriton_in_flight{model="Encoder",process="1"} 3.0
kubetriton_in_flight{model="Decoder",process="0"} 1.0
kubetriton_in_flight_other{model="Encoder"} 100.0
"""


def test_each_models_series_are_summed_whatever_other_labels_they_carry() -> None:
    assert signals.parse(WORKER_PAGE, signals.WORKER_IN_FLIGHT_METRICS) == {
        signals.RUNNING: {"Encoder": 5.0, "Decoder": 1.0}
    }


def triton_page(queue_us: dict[str, float], requests: dict[str, float], pending: dict[str, float]) -> str:
    lines = []
    for model in queue_us:
        labels = f'model="{model}",version="1"'
        lines += [
            f"nv_inference_request_success{{{labels}}} {requests[model]}",
            f"nv_inference_queue_duration_us{{{labels}}} {queue_us[model]}",
            f"nv_inference_pending_request_count{{{labels}}} {pending.get(model, 0)}",
        ]
    return "\n".join(lines)


def reading(page: str, metrics: tuple[str, ...] = signals.QUEUE_TIME_METRICS) -> PodReading:
    return PodReading(signals.parse(page, metrics))


def test_queue_time_is_the_slowest_models_wait_per_request_between_two_readings() -> None:
    models = ("Encoder", "Decoder")
    before = {
        "a": reading(triton_page({"Encoder": 1_000, "Decoder": 0}, {"Encoder": 10, "Decoder": 0}, {})),
        "b": reading(triton_page({"Encoder": 0, "Decoder": 0}, {"Encoder": 0, "Decoder": 0}, {})),
    }
    after = {
        # a: Encoder 100 requests that waited 20 ms each; Decoder idle
        "a": reading(triton_page({"Encoder": 2_001_000, "Decoder": 0}, {"Encoder": 110, "Decoder": 0}, {})),
        # b: Encoder 100 requests, no wait; Decoder 50 requests that waited 30 ms each
        "b": reading(triton_page({"Encoder": 0, "Decoder": 1_500_000}, {"Encoder": 100, "Decoder": 50}, {})),
        "new": reading(triton_page({"Encoder": 0, "Decoder": 0}, {"Encoder": 0, "Decoder": 0}, {})),
    }
    measured = signals.queue_time(before, after, models)
    assert measured == signals.Measurement(30.0, 2), "Decoder waited 30 ms; Encoder 10 ms over both pods"
    assert signals.queue_time(after, after, models) == signals.Measurement(0.0, 3), (
        "idle pods waited for nothing"
    )
    restarted = {"a": reading(triton_page({"Encoder": 0, "Decoder": 0}, {"Encoder": 1, "Decoder": 0}, {}))}
    assert signals.queue_time(after, restarted, models) == signals.Measurement(None, 0)
    assert signals.queue_time({}, after, models) == signals.Measurement(None, 0), "one reading is no signal"
    assert signals.queue_time(before, after, ("Encoder", "Missing")) == signals.Measurement(None, 0)


def test_in_flight_adds_tritons_queue_and_the_workers_callable_per_pod() -> None:
    metrics = (*signals.TRITON_IN_FLIGHT_METRICS, *signals.WORKER_IN_FLIGHT_METRICS)
    page = triton_page(
        {"Encoder": 0, "Decoder": 0}, {"Encoder": 0, "Decoder": 0}, {"Encoder": 4, "Decoder": 0}
    )
    busy = PodReading(signals.parse(page + "\n" + WORKER_PAGE, metrics))
    idle_page = triton_page(
        {"Encoder": 0, "Decoder": 0}, {"Encoder": 0, "Decoder": 0}, {"Encoder": 0, "Decoder": 0}
    )
    idle = PodReading(signals.parse(idle_page + '\nkubetriton_in_flight{model="Encoder"} 0\n', metrics))
    assert signals.in_flight({"busy": busy}, ("Encoder", "Decoder")) == signals.Measurement(10.0, 1)
    assert signals.in_flight({"busy": busy, "idle": idle}, ("Encoder",)) == signals.Measurement(4.5, 2)
    assert signals.in_flight({"busy": busy, "idle": idle}, ("Encoder", "Decoder")) == signals.Measurement(
        10.0, 1
    ), "a page without every model (its worker has not bound Decoder yet) is left out"


@batch
def _slow(x: np.ndarray) -> dict[str, np.ndarray]:
    time.sleep(BATCH_SECONDS)
    return {"y": x}


@pytest.fixture(scope="module")
def slow_triton() -> Iterator[tuple[int, int]]:
    http, grpc, metrics = free_ports(3)
    with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
        triton.bind(
            "Slow",
            _slow,
            inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))],
            config=ModelConfig(max_batch_size=8),
        )
        triton.run()
        yield http, metrics


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_a_real_tritons_page_gives_queue_time_and_pending_requests(slow_triton: tuple[int, int]) -> None:
    """Four closed-loop clients of a model that takes 20 ms per batch: a request waits for the batch
    before it, so Triton's counters show about 20 ms of queue per request, and requests pending."""
    http, metrics = slow_triton
    stop = threading.Event()

    def client() -> None:
        with ModelClient(f"localhost:{http}", "Slow") as model:
            while not stop.is_set():
                model.infer_sample(x=np.ones(1, np.float32))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        wanted = (*signals.QUEUE_TIME_METRICS, *signals.TRITON_IN_FLIGHT_METRICS)
        first = PodReading(signals.parse(_scrape(metrics), wanted))
        pending_seen = 0.0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not pending_seen:
            pending_seen = (
                PodReading(signals.parse(_scrape(metrics), wanted)).of(signals.PENDING, "Slow") or 0.0
            )
        time.sleep(1)
        second = PodReading(signals.parse(_scrape(metrics), wanted))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert pending_seen >= 1
    measured = signals.queue_time({"pod": first}, {"pod": second}, ["Slow"])
    assert measured.pods == 1 and measured.value is not None
    assert BATCH_SECONDS * 1000 / 4 < measured.value < BATCH_SECONDS * 1000 * 4, measured
    idle = PodReading(signals.parse(_scrape(metrics), wanted))
    assert signals.queue_time({"pod": idle}, {"pod": idle}, ["Slow"]) == signals.Measurement(0.0, 1)
    assert signals.in_flight({"pod": idle}, ["Slow"]) == signals.Measurement(None, 0), (
        "Triton's page alone lacks the worker's part"
    )


@pytest.mark.asyncio
async def test_a_metrics_page_too_big_to_read_is_no_reading(caplog: pytest.LogCaptureFixture) -> None:
    """A pod's page is its user's to fill: one that would take the operator's memory is not read."""
    pages = {"/small": WORKER_PAGE, "/big": WORKER_PAGE + "# " + "x" * autoscaler.MAX_PAGE_BYTES + "\n"}

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=pages[request.path])

    app = web.Application()
    app.router.add_get("/{page}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    metrics = signals.WORKER_IN_FLIGHT_METRICS
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as session:
            read = await autoscaler.read_page(session, "/small", "pod-a", metrics)
            too_big = await autoscaler.read_page(session, "/big", "pod-a", metrics)
    finally:
        await runner.cleanup()
    assert read == {"kubetriton_in_flight": {"Encoder": 5.0, "Decoder": 1.0}}
    assert too_big is None
    assert f"serves a metrics page of more than {autoscaler.MAX_PAGE_BYTES} bytes" in caplog.text
