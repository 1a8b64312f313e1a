"""The router's HAProxy configuration, run by a real HAProxy in front of two real tritonservers.

The two servers stand for two pods: each listens on its own loopback address (127.0.0.2, 127.0.0.3) on the
same ports, and a DNS server answers the name of the model's headless Service with the addresses of the
"pods" of the moment, as a cluster's DNS does. Requests go through the router over HTTP and gRPC; each
server's inference statistics say which one served them. Skipped where Debian's haproxy is not installed.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.http
from kubetriton.operator import router
from kubetriton.triton_home import locate

from tests.conftest import free_ports, plain_triton
from tests.operator.names import NameServer

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None, reason="haproxy is not on PATH (Debian's haproxy package)"
)

PODS = "echo-pods.models.svc.cluster.local"
ADDRESSES = ("127.0.0.2", "127.0.0.3")
MODEL = "echo"
ECHO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(request, "x").as_numpy() for request in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]) for x in inputs]
"""
CONFIG = f"""name: "{MODEL}"
backend: "python"
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""


@contextlib.contextmanager
def pod(
    address: str, http: int, grpc: int, workspace: Path
) -> Iterator[tritonclient.http.InferenceServerClient]:
    """A tritonserver serving MODEL on `address` only; a client of it, for its statistics."""
    workspace.mkdir(parents=True)
    with plain_triton(locate(), workspace, address=address, ports=(http, grpc)) as triton:
        triton.add_model(MODEL, ECHO, CONFIG)
        triton.load(MODEL)
        yield triton.control


def served(control: tritonclient.http.InferenceServerClient) -> int:
    (stats,) = control.get_inference_statistics(MODEL)["model_stats"]
    return int(stats["inference_stats"]["success"]["count"])


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s: {what}")
        time.sleep(0.2)


def passing(metrics_port: int) -> dict[str, int]:
    """Each backend's servers whose last health check passed, from HAProxy's Prometheus exporter; none
    while it starts."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    passed = re.findall(
        r'^haproxy_server_check_status\{proxy="([^"]+)",server="[^"]+",state="L[4-7]OK"\} 1',
        text,
        re.MULTILINE,
    )
    return {proxy: passed.count(proxy) for proxy in set(passed)}


def answers(metrics_port: int, path: str) -> int | None:
    """The status HAProxy answers `path` of its metrics port with; None while it does not listen."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def test_haproxy_sends_each_request_to_the_pods_its_name_resolves_to(tmp_path: Path) -> None:
    http, grpc, router_http, router_grpc, router_metrics = free_ports(5)
    ports = router.Ports(router_http, router_grpc, router_metrics, pod_http=http, pod_grpc=grpc)
    data = np.ones(1, np.float32)
    http_input = tritonclient.http.InferInput("x", [1], "FP32")
    http_input.set_data_from_numpy(data)
    grpc_input = tritonclient.grpc.InferInput("x", [1], "FP32")
    grpc_input.set_data_from_numpy(data)
    with contextlib.ExitStack() as stack:
        dns = stack.enter_context(NameServer(PODS))
        first, second = (
            stack.enter_context(pod(address, http, grpc, tmp_path / address)) for address in ADDRESSES
        )
        config = tmp_path / "haproxy.cfg"
        config.write_text(
            router.haproxy_config(PODS, slots=4, ports=ports, nameserver=f"127.0.0.1:{dns.port}")
        )
        log = stack.enter_context((tmp_path / "haproxy.log").open("w"))
        haproxy = subprocess.Popen(
            ["haproxy", "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        stack.callback(haproxy.wait)
        stack.callback(haproxy.terminate)
        client = stack.enter_context(tritonclient.http.InferenceServerClient(f"127.0.0.1:{router_http}"))
        grpc_client = tritonclient.grpc.InferenceServerClient(f"127.0.0.1:{router_grpc}")
        stack.callback(grpc_client.close)

        def both_protocols(times: int) -> None:
            for _ in range(times):
                assert client.infer(MODEL, [http_input]).as_numpy("y").tolist() == [1.0]
                assert grpc_client.infer(MODEL, [grpc_input]).as_numpy("y").tolist() == [1.0]

        one, both = {"pods-http": 1, "pods-grpc": 1}, {"pods-http": 2, "pods-grpc": 2}
        eventually(lambda: answers(router_metrics, router.LIVE_PATH) == 200, "HAProxy alive")
        time.sleep(2)  # the name resolved to nothing, and each backend's first checks came and went
        assert answers(router_metrics, router.READY_PATH) == 503, "not ready while no pod is known"
        assert answers(router_metrics, router.LIVE_PATH) == 200, "alive all the same"

        dns.addresses = [ADDRESSES[0]]
        eventually(lambda: answers(router_metrics, router.READY_PATH) == 200, "ready once a pod is up")
        both_protocols(10)  # at once: a client sent to a router that just turned ready finds the pod
        assert (served(first), served(second)) == (20, 0)

        dns.addresses = list(ADDRESSES)  # a pod joins after the router started, as new pods do
        eventually(lambda: passing(router_metrics) == both, "the pod that joined checked in both backends")
        both_protocols(20)
        assert served(first) + served(second) == 60
        assert served(second) >= 10, "the pod that joined gets its share"

        dns.addresses = [ADDRESSES[0]]
        eventually(lambda: passing(router_metrics) == one, "the pod gone from both backends")
        left = served(second)
        both_protocols(20)
        assert served(second) == left, "a pod that left the name's answer gets no request"
