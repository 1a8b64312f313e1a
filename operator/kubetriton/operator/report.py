"""`kubetriton status [NAME]`: how models are doing, in the words of their Ready condition.

Without a name, one line per model, with the columns of `kubectl get ptm` and the Ready
condition's reason and message, which say what a model waits for or what keeps it from serving.
With a name, the one model in detail: what it runs, its conditions, addresses and pods, and for each
Ready pod the requests its Triton answered since it started, their share of all the pods', and their
average wait in Triton's queue (read from each pod's metrics through the API server's pod proxy), so
that a pod that takes more than its share, or one that takes none, shows. With `--wait`, first follow
the model until it is Ready, as `kubetriton deploy` does, for a model applied otherwise (`kubectl
apply`): it stops, non-zero, where the model cannot get Ready without a change.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubetriton import podenv
from kubetriton.operator import connection, deploy, rollout, signals, status
from kubetriton.operator.connection import Cluster, age
from kubetriton.operator.spec import GROUP, PLURAL, VERSION

COLUMN_GAP = "   "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", nargs="?", default=None, help="one model to show in detail (default: every model)"
    )
    connection.add_arguments(parser)
    parser.add_argument(
        "-A", "--all-namespaces", action="store_true", help="list the models of every namespace"
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait until the model NAME is Ready, showing its progress; exit non-zero where it cannot get "
        "Ready without a change",
    )
    parser.add_argument(
        "--timeout",
        type=deploy.duration,
        default=deploy.duration(deploy.DEFAULT_TIMEOUT),
        help=f"with --wait: how long to wait, e.g. 90s, 5m (default: {deploy.DEFAULT_TIMEOUT})",
    )


def table(rows: list[list[str]], indent: str = "") -> str:
    """Rows in columns as wide as their widest cell, as kubectl prints them."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = [
        COLUMN_GAP.join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(indent + line for line in lines)


def model_row(model: Mapping[str, Any], with_namespace: bool) -> list[str]:
    spec, found = model.get("spec") or {}, model.get("status") or {}
    ready = rollout.condition(model, status.READY)
    row = [
        model["metadata"]["name"],
        ready.get("status", ""),
        str(found.get("replicas", 0)),
        str(found.get("readyReplicas", 0)),
        ",".join(spec.get("models") or []),
        str((spec.get("gpus") or {}).get("count", 0)),
        age(model["metadata"].get("creationTimestamp")),
        ready.get("reason", ""),
        ready.get("message", ""),
    ]
    return [model["metadata"].get("namespace", ""), *row] if with_namespace else row


def _list(cluster: Cluster, every_namespace: bool) -> int:
    if every_namespace:
        listing = cluster.custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, _request_timeout=connection.REQUEST_TIMEOUT_SECONDS
        )
    else:
        listing = cluster.custom.list_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, _request_timeout=connection.REQUEST_TIMEOUT_SECONDS
        )
    models = sorted(
        listing.get("items") or [], key=lambda m: (m["metadata"].get("namespace", ""), m["metadata"]["name"])
    )
    if not models:
        where = "" if every_namespace else f" in {cluster.namespace} namespace"
        print(f"No resources found{where}.", file=sys.stderr)
        return 0
    header = ["NAME", "READY", "REPLICAS", "AVAILABLE", "MODELS", "GPUS", "AGE", "REASON", "MESSAGE"]
    header = ["NAMESPACE", *header] if every_namespace else header
    print(table([header, *(model_row(model, every_namespace) for model in models)]))
    return 0


def pod_state(pod: Mapping[str, Any]) -> str:
    """A pod's STATUS as kubectl shows it: a waiting or failed container's reason, else the phase."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    found = pod.get("status") or {}
    for prefix, key in (("Init:", "initContainerStatuses"), ("", "containerStatuses")):
        for container in found.get(key) or []:
            state = container.get("state") or {}
            reason = (state.get("waiting") or {}).get("reason") or (state.get("terminated") or {}).get(
                "reason"
            )
            if reason and not (prefix and reason == "Completed"):
                return prefix + reason
    return found.get("phase", "Unknown")


def pod_row(pod: Mapping[str, Any]) -> list[str]:
    spec, found = pod.get("spec") or {}, pod.get("status") or {}
    sidecars = {c["name"] for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"}
    serving = [
        *(c for c in found.get("initContainerStatuses") or [] if c.get("name") in sidecars),
        *(found.get("containerStatuses") or []),
    ]
    total = len(sidecars) + len(spec.get("containers") or [])
    restarts = sum(
        c.get("restartCount", 0)
        for c in [*(found.get("initContainerStatuses") or []), *(found.get("containerStatuses") or [])]
    )
    return [
        pod["metadata"]["name"],
        f"{sum(bool(c.get('ready')) for c in serving)}/{total}",
        pod_state(pod),
        str(restarts),
        age(pod["metadata"].get("creationTimestamp")),
    ]


@dataclass(frozen=True)
class PodLoad:
    """What one pod's Triton answered since it started, over the model's declared models."""

    requests: float
    queue_us: float


def pod_load(page: str, models: list[str]) -> PodLoad:
    samples = signals.parse(page, signals.QUEUE_TIME_METRICS)
    requests, waits = samples.get(signals.REQUESTS, {}), samples.get(signals.QUEUE_DURATION, {})
    return PodLoad(
        requests=sum(requests.get(model, 0.0) for model in models),
        queue_us=sum(waits.get(model, 0.0) for model in models),
    )


def load_columns(pods: list[Mapping[str, Any]], loads: Mapping[str, PodLoad]) -> dict[str, list[str]]:
    """REQUESTS, SHARE and QUEUE of each pod: its requests, their share of all the pods' requests, and
    their average wait in Triton's queue; "-" where the pod's metrics were not read."""
    total = sum(load.requests for load in loads.values())
    columns = {}
    for pod in pods:
        load = loads.get(pod["metadata"]["name"])
        if load is None:
            columns[pod["metadata"]["name"]] = ["-", "-", "-"]
            continue
        share = f"{100 * load.requests / total:.0f}%" if total else "-"
        queue = f"{load.queue_us / load.requests / 1000:.1f}ms" if load.requests else "-"
        columns[pod["metadata"]["name"]] = [f"{load.requests:.0f}", share, queue]
    return columns


def describe(
    model: Mapping[str, Any], pods: list[dict[str, Any]], loads: Mapping[str, PodLoad] | None = None
) -> str:
    """One model in detail; `loads`: what each Ready pod answered, when read."""
    spec, found = model.get("spec") or {}, model.get("status") or {}
    worker = spec.get("worker") or {}
    script = worker.get("script")
    fields = [
        ("Name", model["metadata"]["name"]),
        ("Namespace", model["metadata"].get("namespace", "")),
        ("Image", worker.get("image", "")),
        ("Script", f"{script['configMap']} ({script.get('entrypoint', 'serve.py')})" if script else "<none>"),
        ("Models", ", ".join(spec.get("models") or [])),
        ("Replicas", f"{found.get('readyReplicas', 0)} ready of {rollout.wanted_replicas(model)}"),
        ("HTTP", found.get("url") or "<none yet>"),
        ("gRPC", found.get("grpcUrl") or "<none yet>"),
        (
            "ModelClient",
            " or ".join(filter(None, (found.get("podsGrpcUrl"), found.get("podsUrl")))) or "<none yet>",
        ),
    ]
    routed = found.get("router")
    if routed:
        ready = f"{routed.get('readyReplicas', 0)} of {routed.get('replicas', 0)} ready"
        fields.append(("Router", f"{routed.get('url')}, {routed.get('grpcUrl')} ({ready})"))
    width = max(len(label) for label, _ in fields) + 3
    lines = [f"{label + ':':<{width}}{value}" for label, value in fields]
    conditions = found.get("conditions") or []
    lines.append("Conditions:")
    if conditions:
        rows = [
            [c.get("type", ""), c.get("status", ""), c.get("reason", ""), c.get("message", "")]
            for c in conditions
        ]
        lines.append(table([["TYPE", "STATUS", "REASON", "MESSAGE"], *rows], indent="  "))
    else:
        lines.append("  <none: the operator has not reported on this model yet>")
    lines.append("Pods:")
    if pods:
        ordered = sorted(pods, key=lambda p: p["metadata"]["name"])
        header = ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
        rows = [pod_row(pod) for pod in ordered]
        if loads is not None:
            columns = load_columns(ordered, loads)
            header += ["REQUESTS", "SHARE", "QUEUE"]
            rows = [[*row, *columns[pod["metadata"]["name"]]] for row, pod in zip(rows, ordered, strict=True)]
        lines.append(table([header, *rows], indent="  "))
        if loads is not None:
            lines.append(
                "  (requests each pod's Triton answered since it started; SHARE: of all the pods';"
                " QUEUE: their average wait)"
            )
    else:
        lines.append("  <none>")
    return "\n".join(lines)


def read_loads(cluster: Cluster, model: Mapping[str, Any], pods: list[dict[str, Any]]) -> dict[str, PodLoad]:
    """What each Ready pod answered, from its Triton's metrics; a pod whose page cannot be read is left
    out."""
    models = (model.get("spec") or {}).get("models") or []
    loads = {}
    for pod in pods:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        if not ready:
            continue
        page = cluster.pod_metrics(pod["metadata"]["name"], podenv.METRICS_PORT)
        if page is not None:
            loads[pod["metadata"]["name"]] = pod_load(page, models)
    return loads


def _show(args: argparse.Namespace) -> int:
    if args.wait and args.name is None:
        raise connection.CommandError("--wait needs a model NAME")
    cluster = connection.connect(args)
    if args.name is None:
        return _list(cluster, args.all_namespaces)
    if args.all_namespaces:
        raise connection.CommandError("a model NAME cannot be looked up with --all-namespaces; use -n")
    if args.wait:
        cluster.require_model(args.name)
        print(f"waiting for {args.name} to be Ready (timeout {args.timeout:g}s)")
        rollout.follow(cluster, args.name, args.timeout, print)
    model = cluster.require_model(args.name)
    pods = cluster.pods(args.name)
    print(describe(model, pods, read_loads(cluster, model, pods)))
    return 0


def run(args: argparse.Namespace) -> int:
    return connection.run_reporting_failures(lambda: _show(args))
