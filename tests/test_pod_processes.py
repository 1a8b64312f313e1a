"""The rendered pod with two worker processes (`worker.processes: 2`), run for real as local processes as
tests/test_pod.py runs it: the launcher supervises the processes, the pod's probes and metrics are theirs,
a process killed while it serves costs only the requests in flight on it and comes back alone while the
other serves, and SIGTERM to the worker container drains both and stops the sidecar.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from kubetriton import podenv

from tests.test_pod import Pod, wait_for
from tests.test_processes import ClosedLoop, check_failures_of_a_kill

SCRIPT = """
import os

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

INDEX = int(os.environ.get("KUBETRITON_PROCESS_INDEX", "0"))


@batch
def which(x):
    return {"process": np.tile(np.array([[INDEX, os.getpid()]], np.int64), (x.shape[0], 1))}


with Triton() as triton:
    triton.bind("Which", which, [Tensor(name="x", shape=(1,), dtype=np.float32)],
                [Tensor(name="process", shape=(2,), dtype=np.int64)], config=ModelConfig(max_batch_size=8))
    triton.serve()
"""


def _process_pid(supervisor: int, index: int) -> int | None:
    """The pid of the supervisor's worker process `index`, from its environment."""
    wanted = f"\0{podenv.ENV_PROCESS_INDEX}={index}\0".encode()
    for child in Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split():
        try:
            if wanted in b"\0" + Path(f"/proc/{child}/environ").read_bytes():
                return int(child)
        except OSError:
            continue
    return None


def _live(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def test_two_worker_processes_in_the_rendered_pod(tmp_path: Path) -> None:
    pod = Pod(tmp_path, script=SCRIPT, models=("Which",), processes=2)
    try:
        sidecar = pod.start_sidecar()
        wait_for(lambda: _live(f"http://127.0.0.1:{pod.http_port}/v2/health/live"), 60, "the sidecar")
        worker = pod.start("worker", **{podenv.ENV_SHM_DIR: str(pod.shm)})
        wait_for(lambda: pod.probe("/readyz")[0] == 200, 120, f"the pod to be ready:\n{pod.log('worker')}")
        status, metrics = pod.probe("/metrics")
        assert status == 200
        for index in (0, 1):
            assert f'kubetriton_attached{{model="Which",process="{index}"}} 1.0' in metrics, metrics

        http, grpc = f"http://127.0.0.1:{pod.http_port}", f"grpc://127.0.0.1:{pod.grpc_port}"
        loads = [ClosedLoop(http, clients=3), ClosedLoop(grpc, clients=3)]
        wait_for(
            lambda: {index for load in loads for _, index, _ in load.answers} == {0, 1}, 60, "both processes"
        )
        victim = _process_pid(worker.pid, 1)
        assert victim is not None
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: any(index == 1 and pid != victim for load in loads for _, index, pid in load.answers),
            60,
            "the killed process to answer again",
        )
        time.sleep(1)
        results = [load.stop() for load in loads]
        answers = sorted(answer for load_answers, _ in results for answer in load_answers)
        failures = [failure for _, load_failures in results for failure in load_failures]
        back = min(at for at, index, pid in answers if index == 1 and pid != victim) - killed_at
        print(f"the killed process answered again {back:.2f} s after SIGKILL; {len(failures)} failed")
        check_failures_of_a_kill(failures, killed_at, killed_at + back)
        assert any(index == 0 and killed_at <= at <= killed_at + back for at, index, _ in answers)
        assert worker.poll() is None and sidecar.poll() is None, "neither container restarts"
        wait_for(lambda: pod.probe("/readyz")[0] == 200, 60, "the pod to be ready again")
        assert 'kubetriton_process_restarts_total{process="1"} 1.0' in pod.probe("/metrics")[1]

        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, pod.log("worker")
        assert sidecar.wait(30) == 0, "the draining processes stop the sidecar's Triton"
        assert pod.probe("/readyz")[0] == 0, "the pod's endpoint goes with the worker container"
    finally:
        pod.stop()
        shutil.rmtree(pod.shm, ignore_errors=True)
