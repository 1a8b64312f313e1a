"""Attach mode against the sidecar of the rendered pod, run as local processes (see tests/test_pod.py):
`Triton()` inside a pod refuses the settings that cannot apply there, the same script serves alike locally
and in the pod, and `RemoteTriton` binds callables to the sidecar from outside the pod's worker.

The workers run in this test process, with the pod's environment set around each `Triton()`.
"""

from __future__ import annotations

import logging
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from kubetriton import podenv
from pytriton.client import ModelClient
from pytriton.client.auth import create_auth_headers
from pytriton.client.exceptions import PyTritonClientTimeoutError
from pytriton.exceptions import PyTritonRuntimeError, PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.triton import RemoteTriton, Triton, TritonConfig, TritonLifecyclePolicy, TritonSecurityConfig

from tests.conftest import free_ports, self_signed_certificate
from tests.test_pod import Pod, wait_for

X = [Tensor(name="x", shape=(1,), dtype=np.float32)]
Y = [Tensor(name="y", shape=(1,), dtype=np.float32)]


def url(pod: Pod, protocol: str) -> str:
    """The pod's Triton, as a client in the pod writes it."""
    return f"{protocol}://127.0.0.1:{pod.http_port if protocol == 'http' else pod.grpc_port}"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """The pod's bootstrap step and Triton sidecar, without its worker."""
    tmp_path = tmp_path_factory.mktemp("pod")
    pod = Pod(tmp_path)
    try:
        pod.start_sidecar()
        wait_for(lambda: _status(f"{url(pod, 'http')}/v2/health/live") == 200, 60, "the sidecar to be live")
        yield pod
    finally:
        pod.stop()
        shutil.rmtree(pod.shm, ignore_errors=True)


@pytest.fixture
def in_the_pod(sidecar: Pod, monkeypatch: pytest.MonkeyPatch) -> Pod:
    """The worker container's environment, as the operator renders it, with its volumes mapped."""
    for name, value in sidecar.environment("worker").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(podenv.ENV_SHM_DIR, str(sidecar.shm))
    monkeypatch.setenv(podenv.ENV_HEALTH_PORT, str(free_ports(1)[0]))
    return sidecar


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=5
        ) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError):
        return 0


def double(requests):
    return [{"y": request["x"] * 2} for request in requests]


def test_server_settings_are_refused_in_a_pod(in_the_pod: Pod, monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(
        PyTritonValidationError, match=r"TritonConfig http_port, allow_grpc cannot apply in a pod"
    ):
        Triton(config=TritonConfig(http_port=9000, allow_grpc=False))
    with pytest.raises(PyTritonValidationError, match=r"spec\.triton\.args"):
        Triton(config=TritonConfig(grpc_use_ssl=True))
    with pytest.raises(PyTritonValidationError, match="TritonSecurityConfig other than the default"):
        Triton(security_config=TritonSecurityConfig(access_token="mine"))
    with pytest.raises(PyTritonValidationError, match="TritonSecurityConfig other than the default"):
        Triton(security_config=TritonSecurityConfig(restricted_endpoints=[]))
    with pytest.raises(PyTritonValidationError, match="local_model_store=True"):
        Triton(triton_lifecycle_policy=TritonLifecyclePolicy(local_model_store=True))
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_CACHE_CONFIG", "local,size=1024")
    with pytest.raises(PyTritonValidationError, match="cache_config cannot apply"):
        Triton()
    monkeypatch.delenv("PYTRITON_TRITON_CONFIG_CACHE_CONFIG")
    accepted = Triton(config=TritonConfig(log_verbose=0), security_config=TritonSecurityConfig())
    assert accepted.get_access_token() == (in_the_pod.workspace / podenv.ACCESS_TOKEN_FILE).read_text()
    accepted.stop()


def serve_and_query(model: str, ports: dict[str, int]) -> dict[str, object]:
    """A script written against PyTriton 0.7, run as it is locally and in the pod (its clients query the
    server at `ports`): what it observed."""
    calls: list[int] = []

    def scored(requests):
        calls.append(len(requests))
        return [{"y": request["x"] * 2} for request in requests]

    warmup = ModelWarmup("w", 1, {"x": WarmupInput(np.float32, (1,), zero_data=True)}, 1)
    seen: dict[str, object] = {}
    with Triton(config=TritonConfig(log_verbose=1)) as triton:
        token = triton.get_access_token()
        triton.bind(
            model,
            scored,
            X,
            Y,
            model_version=2,
            config=ModelConfig(max_batch_size=4, model_warmup=[warmup]),
            trace_config=["rate=7"],
        )
        seen["calls before the first request"] = len(calls)
        for protocol in ("http", "grpc"):
            url = f"{protocol}://127.0.0.1:{ports[protocol]}"
            with ModelClient(url, model, model_version="2", access_token=token) as client:
                seen[protocol] = client.infer_sample(np.array([1.5], np.float32))["y"].tolist()
        stats = f"http://127.0.0.1:{ports['http']}/v2/models/stats"
        seen["statistics without the token"] = _status(stats)
        seen["statistics with the token"] = _status(stats, create_auth_headers(token, "http"))
        http = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}")
        seen["trace rate"] = http.get_trace_settings(model, headers=create_auth_headers(token, "http"))[
            "trace_rate"
        ]
        http.close()
    return seen


@pytest.mark.parametrize("mode", ["local", "pod"])
def test_the_same_script_serves_alike_locally_and_in_a_pod(request, mode, monkeypatch, caplog):
    if mode == "pod":
        pod = request.getfixturevalue("in_the_pod")
        ports = {"http": pod.http_port, "grpc": pod.grpc_port}
    else:  # the local server takes free ports, from the environment
        ports = dict(zip(("http", "grpc", "metrics"), free_ports(3), strict=True))
        for name, port in ports.items():
            monkeypatch.setenv(f"PYTRITON_TRITON_CONFIG_{name.upper()}_PORT", str(port))
    with caplog.at_level(logging.WARNING, logger="pytriton.triton"):
        seen = serve_and_query(f"Scored_{mode}", ports)
    assert seen == {
        "calls before the first request": 1,
        "http": [3.0],
        "grpc": [3.0],
        "statistics without the token": 403,
        "statistics with the token": 200,
        "trace rate": "7",
    }
    assert "logs verbosely (log_verbose_level=1)" in caplog.text


@pytest.mark.parametrize("written", ["http", "grpc", "without a scheme"])
def test_remote_triton_binds_to_a_triton_running_elsewhere(sidecar: Pod, monkeypatch, written: str):
    monkeypatch.setenv(podenv.ENV_SHM_DIR, str(sidecar.shm))
    token = (sidecar.workspace / podenv.ACCESS_TOKEN_FILE).read_text()
    model = f"Remote_{written.replace(' ', '_')}"
    remote_url = f"127.0.0.1:{sidecar.http_port}" if written == "without a scheme" else url(sidecar, written)
    with RemoteTriton(remote_url, workspace=sidecar.workspace, access_token=token) as remote:
        assert remote.is_connected() and remote.is_alive()
        remote.bind(model, double, X, Y, config=ModelConfig(max_batch_size=4))
        for protocol in ("http", "grpc"):
            with ModelClient(url(sidecar, protocol), model) as client:
                assert client.infer_sample(np.array([2.0], np.float32))["y"].tolist() == [4.0]
    http = httpclient.InferenceServerClient(f"127.0.0.1:{sidecar.http_port}")
    assert not http.is_model_ready(model), "a stopped RemoteTriton unloads its models"
    http.close()


def test_remote_triton_binds_before_connecting(sidecar: Pod, monkeypatch):
    monkeypatch.setenv(podenv.ENV_SHM_DIR, str(sidecar.shm))
    remote = RemoteTriton(url(sidecar, "http"), workspace=sidecar.workspace)
    try:
        remote.bind("Early", double, X, Y, config=ModelConfig(max_batch_size=4))
        assert not remote.is_connected()
        remote.connect()
        with ModelClient(url(sidecar, "grpc"), "Early") as client:
            assert client.infer_sample(np.array([1.0], np.float32))["y"].tolist() == [2.0]
    finally:
        assert remote.stop() is True
    assert remote.stop() is False


def test_remote_triton_needs_the_tritons_workspace(sidecar: Pod, tmp_path: Path):
    with (
        pytest.raises(PyTritonRuntimeError, match="repository-token is missing"),
        RemoteTriton(url(sidecar, "http"), workspace=tmp_path),
    ):
        pass


def test_remote_triton_reaches_a_tls_only_grpc_endpoint(tmp_path: Path, monkeypatch):
    """A sidecar whose gRPC endpoint speaks TLS only, on ports of its own, named by a `grpcs://` URL. Its
    self-signed certificate is trusted through gRPC's own variable for the root certificates."""
    cert, key = self_signed_certificate(tmp_path)
    pod = Pod(tmp_path, ["--grpc-use-ssl=true", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}"])
    http, grpc = pod.http_port, pod.grpc_port
    monkeypatch.setenv(podenv.ENV_SHM_DIR, str(pod.shm))
    monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(cert))
    url = f"grpcs://localhost:{grpc}"
    try:
        pod.start_sidecar()
        wait_for(lambda: _status(f"http://127.0.0.1:{http}/v2/health/live") == 200, 60, "the sidecar")
        token = (pod.workspace / podenv.ACCESS_TOKEN_FILE).read_text()
        with RemoteTriton(url, workspace=pod.workspace, access_token=token) as remote:
            remote.bind("Secure", double, X, Y, config=ModelConfig(max_batch_size=4))
            with ModelClient(url, "Secure") as client:
                assert client.infer_sample(np.array([2.5], np.float32))["y"].tolist() == [5.0]
            with (
                pytest.raises(PyTritonClientTimeoutError),
                ModelClient(f"grpc://localhost:{grpc}", "Secure", init_timeout_s=2) as plain,
            ):
                plain.infer_sample(np.array([2.5], np.float32))
    finally:
        pod.stop()
        shutil.rmtree(pod.shm, ignore_errors=True)
