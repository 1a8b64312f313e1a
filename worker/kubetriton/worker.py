"""The worker runtime: executes bound callables for the proxy model instances inside Triton.

Each (model, instance) pair gets one thread that listens on its own hop socket (and holds the ZeroMQ
ROUTER through which proxy instances attach), so a request goes from the socket to the callable and back
without a hand-off between threads. Callables that release the GIL therefore run in parallel across
instances. Coroutine callables run on one shared event loop. Before it serves, each thread answers the
model's warm-up samples (`warmup`), and the model is loaded into Triton only once every thread did.

The runtime also owns what the callable must not see: it decodes inputs into read-only arrays, checks
that the responses match the declared outputs and maps exceptions to error messages for the client
(`responses`), and streams generator results for decoupled models. While a stream runs, the instance's
thread also takes in the proxy's release and cancel messages, so a long stream neither exhausts the
response arena nor outlives its cancelled clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import logging
import os
import select
import socket
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import zmq
import zmq.utils.monitor
from pytriton.exceptions import (
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonUnrecoverableError,
    PyTritonValidationError,
)
from pytriton.proxy.context import TritonContext, use_triton_context
from pytriton.proxy.types import Request

from kubetriton import podenv
from kubetriton.model_repository import ModelSpec
from kubetriton.private_files import PRIVATE_FILE
from kubetriton.responses import ResponseChecker, ResponseError, SomeRequestsFailed, format_error
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
    REPLY,
    REQUEST,
    Arena,
    ArenaFullError,
    BusyPoll,
    Hop,
    Message,
    RequestBatch,
    SplitOutputs,
    decode_inputs,
    decode_message,
    encode_message,
    encode_rows,
    encode_tensor,
    is_bytes_dtype,
    read_hello,
)

LOGGER = logging.getLogger(__name__)

POLL_INTERVAL_MS = 100
STREAM_BACKPRESSURE_S = 60.0
"""How long a stream waits for the proxy to copy out earlier responses when the response arena is full."""
MAX_SOCKET_PATH = 107
"""A Unix socket's path has 108 bytes, with the terminating NUL."""


class Reply(NamedTuple):
    """A message to the proxy, before its id and released blocks are added."""

    kind: int
    entries: list[bytes]
    frames: list[Any]
    text: str = ""


FINAL_REPLY = Reply(FINAL, [], [])


WORKER_RESTART_WAIT_S = 30.0
"""How long a proxy instance of a model served by several worker processes holds a batch while its own
process restarts: about what a script that loads a model onto a GPU takes to start again. The other
processes serve everything else meanwhile."""

ENV_BUSY_POLL_US = "KUBETRITON_BUSY_POLL_US"
"""How many microseconds the worker's instances and their proxies poll for a message before they sleep
(`BusyPoll`); 0 never polls."""
DEFAULT_BUSY_POLL_US = 2000
"""The polling window where KUBETRITON_BUSY_POLL_US is not set: it spans the gaps between one client's
requests of 32 strings on a 2-vCPU machine (0.9-1.2 ms, which a 1 ms window missed)."""


def busy_poll_us() -> int:
    """The polling window: KUBETRITON_BUSY_POLL_US where set, else `DEFAULT_BUSY_POLL_US`."""
    configured = os.environ.get(ENV_BUSY_POLL_US)
    if configured is None:
        return DEFAULT_BUSY_POLL_US
    if not configured.strip().isdigit():
        raise PyTritonValidationError(
            f"{ENV_BUSY_POLL_US}={configured!r} is not a whole number of microseconds (0 never polls)"
        )
    return int(configured)


def arena_bytes() -> int:
    """The size of each arena: KUBETRITON_ARENA_BYTES where set, else `podenv.DEFAULT_ARENA_BYTES`."""
    configured = os.environ.get(podenv.ENV_ARENA_BYTES)
    if configured is None:
        return podenv.DEFAULT_ARENA_BYTES
    if not configured.strip().isdigit() or int(configured) == 0:
        raise PyTritonValidationError(
            f"{podenv.ENV_ARENA_BYTES}={configured!r} is not a positive whole number of bytes"
            f" (the default, {podenv.DEFAULT_ARENA_BYTES}, is 256 MiB)"
        )
    return int(configured)


SOCKET_STEM_LENGTH = 40
"""The most of a model's name that its sockets' file names hold: a longer name is cut and a digest of the
whole added, so that a socket's path fits MAX_SOCKET_PATH whatever the name (up to 128 characters)."""


def _socket_stem(model: str) -> str:
    if len(model) <= SOCKET_STEM_LENGTH:
        return model
    digest = hashlib.sha256(model.encode()).hexdigest()[:12]
    return f"{model[: SOCKET_STEM_LENGTH - len(digest) - 1]}~{digest}"


@dataclass(frozen=True)
class TransportSettings:
    """Where the proxy instances of a model reach the worker, and how tensors travel."""

    sockets_dir: Path
    arena_dir: Path
    arena_bytes: int
    inline_limit: int = INLINE_LIMIT
    busy_poll_us: int = field(default_factory=busy_poll_us)
    worker_wait_s: float = 0.0
    """How long a proxy instance waits for its worker to listen again before it fails a request: 0 fails
    at once; the instances of several worker processes wait for a restarting one (`WORKER_RESTART_WAIT_S`)."""

    def address(self, model: str, instance: int | str) -> str:
        return f"ipc://{self.presence_path(model, instance)}"

    def presence_path(self, model: str, instance: int | str) -> str:
        """The file of the ZeroMQ socket through which a proxy instance attaches (`address`)."""
        return f"{self.sockets_dir}/{_socket_stem(model)}.{instance}"

    def hop_path(self, model: str, instance: int | str) -> str:
        return f"{self.sockets_dir}/{_socket_stem(model)}.{instance}.hop"

    def model_parameters(self, model: str, instances: int) -> dict[str, str]:
        """The config.pbtxt parameters a proxy instance reads to find its worker; ValueError when the
        sockets of the model's last instance would have too long a path."""
        longest = self.hop_path(model, instances - 1)
        if len(longest) > MAX_SOCKET_PATH:
            raise ValueError(
                f"Socket path {longest} is too long for a Unix socket; use a shorter workspace path"
            )
        parameters = {
            PARAM_ADDRESS: self.address(model, "{instance}"),
            PARAM_HOP_PATH: self.hop_path(model, "{instance}"),
            PARAM_ARENA_DIR: str(self.arena_dir),
            PARAM_ARENA_BYTES: str(self.arena_bytes),
            PARAM_INLINE_LIMIT: str(self.inline_limit),
            PARAM_BUSY_POLL_US: str(self.busy_poll_us),
        }
        if self.worker_wait_s:
            parameters[PARAM_WORKER_WAIT_S] = f"{self.worker_wait_s:g}"
        return parameters


class _EventLoopThread:
    """One event loop, in its own thread, for every coroutine callable of the process."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, awaitable: Any) -> Any:
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, name="kubetriton-async", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), cls._loop).result()

    @classmethod
    def next_item(cls, agen: Any) -> Any:
        return cls.run(agen.__anext__())


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable


@dataclass(eq=False)
class Peer:
    """One proxy instance attached through its hop, and what the worker keeps for it alone: a proxy that
    comes back (after a Triton restart) starts afresh, its request ids and arena blocks included."""

    hop: Hop
    arenas: tuple[Arena, Arena] | None = None
    """Its request arena (read-only) and response arena, mapped when its first message names them."""
    held: set[int] = field(default_factory=set)
    """Blocks of its request arena that decoded inputs still pin."""
    released: list[int] = field(default_factory=list)
    """Blocks of its request arena that callables let go of, told with the next reply."""
    cancelled: int | None = None
    """The id of its stream whose clients all cancelled."""
    refused: str = ""
    """Why its proxy's messages cannot be read (another wire version, or arenas that are not files the proxy
    made in the arena directory): each request gets it as its error."""

    def release(self, offset: int) -> None:
        """An input no longer pins its request block: tell the proxy with the next reply."""
        self.held.discard(offset)
        self.released.append(offset)

    @property
    def blocks_in_use(self) -> int:
        """Its arena blocks that are not free: request blocks held or not yet told free, and response
        blocks the proxy has not released."""
        responses = self.arenas[1].used_blocks if self.arenas else 0
        return len(self.held) + len(self.released) + responses

    def close(self) -> None:
        for arena in self.arenas or ():
            arena.close()
        self.hop.close()


_PEER_CREDENTIALS = struct.Struct("iII")
"""Linux's `struct ucred`, which `SO_PEERCRED` fills in: the peer's process id, user id and group id."""


def peer_user(connection: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket, as the kernel recorded it when the
    process connected."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CREDENTIALS.size)
    return _PEER_CREDENTIALS.unpack(credentials)[1]


def _remove_a_stale_socket(path: str, model: str) -> None:
    """Remove the socket file a killed worker left; PyTritonInvalidOperationError where a live worker
    listens on it: another process (`RemoteTriton`) serves the model through this Triton already, and
    taking its sockets over would leave it serving nothing, and its stop would unload the model."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
        try:
            probe.connect(path)
        except FileNotFoundError:
            return
        except ConnectionRefusedError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
    raise PyTritonInvalidOperationError(
        f"A model named '{model}' is already bound: another process serves it through this Triton, or "
        f"through another that uses the same workspace ({os.path.dirname(path)}); give each Triton() a "
        "workspace of its own"
    )


class InstanceServer(threading.Thread):
    """Serves one proxy instance: receives its requests, runs the callable, sends the responses."""

    def __init__(
        self,
        spec: ModelSpec,
        instance: int,
        infer_func: Callable[..., Any],
        transport: TransportSettings,
        *,
        debug: bool,
        on_unrecoverable: Callable[[BaseException], None],
    ) -> None:
        super().__init__(name=f"kubetriton-{spec.name}-{instance}", daemon=True)
        self.spec = spec
        self.instance = instance
        self._infer_func = infer_func
        self._transport = transport
        self._debug = debug
        self._on_unrecoverable = on_unrecoverable
        self._checker = ResponseChecker(spec)
        self._numeric_outputs = not any(is_bytes_dtype(np.dtype(tensor.dtype)) for tensor in spec.outputs)
        """Whether `@batch`'s outputs can cross as one array each (`_encode_split`): strings cannot."""
        self._batching = bool(spec.max_batch_size)
        self._triton_context = TritonContext(spec.name, spec.config, spec.inputs, spec.outputs)
        self._hop_path = transport.hop_path(spec.name, instance)
        _remove_a_stale_socket(self._hop_path, spec.name)
        self._presence = zmq.Context.instance().socket(zmq.ROUTER)
        self._presence.setsockopt(zmq.LINGER, 0)
        self._presence.bind(transport.address(spec.name, instance))
        os.chmod(transport.presence_path(spec.name, instance), PRIVATE_FILE)
        self._monitor = self._presence.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(self._hop_path)
        os.chmod(self._hop_path, PRIVATE_FILE)  # before it listens: nobody else connects in between
        self._listener.listen()
        self._poller = select.poll()
        self._poller.register(self._listener, select.POLLIN)
        self._busy_poll = BusyPoll(transport.busy_poll_us)
        self._peers: dict[int, Peer] = {}
        """The attached proxy instances, by their hop's descriptor."""
        self._stopping = threading.Event()
        self._backlog: deque[tuple[Peer, list[memoryview]]] = deque()
        self.warmed_up = threading.Event()
        """Set once the warm-up samples are answered, or one failed."""
        self.warmup_error: str | None = None
        """Why a warm-up sample failed, as a client would read it."""
        self.connections = 0
        self.in_flight = 0
        self.requests = 0
        self.failures = 0
        self.busy_seconds = 0.0
        _INSTANCES.add(self)

    last_batch: tuple[InstanceServer | None, int] = (None, 0)
    """The instance server of this process that started a batch last, and when (`perf_counter_ns`)."""

    def _another_busy(self) -> bool:
        """Whether another instance server of this process works on a batch, or started one within the
        polling window. This one does not poll then: a polling thread holds the GIL between its polls,
        and another thread that needs it to take its request in, or to run its callable, waits for it."""
        instance, started = InstanceServer.last_batch
        return bool(_SERVING) or (
            instance is not self and time.perf_counter_ns() - started < self._busy_poll.window_ns
        )

    @property
    def attached(self) -> bool:
        """True while a proxy instance is connected to this instance's ZeroMQ socket."""
        return self.connections > 0

    @property
    def arena_blocks(self) -> int:
        """The arena blocks of its proxy instances that are not free now; read when sampled, never on the
        data path."""
        return sum(peer.blocks_in_use for peer in list(self._peers.values()))

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        # The model's context stays active on this thread, which calls only this model's callable: entering
        # it around each call costs several microseconds per request.
        try:
            with use_triton_context(self._triton_context):
                if self._warm_up():
                    self._serve()
        finally:
            for peer in list(self._peers.values()):
                self._drop(peer)
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._hop_path)
            self._presence.disable_monitor()
            self._monitor.close(linger=0)
            self._presence.close(linger=0)

    def _warm_up(self) -> bool:
        """Answer the model's warm-up samples as clients' requests are answered. False, with the error kept
        in `warmup_error`, when one fails."""
        try:
            for sample in self.spec.warmups:
                batch_sizes = [1 if self._batching else None] * sample.batch_size
                for _ in range(sample.count):
                    requests = sample.requests()
                    result = self._call(requests)
                    if not self.spec.config.decoupled:
                        self._checked(result, batch_sizes, requests)
                        continue
                    try:
                        for item in _items(result):
                            self._checker.check(item, batch_sizes, requests)
                    finally:
                        _close(result)
        except BaseException as error:  # a callable's SystemExit too: it fails the warm-up
            self.warmup_error = format_error(error, debug=self._debug)
            return False
        finally:
            self.warmed_up.set()
        return True

    def _serve(self) -> None:
        # One poll for the listener, the monitor and every hop, then a blocking receive: the fewest calls
        # per request. Asking ZeroMQ for the monitor's events costs a system call, so it is asked only
        # when the monitor's descriptor signals that some may have arrived.
        listener = self._listener.fileno()
        monitor = self._monitor.get(zmq.FD)
        self._poller.register(monitor, select.POLLIN)
        self._track_connections()
        idle_since = time.perf_counter_ns()
        while not self._stopping.is_set():
            if self._backlog:
                self._serve_one(*self._backlog.popleft())
                idle_since = time.perf_counter_ns()
                continue
            ready = self._busy_poll.poll(self._poller, self._another_busy)
            ready = ready or self._poller.poll(POLL_INTERVAL_MS)
            self._busy_poll.waited(time.perf_counter_ns() - idle_since)
            for descriptor, _ in ready:
                if descriptor in self._peers:
                    self._receive_from(self._peers[descriptor])
                elif descriptor == listener:
                    self._accept()
                elif descriptor == monitor:
                    self._track_connections()
            idle_since = time.perf_counter_ns()

    def _track_connections(self) -> None:
        """Count the attach and detach events waiting. ZeroMQ's descriptor signals only new arrivals, so
        every waiting event is taken now."""
        while self._monitor.get(zmq.EVENTS) & zmq.POLLIN:
            event = zmq.utils.monitor.recv_monitor_message(self._monitor)["event"]
            self.connections += 1 if event == zmq.EVENT_ACCEPTED else -1
            self.connections = max(self.connections, 0)

    def _accept(self) -> None:
        """Take a proxy instance's hop in; one of a process of another user is closed unread (the socket's
        mode keeps them out, unless its folder and mode were opened to them)."""
        connection = self._listener.accept()[0]
        user = peer_user(connection)
        if user != os.geteuid():
            LOGGER.warning(
                "Model %s instance %d: dropped a connection to %s from a process of user %d; only user "
                "%d's processes are served",
                self.spec.name,
                self.instance,
                self._hop_path,
                user,
                os.geteuid(),
            )
            connection.close()
            return
        hop = Hop(connection)
        self._peers[hop.fileno()] = Peer(hop)
        self._poller.register(hop, select.POLLIN)

    def _drop(self, peer: Peer) -> None:
        """Forget a hop whose proxy instance went away, with whatever it had sent."""
        self._poller.unregister(peer.hop)
        del self._peers[peer.hop.fileno()]
        peer.close()
        self._backlog = deque(entry for entry in self._backlog if entry[0] is not peer)

    def _receive_from(self, peer: Peer) -> None:
        frames = peer.hop.receive()
        if frames is None:
            self._drop(peer)
        else:
            self._serve_one(peer, frames)

    def _serve_one(self, peer: Peer, frames: list[memoryview]) -> None:
        message = decode_message(frames[0])
        if message.kind == HELLO:  # the hop's first message
            try:
                peer.arenas = self._map_arenas(*read_hello(message.text))
            except ValueError as error:
                peer.refused = str(error)
                LOGGER.error("Model %s instance %d: %s", self.spec.name, self.instance, error)
            return
        if peer.refused:
            if message.kind == REQUEST:
                self._send(peer, message.id, Reply(ERROR, [], [], peer.refused))
            return
        assert peer.arenas is not None, "a hop's first message names its arenas"
        requests_arena, responses_arena = peer.arenas
        for offset in message.released:
            responses_arena.free(offset)
        if message.kind != REQUEST:
            return
        self._busy_poll.batch(len(message.entries))
        self.in_flight += len(message.entries)
        _SERVING.add(self)
        InstanceServer.last_batch = (self, time.perf_counter_ns())
        started = time.perf_counter()
        try:
            data = frames[1:]
            del frames
            if message.flags & DECOUPLED:
                replies = self._stream(peer, message, data, requests_arena, responses_arena)
                try:
                    for reply in replies:
                        self._send(peer, message.id, reply)
                finally:
                    replies.close()
            else:
                self._send(
                    peer, message.id, self._reply(peer, message, data, requests_arena, responses_arena)
                )
        except OSError as error:
            LOGGER.info("Model %s instance %d: the proxy went away: %s", self.spec.name, self.instance, error)
            self._drop(peer)
        finally:
            _SERVING.discard(self)
            self.in_flight -= len(message.entries)
            self.requests += len(message.entries)
            self.busy_seconds += time.perf_counter() - started

    def _map_arenas(self, requests_path: str, responses_path: str) -> tuple[Arena, Arena]:
        """The arenas a HELLO names, mapped (the request arena read-only); ValueError, with neither mapped,
        where one is not a file that the proxy made in the arena directory (`Arena.of_peer`)."""
        directory = str(self._transport.arena_dir)
        requests_arena = Arena.of_peer(requests_path, directory, writable=False)
        try:
            return requests_arena, Arena.of_peer(responses_path, directory, writable=True)
        except ValueError:
            requests_arena.close()
            raise

    def _send(self, peer: Peer, message_id: int, reply: Reply) -> None:
        if reply.kind == ERROR:
            self.failures += 1
        released: list[int] = []
        count = len(peer.released)  # finalizers of inputs may append to it meanwhile, from any thread
        if count:
            released = peer.released[:count]
            del peer.released[:count]
        header = encode_message(reply.kind, message_id, reply.entries, released, text=reply.text)
        peer.hop.send([header, *reply.frames])

    def _decode_requests(
        self, peer: Peer, message: Message, data: list[memoryview], arena: Arena
    ) -> RequestBatch:
        inputs, columns, pinned = decode_inputs(message.entries, data, arena, peer.release)
        peer.held.update(pinned)  # each block stays pinned until its arrays are gone
        requests = [
            Request(arrays, json.loads(parameters) if parameters else {}, outputs)
            for arrays, (_, parameters, outputs) in zip(inputs, message.entries, strict=True)
        ]
        sizes = None
        if self._batching:  # the first dimension of each request's first input
            sizes = [descriptors[0][2][0] if descriptors else None for descriptors, _, _ in message.entries]
        return RequestBatch(requests, columns, sizes)

    def _reply(
        self,
        peer: Peer,
        message: Message,
        data: list[memoryview],
        requests_arena: Arena,
        responses_arena: Arena,
    ) -> Reply:
        """The one reply of a non-decoupled model. Returning drops every reference to the inputs."""
        try:
            requests = self._decode_requests(peer, message, data, requests_arena)
            result = self._call(requests)
            batch_sizes = requests.sizes or [None] * len(requests)
            if type(result) is SplitOutputs:
                reply = self._encode_split(result, batch_sizes, responses_arena)
                if reply is not None:
                    return reply
            try:
                responses = self._checked(result, batch_sizes, requests)
            except SomeRequestsFailed as failed:
                return self._partial_reply(failed, self._encode_responses(failed.outputs, responses_arena))
            return self._encode_responses(responses, responses_arena)
        except BaseException as error:  # a callable's SystemExit or KeyboardInterrupt fails its batch alone
            return self._error_reply(error)

    def _checked(
        self, result: Any, batch_sizes: Sequence[int | None], requests: Sequence[Request]
    ) -> list[dict[str, np.ndarray]]:
        """The responses of a non-decoupled model's callable, checked against the declared outputs."""
        if type(result) not in _PLAIN_RESULTS and _is_generator(result):
            raise ResponseError(
                f"Model '{self.spec.name}' callable is a generator; bind it with "
                "ModelConfig(decoupled=True) to stream responses"
            )
        return self._checker.check(result, batch_sizes, requests)

    def _stream(
        self,
        peer: Peer,
        message: Message,
        data: list[memoryview],
        requests_arena: Arena,
        responses_arena: Arena,
    ) -> Iterator[Reply]:
        """The replies of a decoupled model: one per yielded item, then a final message. A stream whose
        clients all cancelled, or whose proxy went away, closes the generator and ends at once."""
        result = None
        try:
            requests = self._decode_requests(peer, message, data, requests_arena)
            batch_sizes = requests.sizes or [None] * len(requests)
            result = self._call(requests)
            for item in _items(result):
                try:
                    responses = self._checker.check(item, batch_sizes, requests)
                except SomeRequestsFailed as failed:
                    yield self._partial_reply(
                        failed, self._encode_streamed(peer, failed.outputs, responses_arena)
                    )
                else:
                    yield self._encode_streamed(peer, responses, responses_arena)
                self._take_releases(peer, 0)
                if peer.cancelled == message.id:
                    break
        except BaseException as error:
            yield self._error_reply(error)
            return
        finally:
            _close(result)
        yield FINAL_REPLY

    def _encode_streamed(self, peer: Peer, responses: Sequence[dict[str, np.ndarray]], arena: Arena) -> Reply:
        """Encode one streamed item. The proxy releases response blocks while the stream runs: while the
        arena is full of blocks still in flight, wait for those releases instead of failing the stream."""
        deadline = time.monotonic() + STREAM_BACKPRESSURE_S
        while True:
            try:
                return self._encode_responses(responses, arena)
            except ArenaFullError:
                if not arena.used_bytes or time.monotonic() > deadline or self._stopping.is_set():
                    raise
                self._take_releases(peer, POLL_INTERVAL_MS)

    def _take_releases(self, peer: Peer, timeout_ms: int) -> None:
        """Apply the release and cancel messages waiting on a stream's hop; keep requests for the run
        loop. ConnectionResetError when the proxy went away: the stream has no one left to serve."""
        while peer.hop.readable(timeout_ms):
            timeout_ms = 0
            frames = peer.hop.receive()
            if frames is None:
                raise ConnectionResetError(f"the proxy instance of model '{self.spec.name}' went away")
            message = decode_message(frames[0])
            if message.kind == REQUEST:
                self._backlog.append((peer, frames))
                continue
            if message.kind == CONTROL and message.flags & CANCEL:
                peer.cancelled = message.id
            assert peer.arenas is not None, "a hop's first message names its arenas"
            for offset in message.released:
                peer.arenas[1].free(offset)

    def _partial_reply(self, failed: SomeRequestsFailed, reply: Reply) -> Reply:
        """`reply`, the encoded outputs of a batch in which some requests failed, with the error's text for
        the entry of each of those."""
        LOGGER.warning("Model %s instance %d: %s", self.spec.name, self.instance, failed)
        self.failures += len(failed.errors)
        entries: list[Any] = list(reply.entries)
        for index, text in failed.errors.items():
            entries[index] = text
        return Reply(PARTIAL, entries, reply.frames)

    def _error_reply(self, error: BaseException) -> Reply:
        message = format_error(error, debug=self._debug)
        LOGGER.warning("Model %s instance %d: %s", self.spec.name, self.instance, message)
        if isinstance(error, PyTritonUnrecoverableError):
            self._on_unrecoverable(error)
        return Reply(ERROR, [], [], message)

    def _call(self, requests: list[Request]) -> Any:
        result = self._infer_func(requests)  # with the model's context active: see run()
        if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
            result = _EventLoopThread.run(result)
        return result

    def _encode_split(
        self, result: SplitOutputs, batch_sizes: list[int | None], arena: Arena
    ) -> Reply | None:
        """The reply for `@batch`'s responses, each output checked and encoded once for the whole batch,
        where they are still its slices of every declared output, numeric, for the requests' batch sizes;
        None otherwise, and where a check fails: `_checked` then tells each request what is wrong."""
        outputs = result.whole()
        if (
            not self._numeric_outputs
            or outputs is None
            or outputs.keys() != self._checker.outputs.keys()
            or result.sizes != batch_sizes
        ):
            return None
        total = sum(result.sizes)
        frames: list[Any] = []
        allocated: list[int] = []
        inline_limit = self._transport.inline_limit
        try:
            columns = [
                encode_rows(
                    name,
                    self._checker.check_array(name, outputs[name], total),
                    result.sizes,
                    frames,
                    arena,
                    allocated,
                    inline_limit,
                )
                for name in self._checker.outputs
            ]
        except (ResponseError, ArenaFullError):
            for offset in allocated:
                arena.free(offset)
            return None
        return Reply(REPLY, [list(entry) for entry in zip(*columns, strict=True)], frames)

    def _encode_responses(self, responses: Sequence[dict[str, np.ndarray]], arena: Arena) -> Reply:
        frames: list[Any] = []
        allocated: list[int] = []
        entries = []
        inline_limit = self._transport.inline_limit
        try:
            for response in responses:
                entries.append(
                    [
                        encode_tensor(name, array, frames, arena, allocated, inline_limit)
                        for name, array in response.items()
                    ]
                )
        except ArenaFullError as error:
            for offset in allocated:
                arena.free(offset)
            raise ArenaFullError(f"Model '{self.spec.name}' response does not fit: {error}") from None
        return Reply(REPLY, entries, frames)


_INSTANCES: weakref.WeakSet[InstanceServer] = weakref.WeakSet()
"""Every instance server of this process, for `arena_blocks_in_use`."""
_SERVING: set[InstanceServer] = set()
"""The instance servers of this process that are working on a batch now."""


def arena_blocks_in_use() -> int:
    """Arena blocks not free now, over every model and instance this process serves: what a soak samples
    to tell a leak from blocks in flight."""
    return sum(instance.arena_blocks for instance in list(_INSTANCES))


_PLAIN_RESULTS = (list, tuple, dict, SplitOutputs)
"""What most callables return; neither awaitable nor a generator, which the `inspect` checks take longer
to tell on the path of every request."""


def _is_generator(result: Any) -> bool:
    return inspect.isgenerator(result) or inspect.isasyncgen(result)


def _close(result: Any) -> None:
    """Stop a generator early (its clients cancelled): its `finally` blocks run now."""
    if inspect.isasyncgen(result):
        _EventLoopThread.run(result.aclose())
    elif inspect.isgenerator(result):
        result.close()


def _items(result: Any) -> Iterator[Any]:
    """The items a decoupled model's callable streams: a generator's, or the one result it returned."""
    if inspect.isasyncgen(result):
        while True:
            try:
                yield _EventLoopThread.next_item(result)
            except StopAsyncIteration:
                return
    elif inspect.isgenerator(result):
        yield from result
    else:
        yield result


def join_within(threads: Sequence[threading.Thread], timeout_s: float) -> None:
    """Wait until the started `threads` end, `timeout_s` at most for all of them together: a thread in a
    callable that hangs ends when it returns, if ever, and each such thread must not add its own wait."""
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        if thread.is_alive():
            thread.join(max(0.0, deadline - time.monotonic()))


class ModelWorker:
    """The instance servers of one bound model in this process: one per callable, numbered from
    `first_instance` (the model's other instances may be served by other worker processes)."""

    def __init__(
        self,
        spec: ModelSpec,
        infer_funcs: Sequence[Callable[..., Any]],
        transport: TransportSettings,
        *,
        debug: bool,
        on_unrecoverable: Callable[[BaseException], None],
        first_instance: int = 0,
    ) -> None:
        self.spec = spec
        self.instances = [
            InstanceServer(spec, index, func, transport, debug=debug, on_unrecoverable=on_unrecoverable)
            for index, func in enumerate(infer_funcs, start=first_instance)
        ]

    def start(self) -> None:
        """Start the instance servers and wait until each answered the model's warm-up samples.
        PyTritonModelConfigError, with every instance stopped, when a warm-up failed."""
        for instance in self.instances:
            instance.start()
        for instance in self.instances:
            instance.warmed_up.wait()
        for instance in self.instances:
            if instance.warmup_error is not None:
                self.stop()
                raise PyTritonModelConfigError(
                    f"Model '{self.spec.name}' instance {instance.instance} failed its warm-up: "
                    f"{instance.warmup_error}"
                )

    @property
    def attached(self) -> bool:
        return all(instance.attached for instance in self.instances)

    @property
    def in_flight(self) -> int:
        return sum(instance.in_flight for instance in self.instances)

    def stop(self, timeout_s: float = 5.0) -> None:
        for instance in self.instances:
            instance.stop()
        join_within(self.instances, timeout_s)
