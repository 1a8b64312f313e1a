"""bench/batch_path.py's parts that need no servers: the breakdown follows the path a batch takes,
`--against` serves another revision's kubetriton from a worktree that imports as the installed package,
and `--steps` times the worker's own methods."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import batch_path  # noqa: E402 - from bench/, which is not a package


def test_the_breakdown_times_every_step_of_a_batch() -> None:
    spent = batch_path.breakdown(batch_size=4, rounds=3)
    assert len(spent) == 8 and all(microseconds > 0 for microseconds in spent.values()), spent


def test_the_worker_times_its_steps_where_the_worker_defines_them(tmp_path: Path) -> None:
    """Every step names a method the worker has (a renamed one fails here, not in a benchmark run), and
    a timed step's calls and CPU time reach the file a benchmark reads."""
    steps = tmp_path / "steps.json"
    script = (
        "import socket, sys, time\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "import batch_path\n"
        "from kubetriton.transport import Hop\n"
        f"batch_path.time_worker_steps(__import__('pathlib').Path({str(steps)!r}), every_s=0.05)\n"
        "left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "Hop(left).send([b'header', b'x' * 1000])\n"
        "assert [bytes(frame) for frame in Hop(right).receive()] == [b'header', b'x' * 1000]\n"
        "time.sleep(0.3)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    totals = batch_path.read_worker_steps(steps)
    assert set(totals) == set(batch_path.WORKER_STEPS)
    assert totals["receive"][1] == 1 and totals["receive"][0] > 0, totals
    assert all(calls == 0 for name, (_, calls) in totals.items() if name != "receive"), totals


def test_another_revision_imports_from_its_own_worktree(tmp_path: Path) -> None:
    if subprocess.run(["git", "-C", str(BENCH), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    probe = (
        "import kubetriton, kubetriton.sidecar as sidecar, pytriton; "
        "print(kubetriton.__file__, sidecar.__file__, pytriton.__file__)"
    )
    with batch_path.checkout("HEAD") as tree:
        found = subprocess.run(
            [sys.executable, "-c", probe],
            env={"PYTHONPATH": str(tree / "worker"), "PATH": "/usr/bin:/bin"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert all(Path(path).resolve().is_relative_to(tree.resolve()) for path in found), found
    assert not tree.exists()
    listed = subprocess.run(["git", "-C", str(BENCH), "worktree", "list"], capture_output=True, text=True)
    assert str(tree) not in listed.stdout
