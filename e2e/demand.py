"""Closed-loop ModelClient clients whose number follows a schedule: the demand an autoscaler answers.

Runs inside the cluster (`python -c`, in the worker image) against a model's Service or the name of its
pods, as real clients do. The schedule is a list of `seconds:clients` phases, e.g. `30:1,150:12,240:0`;
client i runs while the phase has more than i clients, each sending its next request when the last one
is answered. Even clients use HTTP, odd ones gRPC; each keeps its ModelClient between phases, and each
runs in a process of its own, as clients on different machines would (clients of one process share
what they know of the pods: kubetriton.replicas). Every second it prints one JSON line: the clients of
the moment, each protocol's answers and failures so far (the first failures kept), and the median
latency of the requests answered in that second.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
from pytriton.client import ModelClient

KEPT_FAILURES = 20
PROTOCOLS = ("http", "grpc")


def parse_schedule(text: str) -> list[tuple[float, int]]:
    """`30:1,150:12` as [(30.0, 1), (150.0, 12)]."""
    phases = []
    for phase in text.split(","):
        seconds, _, clients = phase.partition(":")
        phases.append((float(seconds), int(clients)))
    return phases


class Demand:
    """The clients' processes, the schedule they follow, and what they counted."""

    def __init__(self, urls: dict[str, str], model: str, schedule: list[tuple[float, int]]) -> None:
        self.urls, self.model, self.schedule = urls, model, schedule
        context = multiprocessing.get_context("fork")
        self.wanted = context.Value("i", 0)
        self.done = context.Event()
        self.counted: multiprocessing.Queue[tuple[str, float | None, str | None]] = context.Queue()
        """(protocol, latency of an answer or None, failure or None), one per request."""
        self.ok = dict.fromkeys(PROTOCOLS, 0)
        self.failures: dict[str, list[str]] = {protocol: [] for protocol in PROTOCOLS}
        self.failed = dict.fromkeys(PROTOCOLS, 0)
        self.latencies: list[float] = []
        self._context = context
        self._lock = threading.Lock()

    def _client(self, index: int) -> None:
        """One client, in its own process."""
        protocol = PROTOCOLS[index % 2]
        client: ModelClient | None = None
        while not self.done.is_set():
            if index >= self.wanted.value:
                time.sleep(0.05)
                continue
            try:
                if client is None:
                    client = ModelClient(
                        self.urls[protocol], self.model, init_timeout_s=600, inference_timeout_s=30
                    )
                started = time.monotonic()
                client.infer_sample(x=np.ones(1, np.float32))
                self.counted.put((protocol, time.monotonic() - started, None))
            except Exception as error:  # every failure counts, whatever its type
                self.counted.put((protocol, None, f"{time.time():.3f} {type(error).__name__}: {error}"))
        if client is not None:
            client.close()

    def run(self) -> None:
        most = max(clients for _, clients in self.schedule)
        processes = [self._context.Process(target=self._client, args=(index,)) for index in range(most)]
        for process in processes:
            process.start()
        threading.Thread(target=self._count, daemon=True).start()
        print(json.dumps({"started": time.time()}), flush=True)
        for seconds, clients in self.schedule:
            self.wanted.value = clients
            print(json.dumps({"phase": clients, "at": time.time()}), flush=True)
            phase_end = time.monotonic() + seconds
            while time.monotonic() < phase_end:
                time.sleep(min(1.0, max(0.0, phase_end - time.monotonic())))
                self.report()
        self.done.set()
        for process in processes:
            process.join(60)
        time.sleep(0.5)
        self.report()

    def _count(self) -> None:
        while True:
            try:
                protocol, latency, failure = self.counted.get(timeout=1)
            except queue.Empty:
                continue
            with self._lock:
                if failure is None:
                    self.ok[protocol] += 1
                    self.latencies.append(latency or 0.0)
                else:
                    self.failed[protocol] += 1
                    if len(self.failures[protocol]) < KEPT_FAILURES:
                        self.failures[protocol].append(failure)

    def report(self) -> None:
        with self._lock:
            latencies, self.latencies = self.latencies, []
            line: dict[str, Any] = {
                "at": time.time(),
                "clients": self.wanted.value,
                **{
                    protocol: {
                        "ok": self.ok[protocol],
                        "failed": self.failed[protocol],
                        "failures": self.failures[protocol],
                    }
                    for protocol in PROTOCOLS
                },
            }
        if latencies:
            line["latency_ms_p50"] = round(statistics.median(latencies) * 1000, 1)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    Demand({"http": sys.argv[1], "grpc": sys.argv[2]}, sys.argv[3], parse_schedule(sys.argv[4])).run()
