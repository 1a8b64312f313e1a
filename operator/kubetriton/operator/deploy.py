"""`kubetriton deploy SCRIPT`: from a PyTriton script to a served model, with no image to build.

The script's files go into a ConfigMap named after their hash, created once and never changed
(immutable), so a changed script is a new ConfigMap: the model's spec then names another one and
its pods roll as for a new image, while the pods still serving keep the files they started with.
The PyTritonModel is applied server-side under its own field manager, so fields that others set on
the model (by kubectl, by an autoscaler) stay theirs. The ConfigMap is then owned by the model, so
deleting the model deletes its scripts; once the model is Ready, its older scripts are deleted.

Everything applied is first validated with the operator's own pydantic models, and
`--dry-run=client -o yaml` prints it without touching a cluster.
"""

from __future__ import annotations

import argparse
import base64
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException
from kubetriton import podenv
from kubetriton.operator import connection, naming, rollout, script, status
from kubetriton.operator.connection import Cluster, CommandError
from kubetriton.operator.spec import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SINGULAR,
    VERSION,
    ObjectMeta,
    PyTritonModel,
    describe_validation_error,
)
from pydantic import ValidationError

FIELD_MANAGER = "kubetriton-deploy"
DEFAULT_TIMEOUT = "300s"
COMPONENT_LABEL = "app.kubernetes.io/component"
SCRIPT_COMPONENT = "script"
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}


class _BlockDumper(yaml.SafeDumper):
    """YAML with a multi-line string (a script) written as a literal block, as kubectl writes it."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _string)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "script", help="the script to serve: one file, or a folder whose top-level files it needs"
    )
    parser.add_argument(
        "--image",
        help="the worker image: any glibc-based image with CPython 3.10-3.13 and NumPy "
        "(required for a new model; an update keeps the model's image)",
    )
    parser.add_argument(
        "--gpus", type=int, default=None, help="GPUs per replica (default: none, or the model's)"
    )
    parser.add_argument("--replicas", type=int, default=None, help="pods (default: 1, or the model's)")
    parser.add_argument(
        "--processes",
        type=int,
        default=None,
        help="worker processes per pod, each serving its own instances of every model "
        "(default: 1, or the model's)",
    )
    parser.add_argument(
        "--router",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a router in front of the pods, which sends each request of any client (tritonclient, curl, "
        "perf_analyzer) to the pod with the fewest in flight (default: the model's, else the operator's)",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="the model's object and Service name (default: from its first model name)",
    )
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help="a model the script binds (repeatable); needed when its bind() calls do not name them literally",
    )
    parser.add_argument(
        "--entrypoint",
        default=None,
        help=f"the file of a folder to run (default: {script.DEFAULT_ENTRYPOINT})",
    )
    connection.add_arguments(parser)
    parser.add_argument(
        "--timeout",
        type=duration,
        default=duration(DEFAULT_TIMEOUT),
        help=f"how long to wait for Ready, e.g. 90s, 5m, 1h30m (default: {DEFAULT_TIMEOUT})",
    )
    parser.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wait until the model is Ready, showing its progress (default: wait)",
    )
    parser.add_argument(
        "--dry-run",
        nargs="?",
        const="client",
        default="none",
        choices=["none", "client"],
        help="client: print what would be applied, without touching a cluster",
    )
    parser.add_argument(
        "-o", "--output", choices=["yaml"], default=None, help="with --dry-run=client: print YAML"
    )


def duration(text: str) -> float:
    """A duration as kubectl takes one: 300s, 5m, 1h30m, or plain seconds."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    elif DURATION_PART.sub("", text) == "" and text:
        seconds = sum(float(amount) * UNIT_SECONDS[unit] for amount, unit in DURATION_PART.findall(text))
    else:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: write it as 90s, 5m or 1h30m")
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: it must be more than zero")
    return seconds


def script_labels(name: str) -> dict[str, str]:
    """The labels of a model's script ConfigMaps, by which its older ones are found."""
    return {
        naming.INSTANCE_LABEL: name,
        COMPONENT_LABEL: SCRIPT_COMPONENT,
        naming.MANAGED_BY_LABEL: FIELD_MANAGER,
    }


def config_map_name(name: str, files: script.Script) -> str:
    return f"{name}-script-{files.digest}"


def config_map_document(name: str, namespace: str, files: script.Script) -> dict[str, Any]:
    """The immutable ConfigMap of one version of a model's script; a file that is not UTF-8 text goes
    into binaryData."""
    text, binary = {}, {}
    for key, content in files.files.items():
        try:
            text[key] = content.decode()
        except UnicodeDecodeError:
            binary[key] = content
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(name, files),
            "namespace": namespace,
            "labels": script_labels(name),
        },
        "immutable": True,
        "data": text,
    }
    if binary:
        document["binaryData"] = {key: base64.b64encode(content).decode() for key, content in binary.items()}
    return document


def model_document(
    name: str,
    namespace: str,
    *,
    image: str,
    config_map: str,
    entrypoint: str,
    models: list[str],
    gpus: int | None,
    replicas: int | None,
    processes: int | None = None,
    router: bool | None = None,
) -> dict[str, Any]:
    """The PyTritonModel fields that a deploy sets; the rest keep their defaults or others' values."""
    worker: dict[str, Any] = {"image": image, "script": {"configMap": config_map, "entrypoint": entrypoint}}
    if processes is not None:
        worker["processes"] = processes
    spec: dict[str, Any] = {"worker": worker, "models": models}
    if gpus is not None:
        spec["gpus"] = {"count": gpus}
    if replicas is not None:
        spec["replicas"] = replicas
    if router is not None:
        spec["router"] = router
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def validated(document: dict[str, Any]) -> PyTritonModel:
    try:
        return PyTritonModel.read(document)
    except ValidationError as error:
        raise CommandError(f"invalid PyTritonModel:\n{describe_validation_error(error)}") from error


def _read_script(args: argparse.Namespace) -> tuple[script.Script, list[str], str]:
    """The script's files, the models it binds, and the model's object name."""
    try:
        files = script.load(Path(args.script), args.entrypoint)
        models = args.models or script.model_names(files)
    except script.ScriptError as error:
        raise CommandError(str(error)) from error
    for item, why in files.skipped:
        print(f"warning: {args.script}/{item} is not deployed: {why}", file=sys.stderr)
    if args.name is not None:
        try:
            ObjectMeta(name=args.name)
        except ValidationError as error:  # said here, before the names made from it fail too
            raise CommandError(
                f"--name {args.name!r}: {describe_validation_error(error).removeprefix('name: ')}"
            ) from None
        return files, models, args.name
    name = script.object_name(models[0], files.stem)
    if not name:
        raise CommandError(
            f"cannot make an object name from {models[0]!r} or {files.stem!r}: give one with --name"
        )
    if name.endswith(naming.RESERVED_SUFFIXES):
        raise CommandError(
            f"the object name made from {models[0]!r}, {name!r}, ends with"
            f" {' or '.join(naming.RESERVED_SUFFIXES)}, which names the model's own children: give"
            " another with --name"
        )
    return files, models, name


def _documents(
    args: argparse.Namespace,
    files: script.Script,
    models: list[str],
    name: str,
    namespace: str,
    live: dict | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ConfigMap and the PyTritonModel to apply; what a flag does not say, an update keeps."""
    spec = (live or {}).get("spec") or {}
    served = spec.get("models") or []
    if live and served != models:
        before, after = ", ".join(served), ", ".join(models)
        print(
            f"warning: model {name} serves {before}; this deploy makes it serve {after}"
            " (another script? give another --name to deploy it beside)",
            file=sys.stderr,
        )
    command = (spec.get("worker") or {}).get("command")
    if command:
        print(
            f"warning: model {name} has worker.command {command}, which runs instead of the script",
            file=sys.stderr,
        )
    image = args.image or (spec.get("worker") or {}).get("image")
    if not image:
        where = (
            "" if args.dry_run == "client" else f": model {name} does not exist in namespace {namespace} yet"
        )
        raise CommandError(f"--image is required{where}")
    gpus = args.gpus if args.gpus is not None else (spec.get("gpus") or {}).get("count")
    replicas = args.replicas if args.replicas is not None else spec.get("replicas")
    processes = args.processes if args.processes is not None else (spec.get("worker") or {}).get("processes")
    router = args.router if args.router is not None else spec.get("router")
    config_map = config_map_document(name, namespace, files)
    model = model_document(
        name,
        namespace,
        image=image,
        config_map=config_map["metadata"]["name"],
        entrypoint=files.entrypoint,
        models=models,
        gpus=gpus,
        replicas=replicas,
        processes=processes,
        router=router,
    )
    validated(model)
    return config_map, model


def _create_config_map(cluster: Cluster, document: dict[str, Any]) -> str:
    """Create the script's ConfigMap; one of the same name holds the same files already."""
    try:
        cluster.core.create_namespaced_config_map(
            cluster.namespace,
            document,
            field_manager=FIELD_MANAGER,
            _request_timeout=connection.REQUEST_TIMEOUT_SECONDS,
        )
    except ApiException as error:
        if error.status == 409:
            return "unchanged"
        raise
    return "created"


def _apply_model(cluster: Cluster, document: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply; the model as stored."""
    applied = cluster.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        cluster.namespace,
        PLURAL,
        document["metadata"]["name"],
        document,
        field_manager=FIELD_MANAGER,
        force=True,
        _content_type="application/apply-patch+yaml",
        _request_timeout=connection.REQUEST_TIMEOUT_SECONDS,
        _preload_content=False,
    )
    return connection.answer(applied)


def _own_config_map(cluster: Cluster, config_map: str, model: dict[str, Any]) -> None:
    """Make the model the ConfigMap's owner, so that deleting the model deletes it."""
    owner = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": model["metadata"]["name"],
        "uid": model["metadata"]["uid"],
    }
    cluster.core.patch_namespaced_config_map(
        config_map,
        cluster.namespace,
        {"metadata": {"ownerReferences": [owner]}},
        _content_type="application/merge-patch+json",
        _request_timeout=connection.REQUEST_TIMEOUT_SECONDS,
    )


def _delete_older_scripts(cluster: Cluster, name: str, current: str) -> list[str]:
    selector = ",".join(f"{key}={value}" for key, value in script_labels(name).items())
    listing = cluster.core.list_namespaced_config_map(
        cluster.namespace,
        label_selector=selector,
        _request_timeout=connection.REQUEST_TIMEOUT_SECONDS,
        _preload_content=False,
    )
    names = [item["metadata"]["name"] for item in connection.answer(listing)["items"]]
    older = sorted(name for name in names if name != current)
    for config_map in older:
        try:
            cluster.core.delete_namespaced_config_map(
                config_map, cluster.namespace, _request_timeout=connection.REQUEST_TIMEOUT_SECONDS
            )
        except ApiException as error:
            if error.status != 404:
                raise
    return older


def addresses(model: dict[str, Any]) -> list[str]:
    """The Service's addresses, for any client, the router's where the model has one (each request of any
    client to a free pod), and the three lines that query the model from inside the cluster with
    ModelClient, through the name of the pods (each request to a free pod)."""
    name, namespace = model["metadata"]["name"], model["metadata"]["namespace"]
    found = model.get("status") or {}
    http = found.get("url") or naming.http_url(name, namespace)
    grpc = found.get("grpcUrl") or naming.grpc_url(name, namespace)
    pods = found.get("podsGrpcUrl") or f"grpc://{naming.pods_host(name, namespace)}:{podenv.GRPC_PORT}"
    first_model = model["spec"]["models"][0]
    routed = found.get("router") or {}
    return [
        f"HTTP: {http}",
        f"gRPC: {grpc}",
        *([f"Router: {routed['url']}, {routed['grpcUrl']}"] if routed.get("url") else []),
        "",
        "from pytriton.client import ModelClient",
        f'with ModelClient("{pods}", "{first_model}") as client:  # each request to a free pod',
        "    result = client.infer_batch(...)  # one numpy array per input",
    ]


def _deploy(args: argparse.Namespace) -> int:
    if args.output and args.dry_run != "client":
        raise CommandError("--output needs --dry-run=client")
    files, models, name = _read_script(args)
    if args.dry_run == "client":
        config_map, model = _documents(args, files, models, name, connection.namespace_of(args), None)
        if args.output == "yaml":
            sys.stdout.write(yaml.dump_all([config_map, model], Dumper=_BlockDumper, sort_keys=False))
        else:
            print(f"configmap/{config_map['metadata']['name']} applied (dry run)")
            print(f"{SINGULAR}.{GROUP}/{model['metadata']['name']} applied (dry run)")
        return 0
    cluster = connection.connect(args)
    live = cluster.get_model(name)
    config_map, model = _documents(args, files, models, name, cluster.namespace, live)
    script_map = config_map["metadata"]["name"]
    print(f"configmap/{script_map} {_create_config_map(cluster, config_map)}")
    applied = _apply_model(cluster, model)
    print(f"{SINGULAR}.{GROUP}/{name} {'configured' if live else 'created'}")
    _own_config_map(cluster, script_map, applied)
    if not args.wait:
        print("\n".join(addresses(applied)))
        return 0
    goal = "scale to zero" if applied["spec"].get("replicas") == 0 else "be Ready"
    print(f"waiting for {name} to {goal} (timeout {args.timeout:g}s)")
    done = rollout.follow(cluster, name, args.timeout, print)
    for older in _delete_older_scripts(cluster, name, script_map):
        print(f"configmap/{older} deleted (an older script)")
    outcome = "is Ready" if rollout.is_ready(done) else "is scaled to zero"
    print(f"{name} {outcome}: {rollout.condition(done, status.READY).get('message', '')}")
    print()
    print("\n".join(addresses(done)))
    return 0


def run(args: argparse.Namespace) -> int:
    return connection.run_reporting_failures(lambda: _deploy(args))
