"""What the API server does with a PyTritonModel before storing it, done with the generated CRD.

The emulator neither defaults nor validates custom resources, so tests do it here: structural
defaults first, then the OpenAPI schema, then every CEL rule exactly as written in crds/.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "pytritonmodels.kubetriton.dev.yaml"


def load_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Fill in defaults the way the API server does: only inside objects that are present."""
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = apply_defaults(prop, value[name])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def _cel_messages(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    messages = []
    environment = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations", []):
        program = environment.program(environment.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            messages.append(f"{path}: {rule['message']}")
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                messages += _cel_messages(prop, value[name], f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            messages += _cel_messages(schema["items"], item, f"{path}[{index}]")
    return messages


def admit(obj: dict[str, Any], schema: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The object as the API server would store it, and the reasons it would reject it."""
    schema = schema or load_schema()
    stored = apply_defaults(schema, copy.deepcopy(obj))
    errors = [error.message for error in jsonschema.Draft7Validator(schema).iter_errors(stored)]
    if errors:
        return stored, errors
    return stored, _cel_messages(schema, stored, "")
