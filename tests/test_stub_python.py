"""The environment Triton's Python-backend stub runs on in local mode, provisioned by set-up.

The stub runs on kubetriton's environment (NumPy 1.x, pyzmq from the runtime folder), never the
worker's.
"""

from __future__ import annotations

import subprocess

import pytest
from kubetriton.stub_python import (
    PYTHON_VERSIONS,
    StubPython,
    StubPythonError,
    choose_interpreter,
)
from kubetriton.triton_home import TritonNotFoundError, find_server, locate, stub_versions


def run_python(stub_python: StubPython, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(stub_python.bin_dir / "python3"), "-c", code], capture_output=True, text=True, check=False
    )


def test_the_provisioned_environment_has_numpy_1_and_a_pyzmq_wheel_for_its_python():
    stub_python = locate().stub_python
    assert stub_python.version in PYTHON_VERSIONS
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
