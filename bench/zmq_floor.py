"""The floor of any design that puts a round trip to another process inside a Python-backend model.

W1 of `bench/data_path.py` (one [1,16] float32 request at a time over HTTP) against three models in one
tritonserver: the limit (`y = 2x` in the stub); a model that sends the input bytes over a ZeroMQ DEALER
to a ROUTER in another process, which doubles them and answers; and the same over a blocking `AF_UNIX`
`SOCK_SEQPACKET` socket, the hop kubetriton's data path uses. Those two models have none of what a real
data path needs (no header, no arena, no checks, no errors), so their latencies are the least that each
kind of hop between the stub and a worker costs on this machine. The three are timed in alternating
blocks of requests. It prints p50 latencies and ratios.

Usage: python bench/zmq_floor.py [--requests N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import zmq
from data_path import HTTP, NATIVE_DOUBLE, http_input, native_config, plain_triton
from kubetriton.sidecar.bootstrap import install_runtime
from kubetriton.triton_home import locate

FLOOR_MODEL = """
{preamble}
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        {connect}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            self.socket.send(x.tobytes())
            y = np.frombuffer(self.socket.recv({receive_size}), np.float32).reshape(x.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
"""
"""A model that sends its input to a doubler in another process; a floor is this with a kind of socket."""


def zmq_floor_model(address: str, runtime: Path) -> str:
    return FLOOR_MODEL.format(
        # pyzmq for the stub's Python, found as the proxy model finds it
        preamble=f"import sys\nsys.path.insert(0, {str(runtime)!r})\nimport zmq",
        connect=f"self.socket = zmq.Context().socket(zmq.DEALER); self.socket.connect('ipc://{address}')",
        receive_size="",
    )


def seqpacket_floor_model(address: str) -> str:
    return FLOOR_MODEL.format(
        preamble="import socket",
        connect="self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
        f"self.socket.connect({address!r})",
        receive_size="65536",
    )


def zmq_doubler(address: str) -> None:
    router = zmq.Context().socket(zmq.ROUTER)
    router.bind(f"ipc://{address}")
    while True:
        identity, data = router.recv_multipart()
        router.send_multipart([identity, (np.frombuffer(data, np.float32) * 2).tobytes()])


def seqpacket_doubler(address: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen()
    while True:
        connection = listener.accept()[0]
        while data := connection.recv(65536):
            connection.send((np.frombuffer(data, np.float32) * 2).tobytes())
        connection.close()


def p50_ms(models: list[str], count: int, block: int = 100) -> dict[str, float]:
    """Each model's p50, measured in alternating blocks of requests, so that the load of the machine
    weighs on every model alike."""
    client = httpclient.InferenceServerClient(f"localhost:{HTTP}")
    inputs = [http_input("x", np.ones((1, 16), np.float32))]
    samples: dict[str, list[float]] = {model: [] for model in models}
    for model in models:
        for _ in range(count // 10):
            client.infer(model, inputs)
    for _ in range(max(count // block, 1)):
        for model in models:
            for _ in range(block):
                start = time.perf_counter()
                client.infer(model, inputs)
                samples[model].append(time.perf_counter() - start)
    client.close()
    return {model: statistics.median(times) * 1000 for model, times in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="kubetriton-floor-") as workspace:
        addresses = {"zmq": str(Path(workspace) / "zmq.sock"), "seqpacket": str(Path(workspace) / "seq.sock")}
        runtime = Path(workspace) / "runtime"
        stub_python = locate().stub_python
        install_runtime(runtime, stub_python.wheels, stub_python.version)
        doublers = [
            context.Process(target=zmq_doubler, args=(addresses["zmq"],), daemon=True),
            context.Process(target=seqpacket_doubler, args=(addresses["seqpacket"],), daemon=True),
        ]
        for doubler in doublers:
            doubler.start()
        for address in addresses.values():
            while not Path(address).exists():
                time.sleep(0.01)
        sources = {
            "limit": NATIVE_DOUBLE,
            "zmq_floor": zmq_floor_model(addresses["zmq"], runtime),
            "seqpacket_floor": seqpacket_floor_model(addresses["seqpacket"]),
        }
        models = {
            name: (source, native_config(name, "x", "y", "TYPE_FP32")) for name, source in sources.items()
        }
        try:
            with plain_triton(models), context.Pool(1) as pool:
                p50 = pool.apply(p50_ms, (list(models), args.requests))
        finally:
            for doubler in doublers:
                doubler.terminate()
    limit = p50["limit"]
    print(f"W1 http p50: limit {limit:.3f} ms")
    for name, label in (("zmq_floor", "ZeroMQ floor"), ("seqpacket_floor", "SEQPACKET floor")):
        print(f"W1 http p50: {label} {p50[name]:.3f} ms, ratio {p50[name] / limit:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
