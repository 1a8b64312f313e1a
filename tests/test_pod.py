"""The pod that the operator renders, run for real as local processes.

`kubetriton render` produces the pod template for the Identity example. Each container runs its own
command and args with the pod's env; volume mounts become temporary directories, and the pod's fixed
ports free ones (the worker learns Triton's from the contract's port variables), since these processes
share the machine's network:

- `bootstrap` prepares the workspace from the worker's environment;
- `triton` runs its shell command unchanged, with the local Triton standing in for the stock image and a
  Python that has numpy but no pyzmq, so the proxy can only work with the bootstrapped pyzmq;
- `worker` runs a user script written against the PyTriton API, unchanged from local mode.

The test checks the probes, queries over HTTP and gRPC, kills the worker while it serves a request (the
request fails at once) and restarts it (Triton keeps running), kills and restarts Triton (the worker
loads its models again), and stops the pod under load the way Kubernetes does: a stand-in for the
Service sends new connections to another server from the moment the pod stops, clients keep the
connections they have across SIGTERM, and no request of theirs fails.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from kubetriton import podenv
from kubetriton.triton_home import TritonHome, locate
from pytriton.client import DecoupledModelClient, ModelClient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServicePort, consecutive_free_ports, free_ports
from tests.user_images import user_image, worker_image_wheels

REPO = Path(__file__).resolve().parents[1]

WORKER_SCRIPT = """
import time

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


def slow(requests):
    time.sleep(requests[0].parameters.get("seconds", 0.3))
    return [{"y": request["x"]} for request in requests]


def stream(requests):
    for step in range(3):
        time.sleep(0.1)
        yield [{"y": request["x"] + step} for request in requests]


with Triton() as triton:
    time.sleep(2)  # the user's model loads before it is bound: the pod must not be ready yet
    triton.bind(
        model_name="Identity",
        infer_func=lambda requests: requests,
        inputs=[Tensor(dtype=np.float32, shape=(1,))],
        outputs=[Tensor(dtype=np.float32, shape=(1,))],
        config=ModelConfig(max_batch_size=8),
    )
    triton.bind("Slow", slow, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))], config=ModelConfig(max_batch_size=8))
    triton.bind("Cached", lambda requests: requests, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))],
                config=ModelConfig(max_batch_size=8, response_cache=True))
    triton.bind("Stream", stream, [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))],
                config=ModelConfig(batching=False, decoupled=True))
    triton.serve()
"""
DRAIN_SECONDS = 10
"""The pod's drain budget here: long enough for gRPC connections to age out, short enough for a test."""


def tritonserver_shim(directory: Path, home: TritonHome) -> Path:
    """A `tritonserver` on PATH that runs the local installation where the image would run its own, on
    the stub's environment that set-up provisioned: like the image's Python, it has numpy and no pyzmq."""
    environment = home.environment({"PATH": "/usr/bin:/bin"})
    shim = directory / "tritonserver"
    shim.write_text(
        "#!/bin/sh\n"
        f"export LD_LIBRARY_PATH='{environment['LD_LIBRARY_PATH']}'\n"
        f"export PATH='{environment['PATH']}'\n"
        f"exec '{home.executable}' --backend-directory='{home.backends}' "
        f"--cache-directory='{home.path / 'caches'}' \"$@\"\n"
    )
    shim.chmod(0o755)
    return directory


class Pod:
    """The rendered pod's containers as processes, with mounts mapped to temporary directories."""

    def __init__(
        self,
        tmp_path: Path,
        triton_args: Sequence[str] = (),
        script: str = WORKER_SCRIPT,
        models: Sequence[str] = ("Identity",),
        processes: int = 1,
    ) -> None:
        model = yaml.safe_load((REPO / "examples/identity/model.yaml").read_text())
        model["spec"]["models"] = list(models)
        model["spec"]["worker"]["processes"] = processes
        model["spec"]["drainSeconds"] = DRAIN_SECONDS
        model["spec"]["triton"] = {"args": list(triton_args)}
        model_file = tmp_path / "model.yaml"
        model_file.write_text(yaml.safe_dump(model))
        rendered = subprocess.run(
            [sys.executable, "-m", "kubetriton.cli", "render", str(model_file)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        deployment = next(doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "Deployment")
        self.spec = deployment["spec"]["template"]["spec"]
        self.containers = {c["name"]: c for c in self.spec["initContainers"] + self.spec["containers"]}
        self.workspace = tmp_path / "workspace"
        self.shm = Path(tempfile.mkdtemp(prefix="kubetriton-podtest-", dir="/dev/shm"))
        self.workspace.mkdir()
        self.script_dir = tmp_path / "script"
        self.script_dir.mkdir()
        self.script = self.script_dir / "serve.py"
        self.script.write_text(script)
        self.tmp_path = tmp_path
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.health_port = consecutive_free_ports(1 + processes)  # and its worker processes' after it
        self._ports = {
            f"--http-port={podenv.HTTP_PORT}": f"--http-port={self.http_port}",
            f"--grpc-port={podenv.GRPC_PORT}": f"--grpc-port={self.grpc_port}",
            f"--metrics-port={podenv.METRICS_PORT}": f"--metrics-port={self.metrics_port}",
        }
        sidecar = " ".join(self.containers["triton"]["command"])
        assert all(fixed in sidecar for fixed in self._ports), sidecar

    def mapped(self, value: str) -> str:
        """A value of the pod's with its mounts as this test's folders, and its fixed ports as free ones:
        unlike a pod, these processes share the machine's network with other servers."""
        value = value.replace(podenv.WORKSPACE_MOUNT, str(self.workspace))
        value = value.replace(podenv.SCRIPT_MOUNT, str(self.script_dir))
        for fixed, free in self._ports.items():
            value = value.replace(fixed, free)
        return value

    def environment(self, name: str, **extra: str) -> dict[str, str]:
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
        env.update(
            {item["name"]: self.mapped(item["value"]) for item in self.containers[name].get("env", [])}
        )
        if podenv.ENV_HEALTH_PORT in env:  # the worker, told the ports this pod's processes took
            env[podenv.ENV_HEALTH_PORT] = str(self.health_port)
            env[podenv.ENV_TRITON_HTTP_PORT] = str(self.http_port)
            env[podenv.ENV_TRITON_GRPC_PORT] = str(self.grpc_port)
        env.update(extra)
        return env

    def command(self, name: str) -> list[str]:
        container = self.containers[name]
        return [self.mapped(part) for part in container.get("command", []) + container.get("args", [])]

    def start(self, name: str, image_bin: Path | None = None, **extra_env: str) -> subprocess.Popen[bytes]:
        """Run a container's command; `image_bin` holds the image's programs (python3), this test's
        environment stands for the kubetriton worker image otherwise."""
        command = self.command(name)
        if command[0] in ("python3", "kubetriton"):
            command[0] = str((image_bin or Path(sys.executable).parent) / command[0])
        log = (self.tmp_path / f"{name}.log").open("ab")
        process = subprocess.Popen(
            command,
            env=self.environment(name, **extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group per container, as a container's processes die together
        )
        self.processes[name] = process
        return process

    def start_sidecar(self, wheels: Path | None = None) -> subprocess.Popen[bytes]:
        """Run the bootstrap step for the stub's Python that set-up provisioned (numpy, no pyzmq: as in
        the stock image), then the Triton sidecar's command with the local Triton as its tritonserver.
        `wheels` are the pyzmq wheels of the worker image (the stub's only, by default)."""
        home = locate()
        bootstrap = self.start(
            "bootstrap",
            KUBETRITON_SIDECAR_PYTHON=home.stub_python.version,
            KUBETRITON_WHEELS=str(wheels or home.stub_python.wheels),
        )
        assert bootstrap.wait(60) == 0, self.log("bootstrap")
        image_bin = self.tmp_path / "image-bin"
        image_bin.mkdir(exist_ok=True)
        return self.start("triton", PATH=f"{tritonserver_shim(image_bin, home)}:/usr/bin:/bin")

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")

    def probe(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}{path}", timeout=2) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return 0, "unreachable"

    def slow(self, seconds: float) -> np.ndarray:
        """Slow's answer to a request that it works on for `seconds`."""
        client = httpclient.InferenceServerClient(f"127.0.0.1:{self.http_port}", network_timeout=60)
        try:
            tensor = httpclient.InferInput("x", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
            return client.infer("Slow", [tensor], parameters={"seconds": seconds}).as_numpy("y")
        finally:
            client.close()

    def identity(self, protocol: str, value: float) -> np.ndarray:
        module = httpclient if protocol == "http" else grpcclient
        port = self.http_port if protocol == "http" else self.grpc_port
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            tensor = module.InferInput("INPUT_1", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[value]], np.float32))
            return client.infer("Identity", [tensor]).as_numpy("OUTPUT_1")
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM to each container's first process, then, as a container runtime does once that has
        exited, SIGKILL to whatever is left in the container (Python-backend stubs of a Triton that exited
        without unloading its models)."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                process.kill()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


class Load:
    """Clients that query without pause through the Service, each counting its answers and failures."""

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.results: dict[str, list[str]] = {}
        self._running = threading.Event()
        self._running.set()
        one = np.ones((1, 1), np.float32)

        def model_client(url: str) -> Callable[[], None]:
            client = ModelClient(url, "Identity", init_timeout_s=30)
            return lambda: client.infer_batch(one)

        def plain(module: Any, address: str) -> Callable[[], None]:
            client = module.InferenceServerClient(address)
            tensor = module.InferInput("INPUT_1", [1, 1], "FP32")
            tensor.set_data_from_numpy(one)
            return lambda: client.infer("Identity", [tensor])

        stream_client = DecoupledModelClient(grpc_url, "Stream", init_timeout_s=30)

        def streamed() -> None:
            answers = [float(item["y"][0]) for item in stream_client.infer_sample(np.ones(1, np.float32))]
            assert answers == [1.0, 2.0, 3.0], answers

        calls = {
            "ModelClient http": model_client(http_url),
            "ModelClient grpc": model_client(grpc_url),
            "tritonclient grpc": plain(grpcclient, grpc_url.removeprefix("grpc://")),
            "tritonclient http keep-alive": plain(httpclient, http_url.removeprefix("http://")),
            "DecoupledModelClient stream": streamed,
        }
        self._threads = [threading.Thread(target=self._loop, args=item) for item in calls.items()]
        for thread in self._threads:
            thread.start()

    def _loop(self, name: str, call: Callable[[], None]) -> None:
        results = self.results.setdefault(name, [])
        while self._running.is_set():
            try:
                call()
                results.append("ok")
            except Exception as error:  # every failure counts, whatever its type
                results.append(f"{type(error).__name__}: {error}")

    def stop(self) -> dict[str, list[str]]:
        self._running.clear()
        for thread in self._threads:
            thread.join(60)
        return self.results


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def pod(tmp_path) -> Iterator[Pod]:
    running = Pod(tmp_path)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(running.shm, ignore_errors=True)


def test_rendered_pod_serves_probes_restarts_and_drains(pod: Pod, tmp_path: Path):
    home = locate()
    stub_python = home.stub_python
    no_zmq = subprocess.run([str(stub_python.bin_dir / "python"), "-c", "import zmq"], capture_output=True)
    assert no_zmq.returncode != 0, "the sidecar's Python must not have pyzmq of its own"
    sidecar = pod.start_sidecar()
    assert (pod.workspace / "runtime" / "zmq").is_dir()
    shim_dir = tmp_path / "image-bin"

    def sidecar_live() -> bool:
        assert sidecar.poll() is None, pod.log("triton")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{pod.http_port}/v2/health/live", timeout=1
            ) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    wait_for(sidecar_live, 60, "the sidecar's startup probe")

    worker_env = {podenv.ENV_SHM_DIR: str(pod.shm)}
    pod.start("worker", **worker_env)
    wait_for(lambda: pod.probe("/livez")[0] == 200, 30, "worker liveness")
    status, body = pod.probe("/readyz")
    assert status == 503 and "not bound yet" in body, "ready before the model was bound"
    wait_for(lambda: pod.probe("/readyz")[0] == 200, 60, "worker readiness after binding")

    for protocol in ("http", "grpc"):
        assert pod.identity(protocol, 4.5).tolist() == [[4.5]]
    cached = httpclient.InferenceServerClient(f"127.0.0.1:{pod.http_port}")
    wait_for(lambda: cached.is_model_ready("Cached"), 30, "the undeclared model Cached")
    tensor = httpclient.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[2.5]], np.float32))
    for _ in range(3):  # the sidecar's response cache answers the repeats
        assert cached.infer("Cached", [tensor]).as_numpy("y").tolist() == [[2.5]]
    status, metrics = pod.probe("/metrics")
    assert status == 200 and 'kubetriton_requests_total{model="Identity"} 2.0' in metrics
    assert 'kubetriton_requests_total{model="Cached"} 1.0' in metrics

    # Killing the worker: the request in flight and new ones fail fast with a clear error, readiness
    # goes, Triton stays up.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(pod.slow, 30.0)
        wait_for(lambda: 'kubetriton_in_flight{model="Slow"} 1.0' in pod.probe("/metrics")[1], 30, "Slow")
        pod.processes["worker"].kill()
        killed = time.monotonic()
        with pytest.raises(InferenceServerException, match="went away while the request was in flight"):
            in_flight.result(timeout=30)
        assert time.monotonic() - killed < 2
    pod.processes["worker"].wait()
    assert pod.probe("/readyz")[0] != 200
    started = time.monotonic()
    with pytest.raises(InferenceServerException, match="No worker is attached to model 'Identity'"):
        pod.identity("http", 1.0)
    assert time.monotonic() - started < 2
    assert sidecar.poll() is None

    pod.start("worker", **worker_env)
    wait_for(lambda: pod.probe("/readyz")[0] == 200, 60, "readiness after the worker restarted")
    assert pod.identity("grpc", 7.0).tolist() == [[7.0]]
    assert sidecar.poll() is None, "Triton must not restart when the worker does"

    def slow_answers() -> bool:
        try:
            return pod.slow(0.3).tolist() == [[1.0]]
        except InferenceServerException:
            return False

    wait_for(slow_answers, 30, "the second model to be bound again")
    bound_last = 'kubetriton_attached{model="Stream"} 1.0'
    wait_for(lambda: bound_last in pod.probe("/metrics")[1], 30, "the worker to bind all its models again")

    # Killing Triton: the worker stays up and loads its models into the restarted sidecar, which first
    # removes the shared memory that the killed one could not.
    def sidecar_regions() -> set[Path]:
        return set(Path(podenv.SHM_MOUNT).glob(f"{podenv.SIDECAR_SHM_PREFIX}*"))

    killed_regions = sidecar_regions()
    assert killed_regions, "the sidecar's Python backend must name its regions with the pod's prefix"
    os.killpg(sidecar.pid, signal.SIGKILL)
    sidecar.wait()
    assert all(region.exists() for region in killed_regions)
    wait_for(lambda: pod.probe("/readyz")[0] != 200, 10, "readiness to drop with Triton gone")
    assert pod.probe("/livez")[0] == 200, "the worker must outlive a Triton crash"
    sidecar = pod.start("triton", PATH=f"{shim_dir}:/usr/bin:/bin")
    wait_for(sidecar_live, 60, "the restarted sidecar")
    assert not killed_regions & sidecar_regions(), "the killed sidecar's regions must be removed"
    wait_for(lambda: pod.probe("/readyz")[0] == 200, 60, "readiness after Triton restarted")
    for protocol in ("http", "grpc"):
        assert pod.identity(protocol, 3.5).tolist() == [[3.5]]
    wait_for(slow_answers, 30, "the second model to be loaded again")
    wait_for(lambda: cached.is_model_ready("Stream"), 30, "the last model to be loaded again")
    cached.close()
    assert "loading it" in pod.log("worker")

    # Stopping under load. Clients reach the pod through a stand-in for its Service; when the pod stops,
    # new connections go to another server (a local-mode Triton with the same models), while the clients
    # keep their connections to this pod across SIGTERM. The worker serves them until they have moved
    # (gRPC: GOAWAY at the connection's maximum age; ModelClient renews its HTTP connection), then stops
    # Triton and exits after it. No request may fail.
    other = free_ports(3)
    replica = subprocess.Popen(
        [sys.executable, str(pod.script)],
        env={
            **os.environ,
            "PYTRITON_TRITON_CONFIG_HTTP_PORT": str(other[0]),
            "PYTRITON_TRITON_CONFIG_GRPC_PORT": str(other[1]),
            "PYTRITON_TRITON_CONFIG_METRICS_PORT": str(other[2]),
        },
        stdout=(tmp_path / "replica.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    http_service, grpc_service = ServicePort(pod.http_port), ServicePort(pod.grpc_port)
    try:
        replica_http = httpclient.InferenceServerClient(f"127.0.0.1:{other[0]}")
        wait_for(lambda: _ready(replica_http, "Stream"), 90, "the other replica")
        load = Load(f"http://127.0.0.1:{http_service.port}", f"grpc://127.0.0.1:{grpc_service.port}")
        time.sleep(2)
        http_service.backend, grpc_service.backend = other[0], other[1]  # the pod left the endpoints
        this_pod = {http_service: pod.http_port, grpc_service: pod.grpc_port}
        served_before = {service: service.sent_to(port) for service, port in this_pod.items()}
        pod.processes["worker"].send_signal(signal.SIGTERM)  # after preStop, as the kubelet does
        wait_for(lambda: pod.probe("/readyz")[0] != 200, 5, "readiness to drop on SIGTERM")
        assert pod.processes["worker"].wait(DRAIN_SECONDS + 30) == 0, pod.log("worker")
        sidecar_stopped = sidecar.poll() is not None
        time.sleep(1)
        results = load.stop()
    finally:
        http_service.close()
        grpc_service.close()
        replica.send_signal(signal.SIGTERM)
        replica.wait(60)
    assert all(service.sent_to(port) > served_before[service] for service, port in this_pod.items()), (
        "the clients must have stayed connected to the stopping pod across SIGTERM"
    )
    assert http_service.sent_to(other[0]) and grpc_service.sent_to(other[1]), "no client moved on"
    for name, outcomes in results.items():
        failures = [outcome for outcome in outcomes if outcome != "ok"]
        assert outcomes.count("ok") > 0, f"{name}: nothing answered"
        if name == "tritonclient http keep-alive":
            # Triton cannot end an HTTP/1.1 connection between two requests: a client that never renews
            # its connection loses it when Triton stops, and with it the request it was sending then.
            assert all("No worker is attached" not in failure for failure in failures), failures
            assert len(failures) <= 1, failures
        else:
            assert not failures, f"{name}: {len(failures)} of {len(outcomes)} failed: {failures[:3]}"
    assert sidecar_stopped, "the worker must stop Triton before it exits"
    # Only the plain keep-alive HTTP client never leaves: the worker waits for it up to the drain budget.
    left = f"1 client connection(s) still open after the {DRAIN_SECONDS:g} s drain budget"
    assert left in pod.log("worker")


def _ready(client: httpclient.InferenceServerClient, model: str) -> bool:
    try:
        return client.is_model_ready(model)
    except Exception:  # the server is still starting
        return False


USER_IMAGE_SCRIPT = """
import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

from helper import scale


@batch
def numpy_version(x):
    version = np.array([np.__version__.encode()], dtype=object)
    return {"y": scale(x), "numpy": np.tile(version, (len(x), 1))}


def count(requests):
    for step in range(3):
        yield [{"y": request["x"] + step} for request in requests]


with Triton() as triton:
    x, y = Tensor(name="x", dtype=np.float32, shape=(1,)), Tensor(name="y", dtype=np.float32, shape=(1,))
    triton.bind("Version", numpy_version, [x], [y, Tensor(name="numpy", dtype=bytes, shape=(1,))],
                config=ModelConfig(max_batch_size=8))
    triton.bind("Count", count, [x], [y], config=ModelConfig(batching=False, decoupled=True))
    triton.serve()
"""


@pytest.mark.parametrize(("version", "numpy"), [("3.10", "numpy<2"), ("3.13", "numpy>=2")])
def test_script_from_a_config_map_serves_from_an_image_with_only_python_and_numpy(version, numpy, tmp_path):
    """The worker image is a Python with NumPy and nothing else: the init step provides kubetriton and the
    launcher runs the script (and its sibling module) from the ConfigMap's mount."""
    image_bin = user_image(version, numpy)
    user_numpy = subprocess.run(
        [str(image_bin / "python3"), "-c", "import numpy; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pod = Pod(tmp_path, script=USER_IMAGE_SCRIPT, models=("Version", "Count"))
    (pod.script_dir / "helper.py").write_text("def scale(x):\n    return x * 2\n")
    try:
        pod.start_sidecar(worker_image_wheels())
        worker = pod.start("worker", image_bin, **{podenv.ENV_SHM_DIR: str(pod.shm)})
        wait_for(lambda: worker.poll() is None and pod.probe("/readyz")[0] == 200, 90, "worker readiness")
        for module, port in ((httpclient, pod.http_port), (grpcclient, pod.grpc_port)):
            client = module.InferenceServerClient(f"127.0.0.1:{port}")
            tensor = module.InferInput("x", [2, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[1.5], [2.0]], np.float32))
            result = client.infer("Version", [tensor])
            assert result.as_numpy("y").tolist() == [[3.0], [4.0]]
            assert result.as_numpy("numpy").tolist() == [[user_numpy.encode()]] * 2
            client.close()
        with DecoupledModelClient(f"grpc://127.0.0.1:{pod.grpc_port}", "Count") as client:
            answers = [float(item["y"][0]) for item in client.infer_sample(np.ones(1, np.float32))]
        assert answers == [1.0, 2.0, 3.0]
        assert worker.poll() is None, pod.log("worker")
    finally:
        pod.stop()
        shutil.rmtree(pod.shm, ignore_errors=True)


def test_a_declared_model_the_script_does_not_bind_ends_the_worker_naming_what_it_binds(tmp_path):
    """spec.models names a model the script never binds: once the script serves, the worker exits with its
    own status and says which model is missing and which the script bound (the operator reads both)."""
    pod = Pod(tmp_path, models=("Identity", "Other"))
    try:
        pod.start_sidecar()
        worker = pod.start("worker", **{podenv.ENV_SHM_DIR: str(pod.shm)})
        assert worker.wait(120) == podenv.MODEL_NOT_BOUND_EXIT_CODE, pod.log("worker")
        said = (
            "spec.models declares Other, which the script does not bind before serve() "
            "(it binds Cached, Identity, Slow, Stream)"
        )
        assert said in pod.log("worker")
        assert pod.processes["triton"].poll() is None, "the sidecar keeps running for the restarted worker"
    finally:
        pod.stop()
        shutil.rmtree(pod.shm, ignore_errors=True)
