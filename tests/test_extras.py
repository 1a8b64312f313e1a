"""What `pip install kubetriton` brings, and what its extras do: serving a callable, locally and in a pod,
imports nothing beyond the base requirements, and a feature whose extra is missing says which one to
install. The code runs as in a base install (`tests/base_install.py`), against a real tritonserver."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kubetriton.extras import MissingExtraError, needed

from tests.test_seeds import SeedServer

REPO = Path(__file__).resolve().parents[1]
MODEL_YAML = REPO / "examples" / "identity" / "model.yaml"


def readme_quickstart() -> str:
    """The README's first code block, a script that serves a model until it is stopped."""
    return re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)


def base_install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "tests" / "base_install.py"), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_base_install_refuses_what_only_the_extras_bring():
    """The stand-in for a base install is strict: it would let no serving import of an extra through."""
    for module in ("tritonclient", "grpc", "google.protobuf", "kopf", "kubernetes", "pydantic", "yaml"):
        refused = base_install("-c", f"import {module}")
        assert f"No module named '{module.partition('.')[0]}'" in refused.stderr, refused.stderr


def test_the_readme_quickstart_serves_with_the_base_requirements_only(tmp_path: Path):
    prelude = f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\nimport base_install\n"
    server = SeedServer(prelude + "base_install.activate()\n" + readme_quickstart(), tmp_path, sys.executable)
    try:
        server.wait_ready("Lengths")
        sequences = np.array([[b"abc"], [b"de"]], dtype=object)
        for protocol in ("http", "grpc"):
            lengths = server.infer(protocol, "Lengths", {"sequences": sequences}, "lengths")
            assert lengths.tolist() == [[3.0], [2.0]]
    finally:
        assert server.stop() == 0


def test_the_worker_side_of_a_pod_imports_with_the_base_requirements_only():
    imported = base_install("-c", "import kubetriton.launch, kubetriton.worker, pytriton.triton")
    assert imported.returncode == 0, imported.stderr


@pytest.mark.parametrize("command", ["install-triton", "bootstrap"])
def test_the_commands_of_a_machine_that_serves_need_no_extra(command: str):
    helped = base_install("-m", "kubetriton.cli", command, "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith(f"usage: kubetriton {command}")


def test_the_version_is_the_distributions():
    shown = subprocess.run(
        [sys.executable, "-m", "kubetriton.cli", "--version"], capture_output=True, text=True
    )
    assert (shown.returncode, shown.stdout) == (0, f"kubetriton {importlib.metadata.version('kubetriton')}\n")
    without_a_distribution = base_install("-m", "kubetriton.cli", "--version")
    assert without_a_distribution.returncode == 0, without_a_distribution.stderr


@pytest.mark.parametrize(
    "code",
    [
        "from pytriton.client import ModelClient",
        "import pytriton.client; pytriton.client.AsyncioModelClient",
        "import pytriton.check.add_sub",
        "from kubetriton.control import TritonControl; TritonControl('grpc://127.0.0.1:1').is_live()",
    ],
)
def test_the_client_without_its_extra_names_it(code: str):
    refused = base_install("-c", code)
    assert refused.returncode != 0
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("kubetriton.extras.MissingExtraError: "), refused.stderr
    assert last.endswith(
        "needs tritonclient, which kubetriton's client extra installs: pip install 'kubetriton[client]'"
    )


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("render", ["--help"]),
        ("deploy", ["--help"]),
        ("status", ["--help"]),
        ("delete", ["--help"]),
        ("operator", []),  # its --help needs no extra: it parses its options before importing kopf
    ],
)
def test_a_cluster_command_without_its_extra_names_it(command: str, args: list[str]):
    refused = base_install("-m", "kubetriton.cli", command, *args)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr.startswith(f"error: kubetriton {command} needs "), refused.stderr
    assert refused.stderr.endswith(
        ", which kubetriton's cluster extra installs: pip install 'kubetriton[cluster]'\n"
    )


def test_the_cluster_commands_need_the_base_requirements_and_the_cluster_extra_only(tmp_path: Path):
    """What the operator image has: `kubetriton[cluster]`."""
    rendered = base_install("--with", "cluster", "-m", "kubetriton.cli", "render", str(MODEL_YAML))
    assert rendered.returncode == 0, rendered.stderr
    assert "kind: Deployment" in rendered.stdout
    script = REPO / "examples" / "identity" / "serve.py"
    deploy = ["deploy", str(script), "--image", "worker:1", "--dry-run=client", "-o", "yaml"]
    planned = base_install("--with", "cluster", "-m", "kubetriton.cli", *deploy)
    assert planned.returncode == 0, planned.stderr
    assert "kind: PyTritonModel" in planned.stdout
    started = base_install("--with", "cluster", "-c", "from kubetriton.operator import runtime, main")
    assert started.returncode == 0, started.stderr


def test_a_missing_module_of_kubetriton_itself_is_not_blamed_on_an_extra():
    with pytest.raises(ModuleNotFoundError) as raised, needed("client", "a feature"):
        import kubetriton.no_such_module  # noqa: F401
    assert not isinstance(raised.value, MissingExtraError)
