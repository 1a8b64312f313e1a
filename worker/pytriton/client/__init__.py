"""PyTriton's client API: query models served by any Triton server with numpy arrays.

The names below are imported on first use, so that the serving side can import the light modules of this
package (`exceptions`, the URL parser) where tritonclient is not installed, as in a worker pod whose image
has nothing of kubetriton. Where it is not, using one of them says to install kubetriton's client extra.
"""

import importlib
from typing import Any

from kubetriton.extras import CLIENT, needed

_EXPORTS = {
    "AsyncioDecoupledModelClient": "asyncio_client",
    "AsyncioModelClient": "asyncio_client",
    "DecoupledModelClient": "client",
    "FuturesModelClient": "client",
    "ModelClient": "client",
    "PyTritonClientClosedError": "exceptions",
    "PyTritonClientError": "exceptions",
    "PyTritonClientInferenceServerError": "exceptions",
    "PyTritonClientInputError": "exceptions",
    "PyTritonClientInvalidUrlError": "exceptions",
    "PyTritonClientModelDoesntSupportBatchingError": "exceptions",
    "PyTritonClientModelUnavailableError": "exceptions",
    "PyTritonClientQueueFullError": "exceptions",
    "PyTritonClientTimeoutError": "exceptions",
    "PyTritonClientTransactionPolicyError": "exceptions",
    "PyTritonClientValueError": "exceptions",
    "TensorSpec": "triton_model_config",
    "TritonModelConfig": "triton_model_config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        with needed(CLIENT, f"pytriton.client.{name}"):
            module = importlib.import_module(f"pytriton.client.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'pytriton.client' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
