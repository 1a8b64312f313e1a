"""kubetriton: serve PyTriton-style Python callables through NVIDIA Triton, locally or on Kubernetes.

The user-facing API is the `pytriton` package. This package holds the runtime behind it: serving bound
callables through a Triton (`serving`, `triton_serving`, `remote_serving`), the Triton process and its
model repository (`server`, `triton_home`), the worker runtime that executes bound callables (`worker`),
the wire format shared with the proxy model (`transport`), the pod contract (`podenv`), the sidecar side
(`kubetriton.sidecar`) and the operator (`kubetriton.operator`). It imports the contract modules of
`pytriton` (docs/layout.md), never its facade.

Keep this module free of imports: the proxy model imports `kubetriton` inside the stock Triton image,
where only numpy and the bootstrapped pyzmq exist.
"""

__version__ = "0.1.0"
