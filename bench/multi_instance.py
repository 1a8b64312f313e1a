"""Multi-instance benchmark: does a list of callables (one Triton instance each) scale throughput?

The same GIL-releasing callable is bound twice, as one instance (`[work]`) and as two instances
(`[work, work]`), without batching so that every request is one execution. A separate client process
drives each model with 8 concurrent gRPC clients for a fixed time and counts completed requests.

Work kinds: `sleep` (time.sleep, pure waiting) and `matmul` (numpy matrix products with BLAS limited to
one thread, so each instance uses one core and parallelism comes only from the instances).

Usage: python bench/multi_instance.py [--work sleep|matmul|both] [--seconds 5] [--clients 8]
It prints requests per second for each model and the ratio two instances / one instance.
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import argparse  # noqa: E402
import multiprocessing  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from pytriton.model_config import ModelConfig, Tensor  # noqa: E402
from pytriton.triton import Triton, TritonConfig  # noqa: E402

SLEEP_S = 0.02
MATRIX = 512
MATMUL_REPEATS = 4
INPUTS = [Tensor(name="x", shape=(4,), dtype=np.float32)]
OUTPUTS = [Tensor(name="y", shape=(4,), dtype=np.float32)]


def sleep_work(requests):
    time.sleep(SLEEP_S)
    return [{"y": request["x"]} for request in requests]


def make_matmul_work() -> Callable:
    """A callable with its own matrix, as an instance factory would build it."""
    matrix = np.random.default_rng(0).standard_normal((MATRIX, MATRIX)).astype(np.float32) / MATRIX

    def matmul_work(requests):
        product = matrix
        for _ in range(MATMUL_REPEATS):
            product = product @ matrix
        return [{"y": request["x"] + product[0, :4]} for request in requests]

    return matmul_work


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def drive(url: str, model: str, clients: int, seconds: float, results: multiprocessing.Queue) -> None:
    """Client process: `clients` threads, each with its own connection, sending requests back to back."""
    counts = [0] * clients
    errors: list[str] = []
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client_loop(index: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("x", [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, np.float32))
        try:
            client.infer(model, [tensor])
            start.wait()
            while not stop.is_set():
                client.infer(model, [tensor])
                counts[index] += 1
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
    results.put((sum(counts) / (time.perf_counter() - began), errors))


def measure(url: str, model: str, clients: int, seconds: float) -> float:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=drive, args=(url, model, clients, seconds, results))
    process.start()
    rate, errors = results.get(timeout=seconds + 120)
    process.join()
    if errors:
        raise RuntimeError(f"{model}: {len(errors)} client errors, first: {errors[0]}")
    return rate


def run(work: str, clients: int, seconds: float) -> float:
    http, grpc, metrics = free_ports(3)
    factory = {"sleep": lambda: sleep_work, "matmul": make_matmul_work}[work]
    config = ModelConfig(batching=False)
    with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
        triton.bind("one", [factory()], INPUTS, OUTPUTS, config=config)
        triton.bind("two", [factory(), factory()], INPUTS, OUTPUTS, config=config)
        url = f"localhost:{grpc}"
        one = measure(url, "one", clients, seconds)
        two = measure(url, "two", clients, seconds)
    ratio = two / one
    print(f"{work:>6}: 1 instance {one:8.1f} req/s   2 instances {two:8.1f} req/s   ratio {ratio:.2f}x")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", choices=["sleep", "matmul", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, {args.clients} concurrent gRPC clients, {args.seconds:.0f} s per model")
    for work in ["sleep", "matmul"] if args.work == "both" else [args.work]:
        run(work, args.clients, args.seconds)


if __name__ == "__main__":
    main()
