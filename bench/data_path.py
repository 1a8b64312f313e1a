"""Data-path benchmark: kubetriton local mode against the limit, a plain Python-backend model in Triton.

Both sides run in the same tritonserver binary with the same arguments, one after the other, and answer
the same workloads through the same tritonclient calls, made from a separate client process:

  W1  [1,16] float32, sequential: p50 and p99 latency over HTTP and gRPC
  W2  16 concurrent clients, dynamic batching: requests per second over HTTP and gRPC
  W3  16 MiB and 64 MiB float32 round trips over HTTP: MB/s
  W4  32 strings of about 400 bytes, echoed, sequential: p50 latency over HTTP and gRPC

With --instances 2, the model of W1-W3 runs as two instances on both sides (two stubs for the limit,
two proxy instances and worker threads for kubetriton).

For W1 and W2 it also prints the CPU time each process spent per request over the run: the client
process, tritonserver, the Python-backend stubs and, for kubetriton, the worker (this process), which
shows what polling for the next message costs (see `BusyPoll`); for W2 also the mean batch the model
executed (from Triton's metrics). On a machine whose cores W2 fills, req/s follows these.

Usage: python bench/data_path.py [--quick] [--instances N] [--json results.json]
It prints every figure and the ratio kubetriton / limit (for latency, lower is better).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubetriton.podenv import REPOSITORY_TOKEN_HEADER
from kubetriton.server import LocalTritonServer
from kubetriton.triton_home import locate
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

HTTP, GRPC, METRICS = 18500, 18501, 18502
MAX_BATCH = 64

NATIVE_DOUBLE = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2)]))
        return responses
"""
NATIVE_ECHO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("out", text)]))
        return responses
"""


def native_config(name: str, input_name: str, output_name: str, data_type: str, instances: int = 1) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH}\n'
        "dynamic_batching { max_queue_delay_microseconds: 0 }\n"
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
        f'input [ {{ name: "{input_name}" data_type: {data_type} dims: [ -1 ] }} ]\n'
        f'output [ {{ name: "{output_name}" data_type: {data_type} dims: [ -1 ] }} ]\n'
    )


def double(requests):
    return [{"y": request["x"] * 2} for request in requests]


def echo(requests):
    return [{"out": request["text"]} for request in requests]


def http_input(name: str, array: np.ndarray, module=httpclient):
    dtype = "BYTES" if array.dtype == object else "FP32"
    tensor = module.InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def timed(call: Callable[[], object], count: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def run_workloads(models: dict[str, str], quick: bool, worker: list[int]) -> dict[str, float]:
    """Every workload against one server, from a client process of its own (as real clients are).
    `worker` holds the pid of the process that runs kubetriton's worker, if any."""
    servers = [pid for pid in _children(os.getpid()) if _program(pid) == "tritonserver"]
    processes = {
        "tritonserver": servers,
        "stubs": [stub for server in servers for stub in _children(server)],
        "worker": worker,
    }
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(client_workloads, (models, quick, processes))


def _children(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and int(_stat(int(entry))[1]) == pid:
                children.append(int(entry))
    return children


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the program's name: state, ppid, ... (utime is [11])."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def _program(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return os.path.basename(cmdline.read().split(b"\0")[0].decode())


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of the processes, all their threads."""
    ticks = 0
    for pid in pids:
        fields = _stat(pid)
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def model_counts(model: str) -> tuple[float, float]:
    """Triton's count of inferences and of executions (batches) of `model` so far."""
    with urllib.request.urlopen(f"http://localhost:{METRICS}/metrics") as answer:
        text = answer.read().decode()
    counts = {}
    for name in ("nv_inference_count", "nv_inference_exec_count"):
        prefix = f'{name}{{model="{model}",'
        counts[name] = sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
        )
    return counts["nv_inference_count"], counts["nv_inference_exec_count"]


def client_workloads(
    models: dict[str, str], quick: bool, processes: dict[str, list[int]]
) -> dict[str, float]:
    """Every workload against one server; `models` maps double/echo to the model names to query, and
    `processes` names the server's processes whose CPU time W2 reports."""
    figures: dict[str, float] = {}
    count = 300 if quick else 2000
    x16 = np.ones((1, 16), np.float32)

    http = httpclient.InferenceServerClient(f"localhost:{HTTP}")
    grpc = grpcclient.InferenceServerClient(f"localhost:{GRPC}")
    processes = {"client": [os.getpid()], **processes}
    try:
        for protocol, client, module in (("http", http, httpclient), ("grpc", grpc, grpcclient)):
            inputs = [http_input("x", x16, module)]
            infer = functools.partial(client.infer, models["double"], inputs)
            timed(infer, 0, count // 10)
            cpu_before = {name: cpu_seconds(pids) for name, pids in processes.items()}
            samples = timed(infer, count, 0)
            figures[f"W1 {protocol} p50 ms"] = statistics.quantiles(samples, n=100)[49] * 1000
            figures[f"W1 {protocol} p99 ms"] = statistics.quantiles(samples, n=100)[98] * 1000
            for name, pids in processes.items():
                spent = cpu_seconds(pids) - cpu_before[name]
                figures[f"W1 {protocol} CPU us/req {name}"] = spent / count * 1e6
        for protocol, module, port in (("http", httpclient, HTTP), ("grpc", grpcclient, GRPC)):
            cpu_before = {name: cpu_seconds(pids) for name, pids in processes.items()}
            counted = model_counts(models["double"])
            figures[f"W2 {protocol} 16 clients req/s"] = concurrent_throughput(
                models["double"], module, port, 2.0 if quick else 6.0
            )
            now = model_counts(models["double"])
            inferences, executions = now[0] - counted[0], now[1] - counted[1]
            figures[f"W2 {protocol} batch"] = inferences / executions
            for name, pids in processes.items():
                spent = cpu_seconds(pids) - cpu_before[name]
                figures[f"W2 {protocol} CPU us/req {name}"] = spent / inferences * 1e6

        for mib in (16, 64):
            big = np.random.default_rng(mib).standard_normal((1, mib * 1024 * 1024 // 4)).astype(np.float32)
            inputs = [http_input("x", big)]
            outputs = [httpclient.InferRequestedOutput("y", binary_data=True)]
            rounds = 3 if quick else 10
            samples = timed(
                functools.partial(http.infer, models["double"], inputs, outputs=outputs), rounds, 2
            )
            figures[f"W3 {mib} MiB MB/s"] = (2 * big.nbytes / 1e6) / statistics.median(samples)

        strings = np.array([[secrets.token_bytes(400) for _ in range(32)]], dtype=object)
        for protocol, client, module in (("http", http, httpclient), ("grpc", grpc, grpcclient)):
            inputs = [http_input("text", strings, module)]
            samples = timed(functools.partial(client.infer, models["echo"], inputs), count // 2, count // 20)
            figures[f"W4 {protocol} strings p50 ms"] = statistics.median(samples) * 1000
    finally:
        http.close()
        grpc.close()
    return figures


def concurrent_throughput(model: str, module, port: int, seconds: float, clients: int = 16) -> float:
    done = [0] * clients
    stop = threading.Event()

    def loop(index: int) -> None:
        client = module.InferenceServerClient(f"localhost:{port}")
        inputs = [http_input("x", np.ones((1, 16), np.float32), module)]
        try:
            while not stop.is_set():
                client.infer(model, inputs)
                done[index] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=loop, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    start_count, start = sum(done), time.perf_counter()
    time.sleep(seconds)
    rate = (sum(done) - start_count) / (time.perf_counter() - start)
    stop.set()
    for thread in threads:
        thread.join()
    return rate


@contextlib.contextmanager
def plain_triton(
    models: dict[str, tuple[str, str]],
    ports: tuple[int, int, int] | list[int] = (HTTP, GRPC, METRICS),
    extra_args: list[str] | None = None,
) -> Iterator[int]:
    """A tritonserver on `ports` (HTTP, gRPC, metrics; the benchmark's by default) serving plain
    Python-backend models, given as {name: (model.py, config.pbtxt)}, with `extra_args`; yields its pid."""
    http, grpc, metrics = ports
    with tempfile.TemporaryDirectory(prefix="kubetriton-bench-") as workspace:
        repository = Path(workspace) / "models"
        for name, (source, config) in models.items():
            (repository / name / "1").mkdir(parents=True)
            (repository / name / "1" / "model.py").write_text(source)
            (repository / name / "config.pbtxt").write_text(config)
        token = secrets.token_urlsafe(16)
        server = LocalTritonServer(
            locate(),
            model_repository=repository,
            repository_token=token,
            shm_prefix=f"/dev/shm/kubetriton-bench-{secrets.token_hex(4)}",
            log_path=Path(workspace) / "tritonserver.log",
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            exit_timeout_s=5,
            log_verbose=0,
            extra_args=extra_args or [],
        )
        server.start()
        try:
            control = httpclient.InferenceServerClient(f"localhost:{http}")
            for name in models:
                control.load_model(name, headers={REPOSITORY_TOKEN_HEADER: token})
            control.close()
            yield next(pid for pid in _children(os.getpid()) if _program(pid) == "tritonserver")
        finally:
            server.stop()


def measure_limit(quick: bool, instances: int) -> dict[str, float]:
    models = {
        "native_double": (NATIVE_DOUBLE, native_config("native_double", "x", "y", "TYPE_FP32", instances)),
        "native_echo": (NATIVE_ECHO, native_config("native_echo", "text", "out", "TYPE_STRING")),
    }
    with plain_triton(models):
        return run_workloads({"double": "native_double", "echo": "native_echo"}, quick, worker=[])


def bind_models(triton: Triton, instances: int = 1) -> None:
    """kubetriton's side: the models "double" (with `instances` instances) and "echo", batching as the
    limit's do."""
    batching = ModelConfig(max_batch_size=MAX_BATCH)
    triton.bind(
        "double",
        [double] * instances,
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="y", shape=(-1,), dtype=np.float32)],
        config=batching,
    )
    triton.bind(
        "echo",
        echo,
        [Tensor(name="text", shape=(-1,), dtype=bytes)],
        [Tensor(name="out", shape=(-1,), dtype=bytes)],
        config=batching,
    )


def measure_kubetriton(quick: bool, instances: int) -> dict[str, float]:
    config = TritonConfig(http_port=HTTP, grpc_port=GRPC, metrics_port=METRICS, exit_timeout_secs=5)
    with Triton(config=config) as triton:
        bind_models(triton, instances)
        return run_workloads({"double": "double", "echo": "echo"}, quick, worker=[os.getpid()])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples, for a smoke run")
    parser.add_argument("--instances", type=int, default=1, help="instances of the W1-W3 model")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    limit = measure_limit(args.quick, args.instances)
    ours = measure_kubetriton(args.quick, args.instances)
    print(f"{'figure':<34}{'limit':>12}{'kubetriton':>12}{'ratio':>8}")
    for key, value in limit.items():
        ratio = f"{ours[key] / value:>8.2f}" if value else f"{'-':>8}"
        print(f"{key:<34}{value:>12.3f}{ours[key]:>12.3f}{ratio}")
    if args.json:
        args.json.write_text(json.dumps({"limit": limit, "kubetriton": ours}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
