"""PyTriton 0.7's check tools: a self-check that serves and queries a small model (`add_sub`), and the
helpers PyTriton's test scripts import (`utils`: running a script while reading its output, free ports,
finding the verbose-log warning)."""
