"""The wire format between the proxy model inside Triton and the worker that runs the callable.

Each proxy instance reaches its worker instance in two ways. A ZeroMQ DEALER connected to the worker's
ROUTER over `ipc://` carries no messages: it is how the worker knows a proxy instance is attached
(readiness, drain), and ZeroMQ reconnects it by itself to a restarted worker while the proxy is idle.
Requests and replies travel over a `Hop`, a connected `AF_UNIX` `SOCK_SEQPACKET` socket in the same
folder: a blocking send on one side wakes the thread blocked in a receive on the other, with no I/O
thread in between (a ZeroMQ round trip wakes six threads; on a small request that is most of its cost),
and the kernel ends the connection the moment either process dies, so a request in flight fails at once.

A message is a header frame followed by data frames. The header is one `marshal` of plain tuples and
lists (`encode_message`, `decode_message`): its kind, flags, id and the arena blocks the sender
released, then one entry per request or response with a descriptor per tensor (name, dtype, shape,
where its data is). One C call writes it and one reads it back, where a packed binary layout needed
Python steps per request and per tensor. A hop's first message names the proxy instance's arenas, so
that requests need not. A tensor travels either inline, in a frame, or, when it is larger than the
inline limit, through an `Arena`: a bounded, pre-sized shared-memory file. The same input of several
requests of a batch travels in one arena block (`encode_column`), and each output `@batch` split in one
frame or block (`encode_rows`): one copy, and one block to release, per batch; each request's descriptor
addresses its part.

Each proxy instance owns two arenas: the request arena, which only the proxy allocates in and the
worker maps read-only, and the response arena, which only the worker allocates in and the proxy maps
read-only. A block is freed by its allocator only when the reader reports it released, so a callable
may keep an input array after it returns: the block stays pinned until the array is garbage-collected,
and later requests never overwrite it.

This module runs in the worker and inside the stock Triton image, so it depends on numpy alone and is
valid Python 3.10.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import itertools
import marshal
import math
import mmap
import operator
import os
import select
import socket
import stat
import struct
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

INLINE_LIMIT = 64 * 1024
"""Tensors up to this many bytes travel as message frames; larger ones go through an arena."""
ALIGNMENT = 64

PARAM_ADDRESS = "kubetriton.address"
PARAM_HOP_PATH = "kubetriton.hop_path"
PARAM_ARENA_DIR = "kubetriton.arena_dir"
PARAM_ARENA_BYTES = "kubetriton.arena_bytes"
PARAM_INLINE_LIMIT = "kubetriton.inline_limit"
PARAM_BUSY_POLL_US = "kubetriton.busy_poll_us"
PARAM_WORKER_WAIT_S = "kubetriton.worker_wait_s"
"""config.pbtxt parameters through which the worker tells each proxy instance where to find it."""

_LENGTH = struct.Struct("<I")
"""A 4-byte little-endian count: a hop message's frame count."""

HOP_DATAGRAM_BYTES = 128 * 1024
"""A hop message longer than this travels as several datagrams: one datagram must fit the socket's
send buffer, which `Hop` raises to twice this (the kernel's default is about 208 KiB)."""


class ArenaFullError(RuntimeError):
    """A tensor does not fit into the free space of a shared-memory arena."""


class Arena:
    """A shared-memory file of fixed size, with a first-fit allocator for the side that writes it."""

    def __init__(
        self,
        path: str,
        size: int = 0,
        *,
        create: bool = False,
        writable: bool = True,
        descriptor: int | None = None,
    ) -> None:
        """Create the file at `path`, `size` bytes (`create`), or map the one the peer created there, open
        at `descriptor` (`of_peer`); the descriptor is closed once the file is mapped."""
        if create:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(descriptor, size)
        assert descriptor is not None, "an arena the peer created is mapped through Arena.of_peer"
        try:
            self.size = os.fstat(descriptor).st_size
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self._mmap = mmap.mmap(descriptor, self.size, access=access) if self.size else None
        finally:
            os.close(descriptor)
        self.path = path
        self.memory = memoryview(self._mmap) if self._mmap else memoryview(b"")
        self.buffer = np.frombuffer(self.memory, np.uint8)
        self._free_starts: list[int] = [0] if self.size else []
        self._free_lengths: dict[int, int] = {0: self.size} if self.size else {}
        self._used: dict[int, int] = {}

    @classmethod
    def of_peer(cls, path: str, directory: str, *, writable: bool) -> Arena:
        """The arena that the peer named in its HELLO, mapped; ValueError, with nothing opened, unless it is
        a regular file of this process's user with no other link, right inside `directory` (the arena
        directory the worker told the proxy), opened without following a link. Whoever else connected to
        the hop would otherwise have the worker read any file it can back to them, or overwrite one."""
        if os.path.realpath(os.path.dirname(path)) != os.path.realpath(directory):
            raise ValueError(f"Refused the arena {path}: it is not in the arena directory {directory}")
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer, before anything is checked
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                descriptor = os.open(os.path.basename(path), flags, dir_fd=folder)
            finally:
                os.close(folder)
        except OSError as error:
            raise ValueError(f"Refused the arena {path}: it cannot be opened ({error.strerror})") from None
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or status.st_nlink != 1:
            os.close(descriptor)
            raise ValueError(
                f"Refused the arena {path}: it is not a regular file of user {os.geteuid()} with one link"
            )
        return cls(path, writable=writable, descriptor=descriptor)

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    @property
    def used_blocks(self) -> int:
        return len(self._used)

    def allocate(self, nbytes: int) -> int:
        """Reserve `nbytes` and return the offset; raise ArenaFullError when no free range fits."""
        need = max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)
        for start in self._free_starts:
            length = self._free_lengths[start]
            if length >= need:
                self._take(start, length, need)
                return start
        if need > self.size:
            raise ArenaFullError(
                f"{nbytes} bytes do not fit into the shared-memory arena of {self.size} bytes (a bigger one:"
                " KUBETRITON_ARENA_BYTES)"
            )
        raise ArenaFullError(
            f"{nbytes} bytes do not fit into the shared-memory arena now ({self.size - self.used_bytes} of"
            f" {self.size} bytes free): the rest holds other requests' tensors, or inputs that the callable"
            " keeps (keep a copy instead)"
        )

    def _take(self, start: int, length: int, need: int) -> None:
        index = bisect.bisect_left(self._free_starts, start)
        del self._free_starts[index]
        del self._free_lengths[start]
        if length > need:
            self._free_starts.insert(index, start + need)
            self._free_lengths[start + need] = length - need
        self._used[start] = need

    def free(self, offset: int) -> None:
        """Return a block to the free list, merging it with free neighbours."""
        length = self._used.pop(offset, None)
        if length is None:
            return
        index = bisect.bisect_left(self._free_starts, offset)
        end = offset + length
        if index < len(self._free_starts) and self._free_starts[index] == end:
            length += self._free_lengths.pop(end)
            del self._free_starts[index]
        if index > 0:
            before = self._free_starts[index - 1]
            if before + self._free_lengths[before] == offset:
                self._free_lengths[before] += length
                return
        self._free_starts.insert(index, offset)
        self._free_lengths[offset] = length

    def reset(self) -> None:
        """Forget every allocation: the peer that held blocks is gone."""
        self._used.clear()
        self._free_starts = [0] if self.size else []
        self._free_lengths = {0: self.size} if self.size else {}

    def close(self, *, unlink: bool = False) -> None:
        self.buffer = np.empty(0, np.uint8)
        self.memory.release()
        if self._mmap is not None:
            # A caller may still hold a view; the mapping then goes when the view does.
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


SINGLES_BEFORE_POLLING = 4
"""How many batches in a row must have held a single request before a waiting thread polls."""
PAUSES_NS = (10_000_000, 1_000_000_000)
"""How long a thread does not poll after a window in which the machine had no CPU to spare: the first
time, and at most, doubling while such windows follow each other."""
JUDGED_WINDOW_NS = 200_000
"""How long a window must have lasted for its count of runnable threads to pause polling. In a shorter one
the request's own threads can keep more threads runnable than there are CPUs from start to end: the proxy
waits about 80 µs for a small reply, while the worker and tritonserver's threads are busy with it."""


class BusyPoll:
    """Polls for a message for a short window before the waiting thread sleeps, while messages come quickly.

    A thread that sleeps in a receive is woken by the kernel when the message arrives: tens of microseconds
    on an idle CPU, more on a virtual machine, whose idle vCPU must be woken too and whose caches have gone
    cold meanwhile, which slows every step that follows. For a small request that is most of a hop's cost.
    Polling without sleeping avoids both, at the price of the CPU spent polling, so it is done only where
    it is likely to pay: when the last wait ended within the window, and the last few batches each held a
    single request (batches of several mean that requests queue, so the CPU has other work to do, which
    polling would take from it). Between polls the thread yields the CPU to any other thread ready to run
    on it.

    Polling pays only while the machine has a CPU to spare. Beside busy processes a polling thread takes
    CPU time from the very threads that produce its message, and small requests became several times
    slower; the polling thread itself need not notice, as it may have a CPU to itself while the others
    queue on the rest. So each poll also reads the kernel's count of runnable threads (the fourth field of
    `/proc/loadavg`, all CPUs, the poller included, under a microsecond to read): where even its lowest
    count during a window exceeds the CPUs this process may use, someone was waiting for a CPU all along,
    and the thread stops polling for `PAUSES_NS` (a window shorter than `JUDGED_WINDOW_NS` is too short to
    tell). A process that may use fewer than two CPUs (its affinity, or its cgroup's quota: v2 `cpu.max`,
    v1's CFS quota) never polls: the CPU spent polling would be taken from its callable. A window of 0
    never polls.
    """

    def __init__(
        self, window_us: int, loadavg: str = "/proc/loadavg", cgroup: str = "/sys/fs/cgroup"
    ) -> None:
        self._cpus = len(os.sched_getaffinity(0))
        self.window_ns = window_us * 1000 if min(self._cpus, _quota_cpus(cgroup)) >= 2 else 0
        self._loadavg = None
        if self.window_ns:
            try:
                self._loadavg = open(loadavg, "rb", buffering=0)  # noqa: SIM115 - read while it lives
            except OSError:
                self.window_ns = 0  # no count of runnable threads: no way to know when polling hurts
        self._recent = False
        self._singles = 0
        self._pause_ns = 0
        self._paused_until = 0

    def batch(self, requests: int) -> None:
        """Record the number of requests in the batch this thread works on now."""
        self._singles = self._singles + 1 if requests == 1 else 0

    def poll(
        self, poller: select.poll, busy_elsewhere: Callable[[], bool] = lambda: False
    ) -> list[tuple[int, int]]:
        """What `poller` finds ready within the window, if polling is worth it now; empty otherwise.

        Polling stops early once `busy_elsewhere()` is true: in a process whose other threads need the
        CPU or the GIL, which a polling thread holds between its polls."""
        started = time.perf_counter_ns()
        if not (self._recent and self._singles >= SINGLES_BEFORE_POLLING) or started < self._paused_until:
            return []
        deadline = started + self.window_ns
        fewest_runnable = math.inf
        while True:
            fewest_runnable = min(fewest_runnable, self._runnable())
            ready = poller.poll(0)
            now = time.perf_counter_ns()
            if ready or now >= deadline or busy_elsewhere():
                if fewest_runnable > self._cpus and now - started >= JUDGED_WINDOW_NS:
                    self._pause(now)
                return ready
            os.sched_yield()

    def waited(self, nanoseconds: int) -> None:
        """Record how long the last wait for a message took, polling included."""
        self._recent = nanoseconds <= self.window_ns and self.window_ns > 0

    def _runnable(self) -> int:
        """The threads that run or wait for a CPU now, on the whole machine."""
        assert self._loadavg is not None
        fields = os.pread(self._loadavg.fileno(), 128, 0).split(b" ", 4)
        return int(fields[3].partition(b"/")[0])

    def _pause(self, now: int) -> None:
        """Stop polling for a while: twice as long as last time where the last pause ended only just."""
        shortest, longest = PAUSES_NS
        again_soon = now - self._paused_until < self._pause_ns
        self._pause_ns = min(2 * self._pause_ns, longest) if again_soon else shortest
        self._paused_until = now + self._pause_ns


def _quota_cpus(cgroup: str) -> float:
    """The CPUs this process's cgroup may use, from the cgroup file system mounted at `cgroup`: version 2's
    `cpu.max` (`max 100000`: no limit, `50000 100000`: half a CPU), else version 1's `cpu/cpu.cfs_quota_us`
    and `cpu/cpu.cfs_period_us` (a quota of -1: no limit). No limit where neither can be read."""
    try:
        with open(f"{cgroup}/cpu.max") as limit:
            quota, period = limit.read().split()
    except (OSError, ValueError):
        try:
            with (
                open(f"{cgroup}/cpu/cpu.cfs_quota_us") as limit,
                open(f"{cgroup}/cpu/cpu.cfs_period_us") as every,
            ):
                quota, period = limit.read().strip(), every.read().strip()
        except OSError:
            return math.inf
    if quota in ("max", "-1") or not (quota.isdigit() and period.isdigit()) or not int(period):
        return math.inf
    return int(quota) / int(period)


M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameters (malloc.h)."""
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""Blocks up to this size come from the heap: the most that glibc's own adjustment ever raises it to."""
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
"""Free memory at the top of the heap that the process keeps instead of returning it to the kernel: twice
the mmap threshold, the ratio glibc keeps when it adjusts both itself."""


def keep_freed_memory() -> None:
    """Keep the memory of one batch for the next instead of returning it to the kernel after each; the
    proxy's process calls it as it starts.

    A batch of large inputs passes through this process in blocks of hundreds of kilobytes, freed together
    when `execute` returns. glibc starts with blocks over 128 KiB in their own mappings and adjusts as
    they are freed, but it returns free memory at the top of the heap to the kernel once it exceeds twice
    the largest block freed so far, so every batch of several such blocks was given back, and the next one
    faulted its pages in again, zeroed: with batches of 301 KB images the stub spent 39 % of its CPU time
    in those page faults (`bench/RESULTS.md`). Fixed thresholds keep up to one large batch's memory. Only
    glibc has `mallopt`; elsewhere nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


class Hop:
    """A connected `SOCK_SEQPACKET` socket carrying messages of frames, blocking on both sides.

    A message starts with the frame count and each frame's length, followed by the frames; one that
    does not fit a datagram continues in the next ones (datagrams keep their order and boundaries)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * HOP_DATAGRAM_BYTES)
        self.socket = sock
        self._datagram = bytearray(HOP_DATAGRAM_BYTES)
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)

    @classmethod
    def connect(cls, path: str) -> Hop:
        """Connect to the worker instance listening at `path`; OSError when none listens there."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        return cls(sock)

    def fileno(self) -> int:
        return self.socket.fileno()

    def send(self, frames: Sequence[Any]) -> None:
        """Send one message; OSError (BrokenPipeError, ConnectionResetError) when the peer is gone."""
        lengths = [len(frame) for frame in frames]
        prefix = _struct(f"<I{len(frames)}Q").pack(len(frames), *lengths)
        if len(prefix) + sum(lengths) <= HOP_DATAGRAM_BYTES:
            self.socket.sendmsg([prefix, *frames], (), socket.MSG_NOSIGNAL)
            return
        message = memoryview(b"".join([prefix, *frames]))
        for start in range(0, len(message), HOP_DATAGRAM_BYTES):
            self.socket.sendmsg([message[start : start + HOP_DATAGRAM_BYTES]], (), socket.MSG_NOSIGNAL)

    def receive(self) -> list[memoryview] | None:
        """Wait for the next message and return its frames (read-only); None once the peer is gone."""
        try:
            received = self.socket.recv_into(self._datagram)
        except ConnectionResetError:
            return None
        if not received:
            return None  # every message has a prefix, so an empty read is the end of the connection
        datagram = memoryview(self._datagram)
        (count,) = _LENGTH.unpack_from(datagram)
        lengths = _struct(f"<{count}Q").unpack_from(datagram, _LENGTH.size)
        position = _LENGTH.size + 8 * count
        total = position + sum(lengths)
        if total == received:
            message = memoryview(bytes(datagram[:received]))
        else:
            assembled = bytearray(total)
            assembled[:received] = datagram[:received]
            message = memoryview(assembled)
            while received < total:
                try:
                    more = self.socket.recv_into(message[received:])
                except ConnectionResetError:
                    return None
                if not more:
                    return None
                received += more
            message = message.toreadonly()
        frames = []
        for length in lengths:
            frames.append(message[position : position + length])
            position += length
        return frames

    @property
    def poller(self) -> select.poll:
        """A poller for this hop's messages alone."""
        return self._poller

    def readable(self, timeout_ms: int) -> bool:
        """True when a message (or the end of the connection) waits to be received."""
        return bool(self._poller.poll(timeout_ms))

    def peer_closed(self) -> bool:
        """True when the other side has closed its end (its process may have died)."""
        return any(events & select.POLLHUP for _, events in self._poller.poll(0))

    def close(self) -> None:
        self.socket.close()


HELLO = 1
"""Proxy to worker, a hop's first message: `WIRE_VERSION` and the paths of the proxy instance's two arenas,
separated by NUL, as its text (`hello_text`)."""
WIRE_VERSION = 2
"""The version of these messages. The proxy runs the kubetriton of the pod's init step (the operator's
worker image, or `spec.bootstrap.image`), the worker the one of its own image: a worker refuses a proxy
of another version, each request with a message that says so, instead of misreading its tensors."""
REQUEST = 2
"""Proxy to worker: a batch, one entry per request (flag DECOUPLED for a streaming model)."""
CONTROL = 3
"""Proxy to worker while a stream runs: response blocks released, and with flag CANCEL the end of the
stream `id`, whose clients all cancelled."""
REPLY = 4
"""Worker to proxy: one entry per request, its outputs (for a stream, one per streamed item)."""
ERROR = 5
"""Worker to proxy: the batch `id` failed, with the client's message as its text; it ends a stream."""
FINAL = 6
"""Worker to proxy: the stream `id` ended."""
PARTIAL = 7
"""Worker to proxy: a REPLY in which the entry of each request that failed alone is its client's message."""
DECOUPLED = CANCEL = 1
"""Flags of REQUEST and CONTROL messages."""

MARSHAL_VERSION = 4
"""The `marshal` version of message headers and of string tensors' data (see `serialize_bytes`). Both
ends of a hop run this module, on Python versions that may differ: every Python since 3.4 writes version
4 when asked to and reads it."""

Descriptor = tuple[str, str, tuple[int, ...], int, int, int]
"""A tensor descriptor: (name, dtype, shape, block, position, byte length). The dtype is numpy's dtype
string (`<f4`), or `|O` for strings as `serialize_bytes` packs them. Data in the arena: `block` is the
offset of the block that holds it (its own, or a column block that holds one tensor of a whole batch,
see `encode_column` and `encode_rows`) and `position` the data's offset in the arena. Data in a frame:
`block` is -1 - the frame's index (see `frame_block`) and `position` the data's offset in the frame.
Plain tuples: a message holds one per tensor, and a named tuple takes several times as long to make."""


def frame_block(index: int) -> int:
    """A descriptor's `block` for data in frame `index` (and back: the frame's index for such a block)."""
    return -1 - index


RequestEntry = tuple[list[Descriptor], str, "list[str] | None"]
"""A request: (inputs, Triton's JSON text of its parameters or "" for none, the outputs its client asked
for or None for all). A response entry is the list of its outputs' descriptors."""


class Message(NamedTuple):
    """A decoded message header."""

    kind: int
    flags: int
    id: int
    released: Sequence[int]
    """Offsets of blocks the sender released in the receiver's arena."""
    entries: Sequence[Any]
    """A REQUEST's `RequestEntry`s, or a REPLY's output descriptors, one list per request."""
    text: str
    """A HELLO's arena paths, separated by NUL; an ERROR's message."""


_OBJECT = np.dtype(object)
_CODES: dict[np.dtype, str] = {}
_DTYPES: dict[str, np.dtype] = {"|O": _OBJECT}
_STRUCTS: dict[str, struct.Struct] = {}


def _struct(layout: str) -> struct.Struct:
    """A compiled struct for a format used again and again (one per frame count)."""
    compiled = _STRUCTS.get(layout)
    if compiled is None:
        compiled = _STRUCTS[layout] = struct.Struct(layout)
    return compiled


def _dtype_code(dtype: np.dtype) -> str:
    code = _CODES.get(dtype)
    if code is None:
        code = dtype.str
        if dtype.kind not in "biuf" or np.dtype(code) != dtype:
            raise TypeError(f"arrays of dtype {dtype} cannot cross to the other process")
        _CODES[dtype] = code
    return code


def _new_dtype(code: str) -> np.dtype:
    dtype = _DTYPES[code] = np.dtype(code)
    return dtype


def hello_text(requests_path: str, responses_path: str) -> str:
    """A HELLO's text: this module's `WIRE_VERSION` and the proxy instance's arenas."""
    return f"{WIRE_VERSION}\0{requests_path}\0{responses_path}"


def read_hello(text: str) -> tuple[str, str]:
    """The arenas a HELLO names; ValueError, with what to do, when its proxy speaks another version."""
    version, _, paths = text.partition("\0")
    if version != str(WIRE_VERSION):
        theirs = f"version {version}" if version.isdigit() else "an older version"
        raise ValueError(
            f"The proxy model in Triton speaks {theirs} of kubetriton's wire format, this worker version "
            f"{WIRE_VERSION}: run the same kubetriton release in the worker's image and in the pod's init "
            "step (the operator's worker image, or spec.bootstrap.image)"
        )
    requests_path, responses_path = paths.split("\0")
    return requests_path, responses_path


def encode_message(
    kind: int,
    message_id: int = 0,
    entries: Sequence[Any] = (),
    released: Sequence[int] = (),
    *,
    flags: int = 0,
    text: str = "",
) -> bytes:
    """A message header; `entries` are a REQUEST's `RequestEntry`s or a REPLY's response entries."""
    return marshal.dumps((kind, flags, message_id, released, entries, text), MARSHAL_VERSION)


def decode_message(frame: memoryview) -> Message:
    """A message header, as `encode_message` made it."""
    return Message._make(marshal.loads(frame))


def serialize_bytes(array: np.ndarray) -> bytes:
    """The elements as bytes (str as UTF-8), in one `marshal` of their list.

    One C call packs the whole list here and one unpacks it in `deserialize_bytes`, where any layout of
    lengths and data needs a Python step per element on one side: that step was most of what strings
    cost the hop, which serializes and deserializes them once each way. Both ends run this module, and
    each end reads only what the other end's `marshal` wrote (see `MARSHAL_VERSION`). Other objects are
    written as their text, as tritonclient writes them (5 as b"5", never as five zero bytes)."""
    items = array.ravel(order="C").tolist()
    if not _only_bytes(items):
        items = [_as_bytes(item) for item in items]
    return marshal.dumps(items, MARSHAL_VERSION)


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    return str(item).encode()


def deserialize_bytes(buffer: bytes | memoryview, shape: Sequence[int]) -> np.ndarray:
    """The object array of bytes that `serialize_bytes` packed, in `shape`; ValueError when the data is
    not a list of as many bytes as `shape` holds."""
    items = marshal.loads(buffer)
    count = math.prod(shape)
    if type(items) is not list or len(items) != count or not _only_bytes(items):
        raise ValueError(f"a string tensor's data is not a list of {count} bytes objects")
    array = np.empty(count, dtype=object)
    array[:] = items
    return array.reshape(shape)


def _only_bytes(items: list[Any]) -> bool:
    """True when every item is exactly `bytes` (no subclass): the check runs in C, a third faster than a
    generator's Python step per item."""
    return set(map(type, items)) <= {bytes}


def is_bytes_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in "OSU"


def encode_tensor(
    name: str,
    array: np.ndarray,
    frames: list[Any],
    arena: Arena | None,
    allocated: list[int],
    inline_limit: int = INLINE_LIMIT,
) -> Descriptor:
    """The descriptor of `array`, whose data is appended to `frames` or copied into `arena`.

    An arena block's offset is appended to `allocated`: the caller frees it once the peer reports it
    released."""
    serialized = serialize_bytes(array) if is_bytes_dtype(array.dtype) else None
    code = "|O" if serialized is not None else _dtype_code(array.dtype)
    nbytes = len(serialized) if serialized is not None else array.nbytes
    if nbytes <= inline_limit or arena is None or arena.size == 0:
        # bytes, not a numpy buffer: a socket sends them faster
        frames.append(serialized if serialized is not None else array.tobytes())
        return (name, code, array.shape, frame_block(len(frames) - 1), 0, nbytes)
    offset = arena.allocate(nbytes)
    allocated.append(offset)
    target = arena.buffer[offset : offset + nbytes]
    if serialized is not None:
        target[...] = np.frombuffer(serialized, np.uint8)
    else:
        np.copyto(target.view(array.dtype).reshape(array.shape), array)
    return (name, code, array.shape, offset, offset, nbytes)


def encode_column(
    name: str,
    arrays: Sequence[np.ndarray],
    frames: list[Any],
    arena: Arena | None,
    allocated: list[int],
    inline_limit: int = INLINE_LIMIT,
) -> list[Descriptor]:
    """The descriptors of one input of several requests of a batch, as `encode_tensor` would give each.

    Where every array would go through the arena, and all are numeric of one dtype, they go into one
    block, one after another: one allocation, one copy (`np.concatenate` into the block, where the arrays
    differ only along the batch axis), one block for the reader to pin and release, and the whole
    column lies in memory as one array (`decode_inputs`). Otherwise, or where no free range fits the
    whole column, each array is encoded on its own."""
    first = arrays[0]
    dtype = first.dtype
    sizes = [array.nbytes for array in arrays]
    if (
        len(arrays) == 1
        or arena is None
        or arena.size == 0
        or dtype.kind not in "biuf"
        or min(sizes) <= inline_limit
        or [array.dtype for array in arrays].count(dtype) != len(arrays)
    ):
        return [encode_tensor(name, array, frames, arena, allocated, inline_limit) for array in arrays]
    code = _dtype_code(dtype)
    total = sum(sizes)
    try:
        block = arena.allocate(total)
    except ArenaFullError:
        return [encode_tensor(name, array, frames, arena, allocated, inline_limit) for array in arrays]
    allocated.append(block)
    target = arena.buffer[block : block + total].view(dtype)
    sample_shape = first.shape[1:]
    if 0 not in [array.ndim for array in arrays] and {array.shape[1:] for array in arrays} == {sample_shape}:
        np.concatenate(arrays, out=target.reshape((-1, *sample_shape)))
    else:
        start = 0
        for array in arrays:
            np.copyto(target[start : start + array.size].reshape(array.shape), array)
            start += array.size
    positions = itertools.accumulate(sizes[:-1], initial=block)
    return [
        (name, code, array.shape, block, position, nbytes)
        for array, position, nbytes in zip(arrays, positions, sizes, strict=True)
    ]


class _Adjacent:
    """Arrays that lie one after another in memory, exposed as one read-only array through numpy's array
    interface. The array numpy makes from it holds it as its base, and it holds the parts: so the memory
    (an arena block each, pinned by its part) lives as long as any view of the whole."""

    __slots__ = ("__array_interface__", "_parts")

    def __init__(self, parts: Sequence[np.ndarray], shape: tuple[int, ...], address: int) -> None:
        self._parts = parts
        self.__array_interface__ = {
            "version": 3,
            "shape": shape,
            "typestr": parts[0].dtype.str,
            "data": (address, True),
        }


def encode_rows(
    name: str,
    array: np.ndarray,
    rows: Sequence[int],
    frames: list[Any],
    arena: Arena | None,
    allocated: list[int],
    inline_limit: int = INLINE_LIMIT,
) -> list[Descriptor]:
    """The descriptors of consecutive ranges of a numeric array's rows, `rows[i]` rows for the i-th: one
    output of a whole batch, one range per request, in one frame or one arena block (as `encode_tensor`
    would place the whole array). The array may lie in memory in any layout: `tobytes` and the copy into
    the block write its rows in order, so a view such as `batch[:, :1]` is copied once, not twice."""
    nbytes = array.nbytes
    if nbytes <= inline_limit or arena is None or arena.size == 0:
        frames.append(array.tobytes())
        block, position = frame_block(len(frames) - 1), 0
    else:
        block = position = arena.allocate(nbytes)
        allocated.append(block)
        np.copyto(arena.buffer[block : block + nbytes].view(array.dtype).reshape(array.shape), array)
    code = _dtype_code(array.dtype)
    sample_shape = array.shape[1:]
    row_bytes = array.itemsize * math.prod(sample_shape)
    ends = list(itertools.accumulate(rows))
    return [
        (name, code, (count, *sample_shape), block, position + (end - count) * row_bytes, count * row_bytes)
        for count, end in zip(rows, ends, strict=True)
    ]


def split_rows(array: np.ndarray, rows: Sequence[int]) -> list[np.ndarray]:
    """Views of consecutive ranges of `array`'s rows, `rows[i]` rows for the i-th."""
    ends = itertools.accumulate(rows)
    return [array[end - count : end] for count, end in zip(rows, ends, strict=True)]


class SplitOutputs(list):
    """What `@batch` returns: each request's outputs, its rows of each of the batch's outputs, which it
    also holds, so that the worker can check and send each output once for the whole batch (`whole`)."""

    def __init__(self, outputs: dict[str, np.ndarray], sizes: list[int]) -> None:
        self._slices = {name: split_rows(value, sizes) for name, value in outputs.items()}
        if len(outputs) == 1:
            ((name, slices),) = self._slices.items()
            responses = [{name: part} for part in slices]
        elif outputs:
            names = list(outputs)
            responses = [
                dict(zip(names, row, strict=True)) for row in zip(*self._slices.values(), strict=True)
            ]
        else:  # a callable that returned no output: each request gets none
            responses = [{} for _ in sizes]
        super().__init__(responses)
        self._outputs = outputs
        self._made = responses
        self.sizes = sizes
        """Each request's rows of the outputs."""

    def whole(self) -> dict[str, np.ndarray] | None:
        """The batch's outputs, while every response is still the dict `@batch` made, holding the very
        slices it made and nothing else; None once a callable or decorator replaced, added or dropped
        any."""
        made = self._made
        if (
            len(self) != len(made)
            or not all(map(operator.is_, self, made))
            or not all(map(len(self._outputs).__eq__, map(len, made)))
        ):
            return None
        for name, slices in self._slices.items():
            if not all(map(operator.is_, map(dict.get, made, itertools.repeat(name)), slices)):
                return None
        return self._outputs


_REQUEST_DATA = operator.attrgetter("data")
"""A `Request`'s arrays by input name."""


class RequestBatch(list):
    """The requests of one batch as the worker hands them to the callable: a list of its `Request`s that
    also holds each input that crossed in one column block (`encode_column`) as one array, and each
    request's batch size, so that `@batch` need neither check where each request's array lies nor read
    its size (`intact_columns`; once a request changed, `join_adjacent` still finds the parts that lie
    one after another)."""

    def __init__(
        self,
        requests: list[Any],
        columns: dict[str, tuple[np.ndarray, list[np.ndarray]]],
        sizes: list[int] | None = None,
    ) -> None:
        super().__init__(requests)
        self.columns = columns
        """Input name: (the whole batch's array, each request's array as the worker made it, in order)."""
        self.sizes = sizes
        """Each request's batch size, the first axis of its first input; None where the model does not
        batch."""
        self._names = tuple(requests[0].data) if requests else ()

    def intact_columns(self) -> dict[str, np.ndarray] | None:
        """Each column input of the batch as one read-only array, while every request holds the inputs
        it came with: the same names in the same order, the very arrays the worker made of each column,
        and a column first (so `sizes` holds). None otherwise: a callable or decorator changed a
        request, or the batch has no sizes or its first input did not cross as a column."""
        columns, names = self.columns, self._names
        if self.sizes is None or not names or names[0] not in columns or len(self) != len(self.sizes):
            return None
        try:
            inputs = list(map(_REQUEST_DATA, self))
        except AttributeError:  # not a Request
            return None
        if not all(map(names.__eq__, map(tuple, inputs))):
            return None
        for name, (_, parts) in columns.items():
            if not all(map(operator.is_, map(dict.get, inputs, itertools.repeat(name)), parts)):
                return None
        return {name: whole for name, (whole, _) in columns.items()}


def decode_inputs(
    entries: Sequence[RequestEntry],
    frames: Sequence[Any],
    arena: Arena | None,
    on_release: Callable[[int], None],
) -> tuple[list[dict[str, np.ndarray]], dict[str, tuple[np.ndarray, list[np.ndarray]]], set[int]]:
    """A REQUEST's inputs: each request's arrays by name (read-only, owning their blocks as with
    `decode_tensor`), the inputs that fill one column block as (the whole batch's array, each request's
    array), and the arena blocks the arrays pin.

    The proxy lists every request's inputs in the same order, so a column is the descriptors in one place
    of every entry; each request's array of a column is a slice of its whole array."""
    pinned: dict[int, np.ndarray] = {}
    columns: dict[str, tuple[np.ndarray, list[np.ndarray]]] = {}
    widths = {len(descriptors) for descriptors, _, _ in entries}
    if len(entries) > 1 and arena is not None:
        for place in range(min(widths)):
            column = [descriptors[place] for descriptors, _, _ in entries]
            whole = _whole_column(column, arena, on_release, pinned)
            if whole is not None:
                columns[column[0][0]] = (
                    whole,
                    split_rows(whole, [descriptor[2][0] for descriptor in column]),
                )
    if columns and widths == {len(columns)}:  # every input of every request is in a column
        names = list(columns)
        parts = [parts for _, parts in columns.values()]
        inputs = [dict(zip(names, row, strict=True)) for row in zip(*parts, strict=True)]
        return inputs, columns, set(pinned)
    inputs = []
    for index, (descriptors, _parameters, _outputs) in enumerate(entries):
        arrays = {}
        for descriptor in descriptors:
            column = columns.get(descriptor[0])
            if column is not None:
                arrays[descriptor[0]] = column[1][index]
            else:
                arrays[descriptor[0]] = decode_tensor(descriptor, frames, arena, on_release, pinned)
        inputs.append(arrays)
    return inputs, columns, set(pinned)


def _whole_column(
    column: Sequence[Descriptor],
    arena: Arena,
    on_release: Callable[[int], None],
    pinned: dict[int, np.ndarray],
) -> np.ndarray | None:
    """The array over a column block that `column`'s descriptors fill (`_column_layout`), pinning the
    block; None where they do not fill one."""
    layout = _column_layout(column)
    if layout is None or layout[2] < 0:
        return None
    dtype, sample_shape, block, start, end = layout
    base = pinned.get(block)
    if base is None:
        base = pinned[block] = np.frombuffer(arena.memory[block:], np.uint8)
        weakref.finalize(base, on_release, block)
    whole = base[start - block : end - block].view(dtype).reshape((-1, *sample_shape))
    if whole.flags.writeable:
        whole.flags.writeable = False
    return whole


def decode_rows(column: Sequence[Descriptor], frames: Sequence[Any], arena: Arena) -> list[np.ndarray] | None:
    """The arrays of one output of every request of a batch, where `encode_rows` put them one after
    another (`_column_layout`): views of the frame or block that the caller must drop before the block
    is reused, as `decode_tensor`'s without `on_release`; None where they do not lie so."""
    layout = _column_layout(column)
    if layout is None:
        return None
    dtype, sample_shape, block, start, end = layout
    if block < 0:
        data = np.frombuffer(frames[frame_block(block)], np.uint8)[start:end]
    else:
        data = arena.buffer[start:end]
    return split_rows(
        data.view(dtype).reshape((-1, *sample_shape)), [descriptor[2][0] for descriptor in column]
    )


def _column_layout(column: Sequence[Descriptor]) -> tuple[np.dtype, tuple[int, ...], int, int, int] | None:
    """Where `column`'s descriptors, one tensor of each request of a batch, fill a range of one block or
    frame one after another, with one name, one numeric dtype and one sample shape: (the dtype, the
    sample shape, the block, the range's start and end); None where they do not, or hold no data."""
    names, codes, shapes, blocks, positions, sizes = zip(*column, strict=True)
    name, code, shape, block, start = names[0], codes[0], shapes[0], blocks[0], positions[0]
    dtype = _DTYPES.get(code) or _new_dtype(code)
    if not shape or dtype is _OBJECT:
        return None
    count = len(column)
    sample_shape = shape[1:]
    end = positions[-1] + sizes[-1]
    if (
        end == start
        or names.count(name) != count
        or codes.count(code) != count
        or blocks.count(block) != count
        or list(itertools.accumulate(sizes[:-1], initial=start)) != list(positions)
        or {shape[1:] for shape in shapes} != {sample_shape}
    ):
        return None
    return dtype, sample_shape, block, start, end


def join_adjacent(arrays: Sequence[np.ndarray]) -> np.ndarray | None:
    """The arrays concatenated along their first axis without a copy, where they lie one after another in
    memory; None where they do not.

    The proxy writes the same input of every request of a batch one after another into the request arena,
    and blocks keep their order while the arena is not fragmented, so `@batch` finds its inputs joined:
    concatenating them would copy every byte once more, into a new array of the batch's size whose fresh
    pages the kernel must zero and fault in, each batch. Only read-only, C-contiguous numeric arrays of one
    dtype and one sample shape qualify (inputs are read-only, so neither the parts nor the whole can change
    under the callable), the first aligned for its dtype as a copy would be (so is every part after it);
    the whole is read-only too."""
    first = arrays[0]
    dtype, sample_shape = first.dtype, first.shape[1:]
    if dtype.kind not in "biuf" or first.ndim < 1 or not first.flags.aligned:
        return None
    address = end = first.__array_interface__["data"][0]
    rows = 0
    for array in arrays:
        flags = array.flags
        if (
            flags.writeable
            or not flags.c_contiguous
            or array.dtype != dtype
            or array.shape[1:] != sample_shape
        ):
            return None
        if array.__array_interface__["data"][0] != end:
            return None
        end += array.nbytes
        rows += array.shape[0]
    return np.asarray(_Adjacent(arrays, (rows, *sample_shape), address))


def decode_tensor(
    descriptor: Descriptor,
    frames: Sequence[Any],
    arena: Arena | None,
    on_release: Callable[[int], None] | None = None,
    pinned: dict[int, np.ndarray] | None = None,
) -> np.ndarray:
    """The array a descriptor points at, read-only.

    With `on_release`, arena-backed arrays own their block: `on_release(block)` is called once every
    array decoded from the block, and every view of them, is gone. `pinned` holds the blocks met so far
    in one message (a column block holds several requests' arrays); the caller passes the same dict for
    all of a message's descriptors. Without `on_release`, the array is a plain view the caller must drop
    before the block is reused.
    """
    _name, code, shape, block, position, nbytes = descriptor
    dtype = _DTYPES.get(code) or _new_dtype(code)
    if block < 0:
        buffer: Any = frames[frame_block(block)]
        if position or nbytes != len(buffer):
            buffer = memoryview(buffer)[position : position + nbytes]
    else:
        if arena is None:
            raise RuntimeError("a tensor arrived through a shared-memory arena that is not mapped")
        buffer = arena.buffer[position : position + nbytes]
        if on_release is not None and dtype is not _OBJECT:
            # numpy collapses a view's base down to the array made from the buffer, so every array
            # derived from the block keeps that one alive: the finalizer fires when the last is gone.
            base = None if pinned is None else pinned.get(block)
            if base is None:
                base = np.frombuffer(arena.memory[block:], np.uint8)
                weakref.finalize(base, on_release, block)
                if pinned is not None:
                    pinned[block] = base
            buffer = base[position - block : position - block + nbytes]
        elif on_release is not None:
            on_release(block)  # strings are copied out below, so the block is free at once
    if dtype is _OBJECT:
        array = deserialize_bytes(buffer, shape)
        array.flags.writeable = False
        return array
    if isinstance(buffer, np.ndarray):
        array = buffer.view(dtype).reshape(shape)
    else:
        array = np.frombuffer(buffer, dtype).reshape(shape)
    if array.flags.writeable:  # a view of a hop's frames or of a read-only arena is read-only already
        array.flags.writeable = False
    return array
