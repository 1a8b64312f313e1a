"""The Identity model: each request's inputs come back as its outputs, on CPU.

Locally: `python serve.py`. On a cluster with the kubetriton chart installed:
`kubetriton deploy serve.py --image <any image with Python 3.10-3.13 and NumPy>`.
"""

import numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


def identity(requests):
    return requests


with Triton() as triton:
    triton.bind(
        model_name="Identity",
        infer_func=identity,
        inputs=[Tensor(dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=64),
    )
    triton.serve()
