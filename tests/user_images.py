"""Stand-ins for users' own worker images, as local environments: a CPython of a given version with NumPy
and nothing of kubetriton, made once and kept in the user's cache; and the pyzmq wheels that the kubetriton
worker image carries for each Python a worker image may have."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kubetriton import podenv

CACHE = Path.home() / ".cache" / "kubetriton" / "test-user-images"


def find_python(version: str) -> str | None:
    """An interpreter of that minor version, through pyenv or on PATH (where pyenv's shims may stand for
    versions that are not selected, so the candidate must run)."""
    candidates = []
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=True).stdout.strip()
        candidates += sorted(Path(root).glob(f"versions/{version}.*/bin/python{version}"), reverse=True)
    candidates.append(shutil.which(f"python{version}"))
    for candidate in filter(None, candidates):
        if subprocess.run([str(candidate), "-c", "pass"], capture_output=True).returncode == 0:
            return str(candidate)
    return None


def user_image(version: str, numpy: str | None) -> Path:
    """The `bin` folder of an environment with Python `version` and the `numpy` requirement (none when
    None), made once; the test that needs it is skipped when no such Python is installed."""
    python = find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on PATH or through pyenv")
    environment = CACHE / f"python{version}-{re.sub('[^a-z0-9.]+', '-', numpy or 'no-numpy')}"
    if not (environment / ".made").exists():
        shutil.rmtree(environment, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(environment)], check=True)
        if numpy is not None:
            subprocess.run(
                [str(environment / "bin" / "python"), "-m", "pip", "install", "--quiet", numpy], check=True
            )
        (environment / ".made").touch()
    return environment / "bin"


def worker_image_wheels() -> Path:
    """pyzmq wheels for every Python of podenv.WORKER_PYTHONS, as the worker image's Dockerfile gets them."""
    wheels = CACHE / "wheels"
    if not (wheels / ".made").exists():
        for version in podenv.WORKER_PYTHONS:
            pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
            subprocess.run([*pip, "--python-version", version, "-d", str(wheels), "pyzmq>=25"], check=True)
        (wheels / ".made").touch()
    return wheels
