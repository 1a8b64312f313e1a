"""The worker runtime that `kubetriton bootstrap` provides, run by real interpreters of each supported
Python that have NumPy and nothing of kubetriton, as users' own images have."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubetriton import launch, podenv

from tests.user_images import user_image, worker_image_wheels

REPO = Path(__file__).resolve().parents[1]

PROBE_SCRIPT = """
import json, sys

import numpy
import zmq
import kubetriton, pytriton.triton
from pytriton.decorators import batch

import helper

print(json.dumps({
    "argv": sys.argv,
    "numpy": [numpy.__version__, numpy.__file__],
    "zmq": zmq.__file__,
    "kubetriton": kubetriton.__file__,
    "helper": helper.ANSWER,
}))
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    workspace = tmp_path_factory.mktemp("workspace")
    subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "bootstrap", "--workspace", str(workspace)],
        env={"KUBETRITON_WHEELS": str(worker_image_wheels()), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
    )
    return workspace


@pytest.fixture
def script(tmp_path) -> Path:
    (tmp_path / "helper.py").write_text("ANSWER = 42\n")
    entrypoint = tmp_path / "serve.py"
    entrypoint.write_text(PROBE_SCRIPT)
    return entrypoint


def launch_script(python: Path, workspace: Path, script: Path) -> subprocess.CompletedProcess[str]:
    launcher = workspace / podenv.WORKER_RUNTIME_SUBDIR / podenv.LAUNCHER
    return subprocess.run(
        [str(python), str(launcher), str(script), "--flag"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{python.parent}:/usr/bin:/bin"},
    )


@pytest.mark.parametrize(
    ("version", "numpy"),
    [("3.10", "numpy<2"), ("3.11", "numpy<2"), ("3.12", "numpy>=2"), ("3.13", "numpy>=2")],
)
def test_an_image_with_only_python_and_numpy_runs_the_script(version, numpy, workspace, script):
    python = user_image(version, numpy) / "python3"
    result = launch_script(python, workspace, script)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    runtime = workspace / podenv.WORKER_RUNTIME_SUBDIR
    assert seen["argv"] == [str(script), "--flag"]
    assert seen["helper"] == 42, "the script's folder must be importable, as with `python3 SCRIPT`"
    assert Path(seen["numpy"][1]).is_relative_to(python.parent.parent), "the image's NumPy must be used"
    assert int(seen["numpy"][0].split(".")[0]) == (1 if numpy == "numpy<2" else 2)
    assert Path(seen["zmq"]).is_relative_to(runtime / f"cp{version.replace('.', '')}")
    assert Path(seen["kubetriton"]).is_relative_to(runtime / "packages")


def test_an_image_with_kubetriton_keeps_its_own(workspace, script):
    result = launch_script(Path(sys.executable), workspace, script)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert Path(seen["kubetriton"]).is_relative_to(REPO), seen["kubetriton"]
    assert not Path(seen["zmq"]).is_relative_to(workspace), "the image's own pyzmq must win"


@pytest.mark.parametrize(
    ("version", "numpy", "reason"),
    [
        ("3.9", None, "its python3 is CPython 3.9."),
        ("3.12", None, "its Python 3.12 has no NumPy; install numpy in the image"),
    ],
)
def test_an_image_that_cannot_work_is_refused_in_one_line(version, numpy, reason, workspace, script):
    termination_log = Path(launch.TERMINATION_LOG)
    outside_a_pod = not termination_log.exists()
    result = launch_script(user_image(version, numpy) / "python3", workspace, script)
    if outside_a_pod:
        assert not termination_log.exists(), "only the kubelet's termination-message file is written"
    assert result.returncode == podenv.UNSUPPORTED_IMAGE_EXIT_CODE
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("The worker image cannot run kubetriton: ") and reason in lines[0]
    assert result.stdout == ""


def test_sigterm_ends_a_script_that_is_still_loading(workspace, tmp_path):
    """In a container the launcher is PID 1, which ignores SIGTERM by default: a script stopped while it
    loads, before `Triton().serve()`, would keep its pod for the whole grace period."""
    script = tmp_path / "loading.py"
    script.write_text(
        "import time\ntry:\n    print('loading', flush=True)\n    time.sleep(60)\n"
        "finally:\n    print('cleaned up', flush=True)\n"
    )
    launcher = workspace / podenv.WORKER_RUNTIME_SUBDIR / podenv.LAUNCHER
    process = subprocess.Popen(
        [sys.executable, str(launcher), str(script)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "loading\n"
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == 128 + signal.SIGTERM
    assert process.stdout.read() == "cleaned up\n", "the script's finally clauses run"


def test_the_launcher_and_the_pod_contract_agree():
    assert launch.UNSUPPORTED_IMAGE_EXIT_CODE == podenv.UNSUPPORTED_IMAGE_EXIT_CODE
    assert launch.CONFIGURATION_ERROR_EXIT_CODE == podenv.CONFIGURATION_ERROR_EXIT_CODE
    assert tuple(error.__name__ for error in podenv.CONFIGURATION_ERRORS) == launch.CONFIGURATION_ERRORS
    assert launch.EXEC == podenv.LAUNCHER_EXEC
    assert launch.LOCAL == podenv.LAUNCHER_LOCAL
    assert (launch.PROCESS_COUNT, launch.PROCESS_INDEX) == (
        podenv.ENV_PROCESS_COUNT,
        podenv.ENV_PROCESS_INDEX,
    )
    assert [f"{major}.{minor}" for major, minor in launch.SUPPORTED] == [
        podenv.WORKER_PYTHONS[0],
        podenv.WORKER_PYTHONS[-1],
    ]
