"""Replicas that follow demand, on a real cluster: the timeline of a model scaled on its queue time.

Creates a model whose callable takes 20 ms per batch (one instance per pod), scaled by the operator on
its queue time, and runs closed-loop ModelClient clients against its Service from a Pod of the cluster
(`e2e/demand.py`), following a schedule of client counts. Every 5 s it prints the clients of the
moment, the desired and the ready replicas, the queue time's p50 and mean over those 5 s (from every
Ready pod's Triton counters, through the API server's pod proxy; `e2e/timeline.py` says how), the
clients' median latency, and the autoscaler's last reason; at the end, the requests answered and
failed over the whole run.

Needs $KUBECONFIG (or --kubeconfig), the kubetriton operator running in the cluster (the chart), and
a worker image the nodes have (--image, default $KUBETRITON_E2E_WORKER_IMAGE). The model and the load
Pod go into --namespace, and are deleted at the end.

    python bench/autoscale.py [--target-ms 10] [--max 6] [--schedule 30:1,150:12,420:0]
                              [--scale-down-window 300] [--gpus 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from kubernetes import config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e.cluster import Cluster, kubectl
from e2e.timeline import Sample, demand_pod, slow_model

LOAD_POD = "bench-autoscale-demand"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--image", default=os.environ.get("KUBETRITON_E2E_WORKER_IMAGE"))
    parser.add_argument("--namespace", default="bench-autoscale")
    parser.add_argument("--name", default="slow")
    parser.add_argument("--target-ms", type=float, default=10)
    parser.add_argument("--min", type=int, default=1)
    parser.add_argument("--max", type=int, default=6)
    parser.add_argument("--scale-down-window", type=int, default=300, metavar="SECONDS")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per pod")
    parser.add_argument(
        "--schedule", default="30:1,150:12,420:0", help="seconds:clients phases (default: %(default)s)"
    )
    parser.add_argument("--every", type=float, default=5, metavar="SECONDS", help="sample period")
    args = parser.parse_args()
    if not args.kubeconfig or not args.image:
        parser.error("needs a cluster (--kubeconfig or $KUBECONFIG) and a worker image (--image)")
    os.environ["KUBECONFIG"] = args.kubeconfig
    cluster = Cluster(config.new_client_from_config(args.kubeconfig))
    cluster.ensure_namespace(args.namespace)
    autoscaling = {
        "minReplicas": args.min,
        "maxReplicas": args.max,
        "targetQueueMilliseconds": args.target_ms,
        "scaleDown": {"stabilizationSeconds": args.scale_down_window},
    }
    cluster.apply(slow_model(args.name, args.image, autoscaling, gpus=args.gpus), args.namespace)
    try:
        cluster.wait_until_serving(args.name, args.namespace, args.min, 900)
        total_s = sum(float(phase.split(":")[0]) for phase in args.schedule.split(","))
        print(
            f"{args.name}: target queue time {args.target_ms:g} ms, {args.min}-{args.max} replicas, "
            f"scale-down window {args.scale_down_window} s, demand {args.schedule}"
        )
        with demand_pod(cluster, args.image, args.name, args.namespace, LOAD_POD, args.schedule) as timeline:
            print(Sample.HEADER, flush=True)
            while time.time() - timeline.started < total_s:
                print(timeline.sample().line(), flush=True)
                time.sleep(args.every)
            phases = timeline.phases()
            failures = timeline.failures()
        print(f"phases (clients, s after start): {[(clients, round(at, 1)) for clients, at in phases]}")
        for protocol, counts in failures.items():
            print(
                f"ModelClient {protocol}: {counts['ok']} answered, {counts['failed']} failed "
                f"{counts['failures'][:3] if counts['failed'] else ''}"
            )
    finally:
        kubectl(
            "delete", "pytritonmodel", args.name, "-n", args.namespace, "--ignore-not-found", "--wait=true"
        )


if __name__ == "__main__":
    main()
