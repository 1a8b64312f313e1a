"""The hop between a proxy instance and its worker instance, over real Unix sockets, and its headers."""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kubetriton.model_repository import ModelSpec
from kubetriton.transport import (
    CANCEL,
    CONTROL,
    DECOUPLED,
    ERROR,
    FINAL,
    HELLO,
    HOP_DATAGRAM_BYTES,
    PARAM_BUSY_POLL_US,
    PARAM_HOP_PATH,
    PAUSES_NS,
    REPLY,
    REQUEST,
    SINGLES_BEFORE_POLLING,
    Arena,
    ArenaFullError,
    BusyPoll,
    Hop,
    RequestBatch,
    SplitOutputs,
    decode_inputs,
    decode_message,
    decode_rows,
    decode_tensor,
    deserialize_bytes,
    encode_column,
    encode_message,
    encode_rows,
    encode_tensor,
    frame_block,
    hello_text,
    join_adjacent,
    read_hello,
    serialize_bytes,
)
from kubetriton.worker import (
    DEFAULT_BUSY_POLL_US,
    ENV_BUSY_POLL_US,
    MAX_SOCKET_PATH,
    InstanceServer,
    TransportSettings,
    arena_bytes,
    busy_poll_us,
)
from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request


@pytest.fixture
def hops():
    proxy_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proxy, worker = Hop(proxy_end), Hop(worker_end)
    yield proxy, worker
    proxy.close()
    worker.close()


@pytest.mark.parametrize(
    "sizes",
    [[20], [0, 5, 0], [HOP_DATAGRAM_BYTES], [HOP_DATAGRAM_BYTES // 2] * 5, [3 * HOP_DATAGRAM_BYTES + 7, 1]],
    ids=["one-frame", "empty-frames", "one-datagram-and-a-bit", "five-halves", "three-and-more"],
)
def test_messages_keep_their_frames(hops, sizes):
    proxy, worker = hops
    frames = [bytes([index]) * size for index, size in enumerate(sizes)]
    proxy.send(frames)
    proxy.send([b"next"])
    received = worker.receive()
    assert [bytes(frame) for frame in received] == frames
    assert all(frame.readonly for frame in received)
    assert [bytes(frame) for frame in worker.receive()] == [b"next"]


def test_a_closed_end_is_noticed_by_the_other(hops):
    proxy, worker = hops
    assert not proxy.peer_closed() and not proxy.readable(0)
    worker.close()
    assert proxy.peer_closed() and proxy.readable(0)
    assert proxy.receive() is None
    with pytest.raises(BrokenPipeError):
        proxy.send([b"anyone?"])


def test_connect_needs_a_listener(tmp_path):
    path = str(tmp_path / "model.0.hop")
    with pytest.raises(FileNotFoundError):
        Hop.connect(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        listener.bind(path)
        listener.listen()
        proxy = Hop.connect(path)
        worker = Hop(listener.accept()[0])
        proxy.send([b"hello"])
        assert [bytes(frame) for frame in worker.receive()] == [b"hello"]
        proxy.close()
        worker.close()
    with pytest.raises(ConnectionRefusedError):  # what a killed worker leaves behind
        Hop.connect(path)


def test_a_request_header_carries_its_batch(tmp_path):
    """Every field of a REQUEST survives the header: names (not ASCII too), dtypes, ranks from 0, inline
    and arena tensors, parameters, requested outputs and released blocks."""
    arena = Arena(str(tmp_path / "requests"), 1024 * 1024, create=True)
    frames: list = []
    allocated: list[int] = []
    arrays = {
        "x": np.arange(6, dtype=np.float32).reshape(2, 3),
        "größe": np.array(7, dtype=np.int64),
        "flag": np.array([True, False]),
        "text": np.array([[b"a", b""], ["é", b"xyz"]], dtype=object),
        "big": np.ones((1, 40_000), np.float16),
    }
    inputs = [encode_tensor(name, array, frames, arena, allocated, 1024) for name, array in arrays.items()]
    entries = [
        (inputs, '{"temperature":0.5,"name":"ünï"}', ["b", "a"]),
        (inputs[:1], "", None),
    ]
    header = encode_message(REQUEST, 2**40, entries, [0, 64, 2**33], flags=DECOUPLED)
    message = decode_message(memoryview(header))
    assert (message.kind, message.flags, message.id, message.released) == (
        REQUEST,
        DECOUPLED,
        2**40,
        [0, 64, 2**33],
    )
    (first, parameters, outputs), (second, no_parameters, all_outputs) = message.entries
    assert (parameters, outputs, no_parameters, all_outputs) == (
        '{"temperature":0.5,"name":"ünï"}',
        ["b", "a"],
        "",
        None,
    )
    assert allocated == [first[4][4]] and first[4][3] == first[4][4] and first[0][3] < 0
    for descriptor, (name, array) in zip(first, arrays.items(), strict=True):
        decoded = decode_tensor(descriptor, frames, arena)
        assert descriptor[0] == name and decoded.shape == array.shape and not decoded.flags.writeable
        if array.dtype == object:
            assert decoded.tolist() == [[b"a", b""], ["é".encode(), b"xyz"]]
        else:
            assert decoded.dtype == array.dtype and np.array_equal(decoded, array)
    assert second == first[:1]
    arena.close(unlink=True)


def test_inputs_that_lie_one_after_another_in_an_arena_join_without_a_copy(tmp_path):
    """What `@batch` gets for a batch's images: one array over their arena blocks, equal to their
    concatenation, read-only, and pinning every block until the last view of it is gone."""
    arena = Arena(str(tmp_path / "requests"), 1024 * 1024, create=True)
    frames: list = []
    allocated: list[int] = []
    images = [np.full((rows, 3, 8, 8), rows, np.float16) for rows in (1, 2, 1)]
    descriptors = [encode_tensor("image", image, frames, arena, allocated, 0) for image in images]
    released: list[int] = []
    parts = [decode_tensor(descriptor, frames, arena, released.append) for descriptor in descriptors]
    joined = join_adjacent(parts)
    assert joined is not None and np.array_equal(joined, np.concatenate(images))
    assert np.shares_memory(joined, arena.buffer) and not joined.flags.writeable
    rows = joined[1:3]
    del parts, joined
    assert released == []  # a view of the whole keeps every block
    del rows
    assert sorted(released) == sorted(allocated)
    arena.close(unlink=True)


def test_one_input_of_a_batch_crosses_in_one_block_pinned_until_its_last_array_is_gone(tmp_path):
    """A column: one allocation and one block to release for the whole batch's input, each request's
    array a slice of the whole, and the whole handed to `@batch` while the requests keep those arrays."""
    arena = Arena(str(tmp_path / "requests"), 1024 * 1024, create=True)
    frames: list = []
    allocated: list[int] = []
    images = [np.full((rows, 3, 8, 8), rows, np.float16) for rows in (1, 2, 1)]
    descriptors = encode_column("image", images, frames, arena, allocated, 0)
    assert len(allocated) == 1 and arena.used_blocks == 1 and frames == []
    assert {descriptor[3] for descriptor in descriptors} == set(allocated)
    small = [encode_tensor("n", np.array([row]), frames, arena, allocated) for row in range(3)]
    entries = [([image, n], "", None) for image, n in zip(descriptors, small, strict=True)]
    released: list[int] = []
    inputs, columns, pinned = decode_inputs(entries, frames, arena, released.append)
    assert pinned == {allocated[0]} and list(columns) == ["image"]
    assert [request["n"].tolist() for request in inputs] == [[0], [1], [2]]
    parts = [request["image"] for request in inputs]
    assert all(
        np.array_equal(part, image) and not part.flags.writeable
        for part, image in zip(parts, images, strict=True)
    )
    batch = RequestBatch([Request(request) for request in inputs], columns, [1, 2, 1])
    intact = batch.intact_columns()
    assert intact is not None and list(intact) == ["image"]  # "n" crossed inline: not a column
    whole = intact["image"]
    assert np.array_equal(whole, np.concatenate(images)) and not whole.flags.writeable
    assert all(np.shares_memory(part, whole) for part in parts)
    assert join_adjacent(parts[::-1]) is None and join_adjacent([*parts[:2], parts[2].copy()]) is None
    del batch[2]
    assert batch.intact_columns() is None
    del whole, intact, batch, columns, inputs
    last = parts.pop()
    del parts
    assert released == []  # one array of the column still pins the block
    del last
    assert released == allocated[:1]
    arena.close(unlink=True)


def test_a_batch_knows_its_columns_only_while_every_request_holds_what_it_came_with(tmp_path):
    """`intact_columns`: the whole arrays while each request holds the same names and the very arrays the
    worker made; None once any request changed, or where the batch has no sizes (a model without batching)."""
    arena = Arena(str(tmp_path / "requests"), 1024 * 1024, create=True)
    frames: list = []
    images = [np.full((rows, 2, 4), rows, np.float16) for rows in (1, 2, 1)]
    descriptors = encode_column("image", images, frames, arena, [], 0)
    entries = [([descriptor], "", None) for descriptor in descriptors]
    inputs, columns, _ = decode_inputs(entries, frames, arena, lambda block: None)

    def batch(sizes: list[int] | None = None) -> RequestBatch:
        return RequestBatch(
            [Request(dict(arrays)) for arrays in inputs], columns, [1, 2, 1] if sizes is None else sizes
        )

    whole = batch().intact_columns()
    assert whole is not None and np.array_equal(whole["image"], np.concatenate(images))
    assert RequestBatch([Request(dict(arrays)) for arrays in inputs], columns).intact_columns() is None
    replaced = batch()
    replaced[1]["image"] = replaced[1]["image"].copy()
    added = batch()
    added[2]["mask"] = np.ones((1, 2), bool)
    reordered = batch()
    reordered.reverse()
    dropped = batch()
    del dropped[0]
    swapped = batch()
    swapped[0] = {"image": swapped[0]["image"]}  # a dict instead of a Request
    for changed in (replaced, added, reordered, dropped, swapped):
        assert changed.intact_columns() is None
    arena.close(unlink=True)


@pytest.mark.parametrize("inline_limit", [1 << 20, 0], ids=["inline", "arena"])
def test_rows_of_a_whole_output_come_back_as_each_requests_array(tmp_path, inline_limit):
    """`decode_rows` undoes `encode_rows`: each request's rows of the one frame or block; descriptors that do
    not lie one after another in one place are left to `decode_tensor`."""
    arena = Arena(str(tmp_path / "responses"), 1024 * 1024, create=True)
    frames: list = []
    output = np.arange(4 * 3, dtype=np.int32).reshape(4, 3)
    column = encode_rows("y", output, [1, 2, 1], frames, arena, [], inline_limit)
    rows = decode_rows(column, frames, arena)
    assert rows is not None
    assert [part.tolist() for part in rows] == [
        output[:1].tolist(),
        output[1:3].tolist(),
        output[3:].tolist(),
    ]
    strided = np.arange(4 * 6, dtype=np.float16).reshape(4, 6)[:, ::3]  # a view, not contiguous
    rows = decode_rows(encode_rows("y", strided, [3, 1], frames, arena, [], inline_limit), frames, arena)
    assert rows is not None
    assert [part.tolist() for part in rows] == [strided[:3].tolist(), strided[3:].tolist()]
    apart = [encode_tensor("y", output[row : row + 1], frames, arena, [], inline_limit) for row in range(2)]
    assert decode_rows(apart, frames, arena) is None
    arena.close(unlink=True)


def test_batch_outputs_are_whole_only_while_every_response_holds_the_slices_made_of_them():
    outputs = {"y": np.arange(8).reshape(4, 2), "z": np.arange(4).reshape(4, 1)}
    split = SplitOutputs(outputs, [1, 3])
    assert [response["y"].tolist() for response in split] == [[[0, 1]], [[2, 3], [4, 5], [6, 7]]]
    assert split.whole() is outputs and split.sizes == [1, 3]
    rewritten = SplitOutputs(outputs, [1, 3])
    rewritten[1]["z"] = rewritten[1]["z"] * 2
    grown = SplitOutputs(outputs, [1, 3])
    grown[0]["extra"] = np.ones(1)
    replaced = SplitOutputs(outputs, [1, 3])
    replaced[0] = dict(replaced[0])
    for changed in (rewritten, grown, replaced):
        assert changed.whole() is None
    assert list(SplitOutputs({}, [1, 3])) == [{}, {}], "no output: a response, without outputs, per request"


def test_a_full_arena_says_whether_a_bigger_one_or_a_free_one_is_needed(tmp_path):
    arena = Arena(str(tmp_path / "requests"), 4096, create=True)
    with pytest.raises(ArenaFullError, match=r"arena of 4096 bytes \(a bigger one: KUBETRITON_ARENA_BYTES\)"):
        arena.allocate(5000)
    arena.allocate(3000)
    with pytest.raises(ArenaFullError, match=r"arena now \(1088 of 4096 bytes free\): .*keep a copy"):
        arena.allocate(2000)


def test_a_column_that_cannot_share_a_block_crosses_array_by_array(tmp_path):
    arena = Arena(str(tmp_path / "requests"), 4096, create=True)
    frames: list = []
    allocated: list[int] = []
    ragged = [np.arange(600, dtype=np.int32).reshape(2, 300), np.arange(30, dtype=np.int32).reshape(3, 10)]
    descriptors = encode_column("x", ragged, frames, arena, allocated, 100)
    assert len(allocated) == 1  # one block, the arrays copied one by one into it
    for descriptor, array in zip(descriptors, ragged, strict=True):
        assert np.array_equal(decode_tensor(descriptor, frames, arena), array)
    arena.reset()
    allocated.clear()
    small_and_large = [np.ones(10, np.float32), np.ones(100, np.float32)]
    descriptors = encode_column("x", small_and_large, frames, arena, allocated, 100)
    assert [descriptor[3] for descriptor in descriptors] == [frame_block(0), allocated[0]]
    arena.reset()
    allocated.clear()
    filler = arena.allocate(1024)
    arena.allocate(1024)
    arena.free(filler)  # free: 1024 bytes, then 2048 at the end, but no 3 KiB in one piece
    fragmented = [np.ones(256, np.float32), np.ones(512, np.float32)]
    descriptors = encode_column("x", fragmented, frames, arena, allocated, 100)
    assert len(allocated) == 2 and [d[3] for d in descriptors] == allocated
    for descriptor, array in zip(descriptors, fragmented, strict=True):
        assert np.array_equal(decode_tensor(descriptor, frames, arena), array)
    arena.close(unlink=True)


def test_inputs_that_do_not_lie_one_after_another_are_not_joined():
    def read_only(array: np.ndarray) -> np.ndarray:
        array.flags.writeable = False
        return array

    memory = read_only(np.arange(24, dtype=np.float32).reshape(6, 4))
    assert np.shares_memory(join_adjacent([memory[:2], memory[2:5]]), memory)
    for parts in (
        [memory[:2], memory[3:5]],  # a gap between them
        [memory[2:4], memory[:2]],  # out of order
        [memory[:2, :2], memory[2:4, :2]],  # not contiguous
        [np.ones((2, 4), np.float32), np.ones((2, 4), np.float32)],  # writable
        [memory[:2], read_only(memory[2:4].view(np.int32))],  # another dtype
        [memory[:2], read_only(memory[2:4].reshape(4, 2))],  # another sample shape
        [read_only(np.array([b"a", b"b"], dtype=object))],  # not numbers
        [np.frombuffer(bytes(68), np.float64, 2, offset) for offset in (4, 20)],  # not aligned
    ):
        assert join_adjacent(parts) is None


FREED_BATCH = """
import numpy as np
from kubetriton.transport import keep_freed_memory

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

if {keep}:
    keep_freed_memory()
for _ in range(3):
    images = [np.ones(3 * 224 * 224 * 2, np.uint8) for _ in range(16)]
    before = resident()
    del images
print(before - resident())
"""


@pytest.mark.parametrize("keep", [False, True])
def test_the_proxys_process_keeps_a_freed_batch_for_the_next(keep):
    """What the proxy's process does with the memory of a batch of 16 images once it is freed: glibc on
    its own returns it to the kernel each time (the next batch faults it in again); after
    `keep_freed_memory` the process keeps it."""
    returned = subprocess.run(
        [sys.executable, "-c", FREED_BATCH.format(keep=keep)], capture_output=True, text=True, check=True
    )
    batch_bytes = 16 * 3 * 224 * 224 * 2
    assert int(returned.stdout) == 0 if keep else int(returned.stdout) >= batch_bytes // 2


def test_strings_keep_every_byte_and_their_shape():
    """Trailing NULs, empty elements, bytes-like elements, str as UTF-8, and a list where one object
    appears twice (which `marshal` writes as a reference)."""
    same = b"twice\0"
    array = np.array([[same, b"", bytearray(b"\0\xff")], ["żółw", same, np.bytes_(b"np")]], dtype=object)
    decoded = deserialize_bytes(memoryview(serialize_bytes(array)), array.shape)
    assert decoded.dtype == object and decoded.shape == (2, 3)
    assert decoded.tolist() == [[same, b"", b"\0\xff"], ["żółw".encode(), same, b"np"]]
    assert all(type(item) is bytes for item in decoded.ravel())
    assert deserialize_bytes(serialize_bytes(np.empty((0, 4), dtype=object)), (0, 4)).shape == (0, 4)


def test_other_objects_in_a_string_tensor_travel_as_their_text():
    array = np.array([5, 300_000_000, 1.5, None, True], dtype=object)
    expected = [b"5", b"300000000", b"1.5", b"None", b"True"]  # as tritonclient serializes them
    assert deserialize_bytes(serialize_bytes(array), (5,)).tolist() == expected


@pytest.mark.parametrize(
    "data",
    [marshal.dumps([b"a", b"b"]), marshal.dumps((b"a", b"b", b"c")), marshal.dumps([b"a", "b", b"c"])],
    ids=["too few", "not a list", "not all bytes"],
)
def test_string_data_that_does_not_match_its_descriptor_fails_clearly(data):
    with pytest.raises(ValueError, match="not a list of 3 bytes objects"):
        deserialize_bytes(data, (1, 3))


@pytest.mark.parametrize(
    "kind, text", [(HELLO, "/dev/shm/a.req\0/dev/shm/a.resp"), (ERROR, "ValueError: nö"), (FINAL, "")]
)
def test_a_header_without_entries_carries_its_text(kind, text):
    message = decode_message(memoryview(encode_message(kind, 9, released=[128], text=text)))
    assert (message.kind, message.id, message.released, message.entries, message.text) == (
        kind,
        9,
        [128],
        (),
        text,
    )


def test_a_reply_header_carries_its_responses():
    frames: list = []
    outputs = [encode_tensor("y", np.full((3, 1), 2.5), frames, None, [])]
    message = decode_message(memoryview(encode_message(REPLY, 5, [outputs] * 2)))
    assert message.kind == REPLY and message.released == () and len(message.entries) == 2
    for (descriptor,) in message.entries:
        assert descriptor[:3] == ("y", "<f8", (3, 1))
        assert decode_tensor(descriptor, frames, None).tolist() == [[2.5]] * 3
    control = decode_message(memoryview(encode_message(CONTROL, 5, flags=CANCEL)))
    assert (control.kind, control.flags, control.id) == (CONTROL, CANCEL, 5)


def test_a_dtype_that_cannot_cross_is_refused():
    with pytest.raises(TypeError, match="cannot cross"):
        encode_tensor("when", np.array(["2026-11-26"], dtype="datetime64[ns]"), [], None, [])


def _send_later(hop: Hop, delay_s: float) -> threading.Thread:
    sender = threading.Thread(target=lambda: (time.sleep(delay_s), hop.send([b"soon"])))
    sender.start()
    return sender


def _single_requests_came_quickly(busy_poll: BusyPoll) -> None:
    for _ in range(SINGLES_BEFORE_POLLING):
        busy_poll.batch(1)
    busy_poll.waited(1_000)


def test_busy_poll_catches_a_message_that_comes_within_its_window(hops):
    proxy, worker = hops
    busy_poll = BusyPoll(window_us=2_000_000)
    _single_requests_came_quickly(busy_poll)
    sender = _send_later(proxy, 0.05)
    started = time.monotonic()
    ready = busy_poll.poll(worker.poller)
    sender.join()
    assert ready == [(worker.fileno(), select.POLLIN)]
    assert time.monotonic() - started < 1.0
    assert [bytes(frame) for frame in worker.receive()] == [b"soon"]


def test_busy_poll_gives_up_at_the_end_of_its_window(hops):
    _proxy, worker = hops
    busy_poll = BusyPoll(window_us=30_000)
    _single_requests_came_quickly(busy_poll)
    started = time.monotonic()
    assert busy_poll.poll(worker.poller) == []
    assert time.monotonic() - started >= 0.03


@pytest.mark.parametrize(
    ("window_us", "batches", "last_wait_ns"),
    [
        (2_000_000, [1] * SINGLES_BEFORE_POLLING, None),
        (2_000_000, [1] * SINGLES_BEFORE_POLLING, 3_000_000_000),
        (2_000_000, [1] * (SINGLES_BEFORE_POLLING - 1), 1_000),
        (2_000_000, [1] * SINGLES_BEFORE_POLLING + [2], 1_000),
        (0, [1] * SINGLES_BEFORE_POLLING, 0),
    ],
    ids=["nothing-waited-yet", "last-wait-too-long", "too-few-singles", "a-batch-of-two", "window-0"],
)
def test_busy_poll_does_not_poll_where_it_would_not_pay(hops, window_us, batches, last_wait_ns):
    _proxy, worker = hops
    busy_poll = BusyPoll(window_us)
    for requests in batches:
        busy_poll.batch(requests)
    if last_wait_ns is not None:
        busy_poll.waited(last_wait_ns)
    started = time.monotonic()
    assert busy_poll.poll(worker.poller) == []
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(("configured", "window_us"), [("0", 0), ("250", 250), (" 40 ", 40)])
def test_the_polling_window_can_be_set(monkeypatch, configured, window_us):
    monkeypatch.setenv(ENV_BUSY_POLL_US, configured)
    assert busy_poll_us() == window_us


@pytest.mark.parametrize("configured", ["-1", "fast", ""])
def test_a_polling_window_that_is_no_number_is_refused(monkeypatch, configured):
    monkeypatch.setenv(ENV_BUSY_POLL_US, configured)
    with pytest.raises(PyTritonValidationError, match=ENV_BUSY_POLL_US):
        busy_poll_us()


def test_the_worker_polls_for_2_ms_unless_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_BUSY_POLL_US, raising=False)
    assert busy_poll_us() == DEFAULT_BUSY_POLL_US == 2000
    settings = TransportSettings(tmp_path, tmp_path, 1024)
    assert settings.model_parameters("model", 1)[PARAM_BUSY_POLL_US] == "2000"


@pytest.mark.parametrize("value", ["256M", "-5", "0", ""])
def test_an_arena_size_that_is_not_a_number_of_bytes_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("KUBETRITON_ARENA_BYTES", value)
    with pytest.raises(PyTritonValidationError, match=f"KUBETRITON_ARENA_BYTES='{value}' is not a positive"):
        arena_bytes()
    monkeypatch.setenv("KUBETRITON_ARENA_BYTES", "4194304")
    assert arena_bytes() == 4194304


def test_sockets_fit_a_unix_path_for_the_longest_model_names():
    sockets = Path("/workspace/kubetriton/servers/0123456789abcdef/sockets")  # as deep as a pod's, and more
    settings = TransportSettings(sockets, sockets, 1024)
    longest, sibling = "M" * 128, "M" * 127 + "N"
    paths = [settings.hop_path(longest, 63), settings.hop_path(sibling, 63), settings.hop_path("add_sub", 0)]
    assert max(len(path) for path in paths) <= MAX_SOCKET_PATH
    assert len(set(paths)) == 3, "names that share a long prefix get sockets of their own"
    assert paths[2] == f"{sockets}/add_sub.0.hop", "a short name is the socket's name"
    assert settings.model_parameters(longest, 64)[PARAM_HOP_PATH] == settings.hop_path(longest, "{instance}")


@pytest.mark.parametrize(
    ("files", "window_ns"),
    [
        ({"cpu.max": "50000 100000\n"}, 0),
        ({"cpu.max": "150000 100000\n"}, 0),
        ({"cpu.max": "200000 100000\n"}, 2_000_000),
        ({"cpu.max": "max 100000\n"}, 2_000_000),
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2_000_000),
        ({}, 2_000_000),
    ],
    ids=["v2-half", "v2-1.5", "v2-2", "v2-none", "v1-1", "v1-none", "no-cgroup"],
)
def test_a_process_with_less_than_two_cpus_of_quota_never_polls(tmp_path, files, window_ns):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert BusyPoll(window_us=2_000, cgroup=str(tmp_path)).window_ns == window_ns


def test_a_process_that_may_run_on_one_cpu_never_polls():
    affinity = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(affinity)})
        assert BusyPoll(window_us=2_000).window_ns == 0
    finally:
        os.sched_setaffinity(0, affinity)


def test_busy_poll_stops_once_the_process_is_busy_elsewhere(hops):
    _proxy, worker = hops
    busy_poll = BusyPoll(window_us=2_000_000)
    _single_requests_came_quickly(busy_poll)
    another_thread_busy = threading.Event()
    started = time.monotonic()  # before the timer starts: it sets the event no sooner than 0.05 s after this
    threading.Timer(0.05, another_thread_busy.set).start()
    assert busy_poll.poll(worker.poller, busy_elsewhere=another_thread_busy.is_set) == []
    assert 0.05 <= time.monotonic() - started < 1.0


def _no_cpu_to_spare(tmp_path) -> str:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"9.00 9.00 9.00 {len(os.sched_getaffinity(0)) + 1}/900 4242\n")
    return str(loadavg)


def test_busy_poll_pauses_after_a_window_without_a_cpu_to_spare(hops, tmp_path):
    proxy, worker = hops
    busy_poll = BusyPoll(window_us=2_000_000, loadavg=_no_cpu_to_spare(tmp_path))
    _single_requests_came_quickly(busy_poll)
    sender = _send_later(proxy, 0.05)
    assert busy_poll.poll(worker.poller) == [(worker.fileno(), select.POLLIN)]  # this window still polls
    sender.join()
    worker.receive()
    proxy.send([b"waiting"])
    assert busy_poll.poll(worker.poller) == []  # the next one does not, though a message waits
    time.sleep(PAUSES_NS[0] / 1e9)
    assert busy_poll.poll(worker.poller) == [(worker.fileno(), select.POLLIN)]  # until the pause ends


def test_busy_poll_does_not_pause_after_a_window_too_short_to_tell(hops, tmp_path):
    """A message that came at once says nothing about the machine: the chain that delivered it may have
    kept every CPU busy for those few microseconds."""
    proxy, worker = hops
    busy_poll = BusyPoll(window_us=2_000_000, loadavg=_no_cpu_to_spare(tmp_path))
    _single_requests_came_quickly(busy_poll)
    for _ in range(3):
        proxy.send([b"at once"])
        assert busy_poll.poll(worker.poller) == [(worker.fileno(), select.POLLIN)]
        worker.receive()


def test_busy_poll_pauses_twice_as_long_when_the_machine_is_still_busy_after_a_pause(hops, tmp_path):
    proxy, worker = hops
    busy_poll = BusyPoll(window_us=1_000, loadavg=_no_cpu_to_spare(tmp_path))
    _single_requests_came_quickly(busy_poll)
    assert busy_poll.poll(worker.poller) == []  # a window without a spare CPU: a pause of PAUSES_NS[0]
    time.sleep(PAUSES_NS[0] / 1e9)
    assert busy_poll.poll(worker.poller) == []  # another, right after the pause: twice as long
    proxy.send([b"waiting"])
    time.sleep(PAUSES_NS[0] / 1e9)
    assert busy_poll.poll(worker.poller) == []
    time.sleep(PAUSES_NS[0] / 1e9)
    assert busy_poll.poll(worker.poller) == [(worker.fileno(), select.POLLIN)]


def test_busy_poll_pauses_where_other_processes_keep_every_cpu_busy(hops):
    """The real count: one busy loop per CPU, and the poller itself, leave no CPU to spare."""
    proxy, worker = hops
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        time.sleep(0.2)  # the busy loops run
        busy_poll = BusyPoll(window_us=20_000)
        _single_requests_came_quickly(busy_poll)
        assert busy_poll.poll(worker.poller) == []
        proxy.send([b"waiting"])
        assert busy_poll.poll(worker.poller) == []  # paused, though a message waits
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_a_worker_refuses_a_proxy_of_another_wire_version_with_a_message_for_each_request():
    """A proxy from another kubetriton release (the sidecar's runtime comes from the init step's image):
    every request it sends fails with what to do, and the worker goes on serving proxies of its own."""
    folder = Path(tempfile.mkdtemp(prefix="kt-wire-", dir="/tmp"))
    spec = ModelSpec(
        "m",
        (Tensor(name="x", shape=(1,), dtype=np.float32),),
        (Tensor(name="y", shape=(1,), dtype=np.float32),),
        ModelConfig(max_batch_size=8),
        1,
    )
    settings = TransportSettings(sockets_dir=folder, arena_dir=folder, arena_bytes=1 << 20, busy_poll_us=0)
    with echo_server(spec, settings):
        assert read_hello(hello_text("a.req", "a.resp")) == ("a.req", "a.resp")
        x = np.ones((1, 1), np.float32)
        for hello, theirs in (
            ("/dev/shm/a.req\0/dev/shm/a.resp", "an older version"),
            ("1\0a\0b", "version 1"),
        ):
            with pytest.raises(ValueError, match=theirs):
                read_hello(hello)
            deadline = time.monotonic() + 10
            while not os.path.exists(settings.hop_path("m", 0)) and time.monotonic() < deadline:
                time.sleep(0.01)
            hop = Hop.connect(settings.hop_path("m", 0))
            frames: list = []
            hop.send([encode_message(HELLO, text=hello)])
            for request_id in (7, 8):
                entries = [([encode_tensor("x", x, frames, None, [])], "", None)]
                hop.send([encode_message(REQUEST, request_id, entries), *frames])
                assert hop.readable(10_000), "the worker did not answer"
                reply = decode_message(hop.receive()[0])
                assert (reply.kind, reply.id) == (ERROR, request_id)
                assert f"speaks {theirs} of kubetriton's wire format" in reply.text
                assert "spec.bootstrap.image" in reply.text
            hop.close()
        arenas = [Arena(str(folder / name), 1 << 20, create=True) for name in ("a.req", "a.resp")]
        hop = Hop.connect(settings.hop_path("m", 0))
        hop.send([encode_message(HELLO, text=hello_text(*(arena.path for arena in arenas)))])
        frames = []
        hop.send(
            [encode_message(REQUEST, 9, [([encode_tensor("x", x, frames, None, [])], "", None)]), *frames]
        )
        assert hop.readable(10_000), "the worker did not answer"
        answer = hop.receive()
        reply = decode_message(answer[0])
        assert (reply.kind, reply.id) == (REPLY, 9)
        assert decode_tensor(reply.entries[0][0], answer[1:], arenas[1]).tolist() == [[1.0]]
        hop.close()


ECHO = ModelSpec(
    "m",
    (Tensor(name="x", shape=(-1,), dtype=np.uint8),),
    (Tensor(name="y", shape=(-1,), dtype=np.uint8),),
    ModelConfig(max_batch_size=8),
    1,
)


@pytest.fixture
def short_folder() -> Iterator[Path]:
    """A new folder with a path short enough for the sockets below it (pytest's `tmp_path` may not be)."""
    folder = Path(tempfile.mkdtemp(prefix="kt-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def echo_instance(folder: Path) -> Iterator[TransportSettings]:
    """An instance server of ECHO, whose callable returns its input, every tensor crossing through an arena
    (an inline limit of 0), its sockets in `folder`/sockets and its arenas in `folder`/arenas."""
    settings = TransportSettings(
        sockets_dir=folder / "sockets",
        arena_dir=folder / "arenas",
        arena_bytes=1 << 20,
        inline_limit=0,
        busy_poll_us=0,
    )
    settings.sockets_dir.mkdir()
    settings.arena_dir.mkdir()
    with echo_server(ECHO, settings):
        yield settings


@contextlib.contextmanager
def echo_server(spec: ModelSpec, settings: TransportSettings) -> Iterator[InstanceServer]:
    """A started instance server of `spec` whose callable returns its input `x` as `y`."""
    server = InstanceServer(
        spec,
        0,
        lambda requests: [{"y": r["x"]} for r in requests],
        settings,
        debug=False,
        on_unrecoverable=print,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.join(10)


def _send_hello_and_a_request(hop: Hop, requests_path: str, responses_path: str, nbytes: int) -> None:
    """A HELLO naming these arenas, then a request whose input is the first `nbytes` of the request arena."""
    hop.send([encode_message(HELLO, text=hello_text(requests_path, responses_path))])
    descriptor = ("x", np.dtype(np.uint8).str, (1, nbytes), 0, 0, nbytes)
    hop.send([encode_message(REQUEST, 1, [([descriptor], "", None)])])


AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="another user's file or process needs root to make")


def _named_arenas(case: str, folder: Path) -> tuple[Path, Path]:
    """What a HELLO names as its request and response arenas: `folder`/secret and `folder`/victim, which
    lie outside the arena directory `folder`/arenas, or entries inside it that lead to them."""
    targets = (folder / "secret", folder / "victim")
    if case == "outside":
        return targets
    if case == "up-and-out":
        return folder / "arenas/../secret", folder / "arenas/../victim"
    inside = (folder / "arenas" / "a.req", folder / "arenas" / "a.resp")
    for entry, target in zip(inside, targets, strict=True):
        if case == "symbolic-links-inside":
            os.symlink(target, entry)
        elif case == "hard-links-inside":
            os.link(target, entry)
        else:  # another user's files inside
            os.rename(target, entry)
            os.chown(entry, 65534, 65534)
    return inside


@pytest.mark.parametrize(
    "case",
    [
        "outside",
        "up-and-out",
        "symbolic-links-inside",
        "hard-links-inside",
        pytest.param("another-users-files-inside", marks=AS_ROOT),
    ],
)
def test_a_hello_naming_arenas_that_are_not_the_workers_is_refused_and_nothing_is_read_or_written(
    case, short_folder, caplog
):
    """Whoever reaches a hop could name any file as an arena: the worker would map the "request arena" and
    answer with what it holds, and write its answer into the "response arena". Only regular files of the
    worker's user with one link, right inside the arena directory it told Triton, opened without following
    a link, are taken; otherwise every request fails with the reason, which the worker also logs."""
    folder = short_folder
    secret, victim = b"root-only secret", b"must stay as it is; " * 4
    with echo_instance(folder) as settings:
        (folder / "secret").write_bytes(secret)
        (folder / "victim").write_bytes(victim)
        requests_path, responses_path = _named_arenas(case, folder)
        hop = Hop.connect(settings.hop_path("m", 0))
        with caplog.at_level(logging.ERROR, logger="kubetriton.worker"):
            _send_hello_and_a_request(hop, str(requests_path), str(responses_path), len(secret))
            assert hop.readable(10_000), "the worker did not answer"
            answer = hop.receive()
        hop.close()
    reply = decode_message(answer[0])
    assert (reply.kind, reply.id) == (ERROR, 1), "the worker served from a file that is not its arena"
    assert str(requests_path) in reply.text and "arena" in reply.text
    assert not any(secret in bytes(frame) for frame in answer)
    assert responses_path.read_bytes() == victim
    assert requests_path.read_bytes() == secret
    assert str(requests_path) in caplog.text


def _as_another_user(hop_path: str, messages: list[list[bytes]]) -> str:
    """What a process of user 65534 gets once it has sent `messages` through the hop at `hop_path`:
    "answered", or "dropped" when the worker ended the connection. A fork, not a new interpreter, which
    that user may not be allowed to run."""
    readable, writable = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # about forking a process with threads
        pid = os.fork()
    if pid == 0:  # the child makes system calls only, then exits without the parent's clean-ups
        try:
            os.setgid(65534)
            os.setuid(65534)
            hop = Hop.connect(hop_path)
            try:
                for frames in messages:
                    hop.send(frames)
                outcome = b"dropped" if hop.receive() is None else b"answered"
            except OSError:
                outcome = b"dropped"
        except BaseException as error:
            outcome = repr(error).encode()
        os.write(writable, outcome)
        os._exit(0)
    os.close(writable)
    os.waitpid(pid, 0)
    with os.fdopen(readable, "rb") as result:
        return result.read().decode()


@AS_ROOT
def test_the_hop_drops_a_process_of_another_user(short_folder, caplog):
    """A hop socket that another user can reach (its directory and mode open to others, as a umask of 000
    left them) still serves no process of theirs: the worker drops the connection as it accepts it, before
    reading anything, and logs whose it was; its own user's processes are served."""
    folder = short_folder
    with echo_instance(folder) as settings, caplog.at_level(logging.WARNING, logger="kubetriton.worker"):
        arenas = [Arena(str(settings.arena_dir / name), 1 << 16, create=True) for name in ("a.req", "a.resp")]
        hop_path = settings.hop_path("m", 0)
        for path in (folder, settings.sockets_dir, Path(hop_path)):
            os.chmod(path, 0o777)
        hello = [encode_message(HELLO, text=hello_text(*(arena.path for arena in arenas)))]
        request = [
            encode_message(REQUEST, 1, [([("x", "|u1", (1, 1), frame_block(0), 0, 1)], "", None)]),
            b"\x07",
        ]
        assert _as_another_user(hop_path, [hello, request]) == "dropped"
        own = Hop.connect(hop_path)
        own.send(hello)
        own.send(request)
        assert own.readable(10_000), "the worker did not answer"
        assert decode_message(own.receive()[0]).kind == REPLY
        own.close()
    assert "user 65534" in caplog.text
