"""Runs one helm-sdkpy action in its own process: `python helm_process.py < request.json`.

Helm runs as Go code loaded into Python, and the Go runtime reads the environment once, from the
process's start, when the library loads. Helm's release storage (`HELM_DRIVER`) must be chosen that
way, so each action runs in a child process started with the environment it needs. The request is
JSON on standard input ({"action": "install" | "lint", ...}); the answer is JSON on standard output,
{"result": ...} or {"error": "..."}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import helm_sdkpy


async def perform(request: dict[str, Any]) -> Any:
    """Run the requested action against the kubeconfig in the request."""
    config = helm_sdkpy.Configuration(namespace=request["namespace"], kubeconfig=request.get("kubeconfig"))
    if request["action"] == "lint":
        return await helm_sdkpy.Lint(config).run(request["chart"])
    return await helm_sdkpy.Install(config).run(
        request["release"], request["chart"], values=request.get("values"), wait=False, timeout=30
    )


def main() -> int:
    try:
        answer = {"result": asyncio.run(perform(json.load(sys.stdin)))}
    except helm_sdkpy.HelmError as error:
        answer = {"error": str(error)}
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
