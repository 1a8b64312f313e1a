"""`kubetriton bootstrap`: prepare the shared workspace so that the stock Triton image can run the proxy
model, and the user's image can run the worker.

The sidecar runs `nvcr.io/nvidia/tritonserver:<tag>-py3` unmodified. Its Python has numpy but not pyzmq,
and not kubetriton. This init step runs from the kubetriton worker image, before the sidecar starts, and
puts into `<workspace>/runtime` the proxy's own modules and pyzmq unpacked from a wheel built for the
sidecar's Python, which differs from the worker's; the generated model.py puts that folder on the stub's
import path.

The worker's image may have Python and NumPy and nothing else. Which Python is not known here, so
`<workspace>/worker-runtime` gets kubetriton's pure-Python packages once and pyzmq for every supported
Python, with the launcher (`kubetriton.launch`) that picks the right one in the worker container.

It also writes the repository token that Triton demands for loading models, and the access token of the
endpoints it protects by default (PyTriton's `TritonSecurityConfig()`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import secrets
import shutil
import time
import zipfile
from pathlib import Path

import kubetriton
import kubetriton.sidecar
import prometheus_client
import pytriton
from kubetriton import podenv
from kubetriton.private_files import make_tree_private, private_folder

SIDECAR_PYTHON = {"24": "3.10", "25": "3.12"}
"""Python of the stock Triton images by release year: 24.xx images are Ubuntu 22.04, 25.xx are 24.04."""
DEFAULT_WHEELS = Path("/opt/kubetriton/wheels")
"""pyzmq wheels in the worker image, for each Python of podenv.WORKER_PYTHONS (the sidecar's among them)."""
ENV_SIDECAR_PYTHON = "KUBETRITON_SIDECAR_PYTHON"
"""Overrides the Python version derived from the image, for a sidecar that is not a stock image."""
ENV_WHEELS = "KUBETRITON_WHEELS"
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


def _runs_on(wheel: Path, python: str) -> bool:
    """Whether a CPython wheel runs on `python`: built for it, or for the stable ABI of an older one."""
    python_tag, abi_tag = wheel.name.split("-")[2:4]
    wanted = tuple(int(part) for part in python.split("."))
    built_for = (int(python_tag[2]), int(python_tag[3:]))
    return (abi_tag == python_tag and built_for == wanted) or (abi_tag == "abi3" and built_for <= wanted)


def pyzmq_wheel(wheels: Path, python: str) -> Path:
    machine = platform.machine()
    candidates = sorted(
        (wheel for wheel in wheels.glob(f"pyzmq-*-cp3*-*{machine}*.whl") if _runs_on(wheel, python)),
        key=lambda wheel: wheel.name.split("-")[3] == "abi3",  # a wheel built for this Python first
    )
    if not candidates:
        raise BootstrapError(
            f"No pyzmq wheel for Python {python} on {machine} in {wheels}; build the worker image from "
            "worker/Dockerfile, or download one with `pip download pyzmq --only-binary=:all: "
            f"--python-version {python} -d {wheels}`"
        )
    return candidates[0]


def install_runtime(runtime: Path, wheels: Path, python: str) -> None:
    """Fill `runtime` with the proxy's modules and pyzmq for the stub's Python: the sidecar's in a pod, the
    one `kubetriton install-triton` provisioned in local mode, where each local server fills its own. The
    folder is for this user alone: Triton imports and runs what it holds."""
    if runtime.exists():
        shutil.rmtree(runtime)
    private_folder(runtime)
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
    make_tree_private(runtime)


def _copy_package(source: Path, target: Path, *, leave_out: tuple[str, ...] = ()) -> None:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", *leave_out))


def install_worker_runtime(runtime: Path, wheels: Path) -> None:
    """Fill `runtime` with what a worker needs in an image that has only Python and NumPy: the launcher,
    the worker side of kubetriton (not its operator), pytriton and prometheus_client in `packages/`, and
    pyzmq for each supported Python in `cp3XX/`. A Python without a wheel here needs its own pyzmq. The
    folder is for this user alone, as `install_runtime`'s."""
    if runtime.exists():
        shutil.rmtree(runtime)
    private_folder(runtime)
    packages = runtime / "packages"
    package = Path(kubetriton.__file__).parent
    _copy_package(package, packages / "kubetriton", leave_out=("operator", "sidecar"))
    _copy_package(Path(kubetriton.sidecar.__file__).parent, packages / "kubetriton" / "sidecar")
    _copy_package(Path(pytriton.__file__).parent, packages / "pytriton")
    _copy_package(Path(prometheus_client.__file__).parent, packages / "prometheus_client")
    shutil.copyfile(package / "launch.py", runtime / podenv.LAUNCHER)
    for python in podenv.WORKER_PYTHONS:
        with contextlib.suppress(BootstrapError), zipfile.ZipFile(pyzmq_wheel(wheels, python)) as wheel:
            wheel.extractall(runtime / f"cp{python.replace('.', '')}")
    make_tree_private(runtime)


def write_token(workspace: Path, name: str) -> None:
    """A new random token in `<workspace>/<name>`, readable by the pod's UID only."""
    descriptor = os.open(workspace / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_urlsafe(32))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workspace",
        type=Path,
        default=Path(os.environ.get(podenv.ENV_WORKSPACE, podenv.WORKSPACE_MOUNT)),
        help=f"the volume shared with the sidecar (default: ${podenv.ENV_WORKSPACE}, else %(default)s)",
    )
    parser.add_argument(
        "--triton-image",
        default=os.environ.get(podenv.ENV_TRITON_IMAGE, podenv.TRITON_IMAGE),
        help="the sidecar's image, whose tag decides which Python the proxy's runtime is for "
        f"(default: ${podenv.ENV_TRITON_IMAGE}, else %(default)s)",
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        default=Path(os.environ.get(ENV_WHEELS, DEFAULT_WHEELS)),
        help=f"the folder of pyzmq wheels for the sidecar's and workers' Pythons (default: ${ENV_WHEELS}, "
        "else %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        python = os.environ.get(ENV_SIDECAR_PYTHON) or sidecar_python(args.triton_image)
        for subdir in (podenv.MODELS_SUBDIR, podenv.SOCKETS_SUBDIR):
            private_folder(args.workspace / subdir)
        install_runtime(args.workspace / podenv.RUNTIME_SUBDIR, args.wheels, python)
        install_worker_runtime(args.workspace / podenv.WORKER_RUNTIME_SUBDIR, args.wheels)
        write_token(args.workspace, podenv.REPOSITORY_TOKEN_FILE)
        write_token(args.workspace, podenv.ACCESS_TOKEN_FILE)
    except BootstrapError as error:
        print(f"kubetriton bootstrap: {error}")
        return 1
    print(
        f"kubetriton bootstrap: the sidecar's runtime for Python {python} and the worker's for Python "
        f"{', '.join(podenv.WORKER_PYTHONS)} ready in {args.workspace} ({time.monotonic() - started:.2f} s)"
    )
    return 0
