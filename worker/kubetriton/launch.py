"""The worker container's entrypoint for a script from a ConfigMap, in any image with Python and NumPy.

`kubetriton bootstrap` copies this file into the workspace beside kubetriton's pure-Python packages and a
pyzmq for each supported Python. The worker container runs it with the image's own `python3`. It refuses
an image that cannot work with a one-line reason (the container's termination message, which the operator
turns into a status condition), then makes kubetriton importable and runs the script as `__main__`. With
several worker processes (KUBETRITON_PROCESS_COUNT), it becomes their supervisor instead
(`kubetriton.supervisor`), and each process runs this file again with its index; `--exec COMMAND...`
supervises a command of the user's rather than a script. `kubetriton run` runs scripts through it on this
machine too (`--local SCRIPT...`, which checks and provides nothing), so that a script ends as it ends in a
pod (`run_script`).

The provided packages go at the end of the import path, after the image's site-packages: what the image
has wins. An image that has kubetriton keeps its own copy, and the user's NumPy, pyzmq and protobuf stay
the ones the model was built with. Only what the image lacks comes from the workspace.

This file runs before anything is known about the interpreter, so it is written for any Python 3 that
still runs in images (3.6 on): no annotations, nothing newer than the oldest interpreter it must refuse.
"""

import importlib.util
import os
import platform
import runpy
import signal
import sys

SUPPORTED = ((3, 10), (3, 13))
UNSUPPORTED_IMAGE_EXIT_CODE = 78
"""kubetriton.podenv.UNSUPPORTED_IMAGE_EXIT_CODE; this file imports nothing of kubetriton."""
CONFIGURATION_ERROR_EXIT_CODE = 65
CONFIGURATION_ERRORS = ("PyTritonValidationError", "PyTritonBadParameterError")
"""kubetriton.podenv.CONFIGURATION_ERROR_EXIT_CODE, and the names of podenv.CONFIGURATION_ERRORS in
`pytriton.exceptions` (which any kubetriton an image may have holds)."""
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_BYTES = 4000
"""kubetriton.podenv.TERMINATION_LOG and TERMINATION_MESSAGE_BYTES"""
EXEC = "--exec"
"""kubetriton.podenv.LAUNCHER_EXEC"""
LOCAL = "--local"
"""kubetriton.podenv.LAUNCHER_LOCAL"""
PROCESS_COUNT, PROCESS_INDEX = "KUBETRITON_PROCESS_COUNT", "KUBETRITON_PROCESS_INDEX"
"""kubetriton.podenv.ENV_PROCESS_COUNT and ENV_PROCESS_INDEX"""


def write_termination_message(message):
    """kubetriton.podenv.write_termination_message, for the refusals written before kubetriton can be
    imported (in a Python too old for kubetriton's own modules, say)."""
    try:
        descriptor = os.open(TERMINATION_LOG, os.O_WRONLY | os.O_TRUNC)
    except OSError:  # not in a container
        return
    with os.fdopen(descriptor, "w") as log:
        log.write(message[:TERMINATION_MESSAGE_BYTES])


def refuse(reason):
    """Exit with `reason` on stderr and as the container's termination message."""
    line = "The worker image cannot run kubetriton: " + reason
    sys.stderr.write(line + "\n")
    write_termination_message(line)
    sys.exit(UNSUPPORTED_IMAGE_EXIT_CODE)


def check_image():
    """Refuse an interpreter or an image that kubetriton cannot run in."""
    version = "{}.{}".format(*sys.version_info[:2])
    low, high = ("{}.{}".format(*bound) for bound in SUPPORTED)
    if sys.implementation.name != "cpython" or not SUPPORTED[0] <= sys.version_info[:2] <= SUPPORTED[1]:
        found = f"{platform.python_implementation()} {platform.python_version()}"
        refuse(f"its python3 is {found}; kubetriton needs CPython {low} to {high}")
    if platform.libc_ver()[0] != "glibc":
        refuse("its C library is not glibc (musl-based images such as Alpine are not supported)")
    if importlib.util.find_spec("numpy") is None:
        refuse(f"its Python {version} has no NumPy; install numpy in the image")


def provide_runtime(runtime):
    """Append the workspace's packages to the import path, after everything the image has, unless the
    image has kubetriton (and with it everything kubetriton needs)."""
    if importlib.util.find_spec("kubetriton") is not None:
        return
    major, minor = sys.version_info[:2]
    sys.path.extend([os.path.join(runtime, "packages"), os.path.join(runtime, f"cp{major}{minor}")])
    if importlib.util.find_spec("zmq") is None:
        refuse(f"the init step provided no pyzmq for Python {major}.{minor} and the image has none")


def end_on_sigterm(signum, frame):
    """SIGTERM ends the script as it ends Python outside a container, through SystemExit (so that `with`
    blocks and `finally` clauses run), until `Triton().serve()` takes the signal over to drain. As a
    container's first process Python would ignore it (the kernel gives PID 1 no default action), and a
    worker stopped while its script loads, by its startup probe or with its pod, would wait out the
    pod's whole grace period."""
    sys.exit(128 + signum)


def run_script(command):
    """Run `command` (SCRIPT [ARGUMENT...]) as `python3 SCRIPT [ARGUMENT...]` would, but for SIGTERM
    (`end_on_sigterm`) and two endings. An error in the user's settings, which no restart mends
    (CONFIGURATION_ERRORS), ends it with the error's one line, on stderr and as the termination message,
    and CONFIGURATION_ERROR_EXIT_CODE, where a traceback and status 1 would have the worker restarted in
    vain. Ctrl-C (on this machine, under `kubetriton run`) ends it with one line and status 0, as Ctrl-C
    ends `serve()`: it came while the models were loading, and the script's `with` blocks and `finally`
    clauses have stopped what it started."""
    script = command[0]
    sys.argv = list(command)
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python3 SCRIPT` would have it
    signal.signal(signal.SIGTERM, end_on_sigterm)
    import pytriton.exceptions  # in a pod, importable once provide_runtime has run

    configuration_errors = tuple(getattr(pytriton.exceptions, name) for name in CONFIGURATION_ERRORS)
    try:
        runpy.run_path(os.path.abspath(script), run_name="__main__")  # `__file__` as `python3 SCRIPT` has
    except configuration_errors as error:
        line = f"{type(error).__name__}: {error}"
        sys.stderr.write(line + "\n")
        write_termination_message(line)
        sys.exit(CONFIGURATION_ERROR_EXIT_CODE)
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted (Ctrl-C): stopped\n")


def main():
    if len(sys.argv) < 2 or sys.argv[1:] in ([EXEC], [LOCAL]):
        sys.exit(f"usage: python3 launch.py [{LOCAL}] SCRIPT [ARGUMENT...] | {EXEC} COMMAND [ARGUMENT...]")
    if sys.argv[1] == LOCAL:
        run_script(sys.argv[2:])
        return
    check_image()
    provide_runtime(os.path.dirname(os.path.abspath(__file__)))
    command = sys.argv[1:]
    count = os.environ.get(PROCESS_COUNT, "1")
    if count != "1" and PROCESS_INDEX not in os.environ:
        from kubetriton.supervisor import supervise_pod  # importable only once provide_runtime has run

        each = command[1:] if command[0] == EXEC else [sys.executable, os.path.abspath(__file__), *command]
        sys.exit(supervise_pod(each, int(count)))
    if command[0] == EXEC:
        os.execvp(command[1], command[1:])
    run_script(command)


if __name__ == "__main__":
    main()
