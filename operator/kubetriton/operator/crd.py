"""The PyTritonModel CustomResourceDefinition, generated from the pydantic models in `spec`.

pydantic writes JSON Schema with references, nullable unions and titles; the API server wants a
structural OpenAPI v3 schema: everything inline, every property typed (or int-or-string),
pass-through structures marked as such. This module performs that translation and adds what only a
CRD has: the subresources, the printer columns and the names.
"""

from __future__ import annotations

from typing import Any

from kubetriton.operator import spec
from pydantic import BaseModel

_DROPPED_KEYS = {"title", "additionalProperties", "$defs", "anyOf", "$ref"}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Available", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.autoscaling.desiredReplicas"},
    {"name": "Targets", "type": "string", "jsonPath": ".status.autoscaling.targets"},
    {"name": "Models", "type": "string", "jsonPath": ".spec.models"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".spec.gpus.count"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Reason",
        "type": "string",
        "priority": 1,
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
    },
    {"name": "Processes", "type": "integer", "priority": 1, "jsonPath": ".spec.worker.processes"},
    {"name": "URL", "type": "string", "priority": 1, "jsonPath": ".status.url"},
]


def _int_or_string(branches: list[dict[str, Any]]) -> dict[str, Any]:
    """`int | str` (a Kubernetes quantity): the API server's int-or-string, whose only typed form is this
    anyOf; each branch's bounds move beside it, where they apply to values of that branch's type alone
    (a minimum to integers, a pattern to strings)."""
    bounds = {
        key: value for branch in branches for key, value in branch.items() if key not in ("type", "title")
    }
    return {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}], **bounds}


def _structural(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """Inline references, unwrap `X | None`, and mark free-form objects as preserved."""
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = _structural(target, definitions)
        merged.update(
            {
                key: value
                for key, value in node.items()
                if key in ("description", "default", "x-kubernetes-validations") and value is not None
            }
        )
        return merged
    if "anyOf" in node:
        branches = [branch for branch in node["anyOf"] if branch.get("type") != "null"]
        outer = {key: value for key, value in node.items() if key not in _DROPPED_KEYS}
        if sorted(branch.get("type") for branch in branches) == ["integer", "string"]:
            return {**_int_or_string(branches), **outer}
        (branch,) = branches
        return _structural({**branch, **outer}, definitions)

    result: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "default" and value in (None, [], {}):
            continue
        if key == "properties":
            value = {name: _structural(prop, definitions) for name, prop in value.items()}
        elif key == "items":
            value = _structural(value, definitions)
        result[key] = value
    extra = node.get("additionalProperties")
    if extra is True:
        result["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, dict):
        result["additionalProperties"] = _structural(extra, definitions)
    return result


def _one_line_descriptions(node: Any) -> Any:
    """Docstrings wrap at the source's line length; `kubectl explain` wraps descriptions itself."""
    if isinstance(node, dict):
        return {
            key: " ".join(value.split()) if key == "description" else _one_line_descriptions(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_one_line_descriptions(item) for item in node]
    return node


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True)
    return _one_line_descriptions(_structural(raw, raw.get("$defs", {})))


def _metadata_schema() -> dict[str, Any]:
    """The restriction on names (the only one a CRD may make on metadata), bounding what rules read.

    The API server shows CEL the declared name only when generateName is declared beside it.
    """
    names = ("name", "generateName")
    return {
        "type": "object",
        "properties": {name: {"type": "string", "maxLength": spec.OBJECT_NAME_MAX_LENGTH} for name in names},
    }


def openapi_schema() -> dict[str, Any]:
    """The structural schema of a whole PyTritonModel object."""
    return {
        "type": "object",
        "required": ["spec"],
        "x-kubernetes-validations": [spec.SERVICE_SAFE_NAME, spec.RESERVED_NAME_SUFFIX],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": _metadata_schema(),
            "spec": _schema_of(spec.PyTritonModelSpec),
            "status": _schema_of(spec.PyTritonModelStatus),
        },
    }


def custom_resource_definition() -> dict[str, Any]:
    """The CRD manifest, ready to be written as YAML."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{spec.PLURAL}.{spec.GROUP}"},
        "spec": {
            "group": spec.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": spec.KIND,
                "plural": spec.PLURAL,
                "singular": spec.SINGULAR,
                "shortNames": [spec.SHORT_NAME],
                "listKind": f"{spec.KIND}List",
            },
            "versions": [
                {
                    "name": spec.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }
