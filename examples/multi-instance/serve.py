"""One linear layer served by one model instance per GPU: `--instances N` binds N callables, the i-th on
cuda:i, and Triton spreads requests over them.

It needs an image with PyTorch (CUDA), such as `nvcr.io/nvidia/pytorch:24.10-py3` as it is, and N GPUs.
"""

import argparse

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

parser = argparse.ArgumentParser()
parser.add_argument("--instances", type=int, default=1)
arguments = parser.parse_args()

torch.manual_seed(0)
reference = torch.nn.Linear(16, 4)
"""Every instance holds a copy of the same layer."""


def instance(index: int):
    device = f"cuda:{index}" if torch.cuda.device_count() > index else "cpu"
    layer = torch.nn.Linear(16, 4).to(device).eval()
    layer.load_state_dict(reference.state_dict())

    @batch
    def linear(x: np.ndarray):
        with torch.inference_mode():
            y = layer(torch.from_numpy(np.array(x)).to(device))
        return {"y": y.cpu().numpy()}

    return linear


with Triton() as triton:
    triton.bind(
        model_name="Linear",
        infer_func=[instance(index) for index in range(arguments.instances)],
        inputs=[Tensor(name="x", dtype=np.float32, shape=(16,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(4,))],
        config=ModelConfig(max_batch_size=64),
    )
    triton.serve()
