"""What other users of a shared machine can reach of a local server: nothing that kubetriton makes, whatever
the umask of the script that serves (the sockets, the model repository, the proxy's runtime, the log, the
shared-memory directory), while a workspace the user gave keeps the mode they chose."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

from tests.conftest import free_ports

SERVE_UNDER_UMASK_000 = """
import json
import os
import stat
import sys
from pathlib import Path

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

os.umask(0)
workspace = Path(sys.argv[1])
http, grpc, metrics = map(int, sys.argv[2:5])
server_id = sys.argv[5]


@batch
def double(x):
    return {"y": x * 2}


def kind(mode):
    return next(name for name, test in KINDS.items() if test(mode))


KINDS = {"directory": stat.S_ISDIR, "file": stat.S_ISREG, "socket": stat.S_ISSOCK, "link": stat.S_ISLNK}
config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, id=server_id)
with Triton(config=config, workspace=workspace) as triton:
    x, y = (Tensor(name=name, shape=(-1,), dtype=np.float32) for name in "xy")
    triton.bind("double", double, [x], [y], config=ModelConfig(max_batch_size=4))
    found = {}
    for label, root in (("workspace", workspace), ("shm", Path(f"/dev/shm/kubetriton-{server_id}"))):
        for path in (root, *root.rglob("*")):
            mode = path.lstat().st_mode
            found[str(Path(label) / path.relative_to(root))] = (kind(mode), stat.S_IMODE(mode))
    print(json.dumps(found), flush=True)
"""


def test_a_server_started_under_umask_000_keeps_what_it_makes_to_its_user(tmp_path):
    """Under `umask 000` the hop sockets were srwxrwxrwx, the workspace's folders 0777 and model.py 0666:
    another user could connect to the worker or rewrite the model Triton loads. Every folder kubetriton
    (or the Triton it launches) makes is 0700, every file and socket 0600; the workspace the user gave
    keeps its own mode."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    workspace.chmod(0o755)
    server_id = f"umask-{secrets.token_hex(4)}"
    script = tmp_path / "serve.py"
    script.write_text(SERVE_UNDER_UMASK_000)
    served = subprocess.run(
        [sys.executable, str(script), str(workspace), *map(str, free_ports(3)), server_id],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert served.returncode == 0, served.stderr[-3000:]
    found = {path: tuple(entry) for path, entry in json.loads(served.stdout.splitlines()[-1]).items()}
    assert found.pop("workspace") == ("directory", 0o755), "the user's workspace was changed"
    kinds = {kind for kind, _ in found.values()}
    names = {path.rsplit("/", 1)[-1] for path in found}
    assert {"directory", "file", "socket"} <= kinds and "link" not in kinds
    assert {
        "model.py",
        "config.pbtxt",
        "double.0.hop",
        "double.0",
        "tritonserver.log",
        "transport.py",
    } <= names
    assert any(path.endswith(".req") for path in found), "no arena in the shared-memory directory"
    private = {"directory": 0o700, "file": 0o600, "socket": 0o600}
    opened = {path: oct(mode) for path, (kind, mode) in found.items() if mode != private[kind]}
    assert not opened, f"other users may use {opened}"
