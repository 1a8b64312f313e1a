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

The environment is made without pip (`venv --without-pip`), so the interpreter needs no ensurepip
(Debian and Ubuntu leave it out unless python3.X-venv is installed); the pip that runs install-triton
installs into it (`pip --python`), from an index or from local wheels alone.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
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
PIP_WITH_PYTHON_OPTION = (22, 3)
"""The first pip that installs into another environment (`pip --python`)."""
SYSTEM_BIN = Path("/usr/bin")


class StubPythonError(RuntimeError):
    """No environment for the stub can be provisioned; the message says what to install."""


class WheelsNotFound(StubPythonError):
    """pip could not install the environment's packages: where it looked, they are not."""


@dataclass(frozen=True)
class Interpreter:
    """A Python found on this machine, and what decides whether the stub can embed it."""

    executable: str
    implementation: str
    version: str
    library_dir: Path
    shared_libpython: bool
    """Whether `library_dir` holds its libpython3.X.so: the stub must load this one, not another."""

    def refusal(self, versions: Collection[str]) -> str | None:
        """Why the stub cannot run on it, for a Triton that has stubs for `versions`; None if it can."""
        if self.implementation != "cpython" or self.version not in versions:
            return f"{self.executable} is {self.implementation} {self.version}"
        if not self.shared_libpython:
            return f"{self.executable} has no shared libpython (built without --enable-shared)"
        return None


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


def describe(executable: str) -> Interpreter | None:
    """The interpreter at `executable`, or None when it does not run."""
    try:
        facts = json.loads(
            subprocess.run(
                [executable, "-c", DESCRIBE], capture_output=True, text=True, timeout=30, check=True
            ).stdout
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    library_dir = Path(facts["library_dir"] or "")
    try:
        shared = (library_dir / f"libpython{facts['version']}.so.1.0").is_file()
    except OSError:  # a library folder this user may not read (an interpreter copied from elsewhere)
        shared = False
    return Interpreter(executable, facts["implementation"], facts["version"], library_dir, shared)


def pyenv_root() -> Path | None:
    pyenv = shutil.which("pyenv")
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip() if pyenv else ""
    return Path(root) if root else None


def candidates(pyenv: Path | None) -> Iterator[str]:
    """Interpreters to try, in order: the running one, versioned ones on PATH, then pyenv's."""
    yield sys.executable
    for version in PYTHON_VERSIONS:
        found = shutil.which(f"python{version}")
        if found:
            yield found
    found = shutil.which("python3")
    if found:
        yield found
    if pyenv is not None:
        installed = (pyenv / "versions").glob("3.*/bin/python3")
        yield from (str(path) for path in sorted(installed, key=_version_key, reverse=True))


def _version_key(executable: Path) -> tuple[int, ...]:
    name = executable.parents[1].name
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def os_release(path: Path = Path("/etc/os-release")) -> dict[str, str]:
    """The distribution's identity (`ID`, `ID_LIKE`, ...), empty where it does not say."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in lines if "=" in line)
    return {key: value.strip().strip('"') for key, value in pairs}


def what_to_install(
    found: Sequence[Interpreter],
    versions: Collection[str],
    distribution: Mapping[str, str],
    pyenv: Path | None,
) -> str:
    """The one step that gives this machine a Python the stub can embed, given the interpreters `found`
    on it: a shared libpython for a CPython of the right version where it has one, otherwise a CPython
    built with one."""
    wanted = [version for version in PYTHON_VERSIONS if version in versions]
    family = {distribution.get("ID", ""), *distribution.get("ID_LIKE", "").split()}
    for interpreter in found:
        if interpreter.implementation != "cpython" or interpreter.version not in wanted:
            continue
        executable = Path(interpreter.executable)
        if family & {"debian", "ubuntu"} and executable.parent == SYSTEM_BIN:
            return (
                f"Install its shared library: `sudo apt install libpython{interpreter.version}`, then run "
                "`kubetriton install-triton` again"
            )
        if pyenv is not None and executable.is_relative_to(pyenv / "versions"):
            name = executable.relative_to(pyenv / "versions").parts[0]
            return (
                f"Rebuild it with a shared libpython: `PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install "
                f"--force {name}`, then run `kubetriton install-triton` again"
            )
    version = wanted[0] if wanted else PYTHON_VERSIONS[0]
    return (
        f"Install a CPython {version} built with a shared libpython, for example `PYTHON_CONFIGURE_OPTS="
        f"--enable-shared pyenv install {version}`, and run `kubetriton install-triton --stub-python "
        f"/path/to/python{version}` (or set {ENV_STUB_PYTHON})"
    )


def choose_interpreter(versions: Collection[str], requested: str | None = None) -> Interpreter:
    """The interpreter to make the stub's environment from: `requested`, or the first suitable one found.

    `versions` are the CPython versions the Triton installation has a stub for."""
    wanted = [version for version in PYTHON_VERSIONS if version in versions]
    pyenv = pyenv_root()
    found, refusals = [], []
    for executable in [requested] if requested else candidates(pyenv):
        interpreter = describe(executable)
        if interpreter is None:
            refusals.append(f"{executable} does not run")
            continue
        refusal = interpreter.refusal(wanted)
        if refusal is None:
            return interpreter
        found.append(interpreter)
        refusals.append(refusal)
    raise StubPythonError(
        f"No CPython {' or '.join(wanted) or 'version this Triton has a stub for'} with a shared libpython "
        f"for Triton's Python-backend stub ({'; '.join(refusals)}). "
        f"{what_to_install(found, versions, os_release(), pyenv)}."
    )


def pip_command() -> list[str]:
    """The pip of the running Python, which installs into the stub's environment (that has none)."""
    try:
        version = importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        version = ""
    numbers = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if numbers < PIP_WITH_PYTHON_OPTION:
        raise StubPythonError(
            f"{sys.executable} has {f'pip {version}' if version else 'no pip'}; install-triton installs the "
            f"stub's environment with pip {'.'.join(map(str, PIP_WITH_PYTHON_OPTION))} or newer: "
            f"`{sys.executable} -m pip install --upgrade pip` (or `-m ensurepip`)"
        )
    return [sys.executable, "-m", "pip", "--quiet"]


def create(
    path: Path,
    interpreter: Interpreter,
    numpy_requirement: str = STUB_NUMPY,
    index_options: Sequence[str] = (),
) -> StubPython:
    """Make the environment at `path` from `interpreter`, replacing what was there. `index_options` say
    where pip finds the wheels (`--no-index --find-links DIR` for local ones only)."""
    (path / MANIFEST).unlink(missing_ok=True)
    pip = [*pip_command(), "--python", str(path / "bin" / "python")]
    try:
        subprocess.run(
            [interpreter.executable, "-m", "venv", "--clear", "--without-pip", str(path)], check=True
        )
        subprocess.run([*pip, "install", *index_options, numpy_requirement], check=True)
        subprocess.run(
            [
                *pip,
                "download",
                *index_options,
                "--no-deps",
                "--only-binary=:all:",
                "--dest",
                str(path / "wheels"),
                PYZMQ,
            ],
            check=True,
        )
    except subprocess.CalledProcessError as error:
        raise WheelsNotFound(
            f"Provisioning the stub's environment in {path} failed: {' '.join(error.cmd)} "
            f"exited with {error.returncode}"
        ) from None
    stub = StubPython(path, interpreter.version, interpreter.library_dir)
    manifest = {"version": stub.version, "library_dir": str(stub.library_dir)}
    (path / MANIFEST).write_text(json.dumps(manifest) + "\n")
    return stub


def provision(
    path: Path, versions: Collection[str], requested: str | None = None, index_options: Sequence[str] = ()
) -> StubPython:
    """The stub's environment at `path` for one of `versions`: kept when it is there, unless another
    interpreter is requested, otherwise created."""
    existing = StubPython.load(path)
    if existing is not None and existing.version in versions and not requested:
        return existing
    return create(path, choose_interpreter(versions, requested), index_options=index_options)
