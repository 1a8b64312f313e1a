"""The floor of any design that puts a ZeroMQ round trip inside a Python-backend model.

W1 of `bench/data_path.py` (one [1,16] float32 request at a time over HTTP) against three models in one
tritonserver: the limit (`y = 2x` in the stub), and a model that sends the input bytes over a ZeroMQ
DEALER to a ROUTER in another process, which doubles them and answers. That model has none of what a
real data path needs (no header, no arena, no checks, no errors), so its latency is the least that a
ZeroMQ hop between the stub and a worker costs on this machine. It prints p50 latencies and ratios.

Usage: python bench/zmq_floor.py [--requests N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import zmq
from data_path import HTTP, NATIVE_DOUBLE, http_input, native_config, plain_triton

ZMQ_DOUBLE = """
import numpy as np
import triton_python_backend_utils as pb_utils
import zmq

class TritonPythonModel:
    def initialize(self, args):
        self.socket = zmq.Context().socket(zmq.DEALER)
        self.socket.connect("ipc://{address}")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            self.socket.send(x.tobytes())
            y = np.frombuffer(self.socket.recv(), np.float32).reshape(x.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
"""


def doubler(address: str) -> None:
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.bind(f"ipc://{address}")
    while True:
        identity, data = socket.recv_multipart()
        socket.send_multipart([identity, (np.frombuffer(data, np.float32) * 2).tobytes()])


def p50_ms(model: str, count: int) -> float:
    client = httpclient.InferenceServerClient(f"localhost:{HTTP}")
    inputs = [http_input("x", np.ones((1, 16), np.float32))]
    for _ in range(count // 10):
        client.infer(model, inputs)
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        client.infer(model, inputs)
        samples.append(time.perf_counter() - start)
    client.close()
    return statistics.median(samples) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="kubetriton-floor-") as workspace:
        address = str(Path(workspace) / "doubler.sock")
        worker = context.Process(target=doubler, args=(address,), daemon=True)
        worker.start()
        models = {
            name: (source, native_config(name, "x", "y", "TYPE_FP32"))
            for name, source in (("limit", NATIVE_DOUBLE), ("zmq_floor", ZMQ_DOUBLE.format(address=address)))
        }
        try:
            with plain_triton(models), context.Pool(1) as pool:
                limit = pool.apply(p50_ms, ("limit", args.requests))
                floor = pool.apply(p50_ms, ("zmq_floor", args.requests))
        finally:
            worker.terminate()
    print(f"W1 http p50: limit {limit:.3f} ms, ZeroMQ floor {floor:.3f} ms, ratio {floor / limit:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
