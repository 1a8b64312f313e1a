"""The `kubetriton` command: one entry point whose sub-commands live beside the code they drive.

Each sub-command module exposes `add_arguments(parser)` and `run(args) -> int`. Modules are imported
only when their command is chosen, so `kubetriton bootstrap` does not pay for the operator's imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "install-triton": ("kubetriton.triton_home", "install the local tritonserver used by local mode"),
    "run": ("kubetriton.supervisor", "run a PyTriton script in several worker processes that serve together"),
    "render": ("kubetriton.operator.render", "print the objects the operator creates for a model.yaml"),
    "operator": ("kubetriton.operator.main", "run the PyTritonModel operator"),
    "deploy": ("kubetriton.operator.deploy", "serve a PyTriton script on a cluster, in the image you name"),
    "delete": ("kubetriton.operator.delete", "delete a model and what was made for it"),
    "status": ("kubetriton.operator.report", "show how models are doing, or one model in detail"),
    "bootstrap": ("kubetriton.sidecar.bootstrap", "prepare the shared volume for the Triton sidecar"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        top = argparse.ArgumentParser(prog="kubetriton")
        top.add_argument(
            "command", choices=sorted(COMMANDS), help="; ".join(f"{k}: {v[1]}" for k, v in COMMANDS.items())
        )
        top.parse_args(argv[:1])
        return 2
    module_name, help_text = COMMANDS[argv[0]]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"kubetriton {argv[0]}", description=help_text)
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(argv[1:])) or 0)


if __name__ == "__main__":
    sys.exit(main())
