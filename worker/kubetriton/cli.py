"""The `kubetriton` command: one entry point whose sub-commands live beside the code they drive.

Each sub-command module exposes `add_arguments(parser)` and `run(args) -> int`. Modules are imported
only when their command is chosen, so `kubetriton bootstrap` does not pay for the operator's imports, and
a command whose extra is not installed says which one to install (`kubetriton.extras`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

from kubetriton.extras import CLUSTER, MissingExtraError, needed

COMMANDS: dict[str, tuple[str, str | None, str]] = {
    "install-triton": ("kubetriton.triton_home", None, "install the local tritonserver used by local mode"),
    "run": (
        "kubetriton.supervisor",
        None,
        "run a PyTriton script in several worker processes that serve together",
    ),
    "render": (
        "kubetriton.operator.render",
        CLUSTER,
        "print the objects the operator creates for a model.yaml",
    ),
    "operator": ("kubetriton.operator.main", CLUSTER, "run the PyTritonModel operator"),
    "deploy": (
        "kubetriton.operator.deploy",
        CLUSTER,
        "serve a PyTriton script on a cluster, in the image you name",
    ),
    "delete": ("kubetriton.operator.delete", CLUSTER, "delete a model and what was made for it"),
    "status": ("kubetriton.operator.report", CLUSTER, "show how models are doing, or one model in detail"),
    "bootstrap": ("kubetriton.sidecar.bootstrap", None, "prepare the shared volume for the Triton sidecar"),
}


class _Version(argparse.Action):
    """`kubetriton --version`: the installed distribution's version, read only when asked (a pod's worker
    runtime has kubetriton's modules without a distribution)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print kubetriton's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        try:
            version = importlib.metadata.version("kubetriton")
        except importlib.metadata.PackageNotFoundError:
            version = "(its modules, without an installed distribution)"
        print(f"kubetriton {version}")
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        top = argparse.ArgumentParser(prog="kubetriton")
        top.add_argument("--version", action=_Version)
        top.add_argument(
            "command", choices=sorted(COMMANDS), help="; ".join(f"{k}: {v[2]}" for k, v in COMMANDS.items())
        )
        top.parse_args(argv[:1])
        return 2
    module_name, extra, help_text = COMMANDS[argv[0]]
    prog = f"kubetriton {argv[0]}"
    try:
        with needed(extra, prog):
            module = importlib.import_module(module_name)
            parser = argparse.ArgumentParser(prog=prog, description=help_text)
            module.add_arguments(parser)
            return int(module.run(parser.parse_args(argv[1:])) or 0)
    except MissingExtraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
