"""Stopping, which must not wait without end.

SIGINT and SIGTERM handlers: a signal may interrupt the main thread anywhere, inside the handler of the one
before it too (a supervisor killed with -9, a held Ctrl-C), so a handler that takes a lock the interrupted
code holds never returns. Each script makes that certain: once armed, the first `Condition.notify_all` on
the main thread (which `Event.set` calls holding the event's lock) sends the process one more signal at
that very point.

Instances whose callable hangs: the stop waits for them a while, once for all of them.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kubetriton.worker import join_within

from tests.conftest import free_ports

SIGNAL_INSIDE_A_LOCK = """
import os
import signal
import threading

_notify_all = threading.Condition.notify_all
armed = []


def notify_all_signalled(condition, signum=signal.{signal}):
    if armed and threading.get_ident() == threading.main_thread().ident:
        armed.clear()
        os.kill(os.getpid(), signum)  # handled before this returns, with the condition's lock held
    _notify_all(condition)


threading.Condition.notify_all = notify_all_signalled
"""

SERVE_SCRIPT = """
import sys
import time

import numpy as np
from pytriton.model_config import Tensor
from pytriton.triton import Triton, TritonConfig


def say_when_serving():
    while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # until serve() handles it
        time.sleep(0.01)
    print("serving", flush=True)


http, grpc, metrics = map(int, sys.argv[1:4])
with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
    tensor = [Tensor(name="x", shape=(1,), dtype=np.float32)]
    triton.bind("echo", lambda requests: requests, tensor, tensor)
    armed.append(True)
    threading.Thread(target=say_when_serving, daemon=True).start()
    triton.serve()
print("stopped", flush=True)
"""

SUPERVISOR_SCRIPT = """
import logging
import os
import sys

from kubetriton.supervisor import Supervisor

logging.basicConfig(level=logging.INFO)
supervisor = Supervisor(
    [sys.executable, "-c", "import time; time.sleep(60)"], 1, environ=os.environ, stop_timeout_s=5
)
armed.append(True)
sys.exit(supervisor.run())
"""


def _run_and_signal(script: Path, args: list[str], ready: str, signum: signal.Signals) -> tuple[int, str]:
    """Run `script`, send it `signum` once it wrote `ready`; its exit status (-1 when it did not end within
    30 s, and was killed) and its output."""
    process = subprocess.Popen(
        [sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert process.stdout is not None
        lines = []
        while ready not in (line := process.stdout.readline()):
            assert line, "".join(lines)
            lines.append(line)
        process.send_signal(signum)
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            code = -1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return code, "".join(lines) + process.stdout.read()


def test_a_signal_while_serve_is_setting_its_stop_still_stops_it(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(SIGNAL_INSIDE_A_LOCK.format(signal="SIGTERM") + SERVE_SCRIPT)
    code, output = _run_and_signal(script, list(map(str, free_ports(3))), "serving", signal.SIGTERM)
    assert code == 0, f"serve() did not stop:\n{output}"
    assert "stopped" in output
    assert "Already stopping: in-flight requests are being finished" in output


def test_a_signal_while_the_supervisor_is_setting_its_stop_still_stops_it(tmp_path: Path) -> None:
    script = tmp_path / "supervise.py"
    script.write_text(SIGNAL_INSIDE_A_LOCK.format(signal="SIGINT") + SUPERVISOR_SCRIPT)
    code, output = _run_and_signal(script, [], "Started 1 worker processes", signal.SIGINT)
    assert code == 0, f"the supervisor did not stop:\n{output}"
    assert "Stopping 1 worker processes" in output


def test_instances_in_a_callable_that_hangs_are_waited_for_together() -> None:
    """Three instance threads that do not end: stopping waits the timeout once, not once for each."""
    hung = threading.Event()
    threads = [threading.Thread(target=hung.wait, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    join_within([*threads, threading.Thread()], 1.0)  # one never started: nothing to wait for
    waited = time.monotonic() - started
    hung.set()
    assert 0.9 <= waited < 2.0, f"waited {waited:.1f} s"
