"""Remote mode, first script: start Triton on this machine and serve one model, AddSub.

Models that other scripts bind through `RemoteTriton` (see `bind_mul.py`) are served by this same Triton.
Ports come from `PYTRITON_TRITON_CONFIG_HTTP_PORT` and its siblings (default 8000, 8001, 8002); the access
token from `TRITON_ACCESS_TOKEN` (generated when unset).
"""

import os

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonSecurityConfig


@batch
def add_sub(a: np.ndarray, b: np.ndarray):
    return {"add": a + b, "sub": a - b}


with Triton(
    security_config=TritonSecurityConfig(access_token=os.environ.get("TRITON_ACCESS_TOKEN"))
) as triton:
    triton.bind(
        model_name="AddSub",
        infer_func=add_sub,
        inputs=[
            Tensor(name="a", dtype=np.float32, shape=(-1,)),
            Tensor(name="b", dtype=np.float32, shape=(-1,)),
        ],
        outputs=[
            Tensor(name="add", dtype=np.float32, shape=(-1,)),
            Tensor(name="sub", dtype=np.float32, shape=(-1,)),
        ],
        config=ModelConfig(max_batch_size=64),
    )
    triton.serve()
