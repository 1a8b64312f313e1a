"""PyTriton 0.7's helpers for test scripts, with its names and behaviour, so that tests written against
PyTriton run unchanged: run a script in a process of its own while its output is logged and kept
(`ScriptThread`, whose `process` is a `psutil.Popen`, so a test can walk the server's child processes),
find a free port, find the warning about verbose Triton logs, dump the state of a process and its
children (`ProcessMonitoring`, once or every so often with `ProcessMonitoringThread`), set up a test's
logging and monitoring from its command line (`TestMonitoringContext`), and read the version of the
NVIDIA container a test runs in.

psutil is imported by the helpers that need it, so that serving never does; py-spy, when installed, gives
the stack traces of a dump.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gzip
import logging
import logging.handlers
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

DEFAULT_LOG_FORMAT = "%(asctime)s - %(levelname)8s - %(process)8d - %(threadName)s - %(name)s: %(message)s"
VERBOSE_LOG_WARNING = re.compile(
    r"Triton at \S+ logs verbosely \(log_verbose_level=\d+\), which slows inference down"
)
"""What `Triton()` and `RemoteTriton` log once connected to a Triton whose logs are verbose."""
ANSI_ESCAPE = re.compile(r"\x1b\[.*?m")


def _psutil() -> ModuleType:
    """psutil, which these helpers need and serving does not, or an error that says how to get it."""
    try:
        import psutil  # these helpers' alone, installed apart: serving never needs it
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "pytriton.check.utils needs psutil for ScriptThread and the process monitors, as PyTriton's "
            "does: pip install psutil",
            name="psutil",
        ) from error
    return psutil


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
    spawned) and leaving waits for it to end; `process` is the running `psutil.Popen` (None before and
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
        self._process: Any = None
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
        self._psutil = _psutil()
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
            process = self._psutil.Popen(
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
    def process(self) -> Any:
        """The running `psutil.Popen`, or None."""
        return self._process


class ProcessMonitoring:
    """Dumps the state of a process and of its children, recursively, into a log: the stack trace of each
    (py-spy's `dump`, when py-spy is installed), what each custom monitor does for it, and each one's parent.
    Children that ended stay listed, as missing from the process table."""

    def __init__(
        self,
        pid: int,
        logger: logging.Logger | None = None,
        loglevel: int = logging.INFO,
        remove_color: bool = False,
    ) -> None:
        self._psutil = _psutil()
        self._logger = logger or logging.getLogger("monitoring")
        self._loglevel = loglevel
        self._process = self._psutil.Process(pid)
        self._children: list[Any] = list(self._process.children(recursive=True))
        self._remove_color = remove_color
        self._custom_monitors: list[Callable[[int], None]] = []
        self._log("Initial list of children processes: %s", self._children)

    def _log(self, message: str, *args: Any) -> None:
        self._logger.log(self._loglevel, message, *args)

    def register_custom_monitor(self, custom_monitor: Callable[[int], None]) -> None:
        """Run `custom_monitor(pid)` for the process and each child at every dump."""
        self._custom_monitors.append(custom_monitor)

    def dump_state(self) -> None:
        self._dump_processes_stacktrace()
        self._dump_child_processes()

    @property
    def children(self) -> list[Any]:
        """The children seen so far (`psutil.Process`es), those started since the last look included."""
        with contextlib.suppress(self._psutil.NoSuchProcess):
            known = {child.pid for child in self._children}
            self._children += [
                child for child in self._process.children(recursive=True) if child.pid not in known
            ]
        return self._children

    def _dump_processes_stacktrace(self) -> None:
        self._log("==== Dump process stacktrace")
        py_spy = shutil.which("py-spy")
        if py_spy is None:
            self._log("py-spy is not installed (pip install py-spy): no stack traces")
        for process in [self._process, *self.children]:
            try:
                self._log("Dump stack trace for process (pid=%d) with cmd %s", process.pid, process.cmdline())
                for custom_monitor in self._custom_monitors:
                    custom_monitor(process.pid)
            except self._psutil.NoSuchProcess as error:
                self._log("Error during handling process: %s", error)
                continue
            if py_spy is None:
                continue
            dump = subprocess.run(
                [py_spy, "dump", "-ll", "--nonblocking", "-p", str(process.pid)],
                capture_output=True,
                text=True,
                check=False,
            )
            if dump.returncode != 0:
                self._log(
                    "Error during calling py-spy process: %s", dump.stderr.strip() or dump.stdout.strip()
                )
                continue
            self._log(ANSI_ESCAPE.sub("", dump.stdout) if self._remove_color else dump.stdout)

    def _dump_child_processes(self) -> None:
        self._log("==== Dump process info (with its children)")
        for process in [self._process, *self.children]:
            try:
                self._log("%s parent=%s", process, process.parent())
            except self._psutil.NoSuchProcess:
                self._log("%s is missing in process table", process)


class ProcessMonitoringThread:
    """Dumps `monitoring`'s state from a thread of its own: at start, then every `interval` seconds until
    stopped. A context manager."""

    def __init__(self, monitoring: ProcessMonitoring, interval: float = 60) -> None:
        self._monitoring = monitoring
        self._interval = interval
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._logger = logging.getLogger("monitoring")

    def start(self) -> None:
        self._stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._logger = logging.getLogger(self._thread.name)
        self._thread.start()

    def stop(self) -> None:
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> ProcessMonitoringThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        self._logger.info("Monitoring process")
        self._monitoring.dump_state()
        while not self._stop_event.wait(self._interval):
            self._logger.info("Monitoring process")
            self._monitoring.dump_state()


class TestMonitoringContext:
    """A test's logging and monitoring, set from its command line (`extend_args` adds the options): DEBUG
    logs to the console (INFO unless `--verbose`), all of them to `--log-path` as well, rotated at
    `--maximum-log-file` bytes (gzipped with `--compress-logs`); faulthandler (`--enable-fault-handler`,
    tracebacks every `--faulthandler-interval` seconds); and every `--process-monitoring-interval`
    seconds a dump of this process and its children with their memory, descriptors, CPU and threads. A
    context manager; leaving stops what it started."""

    __test__ = False  # not a test class, despite its name

    @staticmethod
    def extend_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--verbose", action="store_true", help="Provide verbose logs")
        parser.add_argument(
            "--log-path", type=str, default=None, help="Provide the path of external log for rotation"
        )
        parser.add_argument("--compress-logs", action="store_true", help="Enable logs compression")
        parser.add_argument(
            "--maximum-log-file",
            type=int,
            default=10 * 1024 * 1024,
            help="Maximum logfile size before rotation is started",
            required=False,
        )
        parser.add_argument("--enable-fault-handler", action="store_true", help="Enable faulthandler")
        parser.add_argument(
            "--faulthandler-interval",
            type=float,
            default=None,
            help="Enable faulthandler after specified number of seconds with repeat",
            required=False,
        )
        parser.add_argument(
            "--process-monitoring-interval",
            type=float,
            default=None,
            help="Enable process monitoring after specified number of seconds with repeat",
            required=False,
        )

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._file_handler: logging.Handler | None = None
        self._monitor: ProcessMonitoringThread | None = None

    def __enter__(self) -> TestMonitoringContext:
        args = self._args
        logging.basicConfig(level=logging.DEBUG, format=DEFAULT_LOG_FORMAT)
        root = logging.getLogger()
        if args.log_path is not None:
            self._file_handler = _rotating_log(
                args.log_path, args.maximum_log_file, compress=args.compress_logs
            )
            root.addHandler(self._file_handler)
            console_level = logging.DEBUG if args.verbose else logging.INFO
            for handler in root.handlers:
                if type(handler) is logging.StreamHandler:
                    handler.setLevel(console_level)
        if args.enable_fault_handler:
            faulthandler.enable()
        if args.faulthandler_interval is not None:
            faulthandler.dump_traceback_later(args.faulthandler_interval, repeat=True, exit=False)
        if args.process_monitoring_interval is not None:
            monitoring = ProcessMonitoring(os.getpid(), root, loglevel=logging.DEBUG, remove_color=True)
            for monitor in _resource_monitors(root):
                monitoring.register_custom_monitor(monitor)
            self._monitor = ProcessMonitoringThread(monitoring, interval=args.process_monitoring_interval)
            self._monitor.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._monitor is not None:
            self._monitor.stop()
            self._monitor = None
        if self._args.faulthandler_interval is not None:
            faulthandler.cancel_dump_traceback_later()
        if self._file_handler is not None:
            logging.getLogger().removeHandler(self._file_handler)
            self._file_handler.close()
            self._file_handler = None


def _rotating_log(path: str, max_bytes: int, *, compress: bool) -> logging.Handler:
    """Every record, to `path`, rotated at `max_bytes` with 500 files kept, gzipped when `compress`."""
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=500)
    handler.setFormatter(logging.Formatter(DEFAULT_LOG_FORMAT))
    handler.setLevel(logging.DEBUG)
    if compress:
        handler.namer = lambda name: name + ".gz"
        handler.rotator = _gzip_rotation
    return handler


def _gzip_rotation(source: str, destination: str) -> None:
    with open(source, "rb") as plain, gzip.open(destination, "wb") as packed:
        shutil.copyfileobj(plain, packed)
    os.remove(source)


def _resource_monitors(logger: logging.Logger) -> list[Callable[[int], None]]:
    """Monitors that log a process's memory, open descriptors, CPU use, threads and whole psutil record."""
    psutil = _psutil()
    readings: list[tuple[str, Callable[[Any], Any]]] = [
        ("RAM USAGE", lambda process: process.memory_info()),
        ("FILE DESCRIPTORS", lambda process: process.num_fds()),
        ("CPU USAGE", lambda process: process.cpu_percent()),
        ("THREADS", lambda process: process.num_threads()),
        ("PROCESS DICT", lambda process: process.as_dict()),
    ]

    processes: dict[int, Any] = {}
    """One psutil.Process per pid, kept: its CPU use is measured since the last reading of it."""

    def monitor(what: str, read: Callable[[Any], Any]) -> Callable[[int], None]:
        def log(pid: int) -> None:
            process = processes.get(pid) or processes.setdefault(pid, psutil.Process(pid))
            logger.debug("MONITOR %s (%d): %s", what, pid, read(process))

        return log

    return [monitor(what, read) for what, read in readings]


def get_current_container_version() -> str | None:
    """The version of the NVIDIA PyTorch or TensorFlow container this runs in (`24.10`), or None outside
    one."""
    version = os.environ.get("NVIDIA_PYTORCH_VERSION") or os.environ.get("NVIDIA_TENSORFLOW_VERSION")
    if version and "-" in version:
        version = version.split("-")[0]  # TensorFlow's is <container version>-<TensorFlow version>
    return version


def verify_docker_image_in_readme_same_as_tested(
    readme_path: str | os.PathLike[str], image_name_with_version: str
) -> None:
    """AssertionError unless every reference in the README to an image of the same name (the last part of
    the repository path) is `image_name_with_version`, e.g. `nvcr.io/nvidia/pytorch:24.10-py3`."""
    image_name, _version = image_name_with_version.split(":")
    framework = re.escape(image_name.split("/")[-1])
    readme = Path(readme_path).read_text()
    for reference in re.finditer(rf"[\w/.\-:]+/{framework}:[\w.-]+", readme):
        if reference.group() != image_name_with_version:
            raise AssertionError(f"{reference.group()} != {image_name_with_version}")
