"""Batches of medium tensors: kubetriton against the limit, and the latency tail of several instances.

Clients send one image each, a [1,3,224,224] float16 tensor (301 KB), closed loop over gRPC, from
`CLIENT_PROCESSES` client processes (asyncio clients, one channel each); Triton batches them. The model
returns each row's first element, so what is measured is what moving the batch costs.

`limit` (the default) compares kubetriton with the limit, the same model written as a Triton
Python-backend model, which concatenates its batch as the callable's `@batch` does (a model on a GPU
needs its batch in one array). Both servers run side by side, each with the model twice, batching up to
16 and up to 64; rounds alternate between them, so both see the same machine. Per request it reports the
CPU time of each process (tritonserver, the Python-backend stubs, the worker), and per batch the time
Triton's statistics count as compute (input, infer and output: the whole `execute` of the model), with
req/s and the ratios kubetriton / limit. kubetriton runs with the settings users get by default. With
`--against REVISION`, kubetriton at that git revision (a temporary worktree) serves beside them, its
rounds alternating with the others': a change is judged against the same machine at the same time,
whose drift between runs is often as large as the change. With `--steps`, this checkout's worker also
times its instance thread step by step in the running server (`WORKER_STEPS`, thread CPU time per batch):
the warm loop of `breakdown` puts the same steps at a fifth to a tenth of what they cost there.

`tail` runs kubetriton alone with a callable that sleeps `SLEEP_MS` (releasing the GIL, as a model on a
GPU waits for it), `max_batch_size` 64, as 2 and 4 worker processes (`kubetriton run --processes`) and as
2 thread instances, at 32 and 64 clients, and reports p50, p90, p99 and p99 / p50.

Usage: python bench/batch_path.py [limit|tail|batcher|breakdown] [--rounds 3] [--seconds 8]
       [--against REVISION] [--steps] [--json figures.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from data_path import cpu_seconds, plain_triton
from kubetriton.podenv import ACCESS_TOKEN_HEADER
from multi_process import free_ports

IMAGE_SHAPE = (3, 224, 224)
CLIENT_PROCESSES = 4
WARMUP_S = 2.0
SLEEP_MS = 10.0
ACCESS_TOKEN = "batch-path-bench"
"""The token of the worker's protected endpoints (statistics among them), chosen here so that the benchmark
can read Triton's statistics; which endpoints are protected stays the default."""
LIMIT_BATCHES = (16, 64)
"""The max_batch_size of the two models each server of `limit` hosts, named m16 and m64."""
TAIL_BAR = 2.5
"""The most p99 / p50 that `tail` accepts of kubetriton in any setup."""
TAIL_SETUPS = (("2 processes", 2, 1), ("4 processes", 4, 1), ("2 instances", 1, 2))
"""Name, worker processes, instances per process."""
WORKER_STEPS = {
    "receive": ("kubetriton.transport", "Hop", "receive"),
    "requests decoded": ("kubetriton.worker", "InstanceServer", "_decode_requests"),
    "callable with @batch": ("kubetriton.worker", "InstanceServer", "_call"),
    "outputs encoded": ("kubetriton.worker", "InstanceServer", "_encode_split"),
    "reply sent": ("kubetriton.worker", "InstanceServer", "_send"),
    "batch after its receive": ("kubetriton.worker", "InstanceServer", "_serve_one"),
}
"""The worker's steps that `--steps` times: name, (module, class, method). The last holds the three before
it and what lies between them; the worker's CPU per batch less it and the receive is the wait's return
and the loop around it."""
STEPS_ENVIRONMENT = "BATCH_PATH_STEPS"
"""Where the worker of `serve` writes its steps' running totals (`time_worker_steps`), when set."""

NATIVE_FIRST = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.sleep_s = float(parameters.get("sleep_ms", {"string_value": "0"})["string_value"]) / 1000

    def execute(self, requests):
        images = [pb_utils.get_input_tensor_by_name(request, "image").as_numpy() for request in requests]
        batch = np.concatenate(images)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        first = batch.reshape(len(batch), -1)[:, :1]
        responses, start = [], 0
        for image in images:
            rows = first[start : start + len(image)]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("first", rows)]))
            start += len(image)
        return responses
"""


def native_config(name: str, max_batch: int, instances: int = 1, sleep_ms: float = 0.0) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n'
        "dynamic_batching { max_queue_delay_microseconds: 0 }\n"
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
        f'parameters {{ key: "sleep_ms" value {{ string_value: "{sleep_ms:g}" }} }}\n'
        'input [ { name: "image" data_type: TYPE_FP16 dims: [ 3, 224, 224 ] } ]\n'
        'output [ { name: "first" data_type: TYPE_FP16 dims: [ 1 ] } ]\n'
    )


def serve(
    models: list[tuple[str, int]],
    instances: int,
    sleep_ms: float,
    queue_delay_us: int,
    trace: str,
    ports: list[int],
) -> None:
    """Run as the worker (`python batch_path.py serve ...`, or under `kubetriton run`): bind each
    (name, max_batch_size) model with `instances` callables, the dynamic batcher's queue delay, and
    kubetriton's defaults otherwise, and serve."""
    if os.environ.get(STEPS_ENVIRONMENT):
        time_worker_steps(Path(os.environ[STEPS_ENVIRONMENT]))
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    @batch
    def first_elements(image: np.ndarray) -> dict[str, np.ndarray]:
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        return {"first": image.reshape(len(image), -1)[:, :1]}

    http, grpc, metrics = ports
    config = TritonConfig(
        http_port=http, grpc_port=grpc, metrics_port=metrics, trace_config=trace_config(trace) or None
    )
    with Triton(config=config, security_config=TritonSecurityConfig(access_token=ACCESS_TOKEN)) as triton:
        for name, max_batch in models:
            triton.bind(
                name,
                [first_elements] * instances,
                [Tensor(name="image", shape=IMAGE_SHAPE, dtype=np.float16)],
                [Tensor(name="first", shape=(1,), dtype=np.float16)],
                config=ModelConfig(
                    max_batch_size=max_batch,
                    batcher=DynamicBatcher(max_queue_delay_microseconds=queue_delay_us),
                ),
            )
        triton.serve()


def time_worker_steps(path: Path, every_s: float = 0.2) -> None:
    """Time each of `WORKER_STEPS` in this process from now on: its thread CPU time and calls, summed
    over the process's threads, written to `path` as JSON every `every_s` (replaced whole, so a reader
    never sees half a file). The timing itself adds a microsecond or two to each step."""
    import importlib

    totals = {name: [0, 0] for name in WORKER_STEPS}

    def timed(name: str, method: Any) -> Any:
        total = totals[name]

        @functools.wraps(method)
        def step(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time_ns()
            try:
                return method(*args, **kwargs)
            finally:
                total[0] += time.thread_time_ns() - started
                total[1] += 1

        return step

    for name, (module, owner, attribute) in WORKER_STEPS.items():
        cls = getattr(importlib.import_module(module), owner)
        setattr(cls, attribute, timed(name, getattr(cls, attribute)))

    def write() -> None:
        partial = path.with_suffix(".partial")
        while True:
            partial.write_text(json.dumps(totals))
            os.replace(partial, path)
            time.sleep(every_s)

    threading.Thread(target=write, name="batch-path-steps", daemon=True).start()


def read_worker_steps(path: Path) -> dict[str, list[int]]:
    """The running totals `time_worker_steps` last wrote: step name, [nanoseconds, calls]."""
    return json.loads(path.read_text())


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, with its program's name."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit():
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                with contextlib.suppress(OSError), open(f"/proc/{child}/cmdline", "rb") as cmdline:
                    found[child] = os.path.basename(cmdline.read().split(b"\0")[0].decode())
                    frontier.append(child)
    return found


def process_groups(root: int) -> dict[str, list[int]]:
    """The processes of a server by role: tritonserver, its Python-backend stubs, and the worker (every
    other process of the tree, `root` included when it is not the server itself)."""
    tree = descendants(root)
    if _program(root) == "tritonserver":
        tree[root] = "tritonserver"
    servers = [pid for pid, program in tree.items() if program == "tritonserver"]
    stubs = [pid for server in servers for pid in descendants(server)]
    worker = [pid for pid in [root, *tree] if pid not in servers and pid not in stubs]
    return {"tritonserver": servers, "stubs": stubs, "worker": worker}


def _program(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return os.path.basename(cmdline.read().split(b"\0")[0].decode())


def batch_statistics(http_port: int, model: str) -> tuple[int, int, int]:
    """Triton's count of requests, of executions (batches), and the nanoseconds of compute (input, infer,
    output) over all batches of `model` so far."""
    url = f"http://127.0.0.1:{http_port}/v2/models/{model}/stats"
    with urllib.request.urlopen(
        urllib.request.Request(url, headers={ACCESS_TOKEN_HEADER: ACCESS_TOKEN})
    ) as answer:
        stats = json.load(answer)["model_stats"][0]
    batches = compute_ns = 0
    for entry in stats.get("batch_stats", []):
        batches += int(entry["compute_infer"]["count"])
        compute_ns += sum(
            int(entry[part]["ns"]) for part in ("compute_input", "compute_infer", "compute_output")
        )
    return int(stats["inference_count"]), batches, compute_ns


def client_process(
    grpc_url: str, model: str, clients: int, until: float, results: multiprocessing.Queue
) -> None:
    """`clients` closed-loop asyncio clients until the monotonic time `until`; puts each request's
    (finish time, latency) and the errors."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import aio

    image = np.random.default_rng(os.getpid()).standard_normal((1, *IMAGE_SHAPE)).astype(np.float16)

    async def loop(samples: list[tuple[float, float]], errors: list[str]) -> None:
        client = aio.InferenceServerClient(grpc_url)
        tensor = grpcclient.InferInput("image", list(image.shape), "FP16")
        tensor.set_data_from_numpy(image)
        try:
            while (sent := time.monotonic()) < until:
                try:
                    answer = await client.infer(model, [tensor])
                except Exception as error:  # counted and reported; the load goes on
                    errors.append(str(error))
                    continue
                done = time.monotonic()
                if answer.as_numpy("first")[0, 0] != image[0, 0, 0, 0]:
                    errors.append("wrong answer")
                samples.append((done, done - sent))
        finally:
            await client.close()

    async def everyone() -> tuple[list[tuple[float, float]], list[str]]:
        samples: list[tuple[float, float]] = []
        errors: list[str] = []
        await asyncio.gather(*(loop(samples, errors) for _ in range(clients)))
        return samples, errors

    results.put(asyncio.run(everyone()))


def load(
    ports: list[int],
    model: str,
    clients: int,
    seconds: float,
    processes: dict[str, list[int]],
    steps: Path | None = None,
) -> dict[str, float]:
    """Closed-loop load for WARMUP_S then `seconds`; the figures of the measured window. `steps`: the file
    of a worker that times its steps (`time_worker_steps`), whose CPU per batch joins the figures."""
    http, grpc = ports[0], ports[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    begin = time.monotonic() + 1.0 + WARMUP_S  # the client processes need about a second to start
    end = begin + seconds
    shares = [
        clients // CLIENT_PROCESSES + (index < clients % CLIENT_PROCESSES)
        for index in range(CLIENT_PROCESSES)
    ]
    started = [
        context.Process(target=client_process, args=(f"127.0.0.1:{grpc}", model, share, end, results))
        for share in shares
        if share
    ]
    for process in started:
        process.start()
    try:
        time.sleep(max(0.0, begin - time.monotonic()))
        cpu_before = {name: cpu_seconds(pids) for name, pids in processes.items()}
        stats_before = batch_statistics(http, model)
        steps_before = read_worker_steps(steps) if steps else {}
        time.sleep(max(0.0, end - time.monotonic()))
        cpu_after = {name: cpu_seconds(pids) for name, pids in processes.items()}
        stats_after = batch_statistics(http, model)
        steps_after = read_worker_steps(steps) if steps else {}
        gathered = [results.get(timeout=120) for _ in started]
    except BaseException:
        # A client process whose results nobody reads never exits (its queue waits for a reader), and
        # neither would this one, which waits for its children as it exits.
        for process in started:
            process.terminate()
        raise
    finally:
        for process in started:
            process.join()
    latencies = sorted(latency for samples, _ in gathered for done, latency in samples if begin <= done < end)
    errors = [error for _, errors in gathered for error in errors]
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, the first: {errors[0]}")
    if not latencies:
        raise RuntimeError(f"no request finished within the {seconds:g} s window: is the machine overloaded?")
    requests, batches, compute_ns = (
        after - before for after, before in zip(stats_after, stats_before, strict=True)
    )
    figures = {
        "req/s": len(latencies) / seconds,
        "p50 ms": 1000 * latencies[len(latencies) // 2],
        "p90 ms": 1000 * latencies[int(len(latencies) * 0.9)],
        "p99 ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "batch": requests / batches,
        "compute ms/batch": compute_ns / batches / 1e6,
    }
    for name in processes:
        figures[f"CPU us/req {name}"] = (cpu_after[name] - cpu_before[name]) / requests * 1e6
    figures["CPU us/req server"] = sum(figures[f"CPU us/req {name}"] for name in processes)
    figures["CPU us/req model"] = figures["CPU us/req stubs"] + figures["CPU us/req worker"]
    if steps_after:
        spent = {
            name: (steps_after[name][0] - steps_before[name][0]) / 1000 / batches for name in steps_after
        }
        figures["worker us/batch"] = figures["CPU us/req worker"] * requests / batches
        figures.update({f"worker us/batch: {name}": value for name, value in spent.items()})
        figures["worker us/batch: the wait's return, the loop"] = (
            figures["worker us/batch"] - spent["receive"] - spent["batch after its receive"]
        )
    return figures


@contextlib.contextmanager
def kubetriton_server(
    models: list[tuple[str, int]],
    processes: int,
    instances: int,
    sleep_ms: float,
    queue_delay_us: int = 0,
    trace: str = "",
    tree: Path | None = None,
    steps: Path | None = None,
) -> Iterator[tuple[list[int], int]]:
    """kubetriton serving `models`, as one script (`python batch_path.py serve`) or under `kubetriton run
    --processes`, writing Triton's trace to the file `trace` if named; yields its ports and the pid at the
    root of its processes. `tree`: another checkout's kubetriton (`checkout`) instead of this one. `steps`:
    the worker times its steps into this file (`time_worker_steps`)."""
    ports = free_ports(3)
    script = str(tree / "bench" / "batch_path.py") if tree else __file__
    arguments = [script, "serve", json.dumps(models), str(instances), str(sleep_ms), str(queue_delay_us)]
    arguments += [trace or "-", *map(str, ports)]
    if processes > 1:
        arguments = ["-m", "kubetriton.cli", "run", "--processes", str(processes), *arguments]
    environment = dict(os.environ)
    if tree:
        environment["PYTHONPATH"] = str(tree / "worker")
    if steps:
        environment[STEPS_ENVIRONMENT] = str(steps)
    server = subprocess.Popen(
        [sys.executable, *arguments], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment
    )
    try:
        _wait_until_ready(ports[0], [name for name, _ in models], server)
        yield ports, server.pid
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(120)


def _wait_until_ready(http_port: int, models: list[str], server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and server.poll() is None:
        with contextlib.suppress(OSError):
            if all(_ready(http_port, model) for model in models):
                return
        time.sleep(0.2)
    raise RuntimeError("the models did not become ready")


def _ready(http_port: int, model: str) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/{model}/ready") as answer:
        return answer.status == 200


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """This repository at `revision`, in a temporary git worktree whose `worker` folder imports as the
    installed package does (kubetriton.sidecar linked into it); removed afterwards."""
    repository = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="kubetriton-bench-") as folder:
        tree = Path(folder) / "tree"
        git = ["git", "-C", str(repository), "worktree"]
        subprocess.run([*git, "add", "--detach", "--quiet", str(tree), revision], check=True)
        try:
            (tree / "worker" / "kubetriton" / "sidecar").symlink_to(
                tree / "sidecar" / "kubetriton" / "sidecar"
            )
            yield tree
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=True)


def compare_with_limit(
    rounds: int, seconds: float, clients: int, against: str | None = None, steps: bool = False
) -> dict[str, list[dict[str, float]]]:
    """Alternating rounds against the limit and kubetriton (and kubetriton at the revision `against`); the
    figures of every round by side and model. `steps`: this checkout's worker times its steps too."""
    names = [(f"m{size}", size) for size in LIMIT_BATCHES]
    figures: dict[str, list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        steps_file = None
        if steps:
            steps_file = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kubetriton-bench-")))
            steps_file /= "steps.json"
        native_ports, native_pid = stack.enter_context(limit_server(names, 1, 0.0))
        ours_ports, ours_pid = stack.enter_context(kubetriton_server(names, 1, 1, 0.0, steps=steps_file))
        sides = {
            "limit": (native_ports, process_groups(native_pid), None),
            "kubetriton": (ours_ports, process_groups(ours_pid), steps_file),
        }
        if against:
            tree = stack.enter_context(checkout(against))
            other_ports, other_pid = stack.enter_context(kubetriton_server(names, 1, 1, 0.0, tree=tree))
            sides[f"kubetriton {against}"] = (other_ports, process_groups(other_pid), None)
        for round_index in range(rounds):
            for name, _ in names:
                for side, (ports, processes, side_steps) in sides.items():
                    measured = load(ports, name, clients, seconds, processes, side_steps)
                    figures.setdefault(f"{side} {name}", []).append(measured)
                    print(f"round {round_index + 1} {side:>10} {name}: " + _line(measured), flush=True)
    return figures


def _line(figures: dict[str, float]) -> str:
    return "  ".join(f"{key} {value:.4g}" for key, value in figures.items())


def report_limit(figures: dict[str, list[dict[str, float]]]) -> None:
    sides = sorted({name.rsplit(" ", 1)[0] for name in figures} - {"limit"})
    for side in sides:
        print(f"\nmedian of the rounds, and {side} / limit per round")
        for size in LIMIT_BATCHES:
            limit, ours = figures[f"limit m{size}"], figures[f"{side} m{size}"]
            print(f"max_batch_size {size}:")
            for key in limit[0]:
                ratios = " ".join(
                    f"{o[key] / b[key]:.2f}" for b, o in zip(limit, ours, strict=True) if b[key]
                )
                print(
                    f"  {key:<24}{statistics.median(r[key] for r in limit):>10.4g}"
                    f"{statistics.median(r[key] for r in ours):>10.4g}   {ratios}"
                )


def report_worker_steps(figures: dict[str, list[dict[str, float]]]) -> None:
    """The steps of kubetriton's worker that `--steps` timed: µs per batch, the median and each round."""
    print("\nkubetriton's worker in the running server, thread CPU µs per batch: median, and each round")
    for size in LIMIT_BATCHES:
        rounds = figures[f"kubetriton m{size}"]
        print(f"max_batch_size {size}, batches of {statistics.median(r['batch'] for r in rounds):.3g}:")
        for key in [key for key in rounds[0] if key.startswith("worker us/batch")]:
            step = key.partition(": ")[2] or "all of it"
            each = " ".join(f"{r[key]:.0f}" for r in rounds)
            print(f"  {step:<44}{statistics.median(r[key] for r in rounds):>8.0f}   {each}")


@contextlib.contextmanager
def limit_server(
    models: list[tuple[str, int]], instances: int, sleep_ms: float, trace: str = ""
) -> Iterator[tuple[list[int], int]]:
    """The in-backend model, as `kubetriton_server` serves the callable: its ports and the server's pid."""
    ports = free_ports(3)
    native = {name: (NATIVE_FIRST, native_config(name, size, instances, sleep_ms)) for name, size in models}
    extra_args = [f"--trace-config={entry}" for entry in trace_config(trace)]
    with plain_triton(native, ports, extra_args) as pid:
        yield ports, pid


def tail_servers(trace: str) -> Iterator[tuple[str, contextlib.AbstractContextManager]]:
    """kubetriton in each of TAIL_SETUPS, then the limit with as many instances, serving m64 with a sleep;
    each writes Triton's trace to the file `trace` if named."""
    models = [("m64", 64)]
    for name, processes, instances in TAIL_SETUPS:
        yield f"kubetriton, {name}", kubetriton_server(models, processes, instances, SLEEP_MS, 0, trace)
    for instances in sorted({processes * instances for _, processes, instances in TAIL_SETUPS}):
        yield f"limit, {instances} instances", limit_server(models, instances, SLEEP_MS, trace)


def measure_tail(seconds: float, trace: bool) -> dict[str, dict[str, float]]:
    """Each setup at 32 and 64 clients; with `trace`, also where each request's time went inside Triton."""
    figures = {}
    with tempfile.TemporaryDirectory(prefix="kubetriton-bench-trace-") as folder:
        trace_file = f"{folder}/trace.json" if trace else ""
        for name, server in tail_servers(trace_file):
            windows = {}
            with server as (ports, pid):
                groups = process_groups(pid)
                for clients in (32, 64):
                    windows[clients] = time.monotonic_ns()
                    measured = load(ports, "m64", clients, seconds, groups)
                    measured["p99/p50"] = measured["p99 ms"] / measured["p50 ms"]
                    figures[f"{name}, {clients} clients"] = measured
                    print(f"{name:>25}, {clients} clients: " + _line(measured), flush=True)
            if trace:  # Triton writes its trace as it stops
                for clients, phases in trace_phases(trace_file, windows, seconds).items():
                    figures[f"{name}, {clients} clients"].update(phases)
                    print(f"{name:>25}, {clients} clients, inside Triton: " + _line(phases), flush=True)
                os.unlink(trace_file)
    return figures


TRACE_PHASES = {
    "queue": ("QUEUE_START", "COMPUTE_START"),
    "compute": ("COMPUTE_START", "COMPUTE_END"),
    "way out": ("COMPUTE_END", "GRPC_SEND_END"),
    "in Triton": ("GRPC_WAITREAD_END", "GRPC_SEND_END"),
}
"""Phases of a request inside Triton, between two of the timestamps of its trace: waiting in the batcher's
queue, the model's `execute` (for kubetriton the proxy, the hop, the worker and the callable), and sending
the response; and everything from the moment its gRPC request was read."""


def trace_config(trace: str) -> list[str]:
    """Triton's --trace-config entries that write every request's timestamps to the file `trace`."""
    if not trace:
        return []
    return ["mode=triton", f"triton,file={trace}", "level=TIMESTAMPS", "rate=1", "triton,log-frequency=0"]


def trace_phases(trace: str, windows: dict[int, int], seconds: float) -> dict[int, dict[str, float]]:
    """p50 and p99 (ms) of each of TRACE_PHASES, over the requests of each measured window; `windows` maps
    each load's clients to the monotonic time (ns) at which its client processes were started."""
    with open(trace) as file:
        timestamps: dict[int, dict[str, int]] = {}
        for entry in json.load(file):
            for stamp in entry.get("timestamps", ()):
                timestamps.setdefault(entry["id"], {})[stamp["name"]] = stamp["ns"]
    phases: dict[int, dict[str, float]] = {}
    for clients, started in windows.items():
        begin = started + int((1.0 + WARMUP_S) * 1e9)
        end = begin + int(seconds * 1e9)
        requests = [
            stamps
            for stamps in timestamps.values()
            if "GRPC_SEND_END" in stamps
            and "COMPUTE_START" in stamps
            and begin <= stamps["GRPC_SEND_END"] < end
        ]
        phases[clients] = {}
        for phase, (first, last) in TRACE_PHASES.items():
            spans = sorted(stamps[last] - stamps[first] for stamps in requests)
            for label, quantile in (("p50", 0.5), ("p99", 0.99)):
                phases[clients][f"{phase} {label} ms"] = spans[int(len(spans) * quantile)] / 1e6
    return phases


BATCHER_QUEUE_DELAYS_US = (0, 2000, 5000)
BATCHER_PROCESSES = (1, 2, 4)


def measure_batcher(seconds: float, clients: int) -> dict[str, dict[str, float]]:
    """kubetriton with 1, 2 and 4 worker processes at `clients` clients, the callable sleeping SLEEP_MS (a
    fixed cost per batch, as a GPU's), for each dynamic batcher queue delay: what the delay buys in batch
    size and req/s, and costs in latency."""
    figures = {}
    for processes in BATCHER_PROCESSES:
        for delay_us in BATCHER_QUEUE_DELAYS_US if processes > 1 else (0,):
            with kubetriton_server([("m64", 64)], processes, 1, SLEEP_MS, delay_us) as (ports, pid):
                measured = load(ports, "m64", clients, seconds, process_groups(pid))
            name = f"{processes} processes, queue delay {delay_us} us, {clients} clients"
            figures[name] = measured
            print(f"{name}: " + _line(measured), flush=True)
    return figures


def breakdown(batch_size: int = 16, rounds: int = 300) -> dict[str, float]:
    """Thread CPU time (µs per batch, mean over `rounds` warm rounds) of each step a batch of
    `batch_size` images takes through kubetriton outside Triton's stub: the same functions the proxy and
    the worker call, in one process. `np.concatenate` is what `@batch` would spend copying the batch
    without the worker's whole input."""
    from kubetriton.model_repository import ModelSpec
    from kubetriton.transport import (
        REPLY,
        REQUEST,
        Arena,
        RequestBatch,
        decode_inputs,
        decode_message,
        decode_rows,
        encode_column,
        encode_message,
        encode_rows,
    )
    from kubetriton.worker import ResponseChecker
    from pytriton.decorators import batch
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.proxy.context import TritonContext, use_triton_context
    from pytriton.proxy.types import Request

    @batch
    def first_elements(image: np.ndarray) -> dict[str, np.ndarray]:
        return {"first": image.reshape(len(image), -1)[:, :1]}

    spec = ModelSpec(
        "m",
        (Tensor(name="image", shape=IMAGE_SHAPE, dtype=np.float16),),
        (Tensor(name="first", shape=(1,), dtype=np.float16),),
        ModelConfig(max_batch_size=64),
        1,
    )
    checker = ResponseChecker(spec)
    images = [
        np.random.default_rng(row).standard_normal((1, *IMAGE_SHAPE)).astype(np.float16)
        for row in range(batch_size)
    ]
    spent: dict[str, int] = {}

    def step(name: str, started: int) -> int:
        now = time.thread_time_ns()
        spent[name] = spent.get(name, 0) + now - started
        return now

    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(dir="/dev/shm"))
        stack.enter_context(
            use_triton_context(TritonContext(spec.name, spec.config, spec.inputs, spec.outputs))
        )
        requests_arena = Arena(f"{folder}/requests", 64 << 20, create=True)
        responses_arena = Arena(f"{folder}/responses", 1 << 20, create=True)
        for round_index in range(rounds + 20):
            if round_index == 20:
                spent.clear()
            frames: list = []
            allocated: list[int] = []
            now = time.thread_time_ns()
            descriptors = encode_column("image", images, frames, requests_arena, allocated)
            now = step("proxy: the inputs into the arena", now)
            header = encode_message(REQUEST, 1, [([descriptor], "", None) for descriptor in descriptors])
            now = step("proxy: request header", now)
            message = decode_message(memoryview(header))
            now = step("worker: request header", now)
            released: list[int] = []
            inputs, columns, _pinned = decode_inputs(message.entries, frames, requests_arena, released.append)
            sizes = [entry[0][0][2][0] for entry in message.entries]
            requests = RequestBatch([Request(arrays) for arrays in inputs], columns, sizes)
            now = step("worker: inputs as arrays, the requests", now)
            copied = np.concatenate([request["image"] for request in requests])
            now = step("(np.concatenate of the batch)", now)
            del copied
            now = time.thread_time_ns()
            result = first_elements(requests)
            now = step("@batch, the callable and the split", now)
            out_frames: list = []
            array = checker.check_array("first", result.whole()["first"], sum(result.sizes))
            outputs = encode_rows("first", array, result.sizes, out_frames, responses_arena, [])
            reply_header = encode_message(REPLY, 1, [[descriptor] for descriptor in outputs], released)
            now = step("worker: the outputs checked, the reply", now)
            del result, requests, inputs, columns, array
            now = time.thread_time_ns()
            answer = decode_message(memoryview(reply_header))
            decoded = [
                decode_rows(column, out_frames, responses_arena)
                for column in zip(*answer.entries, strict=True)
            ]
            now = step("proxy: reply header and outputs", now)
            for offset in allocated:
                requests_arena.free(offset)
            del decoded
        requests_arena.close(unlink=True)
        responses_arena.close(unlink=True)
    return {name: total / rounds / 1000 for name, total in spent.items()}


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        models, instances, sleep_ms, queue_delay_us, trace, *ports = sys.argv[2:]
        serve(
            [tuple(model) for model in json.loads(models)],
            int(instances),
            float(sleep_ms),
            int(queue_delay_us),
            "" if trace == "-" else trace,
            [int(port) for port in ports],
        )
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["limit", "tail", "batcher", "breakdown"], nargs="?", default="limit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--clients", type=int, default=32, help="closed-loop clients of `limit` and `batcher`"
    )
    parser.add_argument(
        "--against", metavar="REVISION", help="limit: also kubetriton at this git revision, side by side"
    )
    parser.add_argument(
        "--steps", action="store_true", help="limit: time the worker's steps in the running server"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--trace", action="store_true", help="tail: where each request's time went inside Triton (its trace)"
    )
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs, {CLIENT_PROCESSES} client processes, "
        f"{args.seconds:g} s windows after {WARMUP_S:g} s"
    )
    if args.what == "limit":
        figures: dict = compare_with_limit(args.rounds, args.seconds, args.clients, args.against, args.steps)
        report_limit(figures)
        if args.steps:
            report_worker_steps(figures)
    elif args.what == "tail":
        figures = measure_tail(args.seconds, args.trace)
        worst = max(value["p99/p50"] for name, value in figures.items() if name.startswith("kubetriton"))
        verdict = "within" if worst <= TAIL_BAR else "over"
        print(f"\nkubetriton's largest p99/p50: {worst:.2f}, {verdict} the bar of {TAIL_BAR:g}")
    elif args.what == "batcher":
        figures = measure_batcher(args.seconds, args.clients)
    else:
        figures = breakdown()
        for name, microseconds in figures.items():
            print(f"{name:<40}{microseconds:>10.1f} µs per batch of 16")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
