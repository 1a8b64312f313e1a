"""Remote mode, the client: query both models, AddSub from `server.py` and Mul from `bind_mul.py`, over HTTP
and gRPC, and print the answers. The URLs are given as arguments (default: localhost's ports 8000, 8001).
"""

import sys

import numpy as np
from pytriton.client import ModelClient

a = np.array([[1.0], [2.0]], dtype=np.float32)
b = np.array([[2.0], [3.0]], dtype=np.float32)

for url in sys.argv[1:] or ["http://localhost:8000", "grpc://localhost:8001"]:
    for model in ("AddSub", "Mul"):
        with ModelClient(url, model, init_timeout_s=120) as client:
            result = client.infer_batch(a, b)
        print(
            f"{url} {model}: "
            + ", ".join(f"{name}={value.tolist()}" for name, value in sorted(result.items()))
        )
