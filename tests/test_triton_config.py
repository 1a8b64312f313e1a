"""PyTriton 0.7's server settings: every `TritonConfig` field, read from code or the environment, reaching a
real `tritonserver`; the lifecycle policy; `TritonSecurityConfig` on Triton's restricted APIs; the warning
about verbose logs. Served models are queried with `tritonclient` and PyTriton's clients over HTTP and gRPC.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubetriton import podenv
from kubetriton.model_repository import PROXY_MODEL_SOURCE
from pytriton.client import ModelClient, PyTritonClientInferenceServerError
from pytriton.client.auth import create_auth_headers
from pytriton.exceptions import PyTritonModelConfigError, PyTritonValidationError
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import (
    DEFAULT_PROTECTED_ENDPOINTS,
    VALID_TRITON_ENDPOINTS,
    Triton,
    TritonConfig,
    TritonLifecyclePolicy,
    TritonSecurityConfig,
    VertextAILifecyclePolicy,
)
from tritonclient.utils import InferenceServerException

from tests.conftest import free_ports, self_signed_certificate

PYTRITON_07_FIELDS = [
    "model_repository",
    "id",
    "log_verbose",
    "log_file",
    "exit_timeout_secs",
    "exit_on_error",
    "strict_readiness",
    "allow_http",
    "http_address",
    "http_port",
    "http_header_forward_pattern",
    "http_thread_count",
    "http_restricted_api",
    "allow_grpc",
    "grpc_address",
    "grpc_port",
    "grpc_header_forward_pattern",
    "grpc_infer_allocation_pool_size",
    "grpc_use_ssl",
    "grpc_use_ssl_mutual",
    "grpc_server_cert",
    "grpc_server_key",
    "grpc_root_cert",
    "grpc_infer_response_compression_level",
    "grpc_keepalive_time",
    "grpc_keepalive_timeout",
    "grpc_keepalive_permit_without_calls",
    "grpc_http2_max_pings_without_data",
    "grpc_http2_min_recv_ping_interval_without_data",
    "grpc_http2_max_ping_strikes",
    "grpc_restricted_protocol",
    "allow_metrics",
    "allow_gpu_metrics",
    "allow_cpu_metrics",
    "metrics_interval_ms",
    "metrics_port",
    "metrics_address",
    "allow_sagemaker",
    "sagemaker_port",
    "sagemaker_safe_port_range",
    "sagemaker_thread_count",
    "allow_vertex_ai",
    "vertex_ai_port",
    "vertex_ai_thread_count",
    "vertex_ai_default_model",
    "metrics_config",
    "trace_config",
    "cache_config",
    "cache_directory",
    "buffer_manager_thread_count",
]
X = [Tensor(name="x", shape=(1,), dtype=np.float32)]
Y = [Tensor(name="y", shape=(1,), dtype=np.float32)]
ONE = np.array([[2.0]], np.float32)


def double(requests):
    return [{"y": request["x"] * 2} for request in requests]


def local_config(**fields) -> tuple[TritonConfig, dict[str, int]]:
    http, grpc, metrics = free_ports(3)
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, **fields)
    return config, {"http": http, "grpc": grpc, "metrics": metrics}


def infer(protocol: str, port: int, model: str = "double", headers: dict[str, str] | None = None, **kwargs):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(f"127.0.0.1:{port}", **kwargs)
    try:
        tensor = module.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(ONE)
        return client.infer(model, [tensor], headers=headers).as_numpy("y")
    finally:
        client.close()


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=5
        ) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_for_endpoint(url: str, timeout_s: float = 20.0) -> None:
    """Triton starts its SageMaker and Vertex AI endpoints after the HTTP one that says it is live."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if http_get(url)[0] == 200:
                return
        except urllib.error.URLError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer"
        time.sleep(0.1)


def test_config_has_every_pytriton_field_and_takes_keywords_only():
    assert [field.name for field in dataclasses.fields(TritonConfig)] == PYTRITON_07_FIELDS
    with pytest.raises(TypeError):
        TritonConfig("id", "/x", False)  # type: ignore[misc]
    with pytest.raises(PyTritonValidationError, match="allow_http and allow_grpc"):
        TritonConfig(allow_http=False, allow_grpc=False)
    config = TritonConfig(grpc_server_cert="/certs/server.pem", model_repository="/models")
    assert config.grpc_server_cert == Path("/certs/server.pem") and config.model_repository == Path("/models")
    assert TritonConfig.from_dict(config.to_dict()) == config


def test_values_are_taken_as_pytriton_passes_them_to_tritonserver():
    config = TritonConfig(
        http_port="8010",
        log_verbose="1",
        allow_grpc="false",
        allow_metrics=0,
        trace_config=("rate=1", "level=TIMESTAMPS"),
        exit_timeout_secs=0,
    )
    assert (config.http_port, config.log_verbose, config.allow_grpc, config.allow_metrics) == (
        8010,
        1,
        False,
        False,
    )
    assert config.trace_config == ["rate=1", "level=TIMESTAMPS"]
    assert {"--trace-config=rate=1", "--trace-config=level=TIMESTAMPS"} <= set(config.extra_args())
    with pytest.raises(PyTritonValidationError, match="allow_http and allow_grpc"):
        TritonConfig(allow_http=0, allow_grpc=0)
    with pytest.raises(ValueError, match="not a boolean"):
        TritonConfig(allow_http="maybe")
    arguments = podenv.tritonserver_args(model_repository="/m", repository_token="t", exit_timeout_s=0)
    assert "--exit-timeout-secs=0" in arguments, "0 lets Triton exit at once, as in PyTriton"


def test_from_env_reads_each_kind_of_field(monkeypatch, caplog):
    for variable, value in {
        "HTTP_PORT": "8010",
        "ALLOW_GRPC": "False",
        "EXIT_ON_ERROR": "yes",
        "GRPC_ROOT_CERT": "/certs/ca.pem",
        "HTTP_HEADER_FORWARD_PATTERN": "x-.*",
        "TRACE_CONFIG_1": "rate=1",
        "TRACE_CONFIG_0": "level=TIMESTAMPS",
        "TRACE_CONFIG_3": "triton,log-frequency=1",
        "CACHE_CONFIG": "local,size=1024;redis,host=r",
        "METRICS_CONFIG": "",
        "NO_SUCH_FIELD": "1",
    }.items():
        monkeypatch.setenv(f"PYTRITON_TRITON_CONFIG_{variable}", value)
    with caplog.at_level(logging.WARNING):
        config = TritonConfig.from_env()
    assert (config.http_port, config.allow_grpc, config.exit_on_error) == (8010, False, True)
    assert config.grpc_root_cert == Path("/certs/ca.pem")
    assert config.http_header_forward_pattern == "x-.*"
    assert config.trace_config == ["level=TIMESTAMPS", "rate=1", "triton,log-frequency=1"]
    assert config.cache_config == ["local,size=1024", "redis,host=r"]
    assert config.metrics_config == []
    assert config.log_verbose is None
    assert "Ignoring no_such_field='1'" in caplog.text
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_ALLOW_METRICS", "maybe")
    with pytest.raises(ValueError, match="allow_metrics: 'maybe' is not a boolean"):
        TritonConfig.from_env()
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_ALLOW_METRICS", "off")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "eighty")
    said = r"grpc_port: 'eighty' is not a whole number \(read from the PYTRITON_TRITON_CONFIG_<FIELD>"
    with pytest.raises(ValueError, match=said):
        TritonConfig.from_env()


def test_every_field_becomes_a_tritonserver_argument():
    launcher = {"model_repository", "log_verbose", "log_file", "exit_timeout_secs"}
    values = {}
    for field in dataclasses.fields(TritonConfig):
        kind = field.type
        if "bool" in kind:
            values[field.name] = True
        elif "int" in kind:
            values[field.name] = 7
        elif "list" in kind:
            values[field.name] = ["a=1", "b=2"]
        else:
            values[field.name] = "/v"
    args = TritonConfig(**values).extra_args()
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if name in launcher or (name.endswith("_port") and name.split("_")[0] in ("http", "grpc", "metrics")):
            assert not any(arg.startswith(flag + "=") for arg in args), name
        elif isinstance(value, bool):
            assert f"{flag}=true" in args
        elif isinstance(value, list):
            assert [f"{flag}=a=1", f"{flag}=b=2"] == [arg for arg in args if arg.startswith(flag + "=")]
        else:
            assert f"{flag}={value}" in args


def test_server_fields_reach_tritonserver(tmp_path):
    """Triton accepts every argument (it refuses unknown ones and bad values at start), and the effects
    of several can be seen from outside."""
    sagemaker, low, high = free_ports(1)[0], 1024, 65535
    trace_file = tmp_path / "trace.json"
    config, ports = local_config(
        id="surface/server",
        exit_on_error=True,
        strict_readiness=False,
        http_address="127.0.0.1",
        http_thread_count=4,
        grpc_address="127.0.0.1",
        grpc_infer_allocation_pool_size=8,
        grpc_infer_response_compression_level="low",
        grpc_keepalive_time=7_200_000,
        grpc_keepalive_timeout=20_000,
        grpc_keepalive_permit_without_calls=True,
        grpc_http2_max_pings_without_data=2,
        grpc_http2_min_recv_ping_interval_without_data=300_000,
        grpc_http2_max_ping_strikes=2,
        allow_gpu_metrics=False,
        allow_cpu_metrics=True,
        metrics_interval_ms=500,
        metrics_address="127.0.0.1",
        metrics_config=["summary_latencies=true"],
        trace_config=["mode=triton", "level=TIMESTAMPS", "rate=1", f"triton,file={trace_file}"],
        allow_sagemaker=True,
        sagemaker_port=sagemaker,
        sagemaker_safe_port_range=f"{low}-{high}",
        sagemaker_thread_count=2,
        buffer_manager_thread_count=2,
        exit_timeout_secs=3,
    )
    with Triton(config=config) as triton:
        triton.bind("double", double, X, Y, config=ModelConfig(max_batch_size=4))
        for protocol in ("http", "grpc"):
            assert infer(protocol, ports[protocol]).tolist() == [[4.0]]
        http = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        assert http.get_server_metadata()["name"] == "surface/server"
        assert grpc.get_server_metadata().name == "surface/server"
        # and a digest, not to be taken for team-svc's (beside it, Triton's regions of that prefix)
        (shm,) = [path for path in Path("/dev/shm").glob("kubetriton-surface-server-*") if path.is_dir()]
        assert not Path("/dev/shm/kubetriton-surface").exists(), "one name, not a folder"
        # strict_readiness=False: a model that failed to load leaves the server ready
        with pytest.raises(PyTritonModelConfigError):
            _bind_unloadable(triton)
        assert http.is_server_ready() and grpc.is_server_ready()
        http.close()
        grpc.close()
        wait_for_endpoint(f"http://127.0.0.1:{sagemaker}/ping")
        _, metrics = http_get(f"http://127.0.0.1:{ports['metrics']}/metrics")
        assert "nv_inference_request_summary_us" in metrics
    assert json.loads(trace_file.read_text()), "the trace file holds the traces of the requests"
    assert not shm.exists()


def _bind_unloadable(triton: Triton) -> None:
    """A model whose preferred batch size exceeds its maximum: Triton refuses to load it."""
    batcher = DynamicBatcher(preferred_batch_size=[8])
    triton.bind("unloadable", double, X, Y, config=ModelConfig(max_batch_size=4, batcher=batcher))


def test_without_http_kubetriton_manages_triton_over_grpc(caplog):
    config, ports = local_config(allow_http=False, log_verbose=1)
    with caplog.at_level(logging.WARNING, logger="pytriton.triton"), Triton(config=config) as triton:
        triton.bind("double", double, X, Y, config=ModelConfig(max_batch_size=4))
        assert triton.is_alive()
        assert infer("grpc", ports["grpc"]).tolist() == [[4.0]]
        with pytest.raises(ConnectionRefusedError):
            infer("http", ports["http"])
    assert f"Triton at grpc://127.0.0.1:{ports['grpc']} logs verbosely (log_verbose_level=1)" in caplog.text


def test_without_grpc_its_port_is_not_needed():
    config, ports = local_config(allow_grpc=False, allow_metrics=False)
    taken = [socket.create_server(("127.0.0.1", ports[name])) for name in ("grpc", "metrics")]
    with Triton(config=config) as triton:
        for sock in taken:
            sock.close()
        triton.bind("double", double, X, Y, config=ModelConfig(max_batch_size=4))
        assert infer("http", ports["http"]).tolist() == [[4.0]]
        with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
            infer("grpc", ports["grpc"])


def test_grpc_over_ssl(tmp_path):
    cert, key = self_signed_certificate(tmp_path)
    config, ports = local_config(grpc_use_ssl=True, grpc_server_cert=str(cert), grpc_server_key=str(key))
    with Triton(config=config) as triton:
        triton.bind("double", double, X, Y, config=ModelConfig(max_batch_size=4))
        secure = {"ssl": True, "root_certificates": str(cert)}
        assert infer("grpc", ports["grpc"], **secure).tolist() == [[4.0]]
        with pytest.raises(InferenceServerException):
            infer("grpc", ports["grpc"])
        assert infer("http", ports["http"]).tolist() == [[4.0]]


def test_vertex_ai_loads_the_models_bound_before_the_launch(monkeypatch):
    """With allow_vertex_ai and no policy, Triton() follows VertextAILifecyclePolicy: entering launches
    nothing, models bound before run() are loaded as Triton starts, as its Vertex AI endpoint needs."""
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/health")
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/predict")
    vertex = free_ports(1)[0]
    config, ports = local_config(
        allow_vertex_ai=True, vertex_ai_port=vertex, vertex_ai_default_model="double"
    )
    with Triton(config=config) as triton:
        assert triton._lifecycle == VertextAILifecyclePolicy
        assert not triton.is_alive()
        triton.bind("double", double, X, Y, config=ModelConfig(max_batch_size=4))
        triton.run()
        wait_for_endpoint(f"http://127.0.0.1:{vertex}/health")
        body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}]}
        request = urllib.request.Request(
            f"http://127.0.0.1:{vertex}/predict",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.loads(response.read())["outputs"][0]["data"] == [4.0]
        assert infer("grpc", ports["grpc"]).tolist() == [[4.0]]


def test_a_deferred_launch_serves_from_run():
    config, ports = local_config()
    policy = TritonLifecyclePolicy(launch_triton_on_startup=False)
    with Triton(config=config, triton_lifecycle_policy=policy) as triton:
        triton.bind("double", double, X, Y, config=ModelConfig(max_batch_size=4))
        assert not triton.is_alive() and not triton.is_connected()
        triton.run()
        assert triton.is_connected()
        for protocol in ("http", "grpc"):
            assert infer(protocol, ports[protocol]).tolist() == [[4.0]]


def statistics_allowed(protocol: str, ports: dict[str, int], token: str | None) -> bool:
    headers = create_auth_headers(token, protocol) if token else None
    if protocol == "http":
        return http_get(f"http://127.0.0.1:{ports['http']}/v2/models/stats", headers)[0] == 200
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
    try:
        client.get_inference_statistics(headers=headers)
        return True
    except InferenceServerException:
        return False
    finally:
        client.close()


@pytest.fixture(scope="module")
def secured() -> Iterator[tuple[Triton, dict[str, int]]]:
    config, ports = local_config(log_verbose=1)
    with Triton(config=config) as triton:
        triton.bind("double", double, X, Y, config=ModelConfig(max_batch_size=4))
        yield triton, ports


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_by_default_pytritons_endpoints_need_the_generated_token(secured, protocol):
    triton, ports = secured
    token = triton.get_access_token()
    assert token and len(token) >= 32
    assert not statistics_allowed(protocol, ports, None)
    assert not statistics_allowed(protocol, ports, "wrong")
    assert statistics_allowed(protocol, ports, token)
    assert infer(protocol, ports[protocol]).tolist() == [[4.0]], "inference stays open"
    with ModelClient(f"{protocol}://127.0.0.1:{ports[protocol]}", "double", access_token=token) as client:
        assert client.infer_batch(ONE)["y"].tolist() == [[4.0]]
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(f"127.0.0.1:{ports[protocol]}")
    with pytest.raises(InferenceServerException):
        client.load_model("double")
    client.load_model("double", headers=create_auth_headers(token, protocol))  # locally, the token opens it
    assert client.is_model_ready("double")
    client.close()


def test_the_endpoints_and_token_of_a_security_config(tmp_path):
    """Any visible ASCII makes a token: Triton's argument `<endpoints>:<header>=<token>` takes ':' and '='
    in the token too, after the header's name."""
    token = "tok3n:a=b,c!~"
    security = TritonSecurityConfig(access_token=token, restricted_endpoints=["inference", "model-config"])
    config, ports = local_config()
    with Triton(config=config, security_config=security) as triton:
        triton.bind("double", double, X, Y, config=ModelConfig(max_batch_size=4))
        assert triton.get_access_token() == token
        for protocol in ("http", "grpc"):
            url = f"{protocol}://127.0.0.1:{ports[protocol]}"
            with pytest.raises(InferenceServerException):
                infer(protocol, ports[protocol])
            assert infer(
                protocol, ports[protocol], headers=create_auth_headers(token, protocol)
            ).tolist() == [[4.0]]
            with ModelClient(url, "double", access_token=token) as client:
                assert client.infer_batch(ONE)["y"].tolist() == [[4.0]]
            with (
                ModelClient(url, "double", init_timeout_s=2) as client,
                pytest.raises(PyTritonClientInferenceServerError),
            ):
                client.infer_batch(ONE)
            assert statistics_allowed(protocol, ports, None), "statistics are no longer protected"


def test_no_restricted_endpoints_means_no_token():
    security = TritonSecurityConfig(restricted_endpoints=[])
    assert security.access_token is None
    config, ports = local_config()
    with Triton(config=config, security_config=security) as triton:
        assert triton.get_access_token() is None
        for protocol in ("http", "grpc"):
            assert statistics_allowed(protocol, ports, None)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}")
        with pytest.raises(InferenceServerException, match="restricted"):
            client.load_model("anything")
        client.close()


def test_restrictions_are_checked_before_launching():
    with pytest.raises(PyTritonValidationError, match="Invalid endpoint names: stats"):
        TritonSecurityConfig(restricted_endpoints=["stats"])
    assert DEFAULT_PROTECTED_ENDPOINTS == [
        "shared-memory",
        "model-repository",
        "statistics",
        "trace",
        "logging",
    ]
    for field in ("http_restricted_api", "grpc_restricted_protocol"):
        with pytest.raises(PyTritonValidationError, match="restricts statistics"):
            Triton(config=TritonConfig(**{field: "statistics,metadata:k=v"}))
        with pytest.raises(PyTritonValidationError, match="restricts model-repository"):
            Triton(
                config=TritonConfig(**{field: "model-repository:k=v"}),
                security_config=TritonSecurityConfig(restricted_endpoints=[]),
            )


def test_an_empty_access_token_is_refused_rather_than_leaving_the_endpoints_open():
    """PyTriton 0.7 takes `access_token=""` and then restricts nothing: shared memory, statistics, trace
    and logging are open to anyone, without a word."""
    for endpoints in (None, ["statistics"], []):
        with pytest.raises(PyTritonValidationError) as caught:
            TritonSecurityConfig(access_token="", restricted_endpoints=endpoints)
        assert "leave it None" in str(caught.value)
        assert "restricted_endpoints=[]" in str(caught.value)


@pytest.mark.parametrize("character", ["\n", "\r\n", " ", "\t", "\0", "\x7f", "é", "\u2028"])
def test_a_token_a_header_cannot_carry_is_refused_without_being_shown(character):
    """The token travels in an HTTP header and in gRPC metadata, which hold visible ASCII; refused later, a
    newline ended as `ValueError: Invalid header value b'<the token>'`, the secret in a traceback."""
    token = f"s3cr3t{character}t0ken"
    with pytest.raises(PyTritonValidationError, match="visible ASCII") as caught:
        TritonSecurityConfig(access_token=token)
    assert "s3cr3t" not in str(caught.value) and "t0ken" not in str(caught.value)


def test_unknown_endpoints_are_named_as_pytriton_names_them_and_triton_takes_the_valid_ones():
    """Scripts match PyTriton 0.7's message: the unknown names, sorted, then every valid one, sorted. Triton
    restricts each name the message offers."""
    with pytest.raises(PyTritonValidationError) as caught:
        TritonSecurityConfig(restricted_endpoints=["statistics", "stats", "infer"])
    message = str(caught.value)
    assert re.fullmatch(r"Invalid endpoint names: infer, stats\. Valid endpoints are: [a-z, -]+", message), (
        message
    )
    valid = message.split("Valid endpoints are: ")[1].split(", ")
    assert valid == sorted(VALID_TRITON_ENDPOINTS)
    config, ports = local_config()
    security = TritonSecurityConfig(access_token="tok3n", restricted_endpoints=valid)
    with Triton(config=config, security_config=security) as triton:
        triton.bind("double", double, X, Y, config=ModelConfig(max_batch_size=4))
        for protocol in ("http", "grpc"):
            with pytest.raises(InferenceServerException):
                infer(protocol, ports[protocol])
            assert not statistics_allowed(protocol, ports, None)
            assert statistics_allowed(protocol, ports, "tok3n")
            headers = create_auth_headers("tok3n", protocol)
            assert infer(protocol, ports[protocol], headers=headers).tolist() == [[4.0]]
        assert http_get(f"http://127.0.0.1:{ports['http']}/v2/health/live")[0] != 200
        assert (
            http_get(
                f"http://127.0.0.1:{ports['http']}/v2/health/live", create_auth_headers("tok3n", "http")
            )[0]
            == 200
        )


def test_a_restriction_of_the_config_applies_beside_the_security_config():
    config, ports = local_config(
        http_restricted_api="metadata:x-key=s3cret", grpc_restricted_protocol="metadata:x-key=s3cret"
    )
    with Triton(config=config):
        assert http_get(f"http://127.0.0.1:{ports['http']}/v2")[0] == 403
        assert http_get(f"http://127.0.0.1:{ports['http']}/v2", {"x-key": "s3cret"})[0] == 200
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        with pytest.raises(InferenceServerException):
            client.get_server_metadata()
        assert client.get_server_metadata(headers={"triton-grpc-protocol-x-key": "s3cret"}).name == "triton"
        client.close()


def test_verbose_logs_are_warned_about(caplog):
    """kubetriton reads Triton's log level through its logging endpoint, which the default security config
    protects, with the access token, and warns when the server starts logging verbosely."""
    config, ports = local_config(log_verbose=2)
    with caplog.at_level(logging.WARNING, logger="pytriton.triton"), Triton(config=config):
        pass
    assert f"Triton at http://127.0.0.1:{ports['http']} logs verbosely (log_verbose_level=2)" in caplog.text
    caplog.clear()
    config, ports = local_config()
    with caplog.at_level(logging.WARNING, logger="pytriton.triton"), Triton(config=config):
        pass
    assert "logs verbosely" not in caplog.text


PLAIN_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(request, "x").as_numpy() for request in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 3)]) for x in inputs]
"""


@pytest.mark.parametrize("local_model_store", [False, True])
def test_a_repository_of_the_users_serves_its_own_models_and_keeps_them(tmp_path, local_model_store):
    """As in PyTriton: the models already in `model_repository` load with Triton, beside the bound ones,
    and stopping removes the bound ones' folders only."""
    plain = tmp_path / "plain"
    (plain / "1").mkdir(parents=True)
    (plain / "1" / "model.py").write_text(PLAIN_MODEL)
    (plain / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    # what a server that did not stop left: a proxy model whose worker is gone; it must not load
    stale = tmp_path / "stale"
    (stale / "1").mkdir(parents=True)
    (stale / "1" / "model.py").write_text(PROXY_MODEL_SOURCE.format(runtime="/gone"))
    (stale / "config.pbtxt").write_text((plain / "config.pbtxt").read_text())
    config, ports = local_config(model_repository=tmp_path)
    lifecycle = TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=local_model_store)
    with Triton(config=config, triton_lifecycle_policy=lifecycle) as triton:
        triton.bind("double", double, X, Y)
        triton.run()
        assert infer("http", ports["http"], "plain").tolist() == [[6.0]]
        assert infer("grpc", ports["grpc"], "double").tolist() == [[4.0]]
        assert not httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}").is_model_ready("stale")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["plain", "stale"]
    assert (plain / "config.pbtxt").is_file()


def fails(requests):
    raise ValueError("the callable's own words")


def test_kubetriton_debug_sends_the_traceback_and_refuses_what_it_cannot_read(monkeypatch):
    monkeypatch.setenv("KUBETRITON_DEBUG", "maybe")
    with pytest.raises(PyTritonValidationError, match="KUBETRITON_DEBUG='maybe': use 1"):
        Triton()
    monkeypatch.setenv("KUBETRITON_DEBUG", "true")
    config, ports = local_config()
    with Triton(config=config) as triton:
        triton.bind("fails", fails, X, Y)
        with pytest.raises(InferenceServerException) as raised:
            infer("http", ports["http"], "fails")
    assert "ValueError: the callable's own words" in str(raised.value)
    assert "Traceback (most recent call last)" in str(raised.value)
