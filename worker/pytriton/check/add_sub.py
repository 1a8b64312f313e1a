"""The self-check: serve an AddSub model through a local Triton and query it, in this process
(`add_sub_example`) or from a server script in a process of its own (`add_sub_example_thread`).

`python -m pytriton.check.add_sub --workspace <dir>` serves the model until SIGINT; with `--infer`, it
queries a model served so and logs the answers. Both use the HTTP port `Triton()` takes from the
environment (`PYTRITON_TRITON_CONFIG_HTTP_PORT`, default 8000).
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import signal
import sys

import numpy as np

from pytriton.check.utils import ScriptThread
from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

LOGGER = logging.getLogger("pytriton.check.add_sub")
SERVER_START_S = 120.0
DEFAULT_HTTP_PORT = 8000


@batch
def _add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    return {"add": a + b, "sub": a - b}


def prepare_triton(workspace: pathlib.Path) -> Triton:
    """A running local Triton with its workspace in `workspace`, serving AddSub."""
    triton = Triton(workspace=str(workspace.resolve()))
    triton.run()
    triton.bind(
        model_name="AddSub",
        infer_func=_add_sub,
        inputs=[
            Tensor(name="a", dtype=np.float32, shape=(-1,)),
            Tensor(name="b", dtype=np.float32, shape=(-1,)),
        ],
        outputs=[
            Tensor(name="add", dtype=np.float32, shape=(-1,)),
            Tensor(name="sub", dtype=np.float32, shape=(-1,)),
        ],
        config=ModelConfig(max_batch_size=128),
        strict=True,
    )
    return triton


def infer_add_sub_model(logger: logging.Logger = LOGGER) -> dict[str, np.ndarray]:
    """Query AddSub on this machine with a batch of two ones each, log the answers and return them."""
    ones = np.ones((2, 1), dtype=np.float32)
    url = f"localhost:{TritonConfig.from_env().http_port or DEFAULT_HTTP_PORT}"
    with ModelClient(url, "AddSub", init_timeout_s=SERVER_START_S) as client:
        result = client.infer_batch(ones, ones)
    for name, values in result.items():
        logger.info("%s: %s", name, values.tolist())
    return result


def serve_triton(workspace: pathlib.Path) -> None:
    """Serve AddSub until SIGINT or SIGTERM."""
    prepare_triton(workspace).serve()


def add_sub_example(workspace: pathlib.Path, logger: logging.Logger) -> None:
    """Serve AddSub in this process, query it, and stop."""
    logger.info("Serving and querying AddSub in this process")
    triton = prepare_triton(workspace)
    try:
        infer_add_sub_model(logger)
    finally:
        triton.stop()


def add_sub_example_thread(workspace: pathlib.Path, logger: logging.Logger) -> None:
    """Serve AddSub from this module run as a script, query it from here, then stop the script (SIGINT);
    the script's output is logged."""
    logger.info("Serving AddSub from a script, querying it from this process")
    command = [sys.executable, "-m", "pytriton.check.add_sub", "--workspace", str(workspace.resolve())]
    with ScriptThread(command, name="server") as server:
        try:
            infer_add_sub_model(logger)
        finally:
            if server.process is not None:
                server.process.send_signal(signal.SIGINT)
    if server.returncode not in (0, -signal.SIGINT):
        logger.error("The server script failed with %s:\n%s", server.returncode, server.output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workspace", type=pathlib.Path, help="where the local Triton keeps its files")
    parser.add_argument("--infer", action="store_true", help="query AddSub instead of serving it")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    if args.infer:
        infer_add_sub_model()
    elif args.workspace is None:
        parser.error("--workspace is needed to serve")
    else:
        serve_triton(args.workspace)


if __name__ == "__main__":
    main()
