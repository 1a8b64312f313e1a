"""The PyTritonModel rules: the API server (CRD schema + CEL) and pydantic must agree on each."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from crd_acceptance import rules
from crd_check import admit, load_schema
from kubetriton import podenv
from kubetriton.operator import pod, spec
from kubetriton.operator.spec import PyTritonModel, describe_validation_error
from kubetriton.supervisor import process_environment
from pydantic import ValidationError

BASE: dict[str, Any] = {
    "apiVersion": "kubetriton.dev/v1alpha1",
    "kind": "PyTritonModel",
    "metadata": {"name": "identity", "namespace": "default"},
    "spec": {"worker": {"image": "registry.example.com/identity:1"}, "models": ["Identity"]},
}


def _with(**changes: Any) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = obj
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return obj


def _worker(**fields: Any) -> dict[str, Any]:
    return {**BASE["spec"]["worker"], **fields}


GPU_LIMIT = {"limits": {spec.GPU_RESOURCE: 2, "memory": "8Gi"}}
WEIGHTS = {"name": "weights", "persistentVolumeClaim": {"claimName": "hf-cache", "readOnly": True}}
WEIGHTS_MOUNT = {"name": "weights", "mountPath": "/models", "readOnly": True}
BELOW_WORKSPACE = {**WEIGHTS_MOUNT, "mountPath": f"{podenv.WORKSPACE_MOUNT}/models"}

RULE_CASES = [
    ("minimal spec", _with(), None, None),
    ("fixed replicas", _with(spec__replicas=3), None, None),
    ("autoscaling alone", _with(spec__autoscaling={"minReplicas": 1, "maxReplicas": 3}), None, None),
    (
        "replicas with autoscaling",
        _with(spec__replicas=2, spec__autoscaling={"maxReplicas": 3}),
        "spec.replicas",
        spec.REPLICAS_XOR_AUTOSCALING,
    ),
    ("max equal to min", _with(spec__autoscaling={"minReplicas": 2, "maxReplicas": 2}), None, None),
    (
        "max below min",
        _with(spec__autoscaling={"minReplicas": 3, "maxReplicas": 2}),
        "spec.autoscaling.maxReplicas",
        spec.MAX_AT_LEAST_MIN,
    ),
    (
        "queue time target",
        _with(spec__autoscaling={"maxReplicas": 6, "targetQueueMilliseconds": 10}),
        None,
        None,
    ),
    (
        "in-flight target with its windows and steps",
        _with(
            spec__autoscaling={
                "maxReplicas": 6,
                "targetInFlightPerPod": 4,
                "tolerance": 0.2,
                "scaleUp": {"stabilizationSeconds": 30, "maxPods": 2, "periodSeconds": 60},
                "scaleDown": {"stabilizationSeconds": 600},
            }
        ),
        None,
        None,
    ),
    (
        "a queue time of zero",
        _with(spec__autoscaling={"maxReplicas": 6, "targetQueueMilliseconds": 0}),
        "spec.autoscaling.targetQueueMilliseconds",
        spec.POSITIVE_TARGET,
    ),
    (
        "a whole number of requests in flight",
        _with(spec__autoscaling={"maxReplicas": 6, "targetInFlightPerPod": 4}),
        None,
        None,
    ),
    (
        "queue time and in-flight targets",
        _with(spec__autoscaling={"maxReplicas": 6, "targetQueueMilliseconds": 10, "targetInFlightPerPod": 4}),
        "spec.autoscaling.targetInFlightPerPod",
        spec.QUEUE_OR_IN_FLIGHT,
    ),
    (
        "queue time with a CPU target",
        _with(
            spec__autoscaling={"maxReplicas": 6, "targetQueueMilliseconds": 10, "targetCPUUtilization": 70}
        ),
        "spec.autoscaling.targetCPUUtilization",
        spec.MODEL_SIGNAL_WITHOUT_CPU,
    ),
    (
        "in-flight with HPA metrics",
        _with(spec__autoscaling={"maxReplicas": 6, "targetInFlightPerPod": 4, "metrics": [{"type": "Pods"}]}),
        "spec.autoscaling.metrics",
        spec.MODEL_SIGNAL_WITHOUT_METRICS,
    ),
    (
        "scale-down window on CPU",
        _with(spec__autoscaling={"maxReplicas": 6, "scaleDown": {"stabilizationSeconds": 60}}),
        "spec.autoscaling",
        spec.BEHAVIOR_NEEDS_MODEL_SIGNAL,
    ),
    ("whole GPUs", _with(spec__gpus={"count": 2}), None, None),
    ("MIG slice", _with(spec__gpus={"count": 1, "resourceName": "nvidia.com/mig-1g.10gb"}), None, None),
    (
        "a GPU the device plugin shares under its own name",
        _with(spec__gpus={"count": 1, "resourceName": "nvidia.com/gpu.shared"}),
        None,
        None,
    ),
    (
        "a shared GPU's limit beside whole GPUs",
        _with(
            spec__worker=_worker(resources={"limits": {"nvidia.com/gpu.shared": 1}}), spec__gpus={"count": 1}
        ),
        "spec.worker.resources.limits",
        spec.GPU_LIMITS_AGREE,
    ),
    (
        "another vendor's GPU",
        _with(spec__gpus={"count": 1, "resourceName": "amd.com/gpu"}),
        "spec.gpus.resourceName",
        spec.GPU_RESOURCE_NAME,
    ),
    (
        "misspelt GPU resource",
        _with(spec__gpus={"count": 1, "resourceName": "nvidia.com/gpus"}),
        "spec.gpus.resourceName",
        spec.GPU_RESOURCE_NAME,
    ),
    (
        "model names as Triton and bind() take them",
        _with(
            spec__models=[
                "ESM1",
                "my-model",
                "add_sub",
                "_private",
                "resnet50.onnx",
                "M" * podenv.MODEL_NAME_MAX_LENGTH,
            ]
        ),
        None,
        None,
    ),
    ("model name starting with a dash", _with(spec__models=["-x"]), "spec.models", spec.MODEL_NAMES),
    ("a comma in a model name", _with(spec__models=["a,b"]), "spec.models", spec.MODEL_NAMES),
    ("uppercase object name", _with(metadata__name="ESM1"), "metadata.name", spec.SERVICE_SAFE_NAME),
    (
        "object name starting with a digit",
        _with(metadata__name="1esm"),
        "metadata.name",
        spec.SERVICE_SAFE_NAME,
    ),
    (
        "a name its pods Service takes",
        _with(metadata__name="esm1-pods"),
        "metadata.name",
        spec.RESERVED_NAME_SUFFIX,
    ),
    (
        "a name its router takes",
        _with(metadata__name="esm1-router"),
        "metadata.name",
        spec.RESERVED_NAME_SUFFIX,
    ),
    ("a suffix inside the name", _with(metadata__name="pods-router-esm1"), None, None),
    (
        "the user's own variable",
        _with(spec__worker=_worker(env=[{"name": "HF_HOME", "value": "/hf"}])),
        None,
        None,
    ),
    (
        "a variable of the pod contract",
        _with(
            spec__worker=_worker(env=[{"name": "A", "value": "1"}, {"name": podenv.ENV_MODELS, "value": "X"}])
        ),
        "spec.worker.env[1].name",
        spec.RESERVED_ENV_NAME,
    ),
    ("no GPU resource, no GPUs", _with(spec__worker=_worker(resources={"limits": {"cpu": 2}})), None, None),
    (
        "a GPU limit as gpus asks",
        _with(spec__worker=_worker(resources=GPU_LIMIT), spec__gpus={"count": 2}),
        None,
        None,
    ),
    (
        "a GPU amount written as a string",
        _with(spec__worker=_worker(resources={"limits": {spec.GPU_RESOURCE: "2"}}), spec__gpus={"count": 2}),
        None,
        None,
    ),
    (
        "another vendor's resource",
        _with(spec__worker=_worker(resources={"limits": {"amd.com/gpu": 1}}), spec__gpus={"count": 1}),
        None,
        None,
    ),
    (
        "a GPU limit other than gpus.count",
        _with(spec__worker=_worker(resources=GPU_LIMIT), spec__gpus={"count": 1}),
        "spec.worker.resources.limits",
        spec.GPU_LIMITS_AGREE,
    ),
    (
        "a MIG limit beside whole GPUs",
        _with(
            spec__worker=_worker(resources={"limits": {"nvidia.com/mig-1g.10gb": 1}}), spec__gpus={"count": 1}
        ),
        "spec.worker.resources.limits",
        spec.GPU_LIMITS_AGREE,
    ),
    (
        "a GPU request without gpus",
        _with(spec__worker=_worker(resources={"requests": {spec.GPU_RESOURCE: 1}})),
        "spec.worker.resources.requests",
        spec.GPU_REQUESTS_AGREE,
    ),
    (
        "weights on a claim, mounted read-only",
        _with(spec__volumes=[WEIGHTS], spec__worker=_worker(volumeMounts=[WEIGHTS_MOUNT])),
        None,
        None,
    ),
    (
        "a volume named like the operator's",
        _with(spec__volumes=[{**WEIGHTS, "name": podenv.WORKSPACE_VOLUME}]),
        "spec.volumes[0].name",
        spec.RESERVED_VOLUME_NAME,
    ),
    (
        "a mount below the workspace",
        _with(
            spec__volumes=[WEIGHTS],
            spec__worker=_worker(volumeMounts=[BELOW_WORKSPACE]),
        ),
        "spec.worker.volumeMounts[0].mountPath",
        spec.RESERVED_MOUNT_PATH,
    ),
    (
        "a mount where the API token of the pod's ServiceAccount goes",
        _with(
            spec__volumes=[WEIGHTS],
            spec__worker=_worker(volumeMounts=[{**WEIGHTS_MOUNT, "mountPath": podenv.API_TOKEN_MOUNT}]),
        ),
        "spec.worker.volumeMounts[0].mountPath",
        spec.RESERVED_MOUNT_PATH,
    ),
    (
        "a mount of no volume",
        _with(spec__worker=_worker(volumeMounts=[WEIGHTS_MOUNT])),
        "spec.worker.volumeMounts",
        spec.MOUNTS_NAME_VOLUMES,
    ),
    (
        "processes for a script",
        _with(spec__worker=_worker(processes=2, script={"configMap": "serve-1"})),
        None,
        None,
    ),
    (
        "processes for a command",
        _with(spec__worker=_worker(processes=2, command=["python3", "s.py"])),
        None,
        None,
    ),
    (
        "processes for the image's entrypoint",
        _with(spec__worker=_worker(processes=2)),
        "spec.worker.processes",
        spec.PROCESSES_NEED_A_COMMAND,
    ),
    (
        "a variable with a value and its source",
        _with(spec__worker=_worker(env=[{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}])),
        "spec.worker.env[0].valueFrom",
        spec.VALUE_OR_VALUE_FROM,
    ),
    (
        "a variable from a secret",
        _with(spec__worker=_worker(env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s"}}}])),
        None,
        None,
    ),
    ("other service ports", _with(spec__service={"ports": {"http": 80, "grpc": 81}}), None, None),
    (
        "one port for two protocols",
        _with(spec__service={"ports": {"http": 9000, "grpc": 9000}}),
        "spec.service.ports",
        spec.PORTS_DIFFER,
    ),
    (
        "a GPU for the Triton sidecar",
        _with(spec__triton={"resources": {"limits": {spec.GPU_RESOURCE: 1}}}),
        "spec.triton.resources",
        spec.NO_GPU_RESOURCES,
    ),
    (
        "a MIG slice for the bootstrap step",
        _with(spec__bootstrap={"resources": {"requests": {"nvidia.com/mig-1g.10gb": 1}}}),
        "spec.bootstrap.resources",
        spec.NO_GPU_RESOURCES,
    ),
    (
        "CPU and memory for the sidecar",
        _with(spec__triton={"resources": {"limits": {"cpu": "500m", "memory": "2Gi"}}}),
        None,
        None,
    ),
    ("a label of the user's", _with(spec__podLabels={"team": "ml"}), None, None),
    (
        "a label the operator sets",
        _with(spec__podLabels={"app.kubernetes.io/instance": "other"}),
        "spec.podLabels",
        spec.RESERVED_LABELS,
    ),
]
"""Each CEL rule, with specs it admits and specs it refuses: the field the API server names, and the rule."""


@pytest.mark.parametrize(
    ("obj", "field", "rule"), [case[1:] for case in RULE_CASES], ids=[c[0] for c in RULE_CASES]
)
def test_api_server_rules(obj: dict[str, Any], field: str | None, rule: dict[str, str] | None) -> None:
    _, errors = admit(obj)
    assert errors == ([] if rule is None else [f"{field}: {rule['message']}"])


@pytest.mark.parametrize(
    ("obj", "rule"), [(case[1], case[3]) for case in RULE_CASES], ids=[c[0] for c in RULE_CASES]
)
def test_pydantic_rules(obj: dict[str, Any], rule: dict[str, str] | None) -> None:
    if rule is None:
        PyTritonModel.read(obj)
        return
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.read(obj)
    assert rule["message"] in describe_validation_error(raised.value)


SCHEMA_CASES = [
    (
        "a quantity with a space",
        _with(spec__worker=_worker(resources={"limits": {"memory": "1Gi "}})),
        "spec.worker.resources.limits.memory",
    ),
    ("a quantity in GB", _with(spec__triton={"resources": {"requests": {"memory": "1GB"}}}), "spec.triton"),
    (
        "a negative quantity",
        _with(spec__bootstrap={"resources": {"limits": {"cpu": "-1"}}}),
        "spec.bootstrap.resources.limits.cpu",
    ),
    (
        "a negative integer amount",
        _with(spec__worker=_worker(resources={"limits": {"cpu": -1}})),
        "spec.worker",
    ),
    ("an empty Triton image", _with(spec__triton={"image": ""}), "spec.triton.image"),
    (
        "an image with a trailing space",
        _with(spec__worker=_worker(image="python:3.13 ")),
        "spec.worker.image",
    ),
    ("an '=' in a variable's name", _with(spec__worker=_worker(env=[{"name": "A=B", "value": "1"}])), "spec"),
    ("an uppercase volume name", _with(spec__volumes=[{**WEIGHTS, "name": "Weights"}]), "spec.volumes"),
    (
        "two mounts on one path",
        _with(
            spec__volumes=[WEIGHTS, {"name": "cache", "emptyDir": {}}],
            spec__worker=_worker(volumeMounts=[WEIGHTS_MOUNT, {"name": "cache", "mountPath": "/models"}]),
        ),
        "spec.worker.volumeMounts",
    ),
    ("a label value with a space", _with(spec__podLabels={"team": "ml ops"}), "spec.podLabels"),
    ("a node label value with a space", _with(spec__scheduling={"nodeSelector": {"a": "b c"}}), "spec"),
    (
        "a ServiceAccount with an underscore",
        _with(spec__serviceAccountName="My_SA"),
        "spec.serviceAccountName",
    ),
    ("a PriorityClass with a space", _with(spec__scheduling={"priorityClassName": "Bad Class"}), "spec"),
    ("an uppercase RuntimeClass", _with(spec__runtimeClassName="Bad_Name"), "spec.runtimeClassName"),
    ("a pull secret with a space", _with(spec__imagePullSecrets=[{"name": "a b"}]), "spec.imagePullSecrets"),
    (
        "the script's folder as its entrypoint",
        _with(spec__worker=_worker(script={"configMap": "s", "entrypoint": ".."})),
        "spec.worker.script.entrypoint",
    ),
]
"""Values whose children the API server would refuse (a Deployment it cannot store), refused by the
CRD's schema as the model is applied, and by render."""


@pytest.mark.parametrize(
    ("obj", "field"), [case[1:] for case in SCHEMA_CASES], ids=[case[0] for case in SCHEMA_CASES]
)
def test_what_the_pods_cannot_hold_is_refused_as_the_model_is_applied(
    obj: dict[str, Any], field: str
) -> None:
    _, errors = admit(obj)
    assert errors, "the CRD admits it"
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.read(obj)
    assert describe_validation_error(raised.value).startswith(field)


@pytest.mark.parametrize(
    "amount", [2, 0, "2", "0.5", "500m", "8Gi", "1e3", "100M", "1.5Gi", ".5", "250u"], ids=str
)
def test_quantities_as_kubernetes_writes_them_are_admitted(amount: int | str) -> None:
    obj = _with(spec__worker=_worker(resources={"requests": {"memory": amount}}))
    assert admit(obj)[1] == []
    PyTritonModel.read(obj)


def test_an_env_name_appears_once() -> None:
    env = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "A", "value": "3"}]
    obj = _with(spec__worker=_worker(env=env))
    assert admit(obj)[1] == ["spec.worker.env[2]: Duplicate value: {'name': 'A'}"]
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.model_validate(obj)
    assert "spec.worker.env: each name at most once: A repeated" in describe_validation_error(raised.value)


def test_a_model_name_appears_once() -> None:
    obj = _with(spec__models=["A", "B", "A"])
    assert admit(obj)[1] == ["spec.models[2]: Duplicate value: 'A'"]
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.model_validate(obj)
    assert "spec.models: each name at most once: A repeated" in describe_validation_error(raised.value)


def test_reserved_env_names_are_the_ones_the_operator_and_the_supervisor_set() -> None:
    model_spec = PyTritonModel.model_validate(
        _with(spec__worker=_worker(env=[{"name": "A", "value": "1"}], processes=2, command=["serve"]))
    ).spec
    names = [variable["name"] for variable in pod.worker_environment(model_spec)]
    assert names == ["A", *(name for name in spec.RESERVED_WORKER_ENV if name != podenv.ENV_PROCESS_INDEX)]
    assert podenv.ENV_PROCESS_INDEX in process_environment(1, 2, {}, {})


def test_resources_are_amounts_by_name_only() -> None:
    obj = _with(spec__worker=_worker(resources={"claims": [{"name": "gpu"}], "limits": {"cpu": 1.5}}))
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.model_validate(obj)
    problems = describe_validation_error(raised.value)
    assert "spec.worker.resources.claims: Extra inputs are not permitted" in problems
    assert "spec.worker.resources.limits.cpu" in problems
    stored, errors = admit(obj)
    assert "claims" not in stored["spec"]["worker"]["resources"], (
        "the API server prunes what it does not know"
    )
    assert errors == ["1.5 is not valid under any of the given schemas"]


def test_every_rule_in_the_crd_is_exercised() -> None:
    exercised = {case[3]["rule"] for case in RULE_CASES if case[3] is not None}
    assert {rule["rule"] for _, _, rule in rules(load_schema())} == exercised


AUTOSCALING_BOUND_CASES = [
    (
        "a queue time over an hour",
        {"targetQueueMilliseconds": 3_600_001},
        "spec.autoscaling.targetQueueMilliseconds",
    ),
    ("a tolerance of 100%", {"targetInFlightPerPod": 4, "tolerance": 1}, "spec.autoscaling.tolerance"),
    (
        "a step of no pods",
        {"targetInFlightPerPod": 4, "scaleUp": {"maxPods": 0}},
        "spec.autoscaling.scaleUp.maxPods",
    ),
    (
        "a window of a day",
        {"targetInFlightPerPod": 4, "scaleDown": {"stabilizationSeconds": 86400}},
        "spec.autoscaling.scaleDown.stabilizationSeconds",
    ),
]


@pytest.mark.parametrize(
    ("fields", "field"),
    [case[1:] for case in AUTOSCALING_BOUND_CASES],
    ids=[case[0] for case in AUTOSCALING_BOUND_CASES],
)
def test_autoscaling_numbers_out_of_range_are_refused_by_both(fields: dict[str, Any], field: str) -> None:
    obj = _with(spec__autoscaling={"maxReplicas": 6, **fields})
    _, errors = admit(obj)
    assert len(errors) == 1 and re.search(r"is (less|greater) than the (minimum|maximum) of", errors[0]), (
        errors
    )
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.model_validate(obj)
    assert describe_validation_error(raised.value).startswith(f"{field}: ")


BOUND_CASES = [
    ("replicas", _with(spec__replicas=spec.MAX_REPLICAS + 1), "spec.replicas"),
    ("autoscaling max", _with(spec__autoscaling={"maxReplicas": 2**31 - 1}), "spec.autoscaling.maxReplicas"),
    (
        "autoscaling min",
        _with(spec__autoscaling={"minReplicas": spec.MAX_REPLICAS + 1, "maxReplicas": spec.MAX_REPLICAS}),
        "spec.autoscaling.minReplicas",
    ),
]


@pytest.mark.parametrize(
    ("obj", "field"), [case[1:] for case in BOUND_CASES], ids=[c[0] for c in BOUND_CASES]
)
def test_replicas_have_a_documented_maximum(obj: dict[str, Any], field: str) -> None:
    _, errors = admit(obj)
    assert len(errors) == 1 and f"maximum of {spec.MAX_REPLICAS}" in errors[0]
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.model_validate(obj)
    assert f"{field}: Input should be less than or equal to {spec.MAX_REPLICAS}" in describe_validation_error(
        raised.value
    )
    node = load_schema()
    for name in field.split("."):
        node = node["properties"][name]
    assert node["maximum"] == spec.MAX_REPLICAS
    assert str(spec.MAX_REPLICAS) in node["description"]


def test_api_server_defaults_match_pydantic() -> None:
    stored, errors = admit(BASE)
    assert errors == []
    assert stored["spec"]["triton"]["image"] == podenv.TRITON_IMAGE
    assert stored["spec"]["gpus"] == {"count": 0, "resourceName": "nvidia.com/gpu"}
    from_raw = PyTritonModel.model_validate(BASE).spec
    from_stored = PyTritonModel.model_validate(stored).spec
    assert from_stored == from_raw


def test_readable_errors_name_the_yaml_field() -> None:
    obj = _with(spec__autoscaling={"maxReplicas": "many"}, spec__worker={})
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.model_validate(obj)
    lines = describe_validation_error(raised.value).splitlines()
    assert "spec.worker.image: Field required" in lines
    assert any(line.startswith("spec.autoscaling.maxReplicas: ") for line in lines)


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        (_with(spec__startup_seconds=30), "spec.startup_seconds: Extra inputs are not permitted"),
        (_with(spec__replicas="2"), "spec.replicas: Input should be a valid integer"),
        (_with(spec__replicas=True), "spec.replicas: Input should be a valid integer"),
        (_with(spec__gpus={"count": "2"}), "spec.gpus.count: Input should be a valid integer"),
    ],
    ids=["a Python field name", "a number as a string", "a boolean for a number", "a GPU count as a string"],
)
def test_what_the_api_server_prunes_or_refuses_render_refuses(obj: dict[str, Any], problem: str) -> None:
    stored, errors = admit(obj)
    assert errors or stored["spec"] != obj["spec"], "the server refuses it, or prunes it"
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.read(obj)
    assert describe_validation_error(raised.value).startswith(problem)


def test_an_explicit_null_is_a_field_left_out() -> None:
    obj = _with(spec__autoscaling={"maxReplicas": 3, "targetCPUUtilization": None, "tolerance": None})
    read = PyTritonModel.read(obj).spec.autoscaling
    assert read is not None and read.target_cpu_utilization is None and read.tolerance is None


def test_misspelt_fields_are_rejected_by_render_and_unknown_to_the_schema() -> None:
    obj = _with(spec__replica=2)
    with pytest.raises(ValidationError, match="replica"):
        PyTritonModel.model_validate(obj)
    spec_schema = load_schema()["properties"]["spec"]
    assert "replica" not in spec_schema["properties"]
    assert "x-kubernetes-preserve-unknown-fields" not in spec_schema


@pytest.mark.parametrize(
    ("models", "gpus", "explicit", "expected"),
    [
        (["Identity"], 0, None, "576Mi"),
        (["Identity"], 1, None, "576Mi"),
        (["Identity"], 2, None, "1088Mi"),
        (["Encoder", "Decoder"], 1, None, "1088Mi"),
        (["Identity"], 2, "2Gi", "2Gi"),
    ],
)
def test_shared_memory_is_derived_unless_set(
    models: list[str], gpus: int, explicit: str | None, expected: str
) -> None:
    model_spec = spec.PyTritonModelSpec.model_validate(
        {
            **BASE["spec"],
            "models": models,
            "gpus": {"count": gpus},
            **({"sharedMemory": explicit} if explicit else {}),
        }
    )
    assert model_spec.shared_memory_limit == expected


@pytest.mark.parametrize(
    ("processes", "refusal"),
    [
        (0, "0 is less than the minimum of 1"),
        (65, f"65 is greater than the maximum of {spec.MAX_WORKER_PROCESSES}"),
    ],
)
def test_worker_processes_are_bounded(processes: int, refusal: str) -> None:
    obj = _with(spec__worker=_worker(processes=processes, command=["serve"]))
    assert admit(obj)[1] == [refusal]
    with pytest.raises(ValidationError) as raised:
        PyTritonModel.model_validate(obj)
    assert "spec.worker.processes: Input should be" in describe_validation_error(raised.value)


def test_shared_memory_holds_an_instance_per_worker_process() -> None:
    model_spec = spec.PyTritonModelSpec.model_validate(
        {**BASE["spec"], "worker": _worker(processes=4, command=["serve"]), "gpus": {"count": 2}}
    )
    assert model_spec.shared_memory_limit == f"{(2 * 256 * 4) + 64}Mi"
