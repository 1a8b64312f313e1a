"""`kubetriton install-triton`: from a wheel file and no index, with an interpreter whose venv module has
no ensurepip (as Debian's and Ubuntu's without python3.X-venv), it installs a private Triton that keeps
only what runs, and local mode serves from it; what is missing, it names.

The offline run has no index (PIP_NO_INDEX, no pip configuration) and an unreachable proxy; its wheels are
downloaded once into the user's cache, beforehand, as a user would carry them to such a machine.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kubetriton.stub_python import PYZMQ, STUB_NUMPY, Interpreter, what_to_install
from kubetriton.triton_home import (
    LIBRARIES_SUBDIR,
    SERVER_SUBDIR,
    STUBS_BY_VERSION,
    WHEEL_REQUIREMENT,
    find_server,
    unused_files,
)

from tests.test_extras import readme_quickstart
from tests.test_seeds import SeedServer

WHEELS = Path.home() / ".cache" / "kubetriton" / "test-offline-wheels"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
UNREACHABLE_PROXY = "http://127.0.0.1:9"
OFFLINE = {
    "PIP_NO_INDEX": "1",
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_FIND_LINKS": "",
    **{name: UNREACHABLE_PROXY for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")},
}


def test_only_the_stub_that_runs_is_kept():
    libraries = [
        "libtritonserver-717102f0.so",
        "libpython3-419a3a08.13.so.1.0",
        "libcudart-09529672.so.12.6.77",
    ]
    stubs = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"]
    assert unused_files(stubs, libraries, "3.12") == sorted(
        [
            Path(LIBRARIES_SUBDIR, "libpython3-419a3a08.13.so.1.0"),
            *(
                SERVER_SUBDIR / STUBS_BY_VERSION / version
                for version in ["3.8", "3.9", "3.10", "3.11", "3.13"]
            ),
        ]
    )
    assert unused_files(["3.11"], libraries, "3.11") == [
        Path(LIBRARIES_SUBDIR, "libpython3-419a3a08.13.so.1.0")
    ]
    assert unused_files(["3.13"], libraries, "3.13") == []


DEBIAN = {"ID": "debian"}
UBUNTU = {"ID": "ubuntu", "ID_LIKE": "debian"}
PYENV = Path("/home/me/.pyenv")
AGAIN = ", then run `kubetriton install-triton` again"
ANOTHER_PYTHON = (
    "Install a CPython 3.12 built with a shared libpython, for example `PYTHON_CONFIGURE_OPTS="
    "--enable-shared pyenv install 3.12`, and run `kubetriton install-triton --stub-python "
    "/path/to/python3.12` (or set KUBETRITON_STUB_PYTHON)"
)


def interpreter(executable: str, version: str, *, shared: bool = False, implementation: str = "cpython"):
    return Interpreter(executable, implementation, version, Path("/usr/lib/x86_64-linux-gnu"), shared)


@pytest.mark.parametrize(
    ("found", "distribution", "pyenv", "advice"),
    [
        (
            [interpreter("/usr/bin/python3", "3.11")],
            DEBIAN,
            None,
            "Install its shared library: `sudo apt install libpython3.11`" + AGAIN,
        ),
        (
            [interpreter("/usr/bin/python3", "3.13"), interpreter("/usr/bin/python3.12", "3.12")],
            UBUNTU,
            None,
            "Install its shared library: `sudo apt install libpython3.12`" + AGAIN,
        ),
        (
            [interpreter(str(PYENV / "versions/3.12.1/bin/python3"), "3.12")],
            DEBIAN,
            PYENV,
            "Rebuild it with a shared libpython: `PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install "
            "--force 3.12.1`" + AGAIN,
        ),
        (
            [
                interpreter("/usr/bin/python3", "3.13"),
                interpreter("/usr/bin/pypy3", "3.11", implementation="pypy"),
            ],
            DEBIAN,
            None,
            ANOTHER_PYTHON,
        ),
        (
            [interpreter("/usr/bin/python3", "3.11")],
            {"ID": "fedora"},
            None,
            ANOTHER_PYTHON,
        ),
    ],
)
def test_with_no_usable_interpreter_it_says_what_to_install(found, distribution, pyenv, advice):
    assert what_to_install(found, ["3.8", "3.10", "3.11", "3.12", "3.13"], distribution, pyenv) == advice


def offline_wheels() -> Path:
    """The nvidia-pytriton wheel, and NumPy 1.x and pyzmq for this Python, downloaded once."""
    folder = WHEELS / f"cp{PYTHON.replace('.', '')}"
    if not folder.is_dir():
        WHEELS.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=WHEELS))
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d"]
        try:
            subprocess.run([*pip, str(staging), WHEEL_REQUIREMENT, STUB_NUMPY, PYZMQ], check=True)
        except subprocess.CalledProcessError:
            shutil.rmtree(staging)
            pytest.skip("the wheels for an offline install-triton could not be downloaded (no index here)")
        staging.rename(folder)
    return folder


def without_ensurepip(target: Path) -> Path:
    """A copy of the running CPython whose standard library has no ensurepip: its `venv` then fails unless
    told `--without-pip`, as Debian's does without python3.X-venv."""
    library = Path(sysconfig.get_paths()["stdlib"])
    if not (Path(sysconfig.get_config_var("LIBDIR")) / f"libpython{PYTHON}.so.1.0").is_file():
        pytest.skip(f"{sys.executable} has no shared libpython for Triton's stub")
    ignored = shutil.ignore_patterns(
        "ensurepip", "site-packages", "test", "idlelib", "tkinter", "__pycache__"
    )
    shutil.copytree(library, target / "lib" / library.name, ignore=ignored)
    (target / "bin").mkdir()
    python = target / "bin" / f"python{PYTHON}"
    shutil.copy2(Path(sys.base_prefix) / "bin" / f"python{PYTHON}", python)
    refused = subprocess.run([python, "-m", "venv", str(target / "with-pip")], capture_output=True, text=True)
    assert refused.returncode != 0 and "ensurepip" in refused.stdout + refused.stderr, refused
    return python


def install_triton(*args: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`kubetriton install-triton` offline, installing into `cache`."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "kubetriton"), "install-triton", *args],
        env={**os.environ, **OFFLINE, "XDG_CACHE_HOME": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture
def wheel() -> Iterator[Path]:
    yield next(offline_wheels().glob("nvidia_pytriton-*.whl"))


def test_offline_from_a_wheel_file_with_a_python_without_ensurepip_the_quickstart_serves(
    wheel: Path, tmp_path: Path
):
    python = without_ensurepip(tmp_path / "python")
    cache = tmp_path / "cache"
    installed = install_triton("--from", str(wheel), "--stub-python", str(python), cache=cache)
    assert installed.returncode == 0, installed.stderr
    root = cache / "kubetriton" / "tritonserver-2.51.0"
    assert stat.S_IMODE(root.parent.stat().st_mode) == 0o700, "nobody else may replace what Triton runs"
    assert [path.name for path in (root / SERVER_SUBDIR / STUBS_BY_VERSION).iterdir()] == [PYTHON]
    assert not list((root / LIBRARIES_SUBDIR).glob("libpython*"))
    site_packages = root / "stub-python" / "lib" / f"python{PYTHON}" / "site-packages"
    assert sorted(path.name.split("-")[0] for path in site_packages.iterdir()) == [
        "numpy",
        "numpy",
        "numpy.libs",
    ]

    server = SeedServer(
        readme_quickstart(), tmp_path, sys.executable, {**OFFLINE, "XDG_CACHE_HOME": str(cache)}
    )
    try:
        server.wait_ready("Lengths")
        sequences = np.array([[b"abc"], [b"de"]], dtype=object)
        assert server.infer("http", "Lengths", {"sequences": sequences}, "lengths").tolist() == [[3.0], [2.0]]
    finally:
        assert server.stop() == 0


def test_a_folder_without_the_stubs_wheels_is_named_with_what_to_put_there(wheel: Path, tmp_path: Path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / wheel.name).symlink_to(wheel)
    refused = install_triton("--from", str(folder), "--stub-python", sys.executable, cache=tmp_path / "cache")
    assert refused.returncode == 1
    assert (
        f"{folder} must hold the wheels of {WHEEL_REQUIREMENT}, and {STUB_NUMPY} and {PYZMQ}"
        in refused.stderr
    )
    assert f"--python-version {PYTHON} -d {folder} '{STUB_NUMPY}' '{PYZMQ}'" in refused.stderr
    assert not (tmp_path / "cache" / "kubetriton" / "tritonserver-2.51.0").exists(), (
        "a failed install leaves nothing"
    )


def test_with_a_triton_of_its_own_only_the_stubs_environment_is_provisioned(wheel: Path, tmp_path: Path):
    """KUBETRITON_TRITON_HOME (or a Triton container's /opt/tritonserver) needs no private copy."""
    server, _ = find_server()
    cache = tmp_path / "cache"
    installed = install_triton("--from", str(wheel.parent), cache=cache, KUBETRITON_TRITON_HOME=str(server))
    assert installed.returncode == 0, installed.stderr
    root = cache / "kubetriton" / "tritonserver-2.51.0"
    assert sorted(path.name for path in root.iterdir()) == ["stub-python"]
    assert (root / "stub-python" / "kubetriton-stub-python.json").is_file()
