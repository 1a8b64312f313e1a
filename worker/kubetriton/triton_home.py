"""Where the tritonserver that local mode runs comes from, what its Python-backend stub runs on, and how
set-up installs both.

Local mode needs a real `tritonserver` with the Python backend. Inside an NVIDIA Triton container it is
`/opt/tritonserver`. Elsewhere it is the server shipped inside the `nvidia-pytriton` wheel, installed
with `--no-deps --target` into a private directory so that the wheel's own `pytriton` package can never
shadow ours: only its Triton files are kept. A locator finds a server in this order: an explicit
setting (argument or `KUBETRITON_TRITON_HOME`), `/opt/tritonserver`, then the private copy.

The stub runs on the environment that `kubetriton.stub_python` provisions beside the private copy, never
on the worker's interpreter. The wheel ships one stub per CPython version; the one for that environment's
Python goes into a backend directory of the environment's own, because the wheel's `backends/python/` is
shared by every process on the machine that uses this Triton (other users, other checkouts, whose stubs
may be for other Pythons): swapping the stub there would pull it from under a running server.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kubetriton.podenv import TRITON_VERSION
from kubetriton.stub_python import ENV_STUB_PYTHON, StubPython, StubPythonError, provision

WHEEL_REQUIREMENT = "nvidia-pytriton==0.7.0"
"""The wheel that ships tritonserver 2.51 (the same version as the pinned sidecar image)."""
ENV_TRITON_HOME = "KUBETRITON_TRITON_HOME"
CONTAINER_HOME = Path("/opt/tritonserver")
STUB_NAME = "triton_python_backend_stub"
STUBS_BY_VERSION = "python_backend_stubs"
"""In the wheel's server: one stub per CPython version, `python_backend_stubs/3.X/`."""
PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
"""What the Python backend is made of besides its stub."""


class TritonNotFoundError(RuntimeError):
    """No tritonserver could be found; the message says how to get one."""


def private_root() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kubetriton" / f"tritonserver-{TRITON_VERSION}"


def stub_python_path() -> Path:
    return private_root() / "stub-python"


@dataclass(frozen=True)
class TritonHome:
    """A Triton installation (`bin/tritonserver`, `backends/python/`, the libraries it needs) and the
    environment its Python-backend stub runs on."""

    path: Path
    backends: Path
    stub_python: StubPython
    library_dirs: tuple[Path, ...] = ()

    @property
    def executable(self) -> Path:
        return self.path / "bin" / "tritonserver"

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment tritonserver needs to run its Python-backend stubs on the stub's Python.

        The stub links `libpython3.X.so`: that Python's library directory goes first so that the stub does
        not pick up another libpython of the same version (a system one, older than the standard library it
        would then run). The stub embeds the first `python3` on PATH, and with it that environment's
        site-packages, so the environment's bin directory goes first on PATH.
        """
        env = dict(os.environ if base is None else base)
        libdirs = [str(self.stub_python.library_dir), *(str(d) for d in self.library_dirs)]
        if env.get("LD_LIBRARY_PATH"):
            libdirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libdirs)
        env["PATH"] = os.pathsep.join([str(self.stub_python.bin_dir), env.get("PATH", "")])
        return env


def find_server(explicit: str | os.PathLike[str] | None = None) -> tuple[Path, tuple[Path, ...]]:
    """The Triton installation local mode uses, in order: explicit, container, private copy; with the
    library directories it needs."""
    explicit = explicit or os.environ.get(ENV_TRITON_HOME)
    if explicit:
        if not (Path(explicit) / "bin" / "tritonserver").is_file():
            raise TritonNotFoundError(f"{ENV_TRITON_HOME}={explicit} holds no bin/tritonserver")
        return Path(explicit), ()
    if (CONTAINER_HOME / "bin" / "tritonserver").is_file():
        return CONTAINER_HOME, ()
    root = private_root()
    if (root / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file():
        return root / "pytriton" / "tritonserver", (root / "nvidia_pytriton.libs",)
    raise TritonNotFoundError(
        "No tritonserver found. Run `kubetriton install-triton` (installs Triton "
        f"{TRITON_VERSION} into {root}), set {ENV_TRITON_HOME} to a Triton installation, "
        "or run inside an nvcr.io/nvidia/tritonserver container."
    )


def stub_versions(server: Path) -> tuple[str, ...]:
    """The CPython versions the server has a Python-backend stub for: one per folder of the wheel's
    server, otherwise the one its installed stub links."""
    if (server / STUBS_BY_VERSION).is_dir():
        return tuple(sorted(stub.parent.name for stub in (server / STUBS_BY_VERSION).glob(f"*/{STUB_NAME}")))
    try:
        linked = re.search(
            rb"libpython(3\.\d+)\.so", (server / "backends" / "python" / STUB_NAME).read_bytes()
        )
    except FileNotFoundError:
        return ()
    return (linked.group(1).decode(),) if linked else ()


def locate(explicit: str | os.PathLike[str] | None = None) -> TritonHome:
    """The Triton installation local mode uses, with the environment provisioned for its stub."""
    server, library_dirs = find_server(explicit)
    stub_python = StubPython.load(stub_python_path())
    if stub_python is None:
        raise TritonNotFoundError(
            "No environment is provisioned for Triton's Python-backend stub. Run `kubetriton install-triton`."
        )
    versions = stub_versions(server)
    if stub_python.version not in versions:
        raise TritonNotFoundError(
            f"The stub's environment in {stub_python.path} has Python {stub_python.version}, but {server} "
            f"has Python-backend stubs for {', '.join(versions) or 'no Python'} only. Run "
            "`kubetriton install-triton` to provision one that fits."
        )
    backends = stub_python.path / "backends" if (server / STUBS_BY_VERSION).is_dir() else server / "backends"
    if not (backends / "python" / STUB_NAME).is_file():
        raise TritonNotFoundError(
            f"{backends} holds no Python backend for the stub's environment. Run `kubetriton install-triton`."
        )
    return TritonHome(server, backends, stub_python, library_dirs)


def link_python_backend(server: Path, stub_python: StubPython) -> None:
    """Give the stub's environment its backend directory: the wheel's Python backend, with the stub built
    for the environment's Python. Links already in place stay, for the servers that may be using them."""
    python_backend = stub_python.path / "backends" / "python"
    python_backend.mkdir(parents=True, exist_ok=True)
    sources = [server / "backends" / "python" / name for name in PYTHON_BACKEND_FILES]
    sources.append(server / STUBS_BY_VERSION / stub_python.version / STUB_NAME)
    for source in sources:
        link = python_backend / source.name
        if link.is_symlink() and link.readlink() == source:
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(source)


def install() -> Path:
    """Install the private Triton: only the server files of the wheel are kept."""
    root = private_root()
    if (root / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as staging:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                staging,
                WHEEL_REQUIREMENT,
            ],
            check=True,
        )
        kept = Path(staging) / "kept"
        (kept / "pytriton").mkdir(parents=True)
        shutil.move(Path(staging) / "pytriton" / "tritonserver", kept / "pytriton" / "tritonserver")
        shutil.move(Path(staging) / "nvidia_pytriton.libs", kept / "nvidia_pytriton.libs")
        shutil.rmtree(root, ignore_errors=True)
        kept.rename(root)
    return root


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stub-python",
        default=os.environ.get(ENV_STUB_PYTHON),
        help="the CPython 3.10-3.12 (with a shared libpython) to make the stub's environment from, "
        f"instead of searching (default: ${ENV_STUB_PYTHON})",
    )


def run(args: argparse.Namespace) -> int:
    root = install()
    print(f"tritonserver {TRITON_VERSION} installed in {root}")
    server, _ = find_server()
    try:
        stub_python = provision(stub_python_path(), stub_versions(server), args.stub_python)
    except StubPythonError as error:
        print(f"kubetriton install-triton: {error}")
        return 1
    if (server / STUBS_BY_VERSION).is_dir():
        link_python_backend(server, stub_python)
    print(f"Python-backend stub: Python {stub_python.version} with NumPy 1.x in {stub_python.path}")
    return 0
