"""Plain tritonclient clients through a model's router, inside the cluster: the clients the router is for.

Runs in a Pod (`python -c`, in the worker image, which has tritonclient and numpy) as any client of the
model would, through the router's Service. Two modes:

- `spread HOST MODEL CLIENTS SECONDS`: closed-loop clients, even ones a plain `tritonclient.http` client
  (one keep-alive connection), odd ones a `tritonclient.grpc` client (one HTTP/2 connection), each kept
  for the whole run. The model answers with the name of the pod that served the request (output `pod`).
  Every second a JSON line: each protocol's answers per pod, and its failures so far (the first kept).
- `latency ROUTER PODS MODEL ROUNDS REQUESTS`: one request at a time, in rounds: REQUESTS small requests
  through the router, as many straight to the pods (their addresses from PODS, the name of the model's
  headless Service), over HTTP and then over gRPC. Prints one JSON line: each path's p50 and p90 in
  milliseconds, and the router's added p50 per protocol. The direct requests go to the pods one each in
  turn, as the router sends them when the pods are idle: a request that follows a pod's last answer
  closely is answered 0.4-0.5 ms faster (on the kit) than one that comes after ~20 ms idle, so a path
  that sent each pod many requests in a row would be compared with an easier load than the router's.
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.http

HTTP_PORT, GRPC_PORT = 8000, 8001
KEPT_FAILURES = 20
PROTOCOLS = ("http", "grpc")


def _request(protocol: str, host: str, model: str, data: np.ndarray) -> Callable[[], Any]:
    """A client of `protocol` for `host`, kept, as a function that sends one request and returns its
    answer."""
    if protocol == "http":
        http = tritonclient.http.InferenceServerClient(f"{host}:{HTTP_PORT}", network_timeout=30)
        http_input = tritonclient.http.InferInput("x", list(data.shape), "FP32")
        http_input.set_data_from_numpy(data)
        return lambda: http.infer(model, [http_input])
    grpc = tritonclient.grpc.InferenceServerClient(f"{host}:{GRPC_PORT}")
    grpc_input = tritonclient.grpc.InferInput("x", list(data.shape), "FP32")
    grpc_input.set_data_from_numpy(data)
    return lambda: grpc.infer(model, [grpc_input], client_timeout=30)


class Spread:
    """The answers per pod and the failures of each protocol's clients."""

    def __init__(self) -> None:
        self.pods: dict[str, Counter[str]] = {protocol: Counter() for protocol in PROTOCOLS}
        self.failures: dict[str, list[str]] = {protocol: [] for protocol in PROTOCOLS}
        self.lock = threading.Lock()

    def client(self, protocol: str, host: str, model: str, deadline: float) -> None:
        send = _request(protocol, host, model, np.ones(1, np.float32))
        while time.monotonic() < deadline:
            try:
                pod = send().as_numpy("pod")[0].decode()
            except Exception as error:  # every failure counts, whatever its type
                with self.lock:
                    self.failures[protocol].append(f"{time.time():.3f} {type(error).__name__}: {error}")
                continue
            with self.lock:
                self.pods[protocol][pod] += 1

    def report(self) -> None:
        with self.lock:
            line = {
                protocol: {
                    "pods": dict(self.pods[protocol]),
                    "failed": len(self.failures[protocol]),
                    "failures": self.failures[protocol][:KEPT_FAILURES],
                }
                for protocol in PROTOCOLS
            }
        print(json.dumps({"at": time.time(), **line}), flush=True)


def spread(host: str, model: str, clients: int, seconds: float) -> None:
    counts = Spread()
    deadline = time.monotonic() + seconds
    threads = [
        threading.Thread(target=counts.client, args=(PROTOCOLS[i % 2], host, model, deadline), daemon=True)
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    print(json.dumps({"started": time.time()}), flush=True)
    while any(thread.is_alive() for thread in threads):
        time.sleep(1)
        counts.report()


def _timed(send: Callable[[], Any], requests: int) -> list[float]:
    taken = []
    for _ in range(requests):
        started = time.perf_counter()
        send()
        taken.append((time.perf_counter() - started) * 1000)
    return taken


def _percentile(values: list[float], fraction: float) -> float:
    return round(sorted(values)[int(fraction * (len(values) - 1))], 3)


def latency(router: str, pods: str, model: str, rounds: int, requests: int) -> None:
    addresses = sorted({info[4][0] for info in socket.getaddrinfo(pods, HTTP_PORT, proto=socket.IPPROTO_TCP)})
    data = np.ones(16, np.float32)
    result: dict[str, Any] = {"pods": len(addresses), "rounds": rounds, "requests": requests}
    for protocol in PROTOCOLS:
        routed = _request(protocol, router, model, data)
        direct = [_request(protocol, address, model, data) for address in addresses]
        for send in (routed, *direct):  # connections open and warm before anything is timed
            _timed(send, 20)
        times: dict[str, list[float]] = {"router": [], "direct": []}
        for _ in range(rounds):
            times["router"] += _timed(routed, requests)
            for index in range(requests):
                times["direct"] += _timed(direct[index % len(direct)], 1)
        for path, taken in times.items():
            result[f"{protocol} {path}"] = {"p50": _percentile(taken, 0.5), "p90": _percentile(taken, 0.9)}
        added = statistics.median(times["router"]) - statistics.median(times["direct"])
        result[f"{protocol} added p50"] = round(added, 3)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    mode, arguments = sys.argv[1], sys.argv[2:]
    if mode == "spread":
        spread(arguments[0], arguments[1], int(arguments[2]), float(arguments[3]))
    else:
        latency(arguments[0], arguments[1], arguments[2], int(arguments[3]), int(arguments[4]))
