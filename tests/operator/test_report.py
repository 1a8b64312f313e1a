"""What `kubetriton status NAME` makes of each pod's Triton metrics: its requests, their share, their wait."""

from __future__ import annotations

from kubetriton.operator import report

PAGE = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="Sleep",version="1"}} {sleep}
nv_inference_request_success{{model="Other",version="1"}} 7
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="Sleep",version="1"}} {waited}
nv_inference_queue_duration_us{{model="Other",version="1"}} 9000
"""


def _pod(name: str) -> dict[str, object]:
    return {"metadata": {"name": name}}


def test_each_pods_share_of_the_requests_and_its_average_wait() -> None:
    loads = {
        "a": report.pod_load(PAGE.format(sleep=300, waited=600_000), ["Sleep"]),
        "b": report.pod_load(PAGE.format(sleep=100, waited=0), ["Sleep"]),
        "c": report.pod_load(PAGE.format(sleep=0, waited=0), ["Sleep"]),
    }
    assert loads["a"] == report.PodLoad(requests=300, queue_us=600_000), "only the declared models count"
    columns = report.load_columns([_pod("a"), _pod("b"), _pod("c"), _pod("unread")], loads)
    assert columns == {
        "a": ["300", "75%", "2.0ms"],
        "b": ["100", "25%", "0.0ms"],
        "c": ["0", "0%", "-"],
        "unread": ["-", "-", "-"],
    }
