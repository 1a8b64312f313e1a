"""The proxy model: a Triton Python-backend model that forwards each batch to the worker process.

Triton runs one proxy instance per bound callable, each in its own stub process. An instance connects a
ZeroMQ DEALER to its worker instance's socket (how the worker knows it is attached; ZeroMQ reconnects it
to a restarted worker while the proxy is idle), creates its two shared-memory arenas, and for every
`execute` sends the batch as one message over its `Hop` and turns the reply into Triton responses. The
hop is connected on the first request and again after its worker went away. For a decoupled model the
worker replies once per streamed item: the proxy forwards each, releases its response blocks at once
(the stream must not fill the arena), and tells the worker to close the generator when every client of
the stream has cancelled.

A worker that is not attached fails a request at once, unless the model's instances are spread over
several worker processes: then the proxy waits a while for its process to come back (Triton hands this
instance's next batch to no other instance, while the other processes serve the rest). A worker that goes
away while a request is in flight fails it as soon as the kernel closes the hop. The arenas are reset
then, because the blocks the worker held are gone with it. This module runs inside the stock Triton
image: numpy, pyzmq and `kubetriton.transport` only, valid Python 3.10.

A stub that cannot exchange tensors with the numpy it runs with refuses to load the model: READY with
wrong answers is the one outcome a client cannot notice.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
import zmq
from kubetriton.transport import (
    CANCEL,
    CONTROL,
    DECOUPLED,
    ERROR,
    FINAL,
    HELLO,
    INLINE_LIMIT,
    PARAM_ADDRESS,
    PARAM_ARENA_BYTES,
    PARAM_ARENA_DIR,
    PARAM_BUSY_POLL_US,
    PARAM_HOP_PATH,
    PARAM_INLINE_LIMIT,
    PARAM_WORKER_WAIT_S,
    PARTIAL,
    REQUEST,
    Arena,
    ArenaFullError,
    BusyPoll,
    Descriptor,
    Hop,
    Message,
    decode_message,
    decode_rows,
    decode_tensor,
    encode_column,
    encode_message,
    encode_tensor,
    hello_text,
    keep_freed_memory,
)

CANCEL_CHECK_S = 0.1
"""How often a running stream asks Triton whether its clients cancelled it."""
WORKER_WAIT_POLL_S = 0.02
"""How often a proxy that waits for its restarting worker tries the hop again."""


class WorkerUnavailableError(RuntimeError):
    """The worker is not attached, or went away while the request was in flight."""


def check_stub_reads_numpy() -> None:
    """Raise when the stub this runs in cannot exchange tensors with the numpy it imported.

    The stub passes arrays to and from Triton through pybind11, compiled into it. Before pybind11 2.12
    (Triton 2.51 and older) it reads array descriptors in NumPy 1.x's layout: under NumPy 2 every output
    leaves with a size of 0 and every input repeats its first element, while the model reports READY.
    pybind11 2.12 and later import `numpy._core` under NumPy 2, so a stub whose program does not name that
    module was built for NumPy 1.x only."""
    if int(np.__version__.split(".")[0]) < 2:
        return
    with open("/proc/self/exe", "rb") as program:
        if b"numpy._core" in program.read():
            return
    raise RuntimeError(
        f"This Triton's Python-backend stub was built for NumPy 1.x and cannot exchange tensors with "
        f"NumPy {np.__version__} (imported from {os.path.dirname(np.__file__)}): its answers would be "
        "wrong. Run the stub on a Python environment with numpy<2: `kubetriton install-triton` "
        "provisions one for local mode; the stock Triton images have one."
    )


def _columns(requests: list[Any]) -> dict[str, list[tuple[int, Any]]]:
    """Each input name of a batch, with (row, tensor) for every request that has it, in order."""
    columns: dict[str, list[tuple[int, Any]]] = {}
    for row, request in enumerate(requests):
        for tensor in request.inputs():
            columns.setdefault(tensor.name(), []).append((row, tensor))
    return columns


class TritonPythonModel:
    """The Python-backend entry points: initialize, execute, finalize."""

    def initialize(self, args: dict[str, str]) -> None:
        check_stub_reads_numpy()
        keep_freed_memory()
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        instance = args["model_instance_name"].rsplit("_", 1)[-1]
        self._model = args["model_name"]
        self._decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        self._inline_limit = int(parameters.get(PARAM_INLINE_LIMIT, INLINE_LIMIT))
        arena_bytes = int(parameters[PARAM_ARENA_BYTES])
        prefix = os.path.join(parameters[PARAM_ARENA_DIR], f"{self._model}.{instance}.{os.getpid()}")
        os.makedirs(parameters[PARAM_ARENA_DIR], mode=0o700, exist_ok=True)
        self._requests_arena = Arena(prefix + ".req", arena_bytes, create=True)
        self._responses_arena = Arena(prefix + ".resp", arena_bytes, create=True, writable=False)
        self._arena_paths = [self._requests_arena.path, self._responses_arena.path]
        self._released_responses: list[int] = []
        self._held_responses: list[int] = []
        """Response blocks read by responses that `execute` has yet to return (a batch sent in parts)."""
        self._next_id = 0
        self._context = zmq.Context()
        self._presence = self._context.socket(zmq.DEALER)
        self._presence.setsockopt(zmq.LINGER, 0)
        self._presence.connect(parameters[PARAM_ADDRESS].format(instance=instance))
        self._hop_path = parameters[PARAM_HOP_PATH].format(instance=instance)
        self._hop: Hop | None = None
        self._busy_poll = BusyPoll(int(parameters.get(PARAM_BUSY_POLL_US, 0)))
        self._worker_wait_s = float(parameters.get(PARAM_WORKER_WAIT_S, 0))

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self._decoupled:
            self._execute_decoupled(requests)
            return None
        self._busy_poll.batch(len(requests))
        responses = self._execute(requests)
        if self._held_responses:
            self._released_responses.extend(self._held_responses)
            self._held_responses.clear()
        return responses

    def _execute(self, requests: list[Any]) -> list[Any]:
        """The responses to `requests`, sent to the worker as one batch; where the batch does not fit the
        request arena, as two halves in turn, down to single requests, each of which may fit (Triton's
        batches grow with the load, so a batch of large requests may not fit where each one does)."""
        try:
            message_id = self._send(requests)
            reply, data = self._receive(message_id)
        except ArenaFullError as error:
            if len(requests) == 1:
                return [pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error)))]
            half = len(requests) // 2
            first = self._execute(requests[:half])
            # Its responses read their blocks until Triton copies them, once `execute` returns.
            self._held_responses.extend(self._released_responses)
            self._released_responses = []
            return first + self._execute(requests[half:])
        except Exception as error:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))) for _ in requests]
        if reply.kind == ERROR:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(reply.text)) for _ in requests]
        if reply.kind == PARTIAL:
            return [self._response_or_error(entry, data) for entry in reply.entries]
        return self._responses(reply.entries, data)

    def _execute_decoupled(self, requests: list[Any]) -> None:
        senders = [request.get_response_sender() for request in requests]
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            message_id = self._send(requests)
            next_check = time.monotonic() + CANCEL_CHECK_S

            def check_cancelled() -> None:
                """Every CANCEL_CHECK_S, between items and while waiting for one: a stream whose clients all
                cancelled is told to close its generator before it is resumed for another item."""
                nonlocal next_check
                if next_check and time.monotonic() >= next_check:
                    next_check = time.monotonic() + CANCEL_CHECK_S
                    if all(request.is_cancelled() for request in requests):
                        self._cancel(message_id)
                        next_check = 0.0

            while True:
                reply, data = self._receive(message_id, check_cancelled)
                if reply.kind == ERROR:
                    error = pb_utils.TritonError(reply.text)
                    for sender in senders:
                        sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                    return
                if reply.kind == FINAL:
                    for sender in senders:
                        sender.send(flags=final)
                    return
                respond = self._response_or_error if reply.kind == PARTIAL else self._response
                for sender, outputs in zip(senders, reply.entries, strict=True):
                    sender.send(respond(outputs, data))
                self._release_responses()
                check_cancelled()
        except Exception as error:
            for sender in senders:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))), flags=final)

    def _send(self, requests: list[Any]) -> int:
        """Encode the batch and send it; large inputs are copied into the request arena.

        A hop whose worker went away fails the send, so no system call is spent on checking it first. A
        restarted worker listens anew: the batch is then encoded again, into an arena that the departure
        reset, and sent over a new hop."""
        for _attempt in range(2):
            try:
                return self._send_over(self._attached_hop(), requests)
            except OSError:
                self._forget_worker()  # its blocks, this request's among them, are free again
        raise self._not_attached()

    def _send_over(self, hop: Hop, requests: list[Any]) -> int:
        """Encode the batch and send it over `hop`; OSError when its worker went away."""
        frames: list[Any] = []
        allocated: list[int] = []
        arena, inline_limit = self._requests_arena, self._inline_limit
        inputs: list[list[Any]] = [[] for _ in requests]
        try:
            if len(requests) == 1:
                inputs[0] = [
                    encode_tensor(tensor.name(), tensor.as_numpy(), frames, arena, allocated, inline_limit)
                    for tensor in requests[0].inputs()
                ]
            else:
                # Input by input, so that each input of the whole batch lies in one block of the arena,
                # which the worker hands to `@batch` as one array without copying (`decode_inputs`).
                for name, rows in _columns(requests).items():
                    arrays = [tensor.as_numpy() for _, tensor in rows]
                    descriptors = encode_column(name, arrays, frames, arena, allocated, inline_limit)
                    for (row, _), descriptor in zip(rows, descriptors, strict=True):
                        inputs[row].append(descriptor)
        except ArenaFullError as error:
            self._free_requests(allocated)
            if hop.peer_closed():  # the arena may be full of blocks that the departed worker held
                raise ConnectionResetError("the worker went away") from None
            raise ArenaFullError(f"Request to model '{self._model}' cannot be sent: {error}") from None
        entries = [
            (descriptors, "" if parameters == "{}" else parameters, sorted(outputs) if outputs else None)
            for descriptors, parameters, outputs in zip(
                inputs,
                [request.parameters() for request in requests],
                [request.requested_output_names() for request in requests],
                strict=True,
            )
        ]
        self._next_id += 1
        released, self._released_responses = self._released_responses, []
        flags = DECOUPLED if self._decoupled else 0
        hop.send([encode_message(REQUEST, self._next_id, entries, released, flags=flags), *frames])
        return self._next_id

    def _receive(
        self, message_id: int, waiting: Callable[[], None] | None = None
    ) -> tuple[Message, list[memoryview]]:
        """Wait for the worker's reply to `message_id` (polling first while single requests come quickly,
        see `BusyPoll`; never for a stream's, which calls `waiting` every CANCEL_CHECK_S while it waits);
        fail as soon as the worker's end of the hop closes."""
        assert self._hop is not None
        while True:
            started = time.perf_counter_ns()
            self._busy_poll.poll(self._hop.poller)
            if waiting is not None:
                while not self._hop.poller.poll(CANCEL_CHECK_S * 1000):
                    waiting()
            frames = self._hop.receive()
            self._busy_poll.waited(time.perf_counter_ns() - started)
            if frames is None:
                self._forget_worker()
                raise WorkerUnavailableError(
                    f"The worker of model '{self._model}' went away while the request was in flight"
                )
            reply = decode_message(frames[0])
            for offset in reply.released:
                self._requests_arena.free(offset)
            if reply.id == message_id:
                return reply, frames[1:]

    def _attached_hop(self) -> Hop:
        """The hop to the worker, connected now if there is none (the first request, or the last hop's
        worker went away)."""
        if self._hop is None:
            hop = self._connect()
            try:
                hop.send([encode_message(HELLO, text=hello_text(*self._arena_paths))])
            except OSError:
                hop.close()
                raise self._not_attached() from None
            self._hop = hop
        return self._hop

    def _connect(self) -> Hop:
        """A new hop to the worker; within `worker_wait_s`, tries again until a restarting worker listens."""
        deadline = time.monotonic() + self._worker_wait_s
        while True:
            try:
                return Hop.connect(self._hop_path)
            except OSError:
                if time.monotonic() >= deadline:
                    raise self._not_attached() from None
                time.sleep(WORKER_WAIT_POLL_S)

    def _not_attached(self) -> WorkerUnavailableError:
        waited = f" within {self._worker_wait_s:g} s" if self._worker_wait_s else ""
        return WorkerUnavailableError(
            f"No worker is attached to model '{self._model}'{waited}; is the worker process running?"
        )

    def _forget_worker(self) -> None:
        """A worker that went away released every block it held, and took its response arena state along."""
        if self._hop is not None:
            self._hop.close()
            self._hop = None
        self._requests_arena.reset()
        self._released_responses.clear()
        self._held_responses.clear()

    def _free_requests(self, offsets: list[int]) -> None:
        for offset in offsets:
            self._requests_arena.free(offset)

    def _cancel(self, message_id: int) -> None:
        """Every client of the stream cancelled: ask the worker to close the generator and end it."""
        self._send_control(CANCEL, message_id)

    def _release_responses(self) -> None:
        """Tell the worker at once which response blocks are copied out; streams cannot wait for a request."""
        if self._released_responses:
            self._send_control(0, 0)

    def _send_control(self, flags: int, message_id: int) -> None:
        """A message of a running stream, with the response blocks copied out since the last message. A
        worker that went away fails the stream's next receive."""
        released, self._released_responses = self._released_responses, []
        if self._hop is not None:
            with contextlib.suppress(OSError):
                self._hop.send([encode_message(CONTROL, message_id, released=released, flags=flags)])

    def _responses(self, entries: list[list[Descriptor]], data: list[memoryview]) -> list[Any]:
        """The responses of a REPLY. Where each output of the whole batch lies in one frame or block (the
        worker's `encode_rows`), it is decoded once and each request's rows are a slice of it."""
        if len(entries) > 1 and entries[0] and len(set(map(len, entries))) == 1:
            columns = list(zip(*entries, strict=True))
            decoded = [decode_rows(column, data, self._responses_arena) for column in columns]
            if None not in decoded:
                names = [column[0][0] for column in columns]
                responses = [
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor(name, rows) for name, rows in zip(names, row, strict=True)
                        ]
                    )
                    for row in zip(*decoded, strict=True)
                ]
                released = self._released_responses
                released.extend({column[0][3] for column in columns if column[0][3] >= 0})
                return responses
        return [self._response(outputs, data) for outputs in entries]

    def _response(self, outputs: list[Descriptor], data: list[memoryview]) -> Any:
        tensors = []
        released = self._released_responses
        for descriptor in outputs:
            block = descriptor[3]
            tensors.append(
                pb_utils.Tensor(descriptor[0], decode_tensor(descriptor, data, self._responses_arena))
            )
            if block >= 0:
                released.append(block)
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _response_or_error(self, entry: list[Descriptor] | str, data: list[memoryview]) -> Any:
        """A request's entry in a PARTIAL reply: its outputs, or the message of its failure."""
        if isinstance(entry, str):
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(entry))
        return self._response(entry, data)

    def finalize(self) -> None:
        if self._hop is not None:
            self._hop.close()
        self._presence.close(linger=0)
        self._context.term()
        self._requests_arena.close(unlink=True)
        self._responses_arena.close(unlink=True)
