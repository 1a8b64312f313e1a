"""`kubetriton render model.yaml`: print the objects the operator would create, without a cluster.

It validates the model.yaml with the same pydantic models the operator uses and prints the same
builders' output, so what you read is what the operator applies (minus owner references, which
need the object's uid from the API server).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from kubetriton.operator import children
from kubetriton.operator.spec import KIND, PyTritonModel, describe_validation_error
from pydantic import ValidationError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a PyTritonModel manifest, or - for standard input")
    parser.add_argument(
        "-n", "--namespace", default=None, help="namespace (default: the manifest's, else default)"
    )
    parser.add_argument(
        "--service-monitor",
        action="store_true",
        help="include the ServiceMonitor, as on a cluster with the Prometheus Operator",
    )


def load_model(text: str, namespace: str | None = None) -> PyTritonModel:
    """Parse and validate a model.yaml (one document, or a stream with one PyTritonModel among others, as
    `kubetriton deploy --dry-run=client -o yaml` prints it); raises ValueError with a readable message."""
    documents = [document for document in yaml.safe_load_all(text) if document is not None]
    models = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == KIND]
    if len(documents) == 1:
        document: Any = documents[0]
    elif len(models) == 1:
        document = models[0]
    else:
        raise ValueError(f"the manifest holds {len(models)} PyTritonModels in {len(documents)} documents")
    if not isinstance(document, dict):
        raise ValueError("the manifest is not a YAML mapping")
    try:
        model = PyTritonModel.read(document)
    except ValidationError as error:
        raise ValueError(describe_validation_error(error)) from error
    model.metadata.namespace = namespace or model.metadata.namespace or "default"
    return model


def render(model: PyTritonModel, *, service_monitor: bool = False) -> str:
    """The children as a multi-document YAML stream."""
    return yaml.safe_dump_all(children.desired(model, service_monitor=service_monitor), sort_keys=False)


def run(args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.path == "-" else Path(args.path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        print(
            f"kubetriton render: cannot read {args.path}: {getattr(error, 'strerror', None) or error}",
            file=sys.stderr,
        )
        return 1
    try:
        model = load_model(text, args.namespace)
    except (ValueError, yaml.YAMLError) as error:
        print(f"kubetriton render: {args.path}: invalid PyTritonModel:\n{error}", file=sys.stderr)
        return 1
    sys.stdout.write(render(model, service_monitor=args.service_monitor))
    return 0
