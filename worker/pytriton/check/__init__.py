"""PyTriton 0.7's check tools: a self-check that serves and queries a small model (`add_sub`), and the
helpers PyTriton's test scripts import (`utils`: running a script while reading its output and walking its
processes, free ports, process monitoring, the container's version).
"""
