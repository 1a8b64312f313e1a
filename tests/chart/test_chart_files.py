"""The chart's copies of the generated CRD and RBAC rules match their sources."""

from __future__ import annotations

import chart_files


def test_chart_copies_match_the_generated_files() -> None:
    stale = [
        str(path.relative_to(chart_files.REPO))
        for path, text in chart_files.expected().items()
        if not path.exists() or path.read_bytes() != text.encode()
    ]
    assert not stale, f"stale chart copies {stale}: run `python tests/chart/chart_files.py`"
