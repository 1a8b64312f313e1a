"""Runs helm-sdkpy actions in their own process: `python helm_process.py < request.json`.

Helm runs as Go code loaded into Python, and the Go runtime reads the environment once, from the
process's start, when the library loads. Helm's release storage (`HELM_DRIVER`) must be chosen that
way, so the actions run in a child process started with the environment it needs. With the memory
driver, releases live as long as that process: an upgrade must run in the same request as its install.

The request is JSON on standard input: {"namespace", "kubeconfig", "steps": [{"action": "lint" |
"install" | "upgrade", "chart", "release", "values"}, ...]}. The answer is JSON on standard output:
{"results": [one per step]} or, at the first step Helm refuses, {"error": "..."}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import helm_sdkpy


async def perform(request: dict[str, Any]) -> list[Any]:
    """Run the steps in order against the kubeconfig in the request."""
    config = helm_sdkpy.Configuration(namespace=request["namespace"], kubeconfig=request.get("kubeconfig"))
    results = []
    for step in request["steps"]:
        if step["action"] == "lint":
            results.append(await helm_sdkpy.Lint(config).run(step["chart"]))
            continue
        action = {"install": helm_sdkpy.Install, "upgrade": helm_sdkpy.Upgrade}[step["action"]](config)
        results.append(
            await action.run(
                step["release"], step["chart"], values=step.get("values"), wait=False, timeout=30
            )
        )
    return results


def main() -> int:
    try:
        answer: dict[str, Any] = {"results": asyncio.run(perform(json.load(sys.stdin)))}
    except helm_sdkpy.HelmError as error:
        answer = {"error": str(error)}
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
