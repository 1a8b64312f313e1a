"""The seed documents are the compatibility contract: their code blocks run unchanged on kubetriton.

Blocks are read from `../shared/seeds` at test time. A `<!--pytest-codeblocks:cont-->` marker continues
the previous block. Where a block binds models inside `with Triton() as triton:` and stops there, the
test serves it the documented way, by calling `triton.serve()` at the end of that block, and queries it
over HTTP and gRPC. Names a seed leaves to the user (`model`) are defined before its code runs. Seed
002's torch example runs in a Python 3.11 venv holding the CPU build of torch that this machine keeps.
"""

from __future__ import annotations

import glob
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import free_ports, shm_entries

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"

pytestmark = pytest.mark.skipif(not SEEDS.is_dir(), reason=f"seed documents not found at {SEEDS}")


@dataclass
class Block:
    code: str
    continues: bool


def code_blocks(seed_prefix: str) -> list[Block]:
    text = next(SEEDS.glob(f"{seed_prefix}_*.txt")).read_text()
    blocks = []
    for match in re.finditer(r"```python\n(.*?)```", text, re.S):
        preceding = text[: match.start()].rstrip().splitlines()[-1:]
        blocks.append(
            Block(match.group(1), continues=any("pytest-codeblocks:cont" in line for line in preceding))
        )
    return blocks


def block_with(seed_prefix: str, needle: str) -> str:
    return next(block.code for block in code_blocks(seed_prefix) if needle in block.code)


def with_serve(code: str) -> str:
    """The block, served as the seeds document: `triton.serve()` at the end of its `with Triton()` body."""
    lines = code.rstrip().splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("with Triton() as triton:"))
    indent = re.match(r"\s*", lines[start + 1]).group(0)
    return "\n".join(lines) + f"\n{indent}triton.serve()\n"


class SeedServer:
    """A seed script run as its own process on free ports, as a user would run it."""

    def __init__(self, code: str, tmp_path: Path, python: str, env: Mapping[str, str] | None = None) -> None:
        """`env` adds to this process's environment."""
        self.http, self.grpc, metrics = free_ports(3)
        script = tmp_path / "seed_script.py"
        script.write_text(code)
        self.log = tmp_path / "tritonserver.log"
        env = {**os.environ, **(env or {})}
        env.update(
            PYTRITON_TRITON_CONFIG_HTTP_PORT=str(self.http),
            PYTRITON_TRITON_CONFIG_GRPC_PORT=str(self.grpc),
            PYTRITON_TRITON_CONFIG_METRICS_PORT=str(metrics),
            PYTRITON_TRITON_CONFIG_LOG_FILE=str(self.log),
        )
        self.process = subprocess.Popen([python, str(script)], cwd=tmp_path, env=env)

    def wait_ready(self, *models: str, timeout_s: float = 60) -> None:
        client = httpclient.InferenceServerClient(f"localhost:{self.http}")
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                assert self.process.poll() is None, f"seed script exited with {self.process.returncode}"
                try:
                    if all(client.is_model_ready(model) for model in models):
                        return
                except Exception:  # the server is still starting
                    pass
                time.sleep(0.1)
        finally:
            client.close()
        raise AssertionError(f"models {models} not ready within {timeout_s} s")

    def infer(self, protocol: str, model: str, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
        module = httpclient if protocol == "http" else grpcclient
        port = self.http if protocol == "http" else self.grpc
        client = module.InferenceServerClient(f"localhost:{port}")
        try:
            tensors = []
            for name, array in inputs.items():
                datatype = "BYTES" if array.dtype == object else "FP32"
                tensor = module.InferInput(name, list(array.shape), datatype)
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)
            return client.infer(model, tensors).as_numpy(output)
        finally:
            client.close()

    def stream_error(self, model: str, inputs: dict[str, np.ndarray]) -> InferenceServerException | None:
        """Send one request on a gRPC stream and return the error of its first answer."""
        answers: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(f"localhost:{self.grpc}")
        try:
            client.start_stream(callback=lambda result, error: answers.put(error))
            tensors = []
            for name, array in inputs.items():
                tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)
            client.async_stream_infer(model, tensors)
            return answers.get(timeout=30)
        finally:
            client.stop_stream()
            client.close()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


@pytest.fixture
def run_seed(tmp_path):
    servers: list[SeedServer] = []
    shm_before = shm_entries()

    def start(code: str, python: str = sys.executable) -> SeedServer:
        server = SeedServer(code, tmp_path, python)
        servers.append(server)
        return server

    yield start
    for server in servers:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    prefixes = tuple(f"kubetriton-{server.process.pid}-" for server in servers)
    leaked = {name for name in shm_entries() - shm_before if name.startswith(prefixes)}
    assert not leaked, f"shared memory left behind: {leaked}"


def test_inference_callables_seed_binds_every_kind_of_callable_unchanged(run_seed):
    """Seed 000: a function, an instance, a bound method, a coroutine and a streaming callable.

    The seed leaves every body as `...`, so each callable returns None: each model answers a query
    over HTTP and gRPC with the error that says so, and the server keeps serving."""
    chain = [block.code for block in code_blocks("000")]
    assert all(block.continues for block in code_blocks("000")[1:])
    server = run_seed(with_serve("\n".join(chain)))
    unary = [
        "MyInferenceFunction",
        "MyInferenceCallable",
        "AlternativeInferenceCallable",
        "MyInferenceCoroutine",
    ]
    server.wait_ready(*unary, "StreamingInferenceCallable")
    x = np.array([[1.5]], dtype=np.float32)
    for model in unary:
        for protocol in ("http", "grpc"):
            with pytest.raises(
                InferenceServerException, match=f"Model '{model}' callable must return a list"
            ):
                server.infer(protocol, model, {"INPUT_1": x}, "OUTPUT_1")
    error = server.stream_error("StreamingInferenceCallable", {"INPUT_1": x})
    assert "Model 'StreamingInferenceCallable' callable must return a list" in str(error)
    assert server.stop() == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_identity_lambda_seed_answers_its_input(run_seed, protocol):
    server = run_seed(with_serve(block_with("002", 'model_name="Identity"')))
    server.wait_ready("Identity")
    x = np.array([[0.5], [-2.0], [7.25]], dtype=np.float32)
    assert np.array_equal(server.infer(protocol, "Identity", {"INPUT_1": x}, "OUTPUT_1"), x)
    assert server.stop() == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batch_decorated_bytes_seed_with_strict_outputs(run_seed, protocol):
    """Seed 002's first block: `@batch` over two bytes inputs, strict outputs; `model` is the user's."""
    user_model = textwrap.dedent(
        """
        import numpy as np

        def model(input1, input2):
            lengths = [[float(len(a[0])), float(sum(len(b) for b in row))] for a, row in zip(input1, input2)]
            return np.array(lengths, dtype=np.float32)
        """
    )
    server = run_seed(user_model + with_serve(block_with("002", 'model_name="ModelName"')))
    server.wait_ready("ModelName")
    first = np.array([[b"abc"], [b"\x00\x01"]], dtype=object)
    second = np.array([[b"xy", b"z\x00"], [b"", b"1234"]], dtype=object)
    result = server.infer(protocol, "ModelName", {"INPUT_1": first, "INPUT_2": second}, "OUTPUT_1")
    assert result.tolist() == [[3.0, 4.0], [2.0, 4.0]]
    assert server.stop() == 0


def test_background_mode_seed_runs_and_stops_in_process(monkeypatch):
    """Seed 003's notebook flow: Triton(), bind, run(), query, stop(), each block as written."""
    http, grpc, metrics = free_ports(3)
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_HTTP_PORT", str(http))
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", str(grpc))
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_METRICS_PORT", str(metrics))
    namespace: dict[str, object] = {}
    for needle in ("triton = Triton()", "outputs = input1 + input2", "triton.run()"):
        exec(block_with("003", needle), namespace)
    try:
        input1 = np.array([[1.0], [2.0]], dtype=np.float32)
        input2 = np.array([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]], dtype=np.float32)
        for module, port in ((httpclient, http), (grpcclient, grpc)):
            client = module.InferenceServerClient(f"localhost:{port}")
            tensors = [
                module.InferInput(name, list(a.shape), "FP32")
                for name, a in (("INPUT_1", input1), ("INPUT_2", input2))
            ]
            tensors[0].set_data_from_numpy(input1)
            tensors[1].set_data_from_numpy(input2)
            assert np.array_equal(client.infer("MyModel", tensors).as_numpy("OUTPUT_1"), input1 + input2)
            client.close()
    finally:
        exec(block_with("003", "triton.stop()"), namespace)
    assert not namespace["triton"].is_alive()


def test_unrecoverable_error_seed_stops_serving_and_exits_non_zero(run_seed):
    """Seed 002's PyTritonUnrecoverableError block, around a user model that fails for good."""
    user_model = textwrap.dedent(
        """
        def model(**inputs):
            raise RuntimeError("the accelerator is gone")
        """
    )
    serve = textwrap.dedent(
        """
        from pytriton.model_config import ModelConfig, Tensor
        from pytriton.triton import Triton

        with Triton() as triton:
            x = Tensor(name="x", dtype=np.float32, shape=(1,))
            y = Tensor(name="y", dtype=np.float32, shape=(1,))
            triton.bind("Fragile", infer_fn, [x], [y], config=ModelConfig(max_batch_size=4))
            triton.serve()
        """
    )
    server = run_seed(user_model + block_with("002", "PyTritonUnrecoverableError(") + serve)
    server.wait_ready("Fragile")
    with pytest.raises(InferenceServerException, match="Some unrecoverable error occurred"):
        server.infer("grpc", "Fragile", {"x": np.ones((1, 1), np.float32)}, "y")
    assert server.process.wait(30) != 0


def python_with_torch() -> str | None:
    """A Python 3.11 venv (cached below .venv/) with the project and the CPU build of torch that this
    machine keeps in /opt/wheels; None when either is missing."""
    wheels = sorted(glob.glob("/opt/wheels/torch-*+cpu-cp311-cp311-*.whl"))
    base = shutil.which("python3.11")
    if not wheels or base is None:
        return None
    repo = Path(__file__).resolve().parents[1]
    venv = repo / ".venv" / "seed-torch-3.11"
    ready = venv / "ready"
    if not ready.exists() or (repo / "pyproject.toml").stat().st_mtime > ready.stat().st_mtime:
        subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", wheels[-1], "numpy<2", "-e", str(repo)],
            check=True,
        )
        ready.touch()
    return str(venv / "bin" / "python")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_torch_multi_instance_seed_serves_from_two_cpu_instances(run_seed, protocol):
    """Seed 002's `_infer_function_factory`: a torch Linear per device, here ["cpu", "cpu"] (no GPU)."""
    python = python_with_torch()
    if python is None:
        pytest.skip(
            "needs python3.11 and /opt/wheels/torch-*+cpu-cp311 (the CPU build of torch on this machine)"
        )
    blocks = [block_with("002", "class _InferFuncWrapper"), block_with("002", "def _infer_function_factory")]
    bind = block_with("002", 'model_name="Linear"')
    assert bind.count('devices=["cuda", "cpu"]') == 1
    code = "\n".join([*blocks, bind.replace('devices=["cuda", "cpu"]', 'devices=["cpu", "cpu"]')])
    server = run_seed(with_serve(code), python)
    server.wait_ready("Linear", timeout_s=120)
    client = httpclient.InferenceServerClient(f"localhost:{server.http}")
    config = client.get_model_config("Linear")
    client.close()
    assert sum(group["count"] for group in config["instance_group"]) == 2
    x = np.random.default_rng(0).standard_normal((4, 20)).astype(np.float32)
    y = server.infer(protocol, "Linear", {"INPUT_1": x}, "OUTPUT_1")
    assert y.shape == (4, 30) and y.dtype == np.float32 and np.isfinite(y).all()
    assert server.stop() == 0
