"""The generated CRD passes what a Kubernetes API server checks before it accepts one, without a cluster.

`kubectl apply -f crds/` and `helm install` fail on a CRD that the server refuses, and the emulator the
other tests use accepts any CRD. The checks themselves (crd_acceptance) are tested here too, on small
schemas with the mistakes they exist to catch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_acceptance import (
    compile_problems,
    cost_problems,
    default_problems,
    structural_problems,
    undescribed_fields,
)
from crd_check import admit, load_crd, rule_violations

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*/model.yaml"))
VERSION = load_crd()["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]


def test_every_rule_compiles() -> None:
    assert compile_problems(SCHEMA) == []


def test_schema_is_structural() -> None:
    assert structural_problems(VERSION) == []


def test_defaults_pass_their_schema_and_rules_as_written() -> None:
    assert default_problems(SCHEMA) == []


def test_rules_read_declared_fields_and_walk_only_bounded_values() -> None:
    assert cost_problems(SCHEMA) == []


def test_every_field_is_described() -> None:
    """`kubectl explain` shows each field's description; pydantic makes them from attribute docstrings."""
    assert undescribed_fields(SCHEMA) == []


def test_rules_on_the_root_and_on_spec_name_their_field() -> None:
    """Without a fieldPath the server reports such a rule at `<nil>` (the root) or at `spec`."""
    for node in (SCHEMA, SCHEMA["properties"]["spec"]):
        for rule in node["x-kubernetes-validations"]:
            assert rule.get("fieldPath") and rule.get("reason"), rule["rule"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_examples_pass_every_rule_after_defaulting(path: Path) -> None:
    stored, errors = admit(yaml.safe_load(path.read_text()))
    assert errors == []
    assert stored["spec"]["gpus"]["resourceName"] == "nvidia.com/gpu"


# The checks catch what they exist to catch.


def _version(spec_schema: dict[str, Any]) -> dict[str, Any]:
    root = {"type": "object", "properties": {"spec": spec_schema}}
    return {"schema": {"openAPIV3Schema": root}, "subresources": {"status": {}}}


def _object(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **extra}


READS_DEFAULTED_FIELD = _object(
    {
        "gpus": _object(
            {"kind": {"type": "string", "maxLength": 9, "default": "gpu"}},
            default={},
            **{"x-kubernetes-validations": [{"rule": "self.kind == 'gpu'", "message": "not a gpu"}]},
        )
    }
)


def test_a_rule_that_reads_a_defaulted_field_fails_on_its_parents_default() -> None:
    assert default_problems(READS_DEFAULTED_FIELD) == [
        "gpus.default: no such member in mapping: 'kind' evaluating rule: not a gpu"
    ]
    admitted = rule_violations(READS_DEFAULTED_FIELD, {"gpus": {"kind": "gpu"}})
    assert admitted == [], "admission fills the nested default first, so only the CRD is refused"


def test_defaults_with_unknown_fields_or_wrong_types_are_found() -> None:
    schema = _object(
        {
            "a": _object({"b": {"type": "integer"}}, default={"b": "one", "c": 1}),
            "d": {"type": "string", "default": None},
        }
    )
    problems = default_problems(schema)
    assert "a.default: must not have unknown fields" in problems
    assert "a.default: 'one' is not of type 'integer'" in problems
    assert structural_problems(_version(schema)) == [".spec.d: default null on a field that is not nullable"]


def test_non_structural_schemas_are_found() -> None:
    schema = _object(
        {
            "untyped": {"description": "no type"},
            "both": _object({"x": {"type": "string"}}, additionalProperties={"type": "string"}),
            "list": {"type": "array"},
            "junctor": {"type": "string", "anyOf": [{"type": "string", "description": "typed"}]},
            "intOrString": {
                "x-kubernetes-int-or-string": True,
                "anyOf": [{"type": "integer"}, {"type": "string"}],
            },
            "loose": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
        title="no",
    )
    version = _version(schema)
    version["schema"]["openAPIV3Schema"]["properties"]["metadata"] = {"type": "object", "description": "x"}
    assert structural_problems(version) == [
        ".metadata: must not specify anything other than name and generateName",
        ".spec.untyped: type must not be empty",
        ".spec.both: additionalProperties and properties are mutually exclusive",
        ".spec.list: an array needs one items schema",
        ".spec.junctor.anyOf[0]: description must not be set inside a junctor",
        ".spec.junctor.anyOf[0]: type must not be set inside a junctor",
    ]


def test_rule_metadata_must_be_valid() -> None:
    rules = [
        {"rule": "true", "fieldPath": ".missing", "reason": "FieldValueInvalid"},
        {"rule": "true", "fieldPath": ".present", "reason": "Wrong"},
        {"rule": "true", "message": "two\nlines"},
    ]
    schema = _object({"present": {"type": "string"}}, **{"x-kubernetes-validations": rules})
    assert structural_problems(_version(schema)) == [
        ".spec: x-kubernetes-validations[0]: fieldPath '.missing' does not name a field of this node",
        ".spec: x-kubernetes-validations[1]: reason 'Wrong' is not one of "
        "['FieldValueDuplicate', 'FieldValueForbidden', 'FieldValueInvalid', 'FieldValueRequired']",
        ".spec: x-kubernetes-validations[2]: message must be non-empty and on one line",
    ]


def test_rules_that_walk_unbounded_values_or_hidden_fields_are_found() -> None:
    names = {"type": "array", "items": {"type": "string"}}
    limits = {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}}
    hidden = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    ports = {
        "type": "array",
        "items": {"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0"}]},
    }
    rules = [
        {"rule": "self.names.all(n, n != '') && has(self.hidden)"},
        {"rule": "self.limits.all(k, k != '')"},
        {"rule": "has(self.hidden.limits)"},
    ]
    schema = _object(
        {"names": names, "limits": limits, "hidden": hidden, "ports": ports},
        **{"x-kubernetes-validations": rules},
    )
    assert cost_problems(schema) == [
        "<root>.names: a list without maxItems (read by a rule at <root>)",
        "<root>.names[]: a string without maxLength (read by a rule at <root>)",
        "<root>.limits: a map without maxProperties (read by a rule at <root>)",
        "<root>.limits{}: a string without maxLength (read by a rule at <root>)",
        "<root>: rule reads self.hidden.limits, which the schema does not declare",
        ".ports: a list without maxItems (holding a rule at .ports[])",
    ]


def test_fields_without_a_description_are_found() -> None:
    schema = _object(
        {"a": {"type": "string", "description": "described"}, "b": _object({"c": {"type": "string"}})}
    )
    assert undescribed_fields(schema) == [".b", ".b.c"]


def test_unparsable_rules_are_found() -> None:
    schema = _object(
        {"a": {"type": "string"}},
        **{"x-kubernetes-validations": [{"rule": "self.a ==", "message": "broken"}]},
    )
    assert [problem.split(":")[0] for problem in compile_problems(schema)] == ["<root>"]
