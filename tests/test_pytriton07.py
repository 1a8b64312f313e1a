"""Scripts and tests written for PyTriton 0.7 run unchanged: each test here does what such code does, as it
is written for PyTriton, against a real local tritonserver. Where kubetriton deliberately differs, docs/api.md
says so and the test asserts kubetriton's behaviour.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.http
from kubetriton import remote_serving
from kubetriton.server import find_published, servers_dir
from kubetriton.triton_home import locate
from pytriton.check.add_sub import add_sub_example, add_sub_example_thread
from pytriton.check.utils import (
    ProcessMonitoring,
    ScriptThread,
    TestMonitoringContext,
    find_free_port,
    get_current_container_version,
    search_warning_on_too_verbose_log_level,
    verify_docker_image_in_readme_same_as_tested,
)
from pytriton.client import (
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
    PyTritonClientInferenceServerError,
)
from pytriton.client.auth import create_auth_headers
from pytriton.client.exceptions import PyTritonClientInvalidUrlError, PyTritonClientTimeoutError
from pytriton.client.utils import (
    ModelState,
    TritonUrl,
    create_client_from_url,
    get_model_config,
    get_model_state,
    wait_for_model_ready,
    wait_for_server_ready,
)
from pytriton.client.warnings import NotSupportedTimeoutWarning
from pytriton.decorators import batch
from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonRuntimeError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.triton import RemoteTriton, Triton, TritonConfig

from tests.conftest import free_ports, plain_triton
from tests.test_seeds import python_with_torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
REMOTE_MODE = EXAMPLES / "remote-mode"


@pytest.fixture(scope="module")
def local() -> Iterator[dict[str, Any]]:
    """A local Triton() with PyTriton's default security: a generated access token."""
    http, grpc, metrics = free_ports(3)
    with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
        yield {
            "triton": triton,
            "http": f"http://127.0.0.1:{http}",
            "grpc": f"grpc://127.0.0.1:{grpc}",
            "ports": (http, grpc),
        }


@batch
def _double(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x * 2}


def _echo(requests):
    yield [{"y": request["x"]} for request in requests]


X = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
Y = [Tensor(name="y", dtype=np.float32, shape=(-1,))]


def test_a_warmup_may_give_some_inputs_and_a_file_may_hold_the_batch(local, tmp_path: Path) -> None:
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.save(tmp_path / "batch.npy", rows)
    seen: list[dict[str, np.ndarray]] = []

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        seen.append(dict(inputs))
        return {"y": inputs["a"].sum(axis=1, keepdims=True)}

    warmup = ModelWarmup(
        name="file-batch",
        batch_size=3,
        inputs={"a": WarmupInput(dtype=np.float32, shape=(2,), input_data_file=str(tmp_path / "batch.npy"))},
        count=1,
    )
    local["triton"].bind(
        "WarmedWithSomeInputs",
        infer,
        inputs=[
            Tensor(name="a", dtype=np.float32, shape=(2,)),
            Tensor(name="b", dtype=np.float32, shape=(2,)),
        ],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))],
        config=ModelConfig(max_batch_size=4, model_warmup=[warmup]),
    )
    (warm,) = seen
    assert set(warm) == {"a"}, "only the inputs the warm-up gives"
    assert warm["a"].tolist() == rows.tolist(), "the file's batch, one sample per request, in order"
    with ModelClient(local["http"], "WarmedWithSomeInputs") as client:
        result = client.infer_sample(a=np.ones(2, np.float32), b=np.ones(2, np.float32))
    assert result["y"].tolist() == [2.0]


def test_a_warmup_file_of_fewer_samples_is_repeated_over_the_batch(local, tmp_path: Path) -> None:
    np.save(tmp_path / "two.npy", np.array([[1.0], [2.0]], np.float32))
    seen: list[list[float]] = []

    @batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        seen.append(x.ravel().tolist())
        return {"y": x}

    warmup = ModelWarmup(
        "repeated", 5, {"x": WarmupInput(np.float32, (1,), input_data_file=str(tmp_path / "two.npy"))}, 1
    )
    local["triton"].bind(
        "WarmedRepeated",
        infer,
        [Tensor(name="x", dtype=np.float32, shape=(1,))],
        [Tensor(name="y", dtype=np.float32, shape=(1,))],
        config=ModelConfig(max_batch_size=8, model_warmup=[warmup]),
    )
    assert seen == [[1.0, 2.0, 1.0, 2.0, 1.0]]


def test_the_access_token_opens_the_model_repository_of_a_local_triton(local) -> None:
    local["triton"].bind("Repository", _double, X, Y, config=ModelConfig(max_batch_size=4))
    token = local["triton"].get_access_token()
    assert token
    http = tritonclient.http.InferenceServerClient(local["http"].removeprefix("http://"))
    grpc = tritonclient.grpc.InferenceServerClient(local["grpc"].removeprefix("grpc://"))
    try:
        with pytest.raises(tritonclient.utils.InferenceServerException, match=r"403|[Pp]ermission"):
            http.get_model_repository_index()
        http_headers = create_auth_headers(token, "http")
        grpc_headers = create_auth_headers(token, "grpc")
        names = {model["name"] for model in http.get_model_repository_index(headers=http_headers)}
        assert "Repository" in names
        indexed = grpc.get_model_repository_index(headers=grpc_headers, as_json=True)
        assert "Repository" in {model["name"] for model in indexed["models"]}
        http.unload_model("Repository", headers=http_headers)
        deadline = time.monotonic() + 30
        while http.is_model_ready("Repository") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not http.is_model_ready("Repository")
        grpc.load_model("Repository", headers=grpc_headers)
        with ModelClient(local["grpc"], "Repository", init_timeout_s=30) as client:
            assert client.infer_sample(np.array([1.5], np.float32))["y"].tolist() == [3.0]
    finally:
        http.close()
        grpc.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_remote_triton_binds_to_a_local_triton_of_another_process(protocol: str) -> None:
    """PyTriton's remote mode: one process serves `Triton()`, this one binds through `RemoteTriton(url)`."""
    http, grpc, metrics = free_ports(3)
    with _script(REMOTE_MODE / "server.py", _ports_env(http, grpc, metrics)) as server:
        _wait_until_served(server, f"http://127.0.0.1:{http}", "AddSub")
        url = f"localhost:{http}" if protocol == "http" else f"grpc://localhost:{grpc}"
        with RemoteTriton(url=url) as remote:
            remote.bind("Double", _double, X, Y, config=ModelConfig(max_batch_size=4))
            for client_url in (f"http://127.0.0.1:{http}", f"grpc://127.0.0.1:{grpc}"):
                with ModelClient(client_url, "Double", init_timeout_s=30) as client:
                    assert client.infer_sample(np.array([2.0], np.float32))["y"].tolist() == [4.0]
        probe = tritonclient.http.InferenceServerClient(f"127.0.0.1:{http}")
        assert not probe.is_model_ready("Double"), "a stopped RemoteTriton unloads its models"
        assert probe.is_model_ready("AddSub")
        probe.close()
        taken = pytest.raises(PyTritonInvalidOperationError, match="'AddSub' is already bound: another")
        with RemoteTriton(url=url) as remote, taken:
            remote.bind("AddSub", _double, X, Y, config=ModelConfig(max_batch_size=4))
        with ModelClient(f"http://127.0.0.1:{http}", "AddSub", init_timeout_s=30) as client:
            ones = np.ones((1, 1), np.float32)
            assert client.infer_batch(ones, ones)["add"].tolist() == [[2.0]], "still the first process's"


def test_a_remote_triton_whose_triton_stopped_ends_its_serve() -> None:
    http, grpc, metrics = free_ports(3)
    outcome: queue.Queue[BaseException | None] = queue.Queue()
    with _script(REMOTE_MODE / "server.py", _ports_env(http, grpc, metrics)) as server:
        _wait_until_served(server, f"http://127.0.0.1:{http}", "AddSub")
        remote = RemoteTriton(url=f"localhost:{http}")
        remote.bind("Double", _double, X, Y, config=ModelConfig(max_batch_size=4))
        remote.connect()

        def serving() -> None:
            try:
                remote.serve(monitoring_period_s=0.2)
            except BaseException as error:
                outcome.put(error)
            else:
                outcome.put(None)

        thread = threading.Thread(target=serving)
        thread.start()
        server.send_signal(signal.SIGINT)
        server.wait(60)
        thread.join(60)
    ended = outcome.get_nowait()
    assert isinstance(ended, PyTritonRuntimeError), ended
    assert str(ended) == (
        f"The Triton() at http://localhost:{http} that this RemoteTriton bound to has stopped, and its models"
        " with it"
    )


def test_the_remote_mode_example_serves_over_http_and_grpc() -> None:
    """examples/remote-mode as its users run it: server.py (which starts Triton) and bind_mul.py (which
    binds Mul from a second process) started at the same moment, then client.py queries both models over
    both protocols."""
    http, grpc, metrics = free_ports(3)
    env = _ports_env(http, grpc, metrics)
    with (
        _script(REMOTE_MODE / "server.py", env) as server,
        _script(REMOTE_MODE / "bind_mul.py", {**env, "TRITON_URL": f"localhost:{http}"}) as mul,
    ):
        _wait_until_served(server, f"http://127.0.0.1:{http}", "AddSub")
        _wait_until_served(mul, f"http://127.0.0.1:{http}", "Mul")
        answer = subprocess.run(
            [
                sys.executable,
                str(REMOTE_MODE / "client.py"),
                f"localhost:{http}",
                f"grpc://localhost:{grpc}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    for url in (f"localhost:{http}", f"grpc://localhost:{grpc}"):
        assert f"{url} AddSub: add=[[3.0], [5.0]], sub=[[-1.0], [-1.0]]" in answer, answer
        assert f"{url} Mul: mul=[[2.0], [6.0]]" in answer, answer


def test_the_identity_example_serves_as_its_users_run_it() -> None:
    """examples/identity: `python serve.py`, queried over HTTP and gRPC with PyTriton's client."""
    http, grpc, metrics = free_ports(3)
    with _script(EXAMPLES / "identity" / "serve.py", _ports_env(http, grpc, metrics)) as server:
        _wait_until_served(server, f"http://127.0.0.1:{http}", "Identity")
        for url in (f"http://127.0.0.1:{http}", f"grpc://127.0.0.1:{grpc}"):
            with ModelClient(url, "Identity", init_timeout_s=30) as client:
                assert client.infer_batch(np.array([[1.5, -2.0]], np.float32))["OUTPUT_1"].tolist() == [
                    [1.5, -2.0]
                ]


def test_the_multi_instance_example_serves_from_two_instances_on_cpu() -> None:
    """examples/multi-instance: `python serve.py --instances 2` with the CPU build of torch (no GPU here: both
    instances fall back to the CPU); each instance answers as the layer it copies."""
    python = python_with_torch()
    if python is None:
        pytest.skip(
            "needs python3.11 and /opt/wheels/torch-*+cpu-cp311 (the CPU build of torch on this machine)"
        )
    expected = json.loads(
        subprocess.run(
            [
                python,
                "-c",
                "import json, torch; torch.manual_seed(0); layer = torch.nn.Linear(16, 4); "
                "print(json.dumps(layer(torch.arange(16.0).reshape(1, 16) / 16).tolist()))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    http, grpc, metrics = free_ports(3)
    env = _ports_env(http, grpc, metrics)
    with _script(EXAMPLES / "multi-instance" / "serve.py", env, "--instances", "2", python=python) as server:
        _wait_until_served(server, f"http://127.0.0.1:{http}", "Linear")
        probe = tritonclient.http.InferenceServerClient(f"127.0.0.1:{http}")
        assert probe.get_model_config("Linear")["instance_group"][0]["count"] == 2
        probe.close()
        x = (np.arange(16, dtype=np.float32) / 16).reshape(1, 16)
        with FuturesModelClient(f"grpc://127.0.0.1:{grpc}", "Linear", max_workers=4) as client:
            results = [future.result() for future in [client.infer_batch(x) for _ in range(8)]]
    for result in results:
        np.testing.assert_allclose(result["y"], expected, rtol=1e-5, atol=1e-6)


def test_remote_triton_says_when_no_local_triton_listens_at_its_url(tmp_path: Path, monkeypatch) -> None:
    """A Triton that answers but that no Triton() of this user published: RemoteTriton waits for a record
    within its timeout, then says so."""
    monkeypatch.delenv("KUBETRITON_WORKSPACE", raising=False)
    monkeypatch.setattr(remote_serving, "REMOTE_WAIT_S", 2.0)
    with plain_triton(locate(), tmp_path) as unpublished:
        remote = RemoteTriton(url=f"localhost:{unpublished.http_port}")
        with pytest.raises(
            PyTritonRuntimeError, match=r"No Triton\(\) of this user on this machine listens at"
        ):
            remote.connect()


def test_remote_triton_of_another_machine_without_a_workspace_is_refused_at_once(monkeypatch) -> None:
    """No Triton() of this machine can answer there, and nothing says where its workspace is: no wait for a
    Triton to answer first (192.0.2.1 is a documentation address: nothing answers)."""
    monkeypatch.delenv("KUBETRITON_WORKSPACE", raising=False)
    remote = RemoteTriton(url="192.0.2.1:8000")
    started = time.monotonic()
    with pytest.raises(PyTritonRuntimeError, match=r"No Triton\(\) of this user on this machine listens at"):
        remote.connect()
    assert time.monotonic() - started < 5


def test_remote_triton_waits_for_the_record_of_a_triton_that_answers_already(local, monkeypatch) -> None:
    """A Triton() and a RemoteTriton started at the same moment: RemoteTriton sees Triton answer before the
    Triton() has published its record. Here the record is hidden until RemoteTriton has looked once."""
    monkeypatch.delenv("KUBETRITON_WORKSPACE", raising=False)
    http, _ = local["ports"]
    (record,) = [
        path
        for path in servers_dir().glob("*.json")
        if json.loads(path.read_text())["ports"].get("http") == http
    ]
    hidden = record.with_suffix(".hidden")
    record.rename(hidden)
    looks: list[bool] = []

    def published_after_the_first_look(endpoint):
        found = find_published(endpoint)
        looks.append(found is not None)
        if hidden.exists():
            hidden.rename(record)
        return found

    try:
        monkeypatch.setattr(remote_serving, "find_published", published_after_the_first_look)
        with RemoteTriton(url=f"localhost:{http}") as remote:
            remote.bind("LatePublished", _double, X, Y, config=ModelConfig(max_batch_size=4))
            with ModelClient(local["grpc"], "LatePublished", init_timeout_s=30) as client:
                assert client.infer_sample(np.array([2.5], np.float32))["y"].tolist() == [5.0]
    finally:
        if hidden.exists():
            hidden.rename(record)
    assert looks[0] is False and looks[-1] is True, looks


def test_the_published_servers_are_private_to_the_user(local) -> None:
    directory = servers_dir()
    assert directory.stat().st_mode & 0o777 == 0o700
    records = list(directory.glob("*.json"))
    assert records and all(record.stat().st_mode & 0o777 == 0o600 for record in records)
    directory.chmod(0o755)
    try:
        with pytest.raises(PyTritonRuntimeError, match="nobody else may use"):
            servers_dir()
    finally:
        directory.chmod(0o700)


def test_a_decoupled_client_sends_its_request_when_called(local) -> None:
    received = threading.Event()
    release = threading.Event()

    def stream(requests):
        received.set()
        release.wait(30)
        for step in range(2):
            yield [{"y": request["x"] + step} for request in requests]

    local["triton"].bind("Streamed", stream, X, Y, config=ModelConfig(max_batch_size=4, decoupled=True))
    with DecoupledModelClient(local["grpc"], "Streamed", init_timeout_s=30) as client:
        responses = client.infer_sample(np.array([1.0], np.float32))
        assert received.wait(30), "the request reached the model before its responses were read"
        with pytest.raises(PyTritonClientInferenceServerError, match="Inference is already in progress"):
            client.infer_sample(np.array([2.0], np.float32))
        release.set()
        assert [response["y"].tolist() for response in responses] == [[1.0], [2.0]]
        assert len(list(client.infer_batch(np.array([[3.0]], np.float32)))) == 2


def test_a_client_of_the_wrong_kind_raises_an_inference_server_error(local) -> None:
    local["triton"].bind("Coupled", _double, X, Y, config=ModelConfig(max_batch_size=4))
    local["triton"].bind(
        "Decoupled",
        _echo,
        X,
        Y,
        config=ModelConfig(max_batch_size=4, decoupled=True),
    )
    with (
        ModelClient(local["http"], "Decoupled", init_timeout_s=30) as client,
        pytest.raises(PyTritonClientInferenceServerError, match="is decoupled"),
    ):
        client.infer_sample(np.array([1.0], np.float32))
    with (
        DecoupledModelClient(local["grpc"], "Coupled", init_timeout_s=30) as client,
        pytest.raises(PyTritonClientInferenceServerError, match="is not decoupled"),
    ):
        list(client.infer_sample(np.array([1.0], np.float32)))


def test_pytritons_client_utils_wait_for_and_describe_a_model(local) -> None:
    local["triton"].bind("Described", _double, X, Y, config=ModelConfig(max_batch_size=4))
    assert TritonUrl.from_url("localhost") == TritonUrl("http", "localhost", 8000)
    assert TritonUrl.from_url("grpc://example.com").with_scheme == "grpc://example.com:8001"
    with pytest.raises(PyTritonClientInvalidUrlError):
        create_client_from_url("ftp://localhost")
    with pytest.warns(NotSupportedTimeoutWarning):
        create_client_from_url(local["grpc"], network_timeout_s=10).close()
    token = local["triton"].get_access_token()
    for protocol in ("http", "grpc"):
        client = create_client_from_url(local[protocol], network_timeout_s=10 if protocol == "http" else None)
        headers = create_auth_headers(token, protocol)
        try:
            wait_for_server_ready(client, timeout_s=10)
            wait_for_model_ready(client, "Described", timeout_s=10)
            assert get_model_state(client, "Described", headers=headers) is ModelState.READY
            assert get_model_state(client, "Described", "1", headers=headers) is ModelState.READY
            assert get_model_state(client, "Unknown", headers=headers) is ModelState.UNAVAILABLE
            config = get_model_config(client, "Described", timeout_s=10)
            assert config.max_batch_size == 4 and [spec.name for spec in config.inputs] == ["x"]
            with pytest.raises(PyTritonClientTimeoutError, match="Unknown/<latest> to be ready timed out"):
                wait_for_model_ready(client, "Unknown", timeout_s=0.5)
        finally:
            client.close()


def test_pytritons_triton_model_config_configures_a_client(local) -> None:
    local["triton"].bind("Configured", _double, X, Y, config=ModelConfig(max_batch_size=4))
    config = TritonModelConfig(
        model_name="Configured",
        inputs=[TensorSpec(name="x", shape=(-1,), dtype=np.float32)],
        outputs=[TensorSpec(name="y", shape=(-1,), dtype=np.float32)],
    )
    assert config.backend == "python" and config.batching and config.model_version == 1
    for protocol in ("http", "grpc"):
        with ModelClient(local[protocol], "Configured", model_config=config, init_timeout_s=30) as client:
            assert client.is_batching_supported
            assert client.infer_sample(np.array([3.0], np.float32))["y"].tolist() == [6.0]


def test_the_check_tools_serve_and_query_add_sub(tmp_path: Path, monkeypatch, caplog) -> None:
    http, grpc, metrics = free_ports(3)
    for name, value in _ports_env(http, grpc, metrics).items():
        monkeypatch.setenv(name, value)
    assert isinstance(find_free_port(), int)
    logger = logging.getLogger("check")
    with caplog.at_level(logging.INFO):
        add_sub_example(tmp_path / "in-process", logger)
        add_sub_example_thread(tmp_path / "script", logger)
    assert caplog.text.count("add: [[2.0], [2.0]]") == 2, caplog.text
    assert caplog.text.count("sub: [[0.0], [0.0]]") == 2
    assert "The server script failed" not in caplog.text
    assert search_warning_on_too_verbose_log_level(
        "Triton at http://127.0.0.1:8000 logs verbosely (log_verbose_level=1), which slows inference down"
    )
    with ScriptThread([sys.executable, "-c", "print('hello')"], name="hello") as script:
        pass
    assert script.output == "hello" and script.returncode == 0


def test_a_script_thread_gives_the_process_tree_of_the_server_it_runs(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """PyTriton's test scripts: serve from a ScriptThread, find tritonserver among the script's children,
    dump the state of the whole tree, stop the script, and see its children gone."""
    http, grpc, metrics = free_ports(3)
    for name, value in _ports_env(http, grpc, metrics).items():
        monkeypatch.setenv(name, value)
    command = [sys.executable, "-m", "pytriton.check.add_sub", "--workspace", str(tmp_path / "workspace")]
    caplog.set_level(logging.INFO)
    with ScriptThread(command, name="server") as server:
        try:
            with ModelClient(f"http://127.0.0.1:{http}", "AddSub", init_timeout_s=120) as client:
                ones = np.ones((1, 1), np.float32)
                assert client.infer_batch(ones, ones)["add"].tolist() == [[2.0]]
            (triton,) = [
                child for child in server.process.children(recursive=True) if child.name() == "tritonserver"
            ]
            assert triton.parent().pid == server.process.pid
            monitoring = ProcessMonitoring(server.process.pid, logging.getLogger("monitoring"))
            seen: list[int] = []
            monitoring.register_custom_monitor(seen.append)
            monitoring.dump_state()
            assert server.process.pid in seen and triton.pid in seen
            assert f"pid={triton.pid}, name='tritonserver'" in caplog.text
            if shutil.which("py-spy") is None:
                assert "py-spy is not installed (pip install py-spy)" in caplog.text
            else:
                assert f"Process {server.process.pid}: " in caplog.text
        finally:
            server.process.send_signal(signal.SIGINT)
    assert server.returncode in (0, -signal.SIGINT), server.output
    assert server.process is None
    caplog.clear()
    monitoring.dump_state()
    assert f"pid={triton.pid}" in caplog.text and "is missing in process table" in caplog.text


def test_the_test_monitoring_context_logs_the_state_of_this_process(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    parser = argparse.ArgumentParser()
    TestMonitoringContext.extend_args(parser)
    log_path = tmp_path / "test.log"
    args = parser.parse_args(
        ["--log-path", str(log_path), "--process-monitoring-interval", "60", "--verbose"]
    )
    caplog.set_level(logging.DEBUG)
    with TestMonitoringContext(args):
        logging.getLogger("a-test").info("the test runs")
    logged = log_path.read_text()
    assert "a-test: the test runs" in logged
    assert f"MONITOR RAM USAGE ({os.getpid()}): " in logged and f"MONITOR THREADS ({os.getpid()}): " in logged
    assert "==== Dump process info (with its children)" in logged
    logging.getLogger("a-test").info("after the test")
    assert "after the test" not in log_path.read_text(), "leaving removes the log file's handler"

    for variable, value, version in (
        ("NVIDIA_PYTORCH_VERSION", "24.10", "24.10"),
        ("NVIDIA_TENSORFLOW_VERSION", "24.09-tf2.16.1", "24.09"),
    ):
        with monkeypatch.context() as patched:
            patched.delenv("NVIDIA_PYTORCH_VERSION", raising=False)
            patched.setenv(variable, value)
            assert get_current_container_version() == version
    monkeypatch.delenv("NVIDIA_PYTORCH_VERSION", raising=False)
    monkeypatch.delenv("NVIDIA_TENSORFLOW_VERSION", raising=False)
    assert get_current_container_version() is None
    readme = tmp_path / "README.md"
    readme.write_text(
        "FROM nvcr.io/nvidia/pytorch:24.10-py3\n\n`docker run nvcr.io/nvidia/pytorch:24.10-py3`\n"
    )
    verify_docker_image_in_readme_same_as_tested(readme, "nvcr.io/nvidia/pytorch:24.10-py3")
    with pytest.raises(
        AssertionError, match=r"nvcr.io/nvidia/pytorch:24.10-py3 != nvcr.io/nvidia/pytorch:24.11-py3"
    ):
        verify_docker_image_in_readme_same_as_tested(readme, "nvcr.io/nvidia/pytorch:24.11-py3")


def test_only_the_helpers_that_need_psutil_import_it(monkeypatch) -> None:
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pytriton.triton, pytriton.client, pytriton.check.utils\n"
            "print('psutil' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert imported.strip() == "False"
    monkeypatch.setitem(sys.modules, "psutil", None)
    with pytest.raises(ModuleNotFoundError, match=r"needs psutil .*: pip install psutil"):
        ScriptThread([sys.executable, "-c", "pass"]).start()
    with pytest.raises(ModuleNotFoundError, match="pip install psutil"):
        ProcessMonitoring(os.getpid())


def _ports_env(http: int, grpc: int, metrics: int) -> dict[str, str]:
    return {
        "PYTRITON_TRITON_CONFIG_HTTP_PORT": str(http),
        "PYTRITON_TRITON_CONFIG_GRPC_PORT": str(grpc),
        "PYTRITON_TRITON_CONFIG_METRICS_PORT": str(metrics),
    }


class _script:
    """A Python script run in its own process, stopped with SIGINT (as a user stops it) on leaving."""

    def __init__(
        self, path: Path, env: dict[str, str], *arguments: str, python: str = sys.executable
    ) -> None:
        self.command = [python, str(path), *arguments]
        self.env = {**os.environ, **env}

    def __enter__(self) -> subprocess.Popen[str]:
        self.process = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return self.process

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()


def _wait_until_served(process: subprocess.Popen[str], url: str, model: str) -> None:
    client = tritonclient.http.InferenceServerClient(url.removeprefix("http://"))
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"{process.args} exited: {process.communicate()[0]}")
            try:
                if client.is_model_ready(model):
                    return
            except Exception:  # not up yet
                pass
            time.sleep(0.2)
    finally:
        client.close()
    raise AssertionError(f"{model} was not served within 120 s")
