"""Remote mode, second script: bind a model, Mul, to the Triton that `server.py` started, from this process.

`RemoteTriton(url)` finds the Triton() of the same user on this machine that listens at `url`
(`TRITON_URL`, default `localhost`, i.e. HTTP on port 8000), waiting for it up to 120 s, so both scripts
may be started at the same moment; Mul's callable runs here, and leaves Triton when this script stops
(SIGINT or SIGTERM).
"""

import os

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import RemoteTriton


@batch
def mul(a: np.ndarray, b: np.ndarray):
    return {"mul": a * b}


with RemoteTriton(
    url=os.environ.get("TRITON_URL", "localhost"), access_token=os.environ.get("TRITON_ACCESS_TOKEN")
) as remote:
    remote.bind(
        model_name="Mul",
        infer_func=mul,
        inputs=[
            Tensor(name="a", dtype=np.float32, shape=(-1,)),
            Tensor(name="b", dtype=np.float32, shape=(-1,)),
        ],
        outputs=[Tensor(name="mul", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=64),
    )
    remote.serve()
