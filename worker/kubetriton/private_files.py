"""Folders and files that kubetriton makes for a server, for its user alone whatever the umask.

On a machine shared with other users, a script run under a permissive umask (`umask 000`) would otherwise
leave the workspace's folders open to all: another user could replace the `model.py` that Triton loads, or
read the repository's configuration. So every folder kubetriton makes is 0700 and every file 0600, the
modes set explicitly after creation (the umask only takes bits away from a mode asked for at creation).
A folder the user gave (`Triton(workspace=...)`, `TritonConfig(model_repository=...)`) stays as they made it.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600


def create_missing(path: Path) -> None:
    """Create the folder `path` and any missing parent, each for this user alone; folders that exist stay
    as they are (the user's own)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(PRIVATE_FOLDER)
        except FileExistsError:  # made meanwhile by another process
            continue
        folder.chmod(PRIVATE_FOLDER)


def private_folder(path: Path) -> Path:
    """`path`, a folder of kubetriton's, created where missing (its missing parents too, as
    `create_missing` does) and for this user alone, also when it exists already."""
    create_missing(path)
    path.chmod(PRIVATE_FOLDER)
    return path


def write_private_file(path: Path, text: str) -> None:
    """Write `text` into the file `path`, which is then for this user alone, also when it existed."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    os.fchmod(descriptor, PRIVATE_FILE)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


def make_tree_private(root: Path) -> None:
    """Every folder below `root` 0700 and every file 0600: what was copied or unpacked there (a wheel)
    took its modes from the umask. Its callers make `root` private before they fill it, so that nobody
    reaches in meanwhile."""
    for folder, subfolders, files in os.walk(root):
        for name in subfolders:
            os.chmod(os.path.join(folder, name), PRIVATE_FOLDER)
        for name in files:
            os.chmod(os.path.join(folder, name), PRIVATE_FILE)
