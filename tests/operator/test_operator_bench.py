"""`bench/operator_scale.py` against the emulated API server, small, so that the bench keeps working.

Its figures on a real cluster are in bench/RESULTS.md; here only what holds on any API server is
checked: every model gets its children and status, and neither a quiet spell nor a restart writes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_operator_bench_runs_against_the_emulator(tmp_path: Path) -> None:
    environment = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    command = [sys.executable, str(ROOT / "bench" / "operator_scale.py"), "--models", "12", "--steady", "1"]
    command += ["--service-monitor-crd", "--timeout", "60", "--operator-log", str(tmp_path / "operator.log")]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = dict(re.findall(r"^([^:\n]+):\s+(.*)$", result.stdout, flags=re.MULTILINE))
    assert figures["API server"] == "the emulated API server of the operator tests"
    assert re.fullmatch(r"[0-9.]+ s after the first create", figures["all statuses written"])
    creating = figures["requests per model, creation"]
    for child in ("deployments", "servicemonitors", "pytritonmodels/status"):
        assert f"PATCH {child} 1.00" in creating, creating
    assert "PATCH services 2.00" in creating, creating  # the model's Service and its pods Service
    assert figures["per model and minute, steady"].startswith("writes 0.00 (none)")
    assert figures["per model, restart (resume)"].startswith("writes 0.00 (none)")
    assert figures["operator exit code"] == "0"
