"""A 30-second run of bench/soak.py: mixed requests from concurrent clients, every answer right, and no
arena block left in use once the load stopped. The 30-minute soak, which judges memory growth, is run by
hand (bench/RESULTS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import free_ports

SOAK = Path(__file__).resolve().parent.parent / "bench" / "soak.py"


def test_a_short_soak_answers_every_request_right_and_returns_every_arena_block():
    ports = [str(port) for port in free_ports(3)]
    run = subprocess.run(
        [sys.executable, str(SOAK), "--minutes", "0.5", "--clients", "4", "--ports", *ports],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = run.stdout.splitlines()
    summary = next(line for line in lines if " answered (" in line)
    assert int(summary.split()[0]) > 0
    assert ", 0 failed, 0 wrong" in summary, run.stdout
    assert any(line.strip() == "blocks      0 in use after the load stopped" for line in lines), run.stdout
    assert run.returncode == 0 and lines[-1] == "verdict: PASS", run.stdout + run.stderr[-2000:]
