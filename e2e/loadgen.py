"""Inputs for any model from its own configuration, and a load loop that counts failed requests.

The e2e tests import `sample_inputs` to query each example model through a port-forward. The same
source runs inside the cluster (`python -c`, in the worker image) as the load during a rollout: its
requests go through the model's Service, as real clients' do, and it prints one JSON summary line.
Only numpy and pytriton's client are used, both in the worker image.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np
from pytriton.client import ModelClient

SEQUENCE = b"MKTAYIAKQRQISFVKSHFSRQ"
"""Bytes inputs get a short protein sequence (the ESM example reads sequences)."""


def sample_inputs(model_config: Any, batch: int = 1) -> dict[str, np.ndarray]:
    """One small valid batch for every input the model declares (variable dimensions become 4)."""
    inputs = {}
    for spec in model_config.inputs:
        shape = [4 if dim == -1 else dim for dim in spec.shape]
        if model_config.batching:
            shape = [batch, *shape]
        if spec.dtype.kind in "OS":
            inputs[spec.name] = np.full(shape, SEQUENCE, dtype=np.object_)
        else:
            inputs[spec.name] = np.ones(shape, dtype=spec.dtype)
    return inputs


def infer(client: ModelClient, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request: a batch when the model batches, otherwise one sample."""
    if client.model_config.batching:
        return client.infer_batch(**inputs)
    return client.infer_sample(**inputs)


def run_load(url: str, model_name: str, seconds: float, ready_timeout_s: float = 600) -> dict[str, Any]:
    """Send requests one after another for `seconds`; count answers and failures."""
    ok, failures = 0, []
    with ModelClient(url, model_name, init_timeout_s=ready_timeout_s, inference_timeout_s=30) as client:
        inputs = sample_inputs(client.model_config)
        print(json.dumps({"started": time.time()}), flush=True)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                infer(client, inputs)
                ok += 1
            except Exception as error:  # every failure counts, whatever its type
                failures.append(f"{time.time():.3f} {type(error).__name__}: {error}")
    return {"ok": ok, "failed": len(failures), "failures": failures[:20]}


if __name__ == "__main__":
    url, model_name, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    print(json.dumps(run_load(url, model_name, seconds)), flush=True)
