"""What a Kubernetes API server checks in a CustomResourceDefinition before it accepts it.

CI has no API server, and an emulator accepts any CRD; a schema the real server refuses fails
`kubectl apply -f crds/` and `helm install` alike. These checks follow the server's rules for a v1
CRD (Kubernetes 1.35): the schema is structural; metadata restricts at most name and generateName;
every default survives pruning, passes its own schema, and passes every CEL rule evaluated on the
default exactly as written (the server fills in no nested defaults there); rule metadata (reason,
fieldPath) is well formed; and each value a rule walks is bounded, since the server estimates a
rule's worst-case cost from maxItems, maxLength and maxProperties and refuses rules that may cost
too much. Each function returns readable problems, empty when the server would agree.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import celpy
from crd_check import compiled, prune, rule_violations, schema_errors, with_object_meta

TYPES = {"array", "boolean", "integer", "number", "object", "string"}
KEYWORDS = {
    "$schema", "$ref", "id", "description", "type", "format", "title", "default", "maximum",
    "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems",
    "minItems", "uniqueItems", "multipleOf", "enum", "maxProperties", "minProperties", "required",
    "items", "allOf", "oneOf", "anyOf", "not", "properties", "additionalProperties",
    "patternProperties", "dependencies", "additionalItems", "definitions", "externalDocs", "example",
    "nullable", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string", "x-kubernetes-list-map-keys", "x-kubernetes-list-type",
    "x-kubernetes-map-type", "x-kubernetes-validations",
}  # fmt: skip
"""The fields of a CRD's JSONSchemaProps; anything else fails strict decoding of the CRD."""
UNSUPPORTED = {"$ref", "id", "definitions", "patternProperties", "dependencies", "additionalItems"}
ROOT_WITH_STATUS = {
    "description", "type", "format", "title", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
    "multipleOf", "required", "items", "properties", "externalDocs", "example",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-validations",
}  # fmt: skip
"""What the root of the schema may hold when the status subresource is on."""
NOT_IN_JUNCTORS = {
    "type", "default", "title", "description", "nullable", "additionalProperties",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string", "x-kubernetes-list-map-keys", "x-kubernetes-list-type",
    "x-kubernetes-map-type", "x-kubernetes-validations",
}  # fmt: skip
"""Structure belongs outside anyOf/allOf/oneOf/not: these may only hold value validations."""
JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]
RULE_REASONS = {"FieldValueRequired", "FieldValueForbidden", "FieldValueInvalid", "FieldValueDuplicate"}
FIELD_PATH_STEP = re.compile(r"\.([^.\[\]']+)|\['([^']*)'\]")
FIELD_PATH = re.compile(f"(?:{FIELD_PATH_STEP.pattern})*")
CONTAINER_STEP = re.compile(r"\[\]|\{\}")
"""Where a schema path (as schema_nodes spells it) steps into list items or map values."""
SELF_REFERENCE = re.compile(r"(has\(\s*)?\bself((?:\.[A-Za-z_]\w*\b(?!\s*\())*)")
"""`self` and the fields selected from it (`self.a.b`), stopping before a method call (`.all(`)."""


def schema_nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every node of the structural schema with its path: `.a.b`, `[]` for items, `{}` for map values."""
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from schema_nodes(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from schema_nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from schema_nodes(schema["additionalProperties"], f"{path}{{}}")


def resolve_field_path(schema: dict[str, Any], field_path: str) -> dict[str, Any] | None:
    """The node that a rule's fieldPath (`.a.b`, `['key']`) names below `schema`, or None."""
    if not FIELD_PATH.fullmatch(field_path):
        return None
    node: dict[str, Any] | None = schema
    for name, key in FIELD_PATH_STEP.findall(field_path):
        if node is None:
            return None
        extra = node.get("additionalProperties")
        node = extra if key and isinstance(extra, dict) else node.get("properties", {}).get(name or key)
    return node


def _junctor_problems(nested: Any, outer: dict[str, Any], path: str) -> list[str]:
    """Value validations under a junctor: no structure of their own, nothing the outer node lacks."""
    if not isinstance(nested, dict):
        return []
    structure = sorted(NOT_IN_JUNCTORS & set(nested))
    problems = [f"{path}: {key} must not be set inside a junctor" for key in structure]
    if "metadata" in nested.get("properties", {}):
        problems.append(f"{path}.properties.metadata: must not be specified in a nested context")
    for name, prop in nested.get("properties", {}).items():
        if name not in outer.get("properties", {}):
            problems.append(f"{path}.properties.{name}: not specified outside the junctor")
        else:
            problems += _junctor_problems(prop, outer["properties"][name], f"{path}.properties.{name}")
    if "items" in nested:
        if not isinstance(outer.get("items"), dict):
            problems.append(f"{path}.items: not specified outside the junctor")
        else:
            problems += _junctor_problems(nested["items"], outer["items"], f"{path}.items")
    for junctor in JUNCTORS:
        problems += _junctors_problems(nested, outer, junctor, path)
    return problems


def _junctors_problems(node: dict[str, Any], outer: dict[str, Any], junctor: str, path: str) -> list[str]:
    """The problems of each branch of one junctor; int-or-string's own anyOf is the one exception."""
    branches = _branches(node, junctor)
    if junctor == "anyOf" and branches == INT_OR_STRING and outer.get("x-kubernetes-int-or-string"):
        return []
    problems = []
    for index, branch in enumerate(branches):
        problems += _junctor_problems(branch, outer, f"{path}.{junctor}[{index}]")
    return problems


def _branches(node: dict[str, Any], junctor: str) -> list[Any]:
    value = node.get(junctor)
    if value is None:
        return []
    return [value] if junctor == "not" else list(value)


def _rule_metadata_problems(node: dict[str, Any], path: str) -> list[str]:
    problems = []
    for index, rule in enumerate(node.get("x-kubernetes-validations", [])):
        where = f"{path}: x-kubernetes-validations[{index}]"
        expression, message = rule.get("rule", ""), rule.get("message")
        if not expression.strip():
            problems.append(f"{where}: rule is not specified")
        if message is not None and (not message.strip() or "\n" in message.strip()):
            problems.append(f"{where}: message must be non-empty and on one line")
        if "\n" in expression.strip() and not (message or "").strip():
            problems.append(f"{where}: a rule with line breaks needs a message")
        if "reason" in rule and rule["reason"] not in RULE_REASONS:
            problems.append(f"{where}: reason {rule['reason']!r} is not one of {sorted(RULE_REASONS)}")
        if "fieldPath" in rule:
            target = rule["fieldPath"]
            if not target.strip() or "\n" in target or resolve_field_path(node, target) is None:
                problems.append(f"{where}: fieldPath {target!r} does not name a field of this node")
    return problems


def _node_problems(node: dict[str, Any], path: str, in_resource_meta: bool) -> list[str]:
    problems = [f"{path}: unknown keyword {key!r}" for key in sorted(set(node) - KEYWORDS)]
    problems += [f"{path}: {key} is not supported" for key in sorted(UNSUPPORTED & set(node))]
    kind = node.get("type")
    int_or_string = node.get("x-kubernetes-int-or-string", False)
    preserved = node.get("x-kubernetes-preserve-unknown-fields")
    if kind is None and not int_or_string and not preserved:
        problems.append(f"{path}: type must not be empty")
    elif kind is not None and kind not in TYPES:
        problems.append(f"{path}: type {kind!r} is not one of {sorted(TYPES)} (null is spelt nullable)")
    if kind == "array" and not isinstance(node.get("items"), dict):
        problems.append(f"{path}: an array needs one items schema")
    if node.get("uniqueItems"):
        problems.append(f"{path}: uniqueItems cannot be true")
    extra = node.get("additionalProperties")
    if extra is not None and node.get("properties") and extra is not True:
        problems.append(f"{path}: additionalProperties and properties are mutually exclusive")
    if preserved is not None and preserved is not True:
        problems.append(f"{path}: x-kubernetes-preserve-unknown-fields must be true or absent")
    if int_or_string and (preserved or node.get("x-kubernetes-embedded-resource")):
        problems.append(f"{path}: int-or-string excludes preserve-unknown-fields and embedded-resource")
    if node.get("x-kubernetes-embedded-resource"):
        if kind != "object":
            problems.append(f"{path}: an embedded resource must be an object")
        if in_resource_meta:
            problems.append(f"{path}: no embedded resource inside resource metadata")
    if "x-kubernetes-list-type" in node and (
        kind != "array" or node["x-kubernetes-list-type"] not in ("atomic", "set", "map")
    ):
        problems.append(f"{path}: x-kubernetes-list-type needs an array and atomic, set or map")
    if "x-kubernetes-map-type" in node and (
        kind != "object" or node["x-kubernetes-map-type"] not in ("atomic", "granular")
    ):
        problems.append(f"{path}: x-kubernetes-map-type needs an object and atomic or granular")
    if "default" in node and node["default"] is None and not node.get("nullable"):
        problems.append(f"{path}: default null on a field that is not nullable")
    if "default" in node and in_resource_meta:
        problems.append(f"{path}: no default inside top-level apiVersion, kind or metadata")
    for junctor in JUNCTORS:
        problems += _junctors_problems(node, node, junctor, path)
    return problems + _rule_metadata_problems(node, path)


def structural_problems(version: dict[str, Any]) -> list[str]:
    """Why the server would refuse this CRD version's schema as not structural, or not allowed."""
    root = version["schema"]["openAPIV3Schema"]
    problems = []
    if root.get("type") != "object":
        problems.append("<root>: type must be object")
    if root.get("nullable"):
        problems.append("<root>: nullable cannot be true at the root")
    if "status" in version.get("subresources", {}):
        problems += [
            f"<root>: {key} is not allowed at the root with the status subresource"
            for key in sorted(set(root) - ROOT_WITH_STATUS)
        ]
    properties = root.get("properties", {})
    for name in ("apiVersion", "kind"):
        if name in properties and properties[name].get("type") != "string":
            problems.append(f".{name}: must be a string")
    if "metadata" in properties:
        metadata = properties["metadata"]
        if metadata.get("type", "object") != "object":
            problems.append(".metadata: must be an object")
        names = set(metadata.get("properties", {}))
        if set(metadata) - {"type", "properties"} or names - {"name", "generateName"}:
            problems.append(".metadata: must not specify anything other than name and generateName")
    for path, node in schema_nodes(root):
        in_resource_meta = path.split(".")[1:2] in (["apiVersion"], ["kind"], ["metadata"])
        problems += _node_problems(node, path or "<root>", in_resource_meta)
    return problems


def default_problems(root: dict[str, Any]) -> list[str]:
    """Why the server would refuse a default: it has unknown fields, fails its own schema, or a rule.

    Rules are evaluated on the default as written, at its node and at every node the default reaches,
    without filling in the default's own nested defaults, exactly as the server does.
    """
    problems = []
    for path, node in schema_nodes(root):
        if node.get("default") is None:
            continue
        default = node["default"]
        where = f"{path}.default".lstrip(".")
        if prune(node, copy.deepcopy(default)) != default:
            problems.append(f"{where}: must not have unknown fields")
        problems += [f"{where}: {error}" for error in schema_errors(node, default)]
        problems += rule_violations(node, default, where)
    return problems


def rules(root: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Every CEL rule with the path and schema of its node."""
    for path, node in schema_nodes(root):
        for rule in node.get("x-kubernetes-validations", []):
            yield path or "<root>", node, rule


def compile_problems(root: dict[str, Any]) -> list[str]:
    problems = []
    for path, _, rule in rules(root):
        for expression in (rule["rule"], rule.get("messageExpression")):
            if expression is None:
                continue
            try:
                compiled(expression)
            except celpy.CELParseError as error:
                problems.append(f"{path}: {expression!r} does not compile: {error}")
    return problems


def _unbounded(node: dict[str, Any], path: str) -> list[str]:
    """Lists, strings and maps under `node` with no size bound for the cost estimator."""
    problems = []
    for where, inner in schema_nodes(node, path):
        kind = inner.get("type")
        if kind == "array" and "maxItems" not in inner:
            problems.append(f"{where}: a list without maxItems")
        if (kind == "string" or inner.get("x-kubernetes-int-or-string")) and not (
            "maxLength" in inner or "enum" in inner
        ):
            problems.append(f"{where}: a string without maxLength")
        if isinstance(inner.get("additionalProperties"), dict) and "maxProperties" not in inner:
            problems.append(f"{where}: a map without maxProperties")
    return problems


def cost_problems(root: dict[str, Any]) -> list[str]:
    """Each field a rule reads must be declared (CEL sees nothing else), and bounded if it is walked.

    `has(self.x)` only tests presence; any other use of `self.x` may walk x (iterate it, match it,
    compare it), so every list, string and map inside x needs a bound. A rule inside a list or a map
    runs once per entry, so the lists and maps around it need bounds too.
    """
    nodes = dict(schema_nodes(root))
    problems: dict[str, None] = {}
    for path, node, rule in rules(root):
        for around in CONTAINER_STEP.finditer(path):
            container = path[: around.start()]
            kind, bound = ("list", "maxItems") if around.group() == "[]" else ("map", "maxProperties")
            if bound not in nodes[container]:
                problems[f"{container}: a {kind} without {bound} (holding a rule at {path})"] = None
        visible = with_object_meta(node) if path == "<root>" else node
        for presence_only, chain in SELF_REFERENCE.findall(rule["rule"]):
            target = resolve_field_path(visible, chain)
            if target is None:
                problems[f"{path}: rule reads self{chain}, which the schema does not declare"] = None
            elif not presence_only:
                unbounded = _unbounded(target, path + chain)
                problems.update(
                    dict.fromkeys(f"{problem} (read by a rule at {path})" for problem in unbounded)
                )
    return list(problems)


def undescribed_fields(root: dict[str, Any]) -> list[str]:
    """Fields with no description for `kubectl explain`. The server describes apiVersion, kind and
    metadata itself (and refuses a CRD that describes metadata)."""
    return [
        path
        for path, node in schema_nodes(root)
        if path
        and path.split(".")[1] not in ("apiVersion", "kind", "metadata")
        and not path.endswith(("[]", "{}"))
        and not node.get("description")
    ]
