"""`kubetriton bootstrap`: prepare the shared workspace so the stock Triton image can run the proxy model.

The sidecar runs `nvcr.io/nvidia/tritonserver:<tag>-py3` unmodified. Its Python has numpy but not pyzmq,
and not kubetriton. This init step runs from the worker image, before the sidecar starts, and puts into
`<workspace>/runtime` the proxy's own modules and pyzmq unpacked from a wheel built for the sidecar's
Python, which differs from the worker's; the generated model.py puts that folder on the stub's import
path. It also writes the repository token that Triton demands for loading models, and the access token of
the endpoints it protects by default (PyTriton's `TritonSecurityConfig()`).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import secrets
import shutil
import zipfile
from pathlib import Path

import kubetriton
import kubetriton.sidecar
from kubetriton import podenv

SIDECAR_PYTHON = {"24": "3.10", "25": "3.12"}
"""Python of the stock Triton images by release year: 24.xx images are Ubuntu 22.04, 25.xx are 24.04."""
DEFAULT_WHEELS = Path("/opt/kubetriton/sidecar-wheels")
ENV_SIDECAR_PYTHON = "KUBETRITON_SIDECAR_PYTHON"
"""Overrides the Python version derived from the image, for a sidecar that is not a stock image."""
ENV_SIDECAR_WHEELS = "KUBETRITON_SIDECAR_WHEELS"
PROXY_MODULES = ("__init__.py", "transport.py", "sidecar/__init__.py", "sidecar/proxy_model.py")


class BootstrapError(RuntimeError):
    """The sidecar cannot be prepared; the message says what is missing."""


def sidecar_python(image: str) -> str:
    """The Python version inside a stock Triton image, from its `<yy>.<mm>-py3` tag."""
    match = re.search(r":(\d{2})\.(\d{2})-py3(?:-[\w.-]+)?$", image)
    if not match or match.group(1) not in SIDECAR_PYTHON:
        supported = ", ".join(f"{year}.xx-py3" for year in sorted(SIDECAR_PYTHON))
        raise BootstrapError(f"Unsupported Triton image {image!r}: supported tags are {supported}")
    return SIDECAR_PYTHON[match.group(1)]


def pyzmq_wheel(wheels: Path, python: str) -> Path:
    tag = "cp" + python.replace(".", "")
    machine = platform.machine()
    candidates = sorted(wheels.glob(f"pyzmq-*-{tag}-*{machine}*.whl"))
    if not candidates:
        raise BootstrapError(
            f"No pyzmq wheel for Python {python} on {machine} in {wheels}; build the worker image from "
            "worker/Dockerfile, or download one with `pip download pyzmq --only-binary=:all: "
            f"--python-version {python} -d {wheels}`"
        )
    return candidates[-1]


def install_runtime(runtime: Path, wheels: Path, python: str) -> None:
    """Fill `runtime` with the proxy's modules and pyzmq for the stub's Python: the sidecar's in a pod, the
    one `kubetriton install-triton` provisioned in local mode, where each local server fills its own."""
    if runtime.exists():
        shutil.rmtree(runtime)
    package = Path(kubetriton.__file__).parent
    sidecar = Path(kubetriton.sidecar.__file__).parent
    for module in PROXY_MODULES:
        source = (
            sidecar / module.removeprefix("sidecar/") if module.startswith("sidecar/") else package / module
        )
        target = runtime / "kubetriton" / module
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    with zipfile.ZipFile(pyzmq_wheel(wheels, python)) as wheel:
        wheel.extractall(runtime)


def write_token(workspace: Path, name: str) -> None:
    """A new random token in `<workspace>/<name>`, readable by the pod's UID only."""
    descriptor = os.open(workspace / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_urlsafe(32))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workspace", type=Path, default=Path(os.environ.get(podenv.ENV_WORKSPACE, podenv.WORKSPACE_MOUNT))
    )
    parser.add_argument(
        "--triton-image", default=os.environ.get(podenv.ENV_TRITON_IMAGE, podenv.TRITON_IMAGE)
    )
    parser.add_argument(
        "--wheels", type=Path, default=Path(os.environ.get(ENV_SIDECAR_WHEELS, DEFAULT_WHEELS))
    )


def run(args: argparse.Namespace) -> int:
    try:
        python = os.environ.get(ENV_SIDECAR_PYTHON) or sidecar_python(args.triton_image)
        for subdir in (podenv.MODELS_SUBDIR, podenv.SOCKETS_SUBDIR):
            (args.workspace / subdir).mkdir(parents=True, exist_ok=True)
        install_runtime(args.workspace / podenv.RUNTIME_SUBDIR, args.wheels, python)
        write_token(args.workspace, podenv.REPOSITORY_TOKEN_FILE)
        write_token(args.workspace, podenv.ACCESS_TOKEN_FILE)
    except BootstrapError as error:
        print(f"kubetriton bootstrap: {error}")
        return 1
    print(
        f"kubetriton bootstrap: runtime for Python {python} ready in {args.workspace / podenv.RUNTIME_SUBDIR}"
    )
    return 0
