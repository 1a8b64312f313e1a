"""The chart's copies of the operator's generated files, and the command that refreshes them.

Helm reads only files inside a chart, so the chart carries copies of the generated CRD
(crds/pytritonmodels.kubetriton.dev.yaml) and of the operator's RBAC rules
(kubetriton.operator.rbac.RULES). `python tests/chart/chart_files.py` rewrites both after
`python -m kubetriton.operator.manifests`; test_chart_files fails while they differ.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from kubetriton.operator import rbac

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubetriton"
GENERATED_CRD = REPO / "crds" / "pytritonmodels.kubetriton.dev.yaml"
CHART_CRD = CHART / "files" / GENERATED_CRD.name
CHART_RULES = CHART / "files" / "operator-rules.yaml"
RULES_HEADER = (
    "# kubetriton.operator.rbac.RULES, copied by `python tests/chart/chart_files.py`; do not edit.\n"
)


def expected() -> dict[Path, str]:
    """Each chart copy's path and the text it must hold."""
    return {
        CHART_CRD: GENERATED_CRD.read_text(),
        CHART_RULES: RULES_HEADER + yaml.safe_dump(rbac.RULES, sort_keys=False),
    }


def main() -> None:
    for path, text in expected().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
