"""Soak: what hours of mixed traffic do to a local kubetriton server's memory, descriptors and arenas.

A benchmark run lasts seconds; a leak of a few bytes, a descriptor or an arena block per request shows
only after a million requests. This script starts `Triton()` in a process of its own (local mode, as
`bench/data_path.py` does), loads it from client processes with a mix of small float tensors, 4 MiB
tensors and strings, over HTTP and gRPC, through `tritonclient` and `ModelClient`, and checks every
answer. Every 10 s it samples, for the worker process (the one that runs `Triton()`), for tritonserver
and for its Python-backend stubs: the resident set (RSS), the open descriptors, and the `/dev/shm` files
they map; and the arena blocks in use (`kubetriton.worker.arena_blocks_in_use`). To tell a leak from a
high-water mark it also prints, unjudged, the shared-memory pages that the worker's and tritonserver's RSS
count (`RssShmem`) and the space kubetriton's arenas take in /dev/shm: an arena page takes space, and
counts in the RSS of each process that touches it, from the first time a tensor is written there, so
these grow whenever more tensors than ever before are in flight at once, up to the arenas' size.

The verdict fits a line to each series from minute 5 (or a sixth of a shorter run) to the end and prints
its growth per hour and over that span. It fails (exit status 1) on any failed or wrong answer, on the
worker's or tritonserver's RSS growing by 5 % or more, on descriptors or `/dev/shm` growing, or on arena
blocks left in use once the load stopped and one small request per model has carried the proxies' last
releases to the worker. Growth is judged in runs of 10 minutes or more; a shorter run (tests/test_soak.py)
shows mostly warm-up, so it judges the answers and the arena blocks only.

Usage: python bench/soak.py [--minutes 30] [--clients 8] [--ports HTTP GRPC METRICS]
Traffic goes to 127.0.0.1 only, from at most --clients processes, for at most --minutes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from data_path import bind_models
from kubetriton.worker import arena_blocks_in_use
from pytriton.client import ModelClient
from pytriton.triton import Triton, TritonConfig

PORTS = (18610, 18611, 18612)
"""HTTP, gRPC and metrics, by default."""
SAMPLE_S = 10.0
SETTLE_S = 300.0
"""Samples before minute 5 show the processes warming up, not leaking: growth is read after it."""
JUDGED_S = 600.0
"""A shorter run shows mostly warm-up: its growth is printed, not judged (answers and arena blocks are)."""
RSS_LIMIT = 0.05
SMALL = np.arange(16, dtype=np.float32).reshape(1, 16)
BIG = np.random.default_rng(4).standard_normal((1, 4 * 1024 * 1024 // 4)).astype(np.float32)


def serve(control: Connection, ports: tuple[int, int, int]) -> None:
    """The worker process: a local server with the two models; answers "sample" with the arena blocks in
    use until told "stop"."""
    config = TritonConfig(http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2], exit_timeout_secs=5)
    with Triton(config=config) as triton:
        bind_models(triton)
        triton.run()
        control.send("ready")
        while control.recv() == "sample":
            control.send(arena_blocks_in_use())


def client(index: int, deadline: float, ports: tuple[int, int, int], results: Connection) -> None:
    """One client until `deadline`: even indexes speak HTTP, odd ones gRPC; indexes 0, 1 (mod 4) use
    tritonclient, 2, 3 use ModelClient. Of every 16 requests one carries 4 MiB, eight 32 strings of up to
    800 bytes, seven 16 floats. Sends (answered, failed, wrong, first problem) when done."""
    protocol = "http" if index % 2 == 0 else "grpc"
    port = ports[0] if protocol == "http" else ports[1]
    call = (_tritonclient_calls if index % 4 < 2 else _model_client_calls)(protocol, port)
    rng = np.random.default_rng(index)
    answered = failed = wrong = 0
    problem = ""
    count = 0
    while time.time() < deadline:
        kind = "big" if count % 16 == 0 else "strings" if count % 2 else "small"
        count += 1
        if kind == "strings":
            lengths = rng.integers(0, 800, 32)
            sent = np.array([[rng.bytes(int(n)) + b"." for n in lengths]], dtype=object)
        else:
            sent = BIG if kind == "big" else SMALL
        try:
            got = call(kind, sent)
        except Exception as error:  # a failed request is what the soak counts, whatever its kind
            failed += 1
            problem = problem or f"{protocol} {kind}: {type(error).__name__}: {error}"
            continue
        expected = sent if kind == "strings" else sent * 2
        if got.shape != expected.shape or not np.array_equal(got, expected):
            wrong += 1
            problem = problem or f"{protocol} {kind}: wrong answer of shape {got.shape}"
        else:
            answered += 1
    results.send((answered, failed, wrong, problem))


def _tritonclient_calls(protocol: str, port: int) -> Callable[[str, np.ndarray], np.ndarray]:
    module = httpclient if protocol == "http" else grpcclient
    connection = module.InferenceServerClient(f"127.0.0.1:{port}")

    def call(kind: str, array: np.ndarray) -> np.ndarray:
        model, name, output, dtype = (
            ("echo", "text", "out", "BYTES") if kind == "strings" else ("double", "x", "y", "FP32")
        )
        tensor = module.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        return connection.infer(model, [tensor]).as_numpy(output)

    return call


def _model_client_calls(protocol: str, port: int) -> Callable[[str, np.ndarray], np.ndarray]:
    clients = {
        model: ModelClient(f"{protocol}://127.0.0.1:{port}", model, init_timeout_s=60)
        for model in ("double", "echo")
    }

    def call(kind: str, array: np.ndarray) -> np.ndarray:
        if kind == "strings":
            return clients["echo"].infer_batch(text=array)["out"]
        return clients["double"].infer_batch(x=array)["y"]

    return call


@dataclass
class Processes:
    worker: int
    tritonserver: int
    stubs: list[int] = field(default_factory=list)


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def find_processes(worker: int) -> Processes:
    servers = [
        pid for pid in children(worker) if Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"
    ]
    if len(servers) != 1:
        raise RuntimeError(f"expected one tritonserver under the worker process {worker}, found {servers}")
    return Processes(worker, servers[0], children(servers[0]))


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A field of /proc/PID/status in bytes: VmRSS, or RssShmem (the shared-memory pages it counts)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def shm_bytes(pids: list[int], arenas: bool = False) -> int:
    """The space taken in /dev/shm by the files these processes map; with `arenas`, by kubetriton's arenas
    alone (files of a fixed size, whose pages take space once first written)."""
    paths = set()
    for pid in pids:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                paths.add(parts[5].removesuffix(" (deleted)"))
    total = 0
    for path in paths:
        if arenas and "/arenas/" not in path:
            continue
        try:
            total += os.stat(path).st_blocks * 512
        except FileNotFoundError:
            continue
    return total


COLUMNS = (
    "worker_rss",
    "triton_rss",
    "stubs_rss",
    "worker_fds",
    "triton_fds",
    "stubs_fds",
    "shm",
    "blocks",
    "worker_shrd",
    "triton_shrd",
    "arenas",
)
"""Sampled every SAMPLE_S; the last three are printed, not judged: the shared-memory pages counted in the
worker's and tritonserver's RSS, and the part of `shm` that is kubetriton's arenas."""


def sample(processes: Processes, control: Connection) -> dict[str, float]:
    control.send("sample")
    stubs = processes.stubs
    return {
        "worker_rss": rss_bytes(processes.worker),
        "triton_rss": rss_bytes(processes.tritonserver),
        "stubs_rss": sum(rss_bytes(pid) for pid in stubs),
        "worker_fds": descriptors(processes.worker),
        "triton_fds": descriptors(processes.tritonserver),
        "stubs_fds": sum(descriptors(pid) for pid in stubs),
        "shm": shm_bytes([processes.worker, processes.tritonserver, *stubs]),
        "blocks": control.recv(),
        "worker_shrd": rss_bytes(processes.worker, "RssShmem"),
        "triton_shrd": rss_bytes(processes.tritonserver, "RssShmem"),
        "arenas": shm_bytes([processes.worker, processes.tritonserver, *stubs], arenas=True),
    }


def fitted_growth(times: list[float], values: list[float]) -> tuple[float, float, float]:
    """A least-squares line through the samples: (value at the first time, at the last, growth per hour)."""
    slope, intercept = np.polyfit(times, values, 1) if len(set(values)) > 1 else (0.0, values[0])
    return intercept + slope * times[0], intercept + slope * times[-1], slope * 3600


def flush(http_port: int, deadline_s: float = 30.0) -> None:
    """One small request per model: it carries the proxy's releases of the last response blocks."""
    connection = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    try:
        for model, name, array, dtype in (
            ("double", "x", SMALL, "FP32"),
            ("echo", "text", np.array([[b"flush"]], dtype=object), "BYTES"),
        ):
            tensor = httpclient.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            connection.infer(model, [tensor], timeout=int(deadline_s))
    finally:
        connection.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the load lasts")
    parser.add_argument("--clients", type=int, default=8, help="client processes")
    parser.add_argument("--ports", type=int, nargs=3, default=PORTS, help="HTTP, gRPC and metrics ports")
    args = parser.parse_args()
    ports = tuple(args.ports)
    duration = args.minutes * 60
    settle = min(SETTLE_S, duration / 6)

    context = multiprocessing.get_context("spawn")
    control, server_end = context.Pipe()
    server = context.Process(target=serve, args=(server_end, ports), name="kubetriton-soak-worker")
    server.start()
    try:
        if not control.poll(180) or control.recv() != "ready":
            raise RuntimeError("the server did not start")
        processes = find_processes(server.pid)
        start = time.time()
        deadline = start + duration
        pipes, clients = [], []
        for index in range(args.clients):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=client, args=(index, deadline, ports, send))
            process.start()
            pipes.append(receive)
            clients.append(process)

        samples: list[tuple[float, dict[str, float]]] = []
        print(f"{'s':>6} " + " ".join(f"{name:>11}" for name in COLUMNS), flush=True)
        next_sample = start
        while time.time() < deadline:
            time.sleep(max(0.0, next_sample - time.time()))
            next_sample += SAMPLE_S
            now = time.time() - start
            values = sample(processes, control)
            samples.append((now, values))
            print(f"{now:>6.0f} " + " ".join(f"{values[name]:>11}" for name in COLUMNS), flush=True)

        answered = failed = wrong = 0
        problems = []
        for receive, process in zip(pipes, clients, strict=True):
            if receive.poll(120):
                done = receive.recv()
                answered, failed, wrong = answered + done[0], failed + done[1], wrong + done[2]
                if done[3]:
                    problems.append(done[3])
            else:
                failed += 1
                problems.append(f"client process {process.pid} never reported")
            process.join(10)
        flush(ports[0])
        time.sleep(1.0)  # the worker takes in the flushes' releases after it replied
        after = sample(processes, control)
    finally:
        if server.is_alive():
            control.send("stop")
        server.join(60)

    return verdict(samples, settle, answered, failed, wrong, problems, after, duration)


def verdict(
    samples: list[tuple[float, dict[str, float]]],
    settle: float,
    answered: int,
    failed: int,
    wrong: int,
    problems: list[str],
    after: dict[str, float],
    duration: float,
) -> int:
    print(f"\n{answered} answered ({answered / duration:.0f}/s), {failed} failed, {wrong} wrong")
    for problem in problems:
        print(f"  first problem of a client: {problem}")
    later = [(t, values) for t, values in samples if t >= settle]
    ok = failed == 0 and wrong == 0 and answered > 0
    judged = duration >= JUDGED_S
    if judged and len(later) < 3:
        print("too few samples after the settling time for a verdict")
        return 1
    times = [t for t, _ in later]
    if len(later) >= 2:
        print(f"\ngrowth from {times[0]:.0f} s to {times[-1]:.0f} s (fitted line)", end="")
        print(":" if judged else f", not judged in a run shorter than {JUDGED_S / 60:.0f} min:")
    for name in COLUMNS if len(later) >= 2 else ():
        first, last, per_hour = fitted_growth(times, [values[name] for _, values in later])
        share = (last - first) / first if first else 0.0
        median = statistics.median(values[name] for _, values in later)
        if name.endswith(("rss", "shrd")) or name == "arenas":
            passed = name not in ("worker_rss", "triton_rss") or share < RSS_LIMIT
            shown = (
                f"{first / 2**20:.1f} -> {last / 2**20:.1f} MiB ({share:+.1%}), {per_hour / 2**20:+.1f} MiB/h"
            )
        elif name == "shm":
            passed = last - first < 2**20
            shown = f"{first / 2**20:.1f} -> {last / 2**20:.1f} MiB, {per_hour / 2**20:+.2f} MiB/h"
        elif name == "blocks":
            passed = True  # blocks in flight under load; what counts is zero once the load stopped
            shown = f"median {median:.0f} under load, {per_hour:+.1f}/h"
        else:
            passed = last - first < 1
            shown = f"{first:.1f} -> {last:.1f}, {per_hour:+.2f}/h"
        passed = passed or not judged
        ok = ok and passed
        print(f"  {name:<11} {shown}{'' if passed else '   FAILED'}")
    print(
        f"  blocks      {after['blocks']} in use after the load stopped"
        f"{'' if after['blocks'] == 0 else '   FAILED'}"
    )
    ok = ok and after["blocks"] == 0
    print("\nverdict:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
