"""Run Python code as if only `pip install kubetriton` had been done, without its extras.

`python tests/base_install.py -c CODE` or `python tests/base_install.py -m MODULE ARGS...` (or a script
that calls `activate()` first): any import
of a module that is neither the standard library's, kubetriton's own nor one of the distributions that
kubetriton requires without an extra (read from its installed metadata, with what they require in turn)
fails as it fails where that module is not installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import runpy
import sys
from collections.abc import Sequence
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

OWN_PACKAGES = {"kubetriton", "pytriton"}


def base_distributions() -> set[str]:
    """kubetriton and every distribution it requires without an extra, transitively."""
    found, pending = set(), ["kubetriton"]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requirements = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:  # excluded by its marker here
            continue
        for line in requirements:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(canonicalize_name(requirement.name))
    return found


def base_modules() -> set[str]:
    """The top-level modules of a base install."""
    distributions = base_distributions()
    return OWN_PACKAGES | {
        module
        for module, owners in importlib.metadata.packages_distributions().items()
        if any(canonicalize_name(owner) in distributions for owner in owners)
    }


class BaseInstall(importlib.abc.MetaPathFinder):
    """Refuses every module that a base install would not have."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed | set(sys.stdlib_module_names)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> None:
        top = fullname.partition(".")[0]
        if top not in self.allowed:
            raise ModuleNotFoundError(f"No module named {top!r}", name=top)
        return None


def activate() -> None:
    sys.meta_path.insert(0, BaseInstall(base_modules()))


def main(argv: list[str]) -> None:
    activate()
    option, target, *rest = argv
    if option == "-c":
        sys.argv = ["-c", *rest]
        exec(compile(target, "<base install>", "exec"), {"__name__": "__main__"})
    elif option == "-m":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.exit(f"usage: {sys.argv[0]} -c CODE | -m MODULE [ARGS...]")


if __name__ == "__main__":
    main(sys.argv[1:])
