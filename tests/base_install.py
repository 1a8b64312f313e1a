"""Run Python code as if only `pip install kubetriton` had been done, or `pip install 'kubetriton[EXTRA]'`.

`python tests/base_install.py [--with EXTRA] -c CODE` or `... -m MODULE ARGS...` (or a script that calls
`activate()` first): any import of a module that is neither the standard library's, kubetriton's own nor
one of the distributions that kubetriton requires without an extra, or with EXTRA (read from the
installed metadata, with what they require in turn), fails as it fails where that module is not
installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import runpy
import sys
import sysconfig
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

OWN_PACKAGES = {"kubetriton", "pytriton"}


def installed_distributions(extras: Collection[str] = ()) -> set[str]:
    """kubetriton with `extras`, and every distribution that it requires, transitively, each with the
    extras its requirement names."""
    found: set[str] = set()
    pending, seen = [("kubetriton", frozenset(extras))], set()
    while pending:
        name, wanted = pending.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        found.add(name)
        try:
            requirements = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:  # excluded by its marker here
            continue
        for line in requirements:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in {"", *wanted}):
                pending.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return found


def installed_modules(extras: Collection[str] = ()) -> set[str]:
    """The top-level modules of that install."""
    distributions = installed_distributions(extras)
    return OWN_PACKAGES | {
        module
        for module, owners in importlib.metadata.packages_distributions().items()
        if any(canonicalize_name(owner) in distributions for owner in owners)
    }


class Installed:
    """Which modules the install has: the standard library's (named, or found in its folders, as the
    platform's `_sysconfigdata_*`) and those of the allowed distributions."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed | set(sys.stdlib_module_names)
        paths = sysconfig.get_paths()
        self.stdlib = [paths["stdlib"], paths["platstdlib"], str(Path(paths["platstdlib"]) / "lib-dynload")]

    def __contains__(self, fullname: str) -> bool:
        top = fullname.partition(".")[0]
        return top in self.allowed or importlib.machinery.PathFinder.find_spec(top, self.stdlib) is not None


class Filtered(importlib.abc.MetaPathFinder):
    """One of the import system's finders, that finds only what the install has: the rest is not found, as
    where it is not installed (an import fails, `importlib.util.find_spec` says None)."""

    def __init__(self, finder: Any, installed: Installed) -> None:
        self.finder = finder
        self.installed = installed

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname not in self.installed:
            return None
        return self.finder.find_spec(fullname, path, target)

    def invalidate_caches(self) -> None:
        if hasattr(self.finder, "invalidate_caches"):
            self.finder.invalidate_caches()


def activate(extras: Collection[str] = ()) -> None:
    installed = Installed(installed_modules(extras))
    sys.meta_path[:] = [Filtered(finder, installed) for finder in sys.meta_path]


def main(argv: list[str]) -> None:
    extras = []
    while argv[:1] == ["--with"]:
        extras.append(argv[1])
        argv = argv[2:]
    activate(extras)
    option, target, *rest = argv
    if option == "-c":
        sys.argv = ["-c", *rest]
        exec(compile(target, "<base install>", "exec"), {"__name__": "__main__"})
    elif option == "-m":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.exit(f"usage: {sys.argv[0]} [--with EXTRA] -c CODE | -m MODULE [ARGS...]")


if __name__ == "__main__":
    main(sys.argv[1:])
