"""What the API server does with a PyTritonModel before storing it, done with the generated CRD.

The emulator neither prunes, defaults nor validates custom resources, so tests do it here the way a
Kubernetes API server does: unknown fields pruned, defaults filled in only inside objects that are
present, then the OpenAPI schema and the keys of map lists, then every CEL rule exactly as written in
crds/. A rule sees only the fields the schema declares (the server gives CEL no view of preserved
unknown fields), and a rule that fails to evaluate rejects the object just as one that evaluates to
false does.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "pytritonmodels.kubetriton.dev.yaml"
RESOURCE_META = ("apiVersion", "kind", "metadata")
"""Root fields that the API server handles itself: never pruned by the schema."""


def load_crd(path: Path = CRD_FILE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def load_schema(path: Path = CRD_FILE) -> dict[str, Any]:
    return load_crd(path)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def prune(schema: dict[str, Any], value: Any, *, resource_root: bool = False) -> Any:
    """Drop the fields the schema does not declare, unless it preserves unknown fields there."""
    if isinstance(value, dict):
        if isinstance(schema.get("additionalProperties"), dict):
            return {key: prune(schema["additionalProperties"], item) for key, item in value.items()}
        properties = schema.get("properties", {})
        kept = {}
        for key, item in value.items():
            if resource_root and key in RESOURCE_META:
                kept[key] = item
            elif key in properties:
                kept[key] = prune(properties[key], item)
            elif schema.get("x-kubernetes-preserve-unknown-fields"):
                kept[key] = item
        return kept
    if isinstance(value, list) and "items" in schema:
        return [prune(schema["items"], item) for item in value]
    return value


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


def schema_errors(schema: dict[str, Any], value: Any) -> list[str]:
    """The OpenAPI validation messages for a value (CEL rules aside)."""
    return [error.message for error in jsonschema.Draft7Validator(schema).iter_errors(value)]


def duplicate_keys(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Entries of a list of `x-kubernetes-list-type: map` that repeat an earlier entry's keys, and of a
    `set` that repeat an earlier entry."""
    problems = []
    if isinstance(value, list) and "items" in schema:
        names = schema.get("x-kubernetes-list-map-keys", [])
        seen: list[Any] = []
        for index, item in enumerate(value):
            if schema.get("x-kubernetes-list-type") == "set":
                if item in seen:
                    problems.append(f"{path[1:]}[{index}]: Duplicate value: {item!r}")
                seen.append(item)
                continue
            key = tuple((name, item.get(name)) for name in names)
            if key and key in seen:
                problems.append(f"{path[1:]}[{index}]: Duplicate value: {dict(key)}")
            seen.append(key)
            problems += duplicate_keys(schema["items"], item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in schema.get("properties", {}):
                problems += duplicate_keys(schema["properties"][key], item, f"{path}.{key}")
    return problems


def with_object_meta(schema: dict[str, Any]) -> dict[str, Any]:
    """The root schema as CEL sees it: the server always exposes metadata.name and generateName.

    It keeps the declared metadata only when both names are declared as strings, as the server does.
    """
    declared = schema.get("properties", {}).get("metadata", {}).get("properties", {})
    if all(declared.get(name, {}).get("type") == "string" for name in ("name", "generateName")):
        return schema
    plain = {"type": "object", "properties": {"name": {"type": "string"}, "generateName": {"type": "string"}}}
    return {**schema, "properties": {**schema.get("properties", {}), "metadata": plain}}


def cel_visible(schema: dict[str, Any], value: Any) -> Any:
    """The part of a value that a CEL rule on this schema node can read."""
    if isinstance(value, dict):
        if isinstance(schema.get("additionalProperties"), dict):
            return {key: cel_visible(schema["additionalProperties"], item) for key, item in value.items()}
        properties = schema.get("properties", {})
        return {key: cel_visible(properties[key], item) for key, item in value.items() if key in properties}
    if isinstance(value, list) and "items" in schema:
        return [cel_visible(schema["items"], item) for item in value]
    return value


@functools.cache
def compiled(expression: str) -> celpy.Runner:
    """A CEL expression compiled once (raises celpy.CELParseError when it does not parse)."""
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def field_path(path: str, relative: str) -> str:
    """`path` extended by a rule's fieldPath (`.a.b` or `['key']`), spelled as the server reports it."""
    joined = path + re.sub(r"\['([^']*)'\]", r"[\1]", relative)
    return joined.lstrip(".") or "<nil>"


def rule_violations(
    schema: dict[str, Any], value: Any, path: str = "", *, resource_root: bool = False
) -> list[str]:
    """Evaluate the CEL rules of this node and of every node below it that the value reaches.

    Each problem reads `<field>: <message>`, the field being the node's path extended by the rule's
    fieldPath; a rule that does not evaluate reports the error as the server does.
    """
    if value is None:
        return []
    visible = cel_visible(with_object_meta(schema) if resource_root else schema, value)
    problems = []
    for rule in schema.get("x-kubernetes-validations", []):
        message = rule.get("message", rule["rule"])
        try:
            result = compiled(rule["rule"]).evaluate({"self": celpy.json_to_cel(visible)})
        except celpy.CELEvalError as error:
            problems.append(f"{field_path(path, '')}: {error.args[0]} evaluating rule: {message}")
            continue
        if isinstance(result, celpy.CELEvalError):
            problems.append(f"{field_path(path, '')}: {result.args[0]} evaluating rule: {message}")
        elif not result:
            problems.append(f"{field_path(path, rule.get('fieldPath', ''))}: {message}")
    if isinstance(value, dict):
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in schema.get("properties", {}):
                problems += rule_violations(schema["properties"][key], item, f"{path}.{key}")
            elif isinstance(extra, dict):
                problems += rule_violations(extra, item, f"{path}[{key}]")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problems += rule_violations(schema["items"], item, f"{path}[{index}]")
    return problems


def admit(obj: dict[str, Any], schema: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The object as the API server would store it, and the reasons it would reject it."""
    schema = schema or load_schema()
    stored = apply_defaults(schema, prune(schema, copy.deepcopy(obj), resource_root=True))
    errors = schema_errors(schema, stored) + duplicate_keys(schema, stored)
    if errors:
        return stored, errors
    return stored, rule_violations(schema, stored, resource_root=True)
