"""Worker processes against thread instances: what a model's second instance adds, as a thread or a process.

Three configurations serve the same callable as model `work`, without batching so that every request is
one execution, each started by `kubetriton run` and measured in turn:

- `1 process`: one instance;
- `2 threads`: one process with two instances (`infer_func=[work, work]`);
- `2 processes`: `kubetriton run --processes 2`, one instance each.

A separate client process drives each with closed-loop gRPC clients for a fixed time and records every
request's latency.

Work kinds: `gil`, pure Python that holds the GIL for about 5 ms a request (the loop's length is measured
once, here, so that every configuration does the same work); `numpy`, matrix products with BLAS on one
thread, which release the GIL for about as long.

Usage: python bench/multi_process.py [--work gil|numpy|both] [--seconds 10] [--clients 8]
It prints req/s, p50 and p99 of each configuration, and the ratios of 2 processes to the other two.
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import argparse  # noqa: E402
import multiprocessing  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

WORK_MS = 5.0
MATRIX = 192
CONFIGURATIONS = (("1 process", 1, 1), ("2 threads", 1, 2), ("2 processes", 2, 1))
"""Name, worker processes, instances per process."""


def spin(rounds: int) -> int:
    """Pure Python arithmetic: holds the GIL throughout."""
    total = 0
    for value in range(rounds):
        total += value * value
    return total


def calibrate(work: str) -> int:
    """How many rounds of the work take about WORK_MS here (the best of several tries)."""
    step, rounds = {"gil": (spin, 20_000), "numpy": (matmuls, 20)}[work]
    best = min(_timed(step, rounds) for _ in range(5))
    return max(1, round(rounds * WORK_MS / 1000 / best))


def _timed(step: Callable[[int], object], rounds: int) -> float:
    started = time.perf_counter()
    step(rounds)
    return time.perf_counter() - started


_MATRIX = np.random.default_rng(0).standard_normal((MATRIX, MATRIX)).astype(np.float32) / MATRIX


def matmuls(rounds: int) -> float:
    """Matrix products with BLAS on one thread: the GIL is released while each runs."""
    product = _MATRIX
    for _ in range(rounds):
        product = product @ _MATRIX
    return float(product[0, 0])


def serve(work: str, instances: int, rounds: int, ports: list[int]) -> None:
    """Run by `kubetriton run`: bind `work` with `instances` callables and serve."""
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    step = {"gil": spin, "numpy": matmuls}[work]

    def infer(requests):
        step(rounds)
        return [{"y": request["x"]} for request in requests]

    http, grpc, metrics = ports
    with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
        triton.bind(
            "work",
            [infer] * instances,
            [Tensor(name="x", shape=(4,), dtype=np.float32)],
            [Tensor(name="y", shape=(4,), dtype=np.float32)],
            config=ModelConfig(batching=False),
        )
        triton.serve()


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def drive(url: str, clients: int, seconds: float, results: multiprocessing.Queue) -> None:
    """Client process: `clients` threads, each with its own connection, sending requests back to back and
    recording each one's latency."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client_loop(index: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("x", [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, np.float32))
        try:
            client.infer("work", [tensor])
            start.wait()
            while not stop.is_set():
                sent = time.perf_counter()
                client.infer("work", [tensor])
                latencies[index].append(time.perf_counter() - sent)
        except Exception as error:
            errors.append(str(error))
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    every = sorted(latency for client in latencies for latency in client)
    results.put((len(every) / (time.perf_counter() - began), every, errors))


def measure(work: str, processes: int, instances: int, rounds: int, clients: int, seconds: float) -> tuple:
    """req/s, p50 and p99 (ms) of one configuration, served by `kubetriton run` for the time it takes."""
    ports = free_ports(3)
    command = [sys.executable, "-m", "kubetriton.cli", "run", "--processes", str(processes), __file__]
    server = subprocess.Popen(
        [*command, "serve", work, str(instances), str(rounds), *map(str, ports)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"localhost:{ports[1]}"
        _wait_until_ready(url, server)
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        client = context.Process(target=drive, args=(url, clients, seconds, results))
        client.start()
        rate, latencies, errors = results.get(timeout=seconds + 120)
        client.join()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(120)
    if errors:
        raise RuntimeError(f"{len(errors)} client errors, first: {errors[0]}")
    return rate, 1000 * latencies[len(latencies) // 2], 1000 * latencies[int(len(latencies) * 0.99)]


def _wait_until_ready(url: str, server: subprocess.Popen) -> None:
    client = grpcclient.InferenceServerClient(url)
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if client.is_model_ready("work"):
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)
    finally:
        client.close()
    raise RuntimeError("the model did not become ready")


def run(work: str, clients: int, seconds: float) -> dict[str, tuple]:
    rounds = calibrate(work)
    figures = {
        name: measure(work, processes, instances, rounds, clients, seconds)
        for name, processes, instances in CONFIGURATIONS
    }
    for name, (rate, p50, p99) in figures.items():
        print(f"{work:>5} {name:>11}: {rate:7.1f} req/s   p50 {p50:6.1f} ms   p99 {p99:6.1f} ms")
    processes = figures["2 processes"][0]
    print(
        f"{work:>5} 2 processes / 1 process {processes / figures['1 process'][0]:.2f}x, "
        f"/ 2 threads {processes / figures['2 threads'][0]:.2f}x (req/s)"
    )
    return figures


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        work, instances, rounds, *ports = sys.argv[2:]
        serve(work, int(instances), int(rounds), [int(port) for port in ports])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", choices=["gil", "numpy", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs, {args.clients} closed-loop gRPC clients, {args.seconds:.0f} s per "
        f"configuration, about {WORK_MS:g} ms of work per request"
    )
    for work in ["gil", "numpy"] if args.work == "both" else [args.work]:
        run(work, args.clients, args.seconds)


if __name__ == "__main__":
    main()
