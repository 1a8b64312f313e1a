"""Request: the inputs and parameters of one inference request, as the callable sees them."""

from __future__ import annotations

import contextlib
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Request:
    """One request: `data` maps input names to read-only arrays; `parameters` holds request parameters
    and the HTTP/gRPC headers Triton was told to forward. Mapping access reads `data`."""

    data: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)
    requested_output_names: list[str] | None = None

    def __getitem__(self, input_name: str) -> np.ndarray:
        return self.data[input_name]

    def __setitem__(self, input_name: str, input_data: np.ndarray) -> None:
        self.data[input_name] = input_data

    def __delitem__(self, input_name: str) -> None:
        del self.data[input_name]

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __contains__(self, input_name: object) -> bool:
        return input_name in self.data

    def items(self) -> ItemsView[str, np.ndarray]:
        return self.data.items()

    def keys(self) -> KeysView[str]:
        return self.data.keys()

    def values(self) -> ValuesView[np.ndarray]:
        return self.data.values()

    @contextlib.contextmanager
    def traced_span(self, span_name: str, **kwargs: Any) -> Iterator[None]:
        """PyTriton's OpenTelemetry span around a block of the callable. The worker records no spans, so
        the block runs as it runs under PyTriton without tracing; Triton's own traces are configured by
        `TritonConfig.trace_config` and `bind(trace_config=...)`."""
        yield


Requests = list[Request]
