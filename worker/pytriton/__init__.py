"""The PyTriton-compatible API served by kubetriton: code written for PyTriton runs unchanged."""
