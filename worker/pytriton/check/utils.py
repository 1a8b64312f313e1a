"""Helpers that test scripts written for PyTriton import: run a script in its own process while its output
is logged and kept (`ScriptThread`), find a free port, and find the warning about verbose Triton logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

DEFAULT_LOG_FORMAT = "%(asctime)s - %(levelname)8s - %(process)8d - %(threadName)s - %(name)s: %(message)s"
VERBOSE_LOG_WARNING = re.compile(
    r"Triton at \S+ logs verbosely \(log_verbose_level=\d+\), which slows inference down"
)
"""What `Triton()` and `RemoteTriton` log once connected to a Triton whose logs are verbose."""


def find_free_port() -> int:
    """A TCP port nothing listens on right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def search_warning_on_too_verbose_log_level(logs: str) -> re.Match[str] | None:
    """The warning about verbose Triton logs in `logs`, or None."""
    return VERBOSE_LOG_WARNING.search(logs)


class ScriptThread(threading.Thread):
    """Runs the command `cmd` in a process of its own, from a thread that logs each line of its output and
    keeps them (`output`). As a context manager, entering starts the process (returning once it was
    spawned) and leaving waits for the thread; `process` is the running `subprocess.Popen` (None before and
    after), `returncode` its exit status once it ended."""

    def __init__(
        self,
        cmd: Sequence[str],
        workdir: str | os.PathLike[str] | None = None,
        group: None = None,
        target: Any = None,
        name: str | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(group, target, name, args, kwargs, daemon=True)
        self.cmd = list(cmd)
        self.workdir = workdir
        self.active = False
        self.returncode: int | None = None
        self._process: subprocess.Popen[str] | None = None
        self._spawned: threading.Event | None = None
        self._lines: list[str] = []
        self._logger = logging.getLogger(self.name)

    def __enter__(self) -> ScriptThread:
        self.start(threading.Event())
        assert self._spawned is not None
        self._spawned.wait()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.join()

    def start(self, flag: threading.Event | None = None) -> None:
        """Start the thread; `flag` is set once the process was spawned (or failed to be)."""
        self._spawned = flag or threading.Event()
        self._logger.info("Starting %s: %s", self.name, " ".join(self.cmd))
        super().start()

    def stop(self) -> None:
        """Stop following the process: the thread ends once the process has."""
        self.active = False

    def run(self) -> None:
        assert self._spawned is not None
        self.returncode = None
        self._lines = []
        try:
            process = subprocess.Popen(
                self.cmd,
                cwd=self.workdir,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            self._spawned.set()
        self._process = process
        self.active = True
        assert process.stdout is not None
        for line in process.stdout:
            self._lines.append(line.rstrip("\n"))
            self._logger.info(self._lines[-1])
        self.returncode = process.wait()
        self._logger.info("%s finished with %d", self.name, self.returncode)
        self.active = False
        self._process = None

    @property
    def output(self) -> str:
        return "\n".join(self._lines)

    @property
    def process(self) -> subprocess.Popen[str] | None:
        return self._process
