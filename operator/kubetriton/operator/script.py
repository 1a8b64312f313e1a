"""A user's script as `kubetriton deploy` ships it: its files, their hash, and the models it binds.

A script is one file, or a small folder whose top-level files travel together (the entrypoint and the
modules it imports). They become the keys of one ConfigMap, whose name carries a hash of the files,
so that an edited script gets a new ConfigMap and the pods roll as they do for a new image.

The model names the pods must serve are read from the script's source, without running it: every
`bind(model_name="...")` or `bind("...", ...)` call, with string literals only. A name computed at
run time cannot be read this way, so the user then gives the names (`--model`).
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from kubetriton.operator.spec import CONFIG_MAP_KEY_PATTERN, OBJECT_NAME_MAX_LENGTH

DEFAULT_ENTRYPOINT = "serve.py"
MAX_CONFIG_MAP_BYTES = 1024 * 1024
"""What one ConfigMap may hold (the API server refuses a larger one)."""
HASH_LENGTH = 10
SKIPPED_FOLDERS = ("__pycache__",)
"""Folders left out without a word: Python's caches are no part of a script (nor are hidden folders, a
repository's .git or a .venv)."""
TOP_LEVEL_ONLY = "only a folder's top-level files are"
HIDDEN = "hidden files are left out, as they often hold secrets (give those in a Secret: worker.envFrom)"


class ScriptError(ValueError):
    """A script that cannot be deployed as it is, with what to do about it."""


@dataclass(frozen=True)
class Script:
    """The files of a script, by ConfigMap key, and the one to run."""

    files: dict[str, bytes]
    entrypoint: str
    source: Path
    skipped: tuple[tuple[str, str], ...] = ()
    """What of a folder script is not deployed, and why: its sub-folders (only top-level files are), its
    hidden files, and links to files outside it."""

    @property
    def digest(self) -> str:
        """A short hash of every file's name and content: it changes whenever the script does."""
        hashed = hashlib.sha256()
        for key in sorted(self.files):
            content = self.files[key]
            hashed.update(f"{key}\0{len(content)}\0".encode())
            hashed.update(content)
        return hashed.hexdigest()[:HASH_LENGTH]

    @property
    def stem(self) -> str:
        """What the script is called: the folder's name, or the file's without its suffix."""
        return self.source.name if self.source.is_dir() else self.source.stem


def load(path: Path, entrypoint: str | None = None) -> Script:
    """Read a script file, or a folder's top-level files with `entrypoint` (serve.py) to run."""
    if path.is_dir():
        files, skipped = {}, []
        inside = path.resolve()
        for item in sorted(path.iterdir()):
            if item.is_dir():
                if item.name not in SKIPPED_FOLDERS and not item.name.startswith("."):
                    skipped.append((item.name, TOP_LEVEL_ONLY))
            elif item.name.startswith("."):
                skipped.append((item.name, HIDDEN))
            elif item.is_symlink() and not item.resolve().is_relative_to(inside):
                skipped.append((item.name, f"it links to {item.resolve()}, outside the folder"))
            elif item.is_file():
                files[_key(item)] = item.read_bytes()
        chosen = entrypoint or DEFAULT_ENTRYPOINT
        if chosen not in files:
            raise ScriptError(
                f"{path} has no {chosen}: name the file to run with --entrypoint"
                if entrypoint is None
                else f"{path} has no file named {chosen}"
            )
        script = Script(files, chosen, path, tuple(skipped))
    elif path.is_file():
        if entrypoint is not None and entrypoint != path.name:
            raise ScriptError(f"--entrypoint names a file of a folder; {path} is one file, run as it is")
        script = Script({_key(path): path.read_bytes()}, path.name, path)
    else:
        raise ScriptError(f"{path}: no such file or folder")
    size = sum(len(key) + len(content) for key, content in script.files.items())
    if size > MAX_CONFIG_MAP_BYTES:
        raise ScriptError(
            f"{path}: the script's files come to {size} bytes, more than the {MAX_CONFIG_MAP_BYTES} a"
            " ConfigMap holds; put large files (weights, data) in the image or on a volume"
        )
    return script


def _key(path: Path) -> str:
    if not re.match(CONFIG_MAP_KEY_PATTERN, path.name):
        raise ScriptError(
            f"{path}: a ConfigMap key may hold only letters, digits, '-', '_' and '.'; rename the file"
        )
    return path.name


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_bind(call: ast.Call) -> bool:
    """Whether the call can be Triton's bind(model_name, infer_func, inputs, outputs, ...): a call named
    bind with a model and its callable, by keyword, by position, or through `**`. A socket's bind (one
    address) is not."""
    function = call.func
    named_bind = (isinstance(function, ast.Attribute) and function.attr == "bind") or (
        isinstance(function, ast.Name) and function.id == "bind"
    )
    keywords = {keyword.arg for keyword in call.keywords}
    return named_bind and (len(call.args) >= 2 or bool(keywords & {"model_name", "infer_func", None}))


def _bound_name(call: ast.Call) -> ast.expr | None:
    """The expression a bind() call names its model with: model_name=, else the first argument."""
    keyword = next((k.value for k in call.keywords if k.arg == "model_name"), None)
    if keyword is not None:
        return keyword
    return call.args[0] if call.args and not isinstance(call.args[0], ast.Starred) else None


def model_names(script: Script) -> list[str]:
    """The models the script binds, in order of appearance, the entrypoint's first.

    Raises ScriptError when there is no bind() call, or one whose name is not a string literal."""
    names: list[str] = []
    python_files = [script.entrypoint, *(key for key in sorted(script.files) if key != script.entrypoint)]
    for key in python_files:
        if not key.endswith(".py"):
            continue
        try:
            tree = ast.parse(script.files[key], filename=key)
        except (SyntaxError, ValueError) as error:
            raise ScriptError(f"{key} is not valid Python: {error}") from error
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and _is_bind(node)]
        for call in sorted(calls, key=lambda node: (node.lineno, node.col_offset)):
            expression = _bound_name(call)
            name = None if expression is None else _literal(expression)
            if name is None:
                raise ScriptError(
                    f"cannot read the model names of {script.source}: the bind() call at {key}:{call.lineno}"
                    " does not name its model with a string literal; give every model name with --model NAME"
                )
            if name not in names:
                names.append(name)
    if not names:
        raise ScriptError(
            f'cannot read the model names of {script.source}: it has no bind(model_name="...") call;'
            " give every model name with --model NAME"
        )
    return names


def object_name(*candidates: str) -> str:
    """The first candidate that makes a DNS-1035 label (lowercase, '-' for other characters, starting
    with a letter, at most 63 characters), as a model and its Service need; "" when none does."""
    for candidate in candidates:
        label = re.sub(r"[^a-z0-9]+", "-", candidate.lower())
        label = re.sub(r"^[^a-z]+", "", label)[:OBJECT_NAME_MAX_LENGTH].rstrip("-")
        if label:
            return label
    return ""
