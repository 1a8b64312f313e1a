"""The local demo: serve a model through a real tritonserver, query it over HTTP and gRPC, print the answer.

The callable runs in this process (the worker); Triton runs as a separate process and reaches it
through the proxy model over ZeroMQ and shared memory, exactly as in a Kubernetes pod.
"""

import numpy as np
from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


@batch
def add_and_scale(a: np.ndarray, b: np.ndarray):
    return {"sum": a + b, "scaled": (a + b) * 10}


def main() -> None:
    config = TritonConfig(http_port=18000, grpc_port=18001, metrics_port=18002)
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
        for url in ("http://localhost:18000", "grpc://localhost:18001"):
            with ModelClient(url, "AddAndScale") as client:
                result = client.infer_batch(a=a, b=b)
            print(
                f"{url}: a + b = {result['sum'][0].tolist()}, (a + b) * 10 = {result['scaled'][0].tolist()}"
            )
            assert np.array_equal(result["sum"], a + b) and np.array_equal(result["scaled"], (a + b) * 10)


if __name__ == "__main__":
    main()
