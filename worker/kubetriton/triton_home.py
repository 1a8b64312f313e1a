"""Where the tritonserver that local mode runs comes from, and how to install it.

Local mode needs a real `tritonserver` with the Python backend. Inside an NVIDIA Triton container it is
`/opt/tritonserver`. Elsewhere it is the server shipped inside the `nvidia-pytriton` wheel, installed
with `--no-deps --target` into a private directory so that the wheel's own `pytriton` package can never
shadow ours: only its Triton files are kept. A locator finds a server in this order: an explicit
setting (argument or `KUBETRITON_TRITON_HOME`), `/opt/tritonserver`, then the private copy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kubetriton.podenv import TRITON_VERSION

WHEEL_REQUIREMENT = "nvidia-pytriton==0.7.0"
"""The wheel that ships tritonserver 2.51 (the same version as the pinned sidecar image)."""
ENV_TRITON_HOME = "KUBETRITON_TRITON_HOME"
CONTAINER_HOME = Path("/opt/tritonserver")
STUB_NAME = "triton_python_backend_stub"


class TritonNotFoundError(RuntimeError):
    """No tritonserver could be found; the message says how to get one."""


def private_root() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kubetriton" / f"tritonserver-{TRITON_VERSION}"


@dataclass(frozen=True)
class TritonHome:
    """A Triton installation: `bin/tritonserver`, `backends/python/`, and the libraries it needs."""

    path: Path
    library_dirs: tuple[Path, ...] = ()

    @property
    def executable(self) -> Path:
        return self.path / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.path / "backends"

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment tritonserver and its Python-backend stubs need to run this interpreter.

        The stub links `libpython3.X.so`: the running interpreter's LIBDIR goes first so the stub does not
        pick up an older system libpython. The stub finds its site-packages through the interpreter on
        PATH, so this interpreter's bin directory goes first on PATH.
        """
        env = dict(os.environ if base is None else base)
        libdirs = [str(d) for d in self.library_dirs]
        libdir = sysconfig.get_config_var("LIBDIR")
        if libdir:
            libdirs.insert(0, libdir)
        if env.get("LD_LIBRARY_PATH"):
            libdirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libdirs)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env


def locate(explicit: str | os.PathLike[str] | None = None) -> TritonHome:
    """The Triton installation local mode uses, in order: explicit, container, private copy."""
    explicit = explicit or os.environ.get(ENV_TRITON_HOME)
    if explicit:
        home = TritonHome(Path(explicit))
        if not home.executable.is_file():
            raise TritonNotFoundError(f"{ENV_TRITON_HOME}={explicit} holds no bin/tritonserver")
        return home
    if (CONTAINER_HOME / "bin" / "tritonserver").is_file():
        return TritonHome(CONTAINER_HOME)
    root = private_root()
    home = TritonHome(root / "pytriton" / "tritonserver", (root / "nvidia_pytriton.libs",))
    if home.executable.is_file():
        _select_stub(home)
        return home
    raise TritonNotFoundError(
        "No tritonserver found. Run `kubetriton install-triton` (installs Triton "
        f"{TRITON_VERSION} into {root}), set {ENV_TRITON_HOME} to a Triton installation, "
        "or run inside an nvcr.io/nvidia/tritonserver container."
    )


def _select_stub(home: TritonHome) -> None:
    """Put the Python-backend stub built for this interpreter's Python version in place."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    source = home.path / "python_backend_stubs" / version / STUB_NAME
    if not source.is_file():
        raise TritonNotFoundError(f"The private Triton ships no Python-backend stub for Python {version}")
    target = home.backends / "python" / STUB_NAME
    marker = target.with_name("stub-python-version")
    if target.is_file() and marker.is_file() and marker.read_text() == version:
        return
    shutil.copy2(source, target)
    marker.write_text(version)


def install(root: Path | None = None) -> Path:
    """Install the private Triton: only the server files of the wheel are kept."""
    root = private_root() if root is None else root
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
    parser.add_argument("--root", type=Path, default=None, help=f"install here instead of {private_root()}")


def run(args: argparse.Namespace) -> int:
    root = install(args.root)
    print(f"tritonserver {TRITON_VERSION} installed in {root}")
    return 0
