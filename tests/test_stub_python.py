"""The environment Triton's Python-backend stub runs on in local mode, provisioned by set-up.

The stub runs on kubetriton's environment (NumPy 1.x, pyzmq from the runtime folder), never the
worker's. A stub that meets a NumPy it cannot exchange tensors with refuses to load the proxy model,
shown against a real tritonserver whose stub is given an environment with NumPy 2.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from kubetriton.model_repository import ModelSpec, write_model
from kubetriton.podenv import RUNTIME_SUBDIR
from kubetriton.sidecar.bootstrap import install_runtime
from kubetriton.stub_python import (
    PYTHON_VERSIONS,
    StubPython,
    StubPythonError,
    choose_interpreter,
    create,
    describe,
)
from kubetriton.triton_home import (
    STUB_NAME,
    STUBS_BY_VERSION,
    TritonHome,
    TritonNotFoundError,
    find_server,
    locate,
    stub_versions,
)
from kubetriton.worker import TransportSettings
from pytriton.model_config import ModelConfig, Tensor
from tritonclient.utils import InferenceServerException

from tests.conftest import plain_triton

REPO = Path(__file__).resolve().parents[1]
NUMPY2_STUB_PYTHON = REPO / ".venv" / "stub-python-numpy2"
"""Kept between runs, as the test venv is: an environment like the provisioned one, with NumPy 2."""
PLAIN_DOUBLER = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(request, "x").as_numpy() for request in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2)]) for x in inputs]
"""
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }} ]
"""


def run_python(stub_python: StubPython, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(stub_python.bin_dir / "python3"), "-c", code], capture_output=True, text=True, check=False
    )


def test_the_provisioned_environment_has_numpy_1_a_pyzmq_wheel_and_the_stub_for_its_python():
    home = locate()
    stub_python = home.stub_python
    assert stub_python.version in PYTHON_VERSIONS
    stub = (home.backends / "python" / STUB_NAME).resolve()
    assert stub == home.path / STUBS_BY_VERSION / stub_python.version / STUB_NAME
    assert home.backends.is_relative_to(stub_python.path), "the wheel's shared backend directory is not used"
    numpy_version = run_python(stub_python, "import numpy; print(numpy.__version__)")
    assert numpy_version.stdout.startswith("1."), numpy_version
    assert list(stub_python.wheels.glob(f"pyzmq-*-cp{stub_python.version.replace('.', '')}-*.whl"))
    assert (stub_python.library_dir / f"libpython{stub_python.version}.so.1.0").is_file()


def test_local_mode_without_a_provisioned_environment_says_how_to_get_one(monkeypatch, tmp_path):
    server, _ = find_server()
    monkeypatch.setenv("KUBETRITON_TRITON_HOME", str(server))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(TritonNotFoundError, match=r"Run `kubetriton install-triton`"):
        locate()


def test_an_interpreter_the_stub_cannot_embed_is_refused_with_what_to_install(tmp_path):
    versions = stub_versions(find_server()[0])
    with pytest.raises(StubPythonError, match=r"does not run.*--stub-python"):
        choose_interpreter(versions, str(tmp_path / "python3.12"))
    chosen = choose_interpreter(versions, str(locate().stub_python.bin_dir / "python3"))
    assert chosen.version in PYTHON_VERSIONS


def test_an_interpreter_whose_library_folder_cannot_be_looked_at_has_no_shared_libpython(tmp_path):
    """An interpreter copied from elsewhere reports the library folder it was built for, which this user
    may not read: it is one the stub cannot embed, not a crash of install-triton. (A name too long for the
    file system stands in for a folder root alone may read: both make the look raise.)"""
    python = tmp_path / "python3"
    facts = '{"version": "3.12", "implementation": "cpython", "library_dir": "/%s"}' % ("x" * 300)
    python.write_text(f"#!/bin/sh\necho '{facts}'\n")
    python.chmod(0o755)
    interpreter = describe(str(python))
    assert interpreter is not None and not interpreter.shared_libpython


@pytest.fixture(scope="module")
def numpy2_home() -> TritonHome:
    """The local Triton, its stub given an environment with NumPy 2 instead of the provisioned one."""
    home = locate()
    stub_python = StubPython.load(NUMPY2_STUB_PYTHON)
    if stub_python is None:
        interpreter = describe(str(home.stub_python.bin_dir / "python3"))
        assert interpreter is not None
        stub_python = create(NUMPY2_STUB_PYTHON, interpreter, numpy_requirement="numpy>=2")
    assert run_python(stub_python, "import numpy; print(numpy.__version__)").stdout.startswith("2.")
    return dataclasses.replace(home, stub_python=stub_python)


def test_a_stub_built_for_numpy_1_refuses_to_load_the_proxy_under_numpy_2(numpy2_home, tmp_path):
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    tensor = httpclient.InferInput("x", [1, 3], "FP32")
    tensor.set_data_from_numpy(x)
    with plain_triton(numpy2_home, tmp_path) as triton:
        # Why the proxy refuses: a plain model on this stub loads, reports READY and answers wrongly.
        triton.add_model("plain", PLAIN_DOUBLER, CONFIG.format(name="plain"))
        triton.load("plain")
        assert triton.control.is_model_ready("plain")
        answer = triton.control.infer("plain", [tensor]).get_output("y")
        assert answer["shape"] == [1, 3] and answer["parameters"]["binary_data_size"] == 0, answer

        runtime = tmp_path / RUNTIME_SUBDIR
        stub_python = numpy2_home.stub_python
        install_runtime(runtime, stub_python.wheels, stub_python.version)
        spec = ModelSpec(
            "proxied",
            (Tensor(name="x", shape=(3,), dtype=np.float32),),
            (Tensor(name="y", shape=(3,), dtype=np.float32),),
            ModelConfig(max_batch_size=4),
            instances=1,
        )
        transport = TransportSettings(tmp_path / "sockets", tmp_path / "arenas", 1024 * 1024)
        write_model(triton.repository, spec, transport.model_parameters("proxied", spec.instances), runtime)
        with pytest.raises(
            InferenceServerException,
            match=r"stub was built for NumPy 1\.x and cannot exchange tensors with NumPy 2\.",
        ):
            triton.load("proxied")
        assert not triton.control.is_model_ready("proxied")
