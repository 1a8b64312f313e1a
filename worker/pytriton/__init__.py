"""The PyTriton-compatible API served by kubetriton: code written for PyTriton runs unchanged.

`__version__` is the PyTriton release whose API this package implements; kubetriton's own version is
`kubetriton.__version__`. As in PyTriton, `import pytriton` makes `pytriton.client`, `pytriton.model_config`
and `pytriton.triton` reachable; they are imported on first use, because kubetriton's runtime imports the
contract modules of this package (`exceptions`, `model_config`, `proxy`, `settings`: docs/layout.md), and
importing them must not load the API built on that runtime.
"""

import importlib
from types import ModuleType

__version__ = "0.7.0"

_SUBMODULES = ("client", "model_config", "triton")


def __getattr__(name: str) -> ModuleType:
    if name in _SUBMODULES:
        return importlib.import_module(f"pytriton.{name}")
    raise AttributeError(f"module 'pytriton' has no attribute {name!r}")
