"""Where the chart is, and the generated CRD it copies (kubetriton.operator.manifests writes both)."""

from __future__ import annotations

from pathlib import Path

from kubetriton.operator import manifests

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubetriton"
GENERATED_CRD = REPO / manifests.CRD_PATH
