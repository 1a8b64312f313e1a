"""The PyTritonModel resource as pydantic models: the single source of truth for its shape.

The CRD's OpenAPI schema is generated from these classes (`crd`), `kubetriton render` validates a
model.yaml with them, and the reconciler parses every object it handles through them. The rules that
the API server enforces with CEL are declared here beside the fields they guard, and mirrored by
pydantic validators so that `render` rejects the same specs that the cluster rejects.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from kubetriton import podenv
from kubetriton.operator import naming
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
    with_config,
)
from pydantic.alias_generators import to_camel
from typing_extensions import NotRequired, TypedDict

GROUP = "kubetriton.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PyTritonModel"
PLURAL = "pytritonmodels"
SINGULAR = "pytritonmodel"
SHORT_NAME = "ptm"

GPU_RESOURCE_PREFIX = "nvidia.com/"
GPU_RESOURCE = f"{GPU_RESOURCE_PREFIX}gpu"
SHARED_GPU_RESOURCE = f"{GPU_RESOURCE}.shared"
"""What the NVIDIA device plugin calls a GPU it shares (time-slicing or MPS) when told to rename it."""
GPU_RESOURCE_PATTERN = r"^nvidia[.]com/(gpu|gpu[.]shared|mig-[1-7]g[.][0-9]+gb)$"
OBJECT_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
OBJECT_NAME_MAX_LENGTH = 63
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
RESOURCE_QUANTITY_PATTERN = r"^[+]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$"
"""A resource amount as Kubernetes writes one, not negative: 2, "0.5", "500m", "8Gi", "1e3"."""
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""The names Kubernetes gives most objects (a ServiceAccount, a ConfigMap, a PriorityClass...), and the
stricter one of volumes."""
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
IMAGE_PATTERN = r"^[^\s]+$"
"""An image reference: the API server refuses one with spaces around it, and the kubelet any space."""
ENV_NAME_PATTERN = r"^[ -<>-~]+$"
"""Printable ASCII other than '=': what Kubernetes 1.34 and later allow an environment variable's name."""
MAX_REPLICAS = 1000
"""The most pods one model may ask for, fixed or autoscaled: beyond it a typo rather than a plan."""
# Bounds on what the CEL rules walk: the API server refuses a rule whose worst-case cost it cannot bound.
MAX_RESOURCE_NAMES = 32
"""The most resources one container's limits (or requests) may name."""
QUANTITY_MAX_LENGTH = 64
MAX_ENV_VARS = 256
"""The most extra environment variables the worker may get."""
ENV_NAME_MAX_LENGTH = 253
MAX_VOLUMES = 64
"""The most volumes the pods may get, and the most mounts the worker may have."""
MAX_COMMAND_PARTS = 256
COMMAND_PART_MAX_LENGTH = 8192
"""Bounds on worker.command, which a rule reads."""
MAX_WORKER_PROCESSES = 64
"""The most worker processes a pod may run: beyond the cores or GPUs of any node."""
MAX_PULL_SECRETS = 16
MAX_POD_METADATA = 64
"""The most labels, and the most annotations, the pods may get."""
NAME_MAX_LENGTH = 253
KEYED_BY_NAME = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
"""Schema markers of a list whose items are told apart by name: the API server refuses a name twice,
and server-side apply merges such lists item by item."""
DEFAULT_STARTUP_SECONDS = 1200
"""How long a worker may take to start serving its health endpoint before Kubernetes restarts it."""
RESERVED_VOLUMES = (
    podenv.WORKSPACE_VOLUME,
    podenv.SHM_VOLUME,
    podenv.TRITON_TMP_VOLUME,
    podenv.SCRIPT_VOLUME,
    podenv.API_TOKEN_VOLUME,
)
RESERVED_MOUNT_PATHS = (podenv.WORKSPACE_MOUNT, podenv.SHM_MOUNT, podenv.SCRIPT_MOUNT, podenv.API_TOKEN_MOUNT)
CONFIG_MAP_KEY_PATTERN = r"^[.]?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
"""A ConfigMap key as Kubernetes allows one: letters, digits, '-', '_' and '.', but not '.' or '..' or a
name that starts with '..'."""
RESERVED_POD_LABELS = tuple(naming.labels("model"))
"""Label keys the operator sets on the pods: the Deployment's selector and the operator's own mark."""
RESERVED_WORKER_ENV = (
    podenv.ENV_MODE,
    podenv.ENV_WORKSPACE,
    podenv.ENV_TRITON_HOST,
    podenv.ENV_MODELS,
    podenv.ENV_DRAIN_SECONDS,
    podenv.ENV_HEALTH_PORT,
    podenv.ENV_PROCESS_COUNT,
    podenv.ENV_STARTUP_SECONDS,
    podenv.ENV_PROCESS_INDEX,
)
"""The worker's variables that the operator (or the supervisor of several worker processes) sets from the
spec (the pod contract): a second entry with one of these names would make the container's env list hold
a key twice, which server-side apply refuses."""

ARENAS_PER_INSTANCE = 2
"""A model instance's proxy maps one arena for requests and one for responses."""
SHM_HEADROOM_BYTES = 64 * 1024 * 1024
"""Room in /dev/shm beyond the worker's arenas, for the Python backend's own shared memory."""


def _cel(rule: str, message: str, *, field_path: str = "", reason: str = "") -> dict[str, str]:
    """An x-kubernetes-validations entry. A rule on an object names the field it refuses with
    `field_path` (relative to the object; the API server reports the object's own path otherwise),
    and `reason` says how: FieldValueInvalid, FieldValueForbidden, FieldValueRequired or
    FieldValueDuplicate."""
    optional = {"fieldPath": field_path, "reason": reason}
    return {"rule": rule, "message": message, **{key: value for key, value in optional.items() if value}}


REPLICAS_XOR_AUTOSCALING = _cel(
    "!(has(self.replicas) && has(self.autoscaling))",
    "set either replicas or autoscaling, not both",
    field_path=".replicas",
    reason="FieldValueForbidden",
)
MAX_AT_LEAST_MIN = _cel(
    "self.maxReplicas >= self.minReplicas",
    "autoscaling.maxReplicas must be greater than or equal to autoscaling.minReplicas",
    field_path=".maxReplicas",
    reason="FieldValueInvalid",
)
QUEUE_OR_IN_FLIGHT = _cel(
    "!(has(self.targetQueueMilliseconds) && has(self.targetInFlightPerPod))",
    "set one of autoscaling.targetQueueMilliseconds and autoscaling.targetInFlightPerPod, not both",
    field_path=".targetInFlightPerPod",
    reason="FieldValueForbidden",
)
_MODEL_SIGNAL_SET = "(has(self.targetQueueMilliseconds) || has(self.targetInFlightPerPod))"
MODEL_SIGNAL_WITHOUT_CPU = _cel(
    f"!({_MODEL_SIGNAL_SET} && has(self.targetCPUUtilization))",
    "autoscaling.targetCPUUtilization is the HorizontalPodAutoscaler's target; the model's own signals"
    " (targetQueueMilliseconds, targetInFlightPerPod) replace that autoscaler: leave it out",
    field_path=".targetCPUUtilization",
    reason="FieldValueForbidden",
)
MODEL_SIGNAL_WITHOUT_METRICS = _cel(
    f"!({_MODEL_SIGNAL_SET} && has(self.metrics))",
    "autoscaling.metrics are the HorizontalPodAutoscaler's; the model's own signals"
    " (targetQueueMilliseconds, targetInFlightPerPod) replace that autoscaler: leave them out",
    field_path=".metrics",
    reason="FieldValueForbidden",
)
BEHAVIOR_NEEDS_MODEL_SIGNAL = _cel(
    f"{_MODEL_SIGNAL_SET} || !(has(self.tolerance) || has(self.scaleUp) || has(self.scaleDown))",
    "autoscaling.tolerance, scaleUp and scaleDown shape the operator's own autoscaler: set"
    " targetQueueMilliseconds or targetInFlightPerPod with them",
    reason="FieldValueForbidden",
)
MIN_TARGET = 0.01
POSITIVE_TARGET = _cel(
    f"double(self) >= {MIN_TARGET}",
    f"a target must be at least {MIN_TARGET}",
    reason="FieldValueInvalid",
)
"""The schema's minimum alone lets 0 through: the API server compares an integer with the minimum cut
to an integer."""
GPU_RESOURCE_NAME = _cel(
    f"self.matches('{GPU_RESOURCE_PATTERN}')",
    "must be nvidia.com/gpu, nvidia.com/gpu.shared (a GPU the device plugin shares, renamed) or a MIG"
    " resource such as nvidia.com/mig-1g.10gb",
)
MODEL_NAMES = _cel(
    f"self.all(m, m.matches('{podenv.MODEL_NAME_PATTERN}'))",
    "each model name must be 1-128 letters, digits, '_', '.' or '-', starting with a letter, digit or '_',"
    " as bind() requires",
)

RESERVED_ENV_NAME = _cel(
    f"!(self in [{', '.join(repr(name) for name in RESERVED_WORKER_ENV)}])",
    f"the operator sets this variable from the spec; worker.env may not set {', '.join(RESERVED_WORKER_ENV)}",
    reason="FieldValueInvalid",
)


def _gpus_agree(part: str) -> dict[str, str]:
    """A rule on spec: a GPU resource in worker.resources.<part> must be the one `gpus` asks for."""
    amounts = f"self.worker.resources.{part}"
    return _cel(
        f"!has(self.worker.resources) || !has({amounts}) || {amounts}.all(r,"
        f" !(r == '{GPU_RESOURCE}' || r == '{SHARED_GPU_RESOURCE}'"
        f" || r.startsWith('{GPU_RESOURCE_PREFIX}mig-'))"
        f" || (r == self.gpus.resourceName && string({amounts}[r]) == string(self.gpus.count)))",
        f"a GPU resource in worker.resources.{part} must be gpus.resourceName with gpus.count:"
        " set GPUs with spec.gpus (the operator adds the limit), or leave them out here",
        field_path=f".worker.resources.{part}",
        reason="FieldValueInvalid",
    )


def _one_of(values: tuple[str, ...]) -> str:
    return f"[{', '.join(repr(value) for value in values)}]"


PROCESSES_NEED_A_COMMAND = _cel(
    "!has(self.processes) || self.processes == 1 || has(self.script)"
    " || (has(self.command) && size(self.command) > 0)",
    "worker.processes above 1 needs worker.script or worker.command: the worker container runs them under"
    " a supervisor, which cannot wrap the image's own entrypoint",
    field_path=".processes",
    reason="FieldValueInvalid",
)


RESERVED_VOLUME_NAME = _cel(
    f"!(self in {_one_of(RESERVED_VOLUMES)})",
    f"the operator's own volumes are named {' and '.join(RESERVED_VOLUMES)}; choose another name",
    reason="FieldValueInvalid",
)
RESERVED_MOUNT_PATH = _cel(
    " && ".join(f"self != '{path}' && !self.startsWith('{path}/')" for path in RESERVED_MOUNT_PATHS),
    f"the operator mounts its own volumes at {' and '.join(RESERVED_MOUNT_PATHS)}; mount elsewhere",
    reason="FieldValueInvalid",
)
MOUNTS_NAME_VOLUMES = _cel(
    "!has(self.worker.volumeMounts) || self.worker.volumeMounts.all(m,"
    " has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
    "each of worker.volumeMounts must name one of spec.volumes",
    field_path=".worker.volumeMounts",
    reason="FieldValueInvalid",
)
RESERVED_LABELS = _cel(
    " && ".join(f"!('{key}' in self)" for key in RESERVED_POD_LABELS),
    f"the operator sets {', '.join(RESERVED_POD_LABELS)} on the pods; podLabels may not",
    reason="FieldValueInvalid",
)

VALUE_OR_VALUE_FROM = _cel(
    "!(has(self.value) && has(self.valueFrom))",
    "give a variable either value or valueFrom, not both",
    field_path=".valueFrom",
    reason="FieldValueForbidden",
)
PORTS_DIFFER = _cel(
    "self.http != self.grpc && self.http != self.metrics && self.http != self.worker"
    " && self.grpc != self.metrics && self.grpc != self.worker && self.metrics != self.worker",
    "service.ports http, grpc, metrics and worker must be four different ports",
    reason="FieldValueInvalid",
)
NO_GPU_RESOURCES = _cel(
    "(!has(self.limits) || self.limits.all(r, !r.startsWith('nvidia.com/')))"
    " && (!has(self.requests) || self.requests.all(r, !r.startsWith('nvidia.com/')))",
    "only the worker runs on GPUs: ask for them with spec.gpus, not in this container's resources,"
    " where they would be held unused",
    reason="FieldValueForbidden",
)

GPU_LIMITS_AGREE = _gpus_agree("limits")
GPU_REQUESTS_AGREE = _gpus_agree("requests")

SERVICE_SAFE_NAME = _cel(
    f"size(self.metadata.name) <= {OBJECT_NAME_MAX_LENGTH}"
    f" && self.metadata.name.matches('{OBJECT_NAME_PATTERN}')",
    "metadata.name must be at most 63 lowercase letters, digits or '-', starting with a letter:"
    " it names the model's Service",
    field_path=".metadata.name",
    reason="FieldValueInvalid",
)
RESERVED_NAME_SUFFIX = _cel(
    " && ".join(f"!self.metadata.name.endsWith('{suffix}')" for suffix in naming.RESERVED_SUFFIXES),
    f"metadata.name may not end with {' or '.join(naming.RESERVED_SUFFIXES)}: the model's own children"
    " are named so",
    field_path=".metadata.name",
    reason="FieldValueInvalid",
)


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )


PassThrough = dict[str, Any]
"""A Kubernetes structure (affinity, a toleration, a metric) kept as is and validated by the API server."""

Quantity = (
    Annotated[int, Field(ge=0)]
    | Annotated[str, Field(max_length=QUANTITY_MAX_LENGTH, pattern=RESOURCE_QUANTITY_PATTERN)]
)
"""An amount of a resource, as Kubernetes writes it: 2, "500m", "8Gi"."""


def _once(values: list[str], what: str = "name") -> None:
    """Refuse a list whose items a key tells apart (as a list-map's or a set's) when a key repeats."""
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise ValueError(f"each {what} at most once: {', '.join(repeated)} repeated")


def _refused(value: str, allowed: bool, rule: dict[str, str]) -> str:
    if not allowed:
        raise ValueError(f"{value!r}: {rule['message']}")
    return value


def _guarded(
    max_length: int, rule: dict[str, str], allowed: Callable[[str], bool], pattern: str | None = None
) -> Any:
    """A string field that the API server checks with `rule` and pydantic with `allowed` (and both with
    `pattern`, where given)."""
    return Annotated[
        str,
        Field(
            min_length=1,
            max_length=max_length,
            pattern=pattern,
            json_schema_extra={"x-kubernetes-validations": [rule]},
        ),
        AfterValidator(lambda value: _refused(value, allowed(value), rule)),
    ]


def _outside_reserved_paths(path: str) -> bool:
    return not any(path == reserved or path.startswith(f"{reserved}/") for reserved in RESERVED_MOUNT_PATHS)


@with_config(
    ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        json_schema_extra={"x-kubernetes-validations": [VALUE_OR_VALUE_FROM]},
    )
)
class EnvVar(TypedDict):
    """An environment variable of the worker container (core/v1 EnvVar)."""

    name: _guarded(
        ENV_NAME_MAX_LENGTH, RESERVED_ENV_NAME, lambda name: name not in RESERVED_WORKER_ENV, ENV_NAME_PATTERN
    )
    """The variable's name: printable ASCII other than '='; the ones the operator sets (KUBETRITON_MODE and
    the rest of the pod contract) are refused."""
    value: NotRequired[str]
    """Its value, with $(NAME) references to variables defined before it expanded."""
    valueFrom: NotRequired[PassThrough]
    """Where the value comes from instead (core/v1 EnvVarSource): a ConfigMap or Secret key, a field
    of the pod, or a resource of a container."""


@with_config(ConfigDict(extra="forbid", use_attribute_docstrings=True))
class ResourceRequirements(TypedDict, total=False):
    """Compute resources of a container (core/v1 ResourceRequirements, without claims)."""

    limits: Annotated[dict[str, Quantity], Field(max_length=MAX_RESOURCE_NAMES)]
    """The most of each resource the container may use, by resource name (at most 32 names); amounts are
    integers or strings, so fractions are written "0.5" or "500m"."""
    requests: Annotated[dict[str, Quantity], Field(max_length=MAX_RESOURCE_NAMES)]
    """The amount of each resource reserved for the container when it is scheduled (at most 32 names);
    amounts as in limits."""


@with_config(ConfigDict(extra="forbid", use_attribute_docstrings=True))
class VolumeMount(TypedDict):
    """Where a volume of the pod appears in the worker container (core/v1 VolumeMount)."""

    name: Annotated[str, Field(min_length=1, max_length=OBJECT_NAME_MAX_LENGTH, pattern=DNS_LABEL_PATTERN)]
    """The name of one of spec.volumes."""
    mountPath: _guarded(NAME_MAX_LENGTH, RESERVED_MOUNT_PATH, _outside_reserved_paths)
    """The path in the container; not the operator's own mounts (/workspace, /dev/shm) or below them."""
    readOnly: NotRequired[bool]
    """Mount it read-only (a volume that replicas share, such as model weights, should be)."""
    subPath: NotRequired[Annotated[str, Field(max_length=NAME_MAX_LENGTH)]]
    """A path inside the volume to mount instead of its root."""
    subPathExpr: NotRequired[Annotated[str, Field(max_length=NAME_MAX_LENGTH)]]
    """As subPath, with $(VAR) references to the container's environment expanded."""
    mountPropagation: NotRequired[Literal["None", "HostToContainer", "Bidirectional"]]
    """How mounts propagate between the host and the container."""
    recursiveReadOnly: NotRequired[Literal["Disabled", "IfPossible", "Enabled"]]
    """Whether a read-only mount makes the mounts below it read-only too."""


class Volume(BaseModel):
    """A volume of the pods (core/v1 Volume): a name, and one source such as persistentVolumeClaim,
    secret, configMap, csi or emptyDir, which the API server validates."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    name: _guarded(
        OBJECT_NAME_MAX_LENGTH,
        RESERVED_VOLUME_NAME,
        lambda name: name not in RESERVED_VOLUMES,
        DNS_LABEL_PATTERN,
    )
    """The volume's name in the pod, a DNS label (lowercase letters, digits and '-'); not the operator's
    own (workspace, dshm)."""


@with_config(ConfigDict(extra="forbid", use_attribute_docstrings=True))
class LocalObjectReference(TypedDict):
    """The name of an object in the model's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=NAME_MAX_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)]
    """Its name."""


class ScriptSpec(_Model):
    """The user's script, from a ConfigMap: one file, or a small folder's files, one key each."""

    config_map: Annotated[str, Field(min_length=1, max_length=NAME_MAX_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)]
    """The ConfigMap in the model's namespace. Its keys appear as files in /kubetriton/script. Pods read
    it when they start: give a changed script a new ConfigMap name (as `kubetriton deploy` does) to roll
    them."""
    entrypoint: Annotated[
        str, Field(min_length=1, max_length=NAME_MAX_LENGTH, pattern=CONFIG_MAP_KEY_PATTERN)
    ] = "serve.py"
    """The key of the file to run, with the other files beside it (importable as modules)."""


class WorkerSpec(_Model):
    """The user's container: it imports pytriton, binds the callables and attaches to the sidecar."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [PROCESSES_NEED_A_COMMAND]})

    image: Annotated[str, Field(min_length=1, pattern=IMAGE_PATTERN)]
    """Worker image: any glibc-based image with CPython 3.10 to 3.13 and NumPy (the pod's init step
    provides kubetriton when the image has none), or one built from the kubetriton worker image."""
    script: ScriptSpec | None = None
    """The script to run when `command` is empty, from a ConfigMap, with kubetriton's launcher, which
    checks the image and provides kubetriton when the image lacks it."""
    command: Annotated[
        list[Annotated[str, Field(max_length=COMMAND_PART_MAX_LENGTH)]], Field(max_length=MAX_COMMAND_PARTS)
    ] = []
    """The container's entrypoint, e.g. ["python", "/app/serve.py"]; the launcher running `script` when
    that is given, else the image's, when empty. Without `script`, the image must have kubetriton."""
    args: list[str] = []
    """Arguments to the entrypoint; the image's when both this and command are empty."""
    env: Annotated[
        list[EnvVar],
        Field(
            max_length=MAX_ENV_VARS,
            json_schema_extra=KEYED_BY_NAME,
        ),
    ] = []
    """Extra environment variables, at most 256, each name once; the operator adds the pod contract's
    own (KUBETRITON_*) after them."""
    resources: ResourceRequirements = {}
    """Requests and limits of the worker container. The GPU limit comes from `gpus`: a GPU resource
    (nvidia.com/gpu, nvidia.com/mig-*) named here must be gpus.resourceName with gpus.count."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    """When to pull the worker image (also used for the bootstrap step, which runs it); Kubernetes'
    default when unset."""
    env_from: Annotated[list[PassThrough], Field(max_length=MAX_VOLUMES)] = []
    """core/v1 EnvFromSource entries: every key of a ConfigMap or Secret as a variable (a hub token, say)."""
    volume_mounts: Annotated[
        list[VolumeMount],
        Field(
            max_length=MAX_VOLUMES,
            json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["mountPath"]},
        ),
    ] = []
    """Where spec.volumes appear in the worker container, at most 64, each path once."""
    processes: Annotated[int, Field(ge=1, le=MAX_WORKER_PROCESSES)] = 1
    """Worker processes that run the script, 1 to 64, each with its own copy of the model and its own
    instances of every model: more than one lets callables that hold Python's GIL run at once. Each reads
    its index and the count from KUBETRITON_PROCESS_INDEX and KUBETRITON_PROCESS_COUNT; with as many GPUs
    as processes, each sees only its own. More than one needs script or command."""

    @model_validator(mode="after")
    def _processes_need_a_command(self) -> WorkerSpec:
        if self.processes > 1 and self.script is None and not self.command:
            raise ValueError(PROCESSES_NEED_A_COMMAND["message"])
        return self

    @field_validator("env")
    @classmethod
    def _names_once(cls, env: list[EnvVar]) -> list[EnvVar]:
        _once([variable["name"] for variable in env])
        for variable in env:
            if "value" in variable and "valueFrom" in variable:
                raise ValueError(f"{variable['name']}: {VALUE_OR_VALUE_FROM['message']}")
        return env

    @field_validator("volume_mounts")
    @classmethod
    def _paths_once(cls, mounts: list[VolumeMount]) -> list[VolumeMount]:
        _once([mount["mountPath"] for mount in mounts], "mountPath")
        return mounts


WITHOUT_GPUS = {"x-kubernetes-validations": [NO_GPU_RESOURCES]}


def _without_gpus(resources: ResourceRequirements) -> ResourceRequirements:
    amounts = [*resources.get("limits", {}), *resources.get("requests", {})]
    if any(name.startswith(GPU_RESOURCE_PREFIX) for name in amounts):
        raise ValueError(NO_GPU_RESOURCES["message"])
    return resources


class TritonSpec(_Model):
    """The stock Triton sidecar."""

    image: Annotated[str, Field(min_length=1, pattern=IMAGE_PATTERN)] = podenv.TRITON_IMAGE
    """Stock Triton image; the default matches the Triton version used in local mode."""
    args: list[str] = []
    """Extra tritonserver arguments, appended after the ones kubetriton sets."""
    resources: Annotated[ResourceRequirements, Field(json_schema_extra=WITHOUT_GPUS)] = {}
    """Requests and limits of the Triton container; it needs no GPU, and may not ask for one."""

    @field_validator("resources")
    @classmethod
    def _no_gpus(cls, resources: ResourceRequirements) -> ResourceRequirements:
        return _without_gpus(resources)


class BootstrapSpec(_Model):
    """The init step that prepares the workspace for the Triton sidecar and the worker."""

    image: Annotated[str | None, Field(min_length=1, pattern=IMAGE_PATTERN)] = None
    """The kubetriton worker image that runs it; the operator's (the chart's workerImage) when unset, or
    the worker's own image when the operator has none."""
    resources: Annotated[ResourceRequirements, Field(json_schema_extra=WITHOUT_GPUS)] = {}
    """Requests and limits of the bootstrap container (namespaces with a LimitRange or quota need them);
    no GPU."""

    @field_validator("resources")
    @classmethod
    def _no_gpus(cls, resources: ResourceRequirements) -> ResourceRequirements:
        return _without_gpus(resources)


class GpuSpec(_Model):
    """GPUs per replica, requested on the worker container."""

    count: Annotated[int, Field(ge=0, le=64)] = 0
    """GPUs (or MIG slices) each pod's worker gets, 0 to 64; 0 runs on CPU."""
    resource_name: Annotated[
        str, Field(max_length=253, json_schema_extra={"x-kubernetes-validations": [GPU_RESOURCE_NAME]})
    ] = GPU_RESOURCE
    """`nvidia.com/gpu`; `nvidia.com/gpu.shared`, the units of a GPU that the device plugin shares by
    time-slicing or MPS under a name of their own; or a MIG resource such as `nvidia.com/mig-1g.10gb`."""

    @field_validator("resource_name")
    @classmethod
    def _known_gpu_resource(cls, value: str) -> str:
        if not re.match(GPU_RESOURCE_PATTERN, value):
            raise ValueError(GPU_RESOURCE_NAME["message"])
        return value


def _target(most: float) -> Any:
    """A target of the model's own signal, up to `most`; at least MIN_TARGET by a CEL rule rather than a
    schema minimum (see POSITIVE_TARGET)."""

    def positive(value: float) -> float:
        if value < MIN_TARGET:
            raise ValueError(f"{value!r}: {POSITIVE_TARGET['message']}")
        return value

    rules = {"x-kubernetes-validations": [POSITIVE_TARGET]}
    return Annotated[float, Field(le=most, json_schema_extra=rules), AfterValidator(positive)]


QUEUE_TIME = "QueueTime"
IN_FLIGHT = "InFlight"
DEFAULT_TOLERANCE = 0.1
DEFAULT_SCALE_UP_STABILIZATION_SECONDS = 0
DEFAULT_SCALE_UP_MAX_PODS = 4
DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS = 300
DEFAULT_SCALING_PERIOD_SECONDS = 15
MAX_STABILIZATION_SECONDS = 3600


class ScalingRules(_Model):
    """How fast the operator's own autoscaler may move the replica count in one direction."""

    stabilization_seconds: Annotated[int | None, Field(ge=0, le=MAX_STABILIZATION_SECONDS)] = None
    """Seconds over which recommendations are remembered: a scale-up goes to the lowest of them, a
    scale-down to the highest, so a short burst or lull moves nothing. 0 to 3600; 0 up, 300 down when
    unset."""
    max_pods: Annotated[int | None, Field(ge=1, le=MAX_REPLICAS)] = None
    """The most pods added (or removed) within periodSeconds, 1 to 1000; 4 up and no limit down when
    unset. minReplicas and maxReplicas win over it."""
    period_seconds: Annotated[int | None, Field(ge=1, le=1800)] = None
    """The window maxPods counts over, 1 to 1800 seconds; 15 when unset."""


class AutoscalingSpec(_Model):
    """How many pods, between minReplicas and maxReplicas: by the model's own signals
    (targetQueueMilliseconds or targetInFlightPerPod, which the operator reads from the pods), or by a
    HorizontalPodAutoscaler on CPU (targetCPUUtilization) or on autoscaling/v2 metrics."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                MAX_AT_LEAST_MIN,
                QUEUE_OR_IN_FLIGHT,
                MODEL_SIGNAL_WITHOUT_CPU,
                MODEL_SIGNAL_WITHOUT_METRICS,
                BEHAVIOR_NEEDS_MODEL_SIGNAL,
            ]
        }
    )

    min_replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] = 1
    """The fewest pods the autoscaler keeps, 1 to 1000."""
    max_replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
    """The most pods the autoscaler may run, 1 to 1000, and at least minReplicas."""
    target_cpu_utilization: Annotated[int | None, Field(ge=1, le=100, alias="targetCPUUtilization")] = None
    """Average CPU utilisation (percent of requests) for a HorizontalPodAutoscaler to aim for; 80 when
    neither metrics nor a target of the model's own is given."""
    metrics: list[PassThrough] = []
    """autoscaling/v2 MetricSpec entries for a HorizontalPodAutoscaler, used as they are."""
    target_queue_milliseconds: _target(3_600_000) | None = None
    """Average time a request waits in Triton's queue before the model runs it, in milliseconds, across
    the pods and the slowest of the models: the operator sets the replicas from it (no
    HorizontalPodAutoscaler)."""
    target_in_flight_per_pod: _target(1_000_000) | None = None
    """Requests queued in Triton or running in the callable, per pod, summed over the pod's models:
    the operator sets the replicas from it (no HorizontalPodAutoscaler)."""
    tolerance: Annotated[float | None, Field(ge=0, le=0.99)] = None
    """How far the signal may stray from its target, as a fraction of it, before the replicas change;
    0.1 when unset. Only with a target of the model's own."""
    scale_up: ScalingRules | None = None
    """Stabilization and step limit when adding pods (by default at once, at most 4 pods per 15 s).
    Only with a target of the model's own."""
    scale_down: ScalingRules | None = None
    """Stabilization and step limit when removing pods (by default once every recommendation of the
    last 300 s is lower, with no step limit). Only with a target of the model's own."""

    @model_validator(mode="after")
    def _max_at_least_min(self) -> AutoscalingSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError(MAX_AT_LEAST_MIN["message"])
        return self

    @model_validator(mode="after")
    def _one_kind_of_target(self) -> AutoscalingSpec:
        fields = self.model_fields_set
        if {"target_queue_milliseconds", "target_in_flight_per_pod"} <= fields:
            raise ValueError(QUEUE_OR_IN_FLIGHT["message"])
        if self.signal is not None and "target_cpu_utilization" in fields:
            raise ValueError(MODEL_SIGNAL_WITHOUT_CPU["message"])
        if self.signal is not None and "metrics" in fields:
            raise ValueError(MODEL_SIGNAL_WITHOUT_METRICS["message"])
        if self.signal is None and fields & {"tolerance", "scale_up", "scale_down"}:
            raise ValueError(BEHAVIOR_NEEDS_MODEL_SIGNAL["message"])
        return self

    @property
    def signal(self) -> str | None:
        """QUEUE_TIME or IN_FLIGHT when the operator scales on the model's own signal; None when a
        HorizontalPodAutoscaler does."""
        if self.target_queue_milliseconds is not None:
            return QUEUE_TIME
        if self.target_in_flight_per_pod is not None:
            return IN_FLIGHT
        return None

    @property
    def target(self) -> float:
        """The target of the model's own signal (milliseconds, or requests per pod)."""
        target = self.target_queue_milliseconds or self.target_in_flight_per_pod
        assert target is not None, "only an autoscaler on the model's own signal has a target"
        return target


class SchedulingSpec(_Model):
    """Where the pods may run, passed to the pod spec as is."""

    node_selector: dict[
        str, Annotated[str, Field(max_length=OBJECT_NAME_MAX_LENGTH, pattern=LABEL_VALUE_PATTERN)]
    ] = {}
    """Labels a node must have to run the pods."""
    tolerations: list[PassThrough] = []
    """core/v1 Toleration entries: the node taints the pods tolerate."""
    affinity: PassThrough = {}
    """core/v1 Affinity: node affinity and pod (anti-)affinity of the pods."""
    topology_spread_constraints: list[PassThrough] = []
    """core/v1 TopologySpreadConstraint entries: how the pods spread across zones or nodes."""
    priority_class_name: Annotated[
        str | None, Field(max_length=NAME_MAX_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)
    ] = None
    """PriorityClass of the pods."""


class ServicePorts(_Model):
    """Ports that the Service exposes; they route to fixed ports in the pod: Triton's HTTP, gRPC and
    metrics, and the worker's health endpoint, whose /metrics has the worker's own counters."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [PORTS_DIFFER]})

    http: Annotated[int, Field(ge=1, le=65535)] = podenv.HTTP_PORT
    """Service port for Triton's HTTP/REST (KServe v2) endpoint."""
    grpc: Annotated[int, Field(ge=1, le=65535)] = podenv.GRPC_PORT
    """Service port for Triton's gRPC endpoint."""
    metrics: Annotated[int, Field(ge=1, le=65535)] = podenv.METRICS_PORT
    """Service port for Triton's Prometheus metrics."""
    worker: Annotated[int, Field(ge=1, le=65535)] = podenv.HEALTH_PORT
    """Service port for the worker's health endpoint and its Prometheus metrics."""

    @model_validator(mode="after")
    def _ports_differ(self) -> ServicePorts:
        if len({self.http, self.grpc, self.metrics, self.worker}) < 4:
            raise ValueError(PORTS_DIFFER["message"])
        return self


class ServiceSpec(_Model):
    """The Service in front of the model's pods."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """How the Service is exposed: inside the cluster only (ClusterIP), or also on every node's port
    or through a cloud load balancer."""
    ports: Annotated[
        ServicePorts,
        Field(
            default_factory=ServicePorts,
            json_schema_extra={"default": ServicePorts().model_dump(by_alias=True)},
        ),
    ]


def _model_name(value: str) -> str:
    if not re.fullmatch(podenv.MODEL_NAME_PATTERN, value):
        raise ValueError(f"{value!r}: {MODEL_NAMES['message']}")
    return value


class PyTritonModelSpec(_Model):
    """What to serve and how: the worker, its Triton sidecar, replicas and placement."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                REPLICAS_XOR_AUTOSCALING,
                GPU_LIMITS_AGREE,
                GPU_REQUESTS_AGREE,
                MOUNTS_NAME_VOLUMES,
            ]
        }
    )

    worker: WorkerSpec
    triton: Annotated[TritonSpec, Field(default_factory=TritonSpec, json_schema_extra={"default": {}})]
    models: Annotated[
        list[Annotated[str, Field(max_length=podenv.MODEL_NAME_MAX_LENGTH)]],
        Field(
            min_length=1,
            max_length=64,
            json_schema_extra={"x-kubernetes-list-type": "set", "x-kubernetes-validations": [MODEL_NAMES]},
        ),
    ]
    """Names of the models the worker binds, each once; a pod is ready once every one is loaded and
    attached."""
    replicas: Annotated[int | None, Field(ge=0, le=MAX_REPLICAS)] = None
    """Fixed number of pods, 0 to 1000 (1 when neither this nor autoscaling is set)."""
    autoscaling: AutoscalingSpec | None = None
    """Let the number of pods follow demand, by the model's own signals or a HorizontalPodAutoscaler;
    excludes replicas."""
    gpus: Annotated[GpuSpec, Field(default_factory=GpuSpec, json_schema_extra={"default": {}})]
    shared_memory: Annotated[str | None, Field(pattern=QUANTITY_PATTERN)] = None
    """Size limit of the /dev/shm volume; derived from models, GPUs and the arena size when unset."""
    scheduling: Annotated[
        SchedulingSpec, Field(default_factory=SchedulingSpec, json_schema_extra={"default": {}})
    ]
    service: Annotated[ServiceSpec, Field(default_factory=ServiceSpec, json_schema_extra={"default": {}})]
    router: bool | None = None
    """Run a router in front of the pods (HAProxy, two replicas, Service `<name>-router` on the model's
    HTTP and gRPC ports), which sends each request to the pod with the fewest in flight: for clients
    other than ModelClient, which keep one connection and so one pod. Unset: the operator's default
    (the chart's router.enabledByDefault)."""
    service_account_name: Annotated[
        str | None, Field(max_length=NAME_MAX_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)
    ] = None
    """ServiceAccount the pods run as; the namespace's default when unset."""
    drain_seconds: Annotated[int, Field(ge=1, le=3600)] = podenv.DEFAULT_DRAIN_SECONDS
    """How long a stopping pod keeps serving its clients' connections, waiting for them to move to other
    pods, before it stops Triton."""
    startup_seconds: Annotated[int, Field(ge=10, le=86400)] = DEFAULT_STARTUP_SECONDS
    """How long the worker may take to start (a script that loads multi-GB weights before it creates
    Triton()) before Kubernetes restarts it; liveness checks begin only after. Loading after Triton() has
    no limit: the pod is simply not ready, and the status says Loading."""
    volumes: Annotated[
        list[Volume],
        Field(
            max_length=MAX_VOLUMES,
            json_schema_extra=KEYED_BY_NAME,
        ),
    ] = []
    """Volumes of the pods (core/v1 Volume: persistentVolumeClaim, secret, configMap, csi, emptyDir...),
    each name once; worker.volumeMounts places them in the worker container."""
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=MAX_PULL_SECRETS)] = []
    """Secrets with registry credentials, used for every image of the pod (worker, bootstrap, Triton)."""
    pod_labels: Annotated[
        dict[str, Annotated[str, Field(max_length=OBJECT_NAME_MAX_LENGTH, pattern=LABEL_VALUE_PATTERN)]],
        Field(max_length=MAX_POD_METADATA, json_schema_extra={"x-kubernetes-validations": [RESERVED_LABELS]}),
    ] = {}
    """Extra labels of the pods (a service mesh's, a team's); not the ones the operator sets."""
    pod_annotations: Annotated[dict[str, str], Field(max_length=MAX_POD_METADATA)] = {}
    """Extra annotations of the pods (scraping, a mesh's sidecar settings)."""
    runtime_class_name: Annotated[
        str | None, Field(max_length=NAME_MAX_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)
    ] = None
    """RuntimeClass of the pods (e.g. the NVIDIA container runtime's)."""
    bootstrap: Annotated[
        BootstrapSpec, Field(default_factory=BootstrapSpec, json_schema_extra={"default": {}})
    ]

    @field_validator("models")
    @classmethod
    def _bindable_models_once(cls, names: list[str]) -> list[str]:
        _once(names)
        return [_model_name(name) for name in names]

    @model_validator(mode="after")
    def _replicas_xor_autoscaling(self) -> PyTritonModelSpec:
        if self.replicas is not None and self.autoscaling is not None:
            raise ValueError(REPLICAS_XOR_AUTOSCALING["message"])
        return self

    @field_validator("pod_labels")
    @classmethod
    def _not_the_operators_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        taken = sorted(set(labels) & set(RESERVED_POD_LABELS))
        return labels if not taken else _refused(", ".join(taken), False, RESERVED_LABELS)

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> PyTritonModelSpec:
        names = {volume.name for volume in self.volumes}
        for mount in self.worker.volume_mounts:
            _refused(mount["name"], mount["name"] in names, MOUNTS_NAME_VOLUMES)
        try:
            _once([volume.name for volume in self.volumes])
        except ValueError as error:
            raise ValueError(f"volumes: {error}") from None
        return self

    @model_validator(mode="after")
    def _gpu_resources_agree(self) -> PyTritonModelSpec:
        for part, rule in (("limits", GPU_LIMITS_AGREE), ("requests", GPU_REQUESTS_AGREE)):
            for name, amount in self.worker.resources.get(part, {}).items():
                is_gpu = name in (GPU_RESOURCE, SHARED_GPU_RESOURCE) or name.startswith(
                    f"{GPU_RESOURCE_PREFIX}mig-"
                )
                if is_gpu and (name != self.gpus.resource_name or str(amount) != str(self.gpus.count)):
                    raise ValueError(rule["message"])
        return self

    @property
    def fixed_replicas(self) -> int | None:
        """The replica count the Deployment is pinned to, or None when the autoscaler owns it."""
        if self.autoscaling is not None:
            return None
        return 1 if self.replicas is None else self.replicas

    @property
    def scaled_by_operator(self) -> bool:
        """Whether the operator itself sets the replicas from the model's own signals (no HPA)."""
        return self.autoscaling is not None and self.autoscaling.signal is not None

    @property
    def min_replicas(self) -> int:
        """The fewest pods the model runs with in normal operation."""
        return self.autoscaling.min_replicas if self.autoscaling is not None else self.fixed_replicas or 0

    @property
    def shared_memory_limit(self) -> str:
        """The /dev/shm size: the explicit one, or enough for every model instance's arenas.

        Each model instance maps a request and a response arena of the default arena size; the
        default assumes one instance of each declared model per GPU or per worker process, whichever are
        more (at least one), plus headroom.
        """
        if self.shared_memory is not None:
            return self.shared_memory
        instances = len(self.models) * max(1, self.gpus.count, self.worker.processes)
        total = ARENAS_PER_INSTANCE * podenv.DEFAULT_ARENA_BYTES * instances + SHM_HEADROOM_BYTES
        return f"{total // (1024 * 1024)}Mi"


class Condition(_Model):
    """A status condition in the usual Kubernetes shape."""

    type: str
    """Ready (every wanted pod serves every model), Progressing (pods are being created or rolled out)
    or Degraded (a problem, named by reason, keeps pods from serving); RouterReady for a model with a
    router (a router pod serves)."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = ""
    """One word for why, e.g. InsufficientGPU, Unschedulable, ImagePullBackOff or ModelLoadFailed."""
    message: str = ""
    """What happened, in a sentence for people."""
    last_transition_time: str | None = None
    """When status last changed (RFC 3339)."""


class AutoscalingStatus(_Model):
    """What the operator's own autoscaler saw and decided last, and why."""

    signal: str = ""
    """QueueTime or InFlight."""
    targets: str = ""
    """The signal against its target, as `kubectl get` shows it: "queue 12.5ms/10ms", "in-flight 3.2/4"."""
    current_value: float | None = None
    """The signal as last measured (milliseconds, or requests per pod); absent while no pod answers."""
    target_value: float = 0
    """The target it is compared with."""
    measured_pods: int = 0
    """Ready pods whose metrics the last measurement read."""
    current_replicas: int = 0
    """The Deployment's replicas when the decision was made."""
    desired_replicas: int = 0
    """The replicas decided on."""
    reason: str = ""
    """One word for the decision: ScaledUp, ScaledDown, WithinTolerance, Stabilizing, StepLimited,
    AtMaximum, AtMinimum, Unschedulable (pods that cannot be scheduled hold scale-ups) or NoMetrics."""
    message: str = ""
    """The decision in a sentence: the signal, the recommendation, what held it back."""
    last_decision_time: str | None = None
    """When this status was decided (RFC 3339): a new decision is written at once, the same one on a
    signal that moved at most every 15 s, and nothing while nothing changes."""
    last_scale_time: str | None = None
    """When the autoscaler last changed the replicas (RFC 3339)."""


class RouterStatus(_Model):
    """The model's router: where clients reach it, and its pods."""

    url: str = ""
    """HTTP endpoint of the router's Service, inside the cluster."""
    grpc_url: str = ""
    """gRPC endpoint of the router's Service, inside the cluster."""
    replicas: int = 0
    """Pods of the router's Deployment."""
    ready_replicas: int = 0
    """Router pods that are ready."""


class PyTritonModelStatus(_Model):
    """What the operator observed; written by the operator only."""

    observed_generation: int | None = None
    """The metadata.generation of the spec this status describes."""
    replicas: int = 0
    """Pods of the model's Deployment, for the scale subresource."""
    ready_replicas: int = 0
    """Pods that are ready: every declared model loaded in Triton and attached to its worker."""
    selector: str = ""
    """Label selector of the pods, for the scale subresource."""
    conditions: list[Condition] = []
    """Ready, Progressing and Degraded; RouterReady for a model with a router."""
    url: str = ""
    """HTTP endpoint of the model's Service, inside the cluster."""
    grpc_url: str = ""
    """gRPC endpoint of the model's Service, inside the cluster."""
    pods_url: str = ""
    """HTTP endpoint whose name resolves to each Ready pod: a ModelClient given it balances each request
    over the pods."""
    pods_grpc_url: str = ""
    """The same over gRPC."""
    autoscaling: AutoscalingStatus | None = None
    """The operator's own autoscaler, for a model scaled on its own signals."""
    router: RouterStatus | None = None
    """The model's router, when it has one."""


class ObjectMeta(BaseModel):
    """The part of metadata a model.yaml sets; the rest belongs to the API server."""

    model_config = ConfigDict(extra="ignore")

    name: str
    """Also the name of every child; a Service name must be a DNS-1035 label."""
    namespace: str | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}

    @field_validator("name")
    @classmethod
    def _service_safe(cls, value: str) -> str:
        if len(value) > OBJECT_NAME_MAX_LENGTH or not re.match(OBJECT_NAME_PATTERN, value):
            raise ValueError(SERVICE_SAFE_NAME["message"])
        if value.endswith(naming.RESERVED_SUFFIXES):
            raise ValueError(RESERVED_NAME_SUFFIX["message"])
        return value


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


class PyTritonModel(BaseModel):
    """A whole PyTritonModel document, as in a model.yaml."""

    model_config = ConfigDict(extra="ignore")

    api_version: Annotated[Literal["kubetriton.dev/v1alpha1"], Field(alias="apiVersion")] = API_VERSION
    kind: Literal["PyTritonModel"] = KIND
    metadata: ObjectMeta
    spec: PyTritonModelSpec

    @classmethod
    def read(cls, document: Mapping[str, Any]) -> PyTritonModel:
        """A document as the API server reads it: each field by its YAML name only (never by the Python
        name, which the server would prune), each value of the type the schema declares (no "2" for 2),
        and an explicit null as a field left out (the server drops it)."""
        return cls.model_validate(_without_nulls(document), strict=True, by_name=False)


def describe_validation_error(error: ValidationError) -> str:
    """One readable line per problem, each naming the field as it is spelled in YAML."""
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "object"
        message = problem["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return "\n".join(lines)
