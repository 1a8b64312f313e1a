"""The local demo: serve a model through a real tritonserver, query it over HTTP and gRPC, print the answer.

The callable runs in this process (the worker); Triton runs as a separate process and reaches it
through the proxy model over a Unix socket and a shared-memory arena, exactly as in a Kubernetes pod.
It listens on ports that are free when it starts, so that it runs beside other servers, and beside other
runs of itself.
"""

import socket

import numpy as np
from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


@batch
def add_and_scale(a: np.ndarray, b: np.ndarray):
    return {"sum": a + b, "scaled": (a + b) * 10}


def free_ports(count: int) -> list[int]:
    """`count` different ports that nothing listens on now."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def main() -> None:
    http_port, grpc_port, metrics_port = free_ports(3)
    config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    with Triton(config=config) as triton:
        triton.bind(
            model_name="AddAndScale",
            infer_func=add_and_scale,
            inputs=[
                Tensor(name="a", dtype=np.float32, shape=(-1,)),
                Tensor(name="b", dtype=np.float32, shape=(-1,)),
            ],
            outputs=[
                Tensor(name="sum", dtype=np.float32, shape=(-1,)),
                Tensor(name="scaled", dtype=np.float32, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=16),
        )
        a = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
        b = np.array([[10.0, 20.0, 30.0]], dtype=np.float32)
        for url in (f"http://localhost:{http_port}", f"grpc://localhost:{grpc_port}"):
            with ModelClient(url, "AddAndScale") as client:
                result = client.infer_batch(a=a, b=b)
            print(
                f"{url}: a + b = {result['sum'][0].tolist()}, (a + b) * 10 = {result['scaled'][0].tolist()}"
            )
            assert np.array_equal(result["sum"], a + b) and np.array_equal(result["scaled"], (a + b) * 10)


if __name__ == "__main__":
    main()
