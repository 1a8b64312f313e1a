"""The Python that Triton's Python-backend stub runs on in local mode: kubetriton's, never the user's.

The stub is a program of its own that embeds CPython: it links `libpython3.X.so`, takes its interpreter
and site-packages from the `python3` it finds first on PATH, and exchanges tensors with numpy through
pybind11. Triton 2.51's stub reads NumPy 1.x arrays only, and the NumPy 1.x wheels stop at CPython 3.12,
so the worker process, whose interpreter is the user's (NumPy 2, Python 3.13, ...), cannot lend it its
environment.

`kubetriton install-triton` therefore provisions a virtual environment for the stub, once: made from a
CPython 3.10-3.12 with a shared libpython, holding NumPy 1.x, and beside it the pyzmq wheel for that
Python. It plays the part that the stock Triton image's own Python plays in a pod (numpy, no pyzmq, no
kubetriton): each local server gets the proxy's modules and pyzmq the way a pod's sidecar does, through
`kubetriton.sidecar.bootstrap.install_runtime`, so the proxy always matches the running worker.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

STUB_NUMPY = "numpy>=1.24,<2"
"""The numpy the stub's environment gets: Triton 2.51's stub is built against NumPy 1.x."""
PYZMQ = "pyzmq>=25"
PYTHON_VERSIONS = ("3.12", "3.11", "3.10")
"""CPython versions the stub's environment may have, preferred first: kubetriton's proxy modules need
3.10, and NumPy 1.x has no wheels for 3.13."""
ENV_STUB_PYTHON = "KUBETRITON_STUB_PYTHON"
"""The interpreter `kubetriton install-triton` makes the stub's environment from, instead of searching."""
MANIFEST = "kubetriton-stub-python.json"
"""Written last by provisioning: an environment without it is incomplete."""
DESCRIBE = (
    "import json, sys, sysconfig; print(json.dumps({"
    "'version': '%d.%d' % sys.version_info[:2], "
    "'implementation': sys.implementation.name, "
    "'library_dir': sysconfig.get_config_var('LIBDIR')}))"
)
"""Run by each candidate interpreter: what decides whether the stub can embed it."""
HOW_TO_GET_ONE = (
    "Install one, for example your distribution's python3.X-venv and libpython3.X packages (Debian 12: "
    "`apt install python3.11-venv libpython3.11`) or `PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install "
    f"3.12`, and run `kubetriton install-triton --stub-python /path/to/python3.X` (or set {ENV_STUB_PYTHON})"
)


class StubPythonError(RuntimeError):
    """No environment for the stub can be provisioned; the message says what to install."""


@dataclass(frozen=True)
class Interpreter:
    """A CPython that can be the base of the stub's environment."""

    executable: str
    version: str
    library_dir: Path
    """Where its shared libpython lies: the stub must load this one, not another libpython3.X."""


@dataclass(frozen=True)
class StubPython:
    """A provisioned environment: a venv with NumPy 1.x, and the pyzmq wheel for its Python."""

    path: Path
    version: str
    library_dir: Path

    @property
    def bin_dir(self) -> Path:
        """Goes first on tritonserver's PATH: the stub embeds the `python3` it finds there."""
        return self.path / "bin"

    @property
    def wheels(self) -> Path:
        return self.path / "wheels"

    @classmethod
    def load(cls, path: Path) -> StubPython | None:
        """The environment provisioned at `path`, or None when there is none (or it is incomplete)."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            return None
        return cls(path, manifest["version"], Path(manifest["library_dir"]))


def describe(executable: str) -> Interpreter | str:
    """The interpreter at `executable` if the stub can embed it, otherwise why not."""
    try:
        facts = json.loads(
            subprocess.run(
                [executable, "-c", DESCRIBE], capture_output=True, text=True, timeout=30, check=True
            ).stdout
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return f"{executable} does not run"
    if facts["implementation"] != "cpython" or facts["version"] not in PYTHON_VERSIONS:
        return f"{executable} is {facts['implementation']} {facts['version']}"
    library_dir = Path(facts["library_dir"] or "")
    if not (library_dir / f"libpython{facts['version']}.so.1.0").is_file():
        return f"{executable} has no shared libpython (built without --enable-shared)"
    return Interpreter(executable, facts["version"], library_dir)


def candidates() -> Iterator[str]:
    """Interpreters to try, in order: the running one, versioned ones on PATH, then pyenv's."""
    yield sys.executable
    for version in PYTHON_VERSIONS:
        found = shutil.which(f"python{version}")
        if found:
            yield found
    found = shutil.which("python3")
    if found:
        yield found
    pyenv = shutil.which("pyenv")
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip() if pyenv else ""
    if root:
        installed = Path(root, "versions").glob("3.*/bin/python3")
        yield from (str(path) for path in sorted(installed, key=_version_key, reverse=True))


def _version_key(executable: Path) -> tuple[int, ...]:
    name = executable.parents[1].name
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def choose_interpreter(versions: Collection[str], requested: str | None = None) -> Interpreter:
    """The interpreter to make the stub's environment from: `requested`, or the first suitable one found.

    `versions` are the CPython versions the Triton installation has a stub for."""
    wanted = [version for version in PYTHON_VERSIONS if version in versions]
    refusals = []
    for executable in [requested] if requested else candidates():
        found = describe(executable)
        if isinstance(found, Interpreter) and found.version in wanted:
            return found
        refusals.append(found if isinstance(found, str) else f"{executable} is {found.version}")
    raise StubPythonError(
        f"No CPython {' or '.join(wanted) or 'version this Triton has a stub for'} with a shared libpython "
        f"for Triton's Python-backend stub ({'; '.join(refusals)}). {HOW_TO_GET_ONE}"
    )


def create(path: Path, interpreter: Interpreter, numpy_requirement: str = STUB_NUMPY) -> StubPython:
    """Make the environment at `path` from `interpreter`, replacing what was there."""
    (path / MANIFEST).unlink(missing_ok=True)
    pip = [str(path / "bin" / "python"), "-m", "pip", "--quiet"]
    try:
        subprocess.run([interpreter.executable, "-m", "venv", "--clear", str(path)], check=True)
        subprocess.run([*pip, "install", numpy_requirement], check=True)
        subprocess.run(
            [*pip, "download", "--no-deps", "--only-binary=:all:", "--dest", str(path / "wheels"), PYZMQ],
            check=True,
        )
    except subprocess.CalledProcessError as error:
        raise StubPythonError(
            f"Provisioning the stub's environment in {path} failed: {' '.join(error.cmd)} "
            f"exited with {error.returncode}"
        ) from None
    stub = StubPython(path, interpreter.version, interpreter.library_dir)
    manifest = {"version": stub.version, "library_dir": str(stub.library_dir)}
    (path / MANIFEST).write_text(json.dumps(manifest) + "\n")
    return stub


def provision(path: Path, versions: Collection[str], requested: str | None = None) -> StubPython:
    """The stub's environment at `path` for one of `versions`: kept when it is there, unless another
    interpreter is requested, otherwise created."""
    existing = StubPython.load(path)
    if existing is not None and existing.version in versions and not requested:
        return existing
    return create(path, choose_interpreter(versions, requested))
