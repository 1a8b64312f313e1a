"""The hop between a proxy instance and its worker instance, over real Unix sockets, and its headers."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from kubetriton.transport import (
    CANCEL,
    CONTROL,
    DECOUPLED,
    ERROR,
    FINAL,
    HELLO,
    HOP_DATAGRAM_BYTES,
    REPLY,
    REQUEST,
    Arena,
    Hop,
    decode_message,
    decode_tensor,
    encode_message,
    encode_request_entry,
    encode_response_entry,
    encode_tensor,
)


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
    """Every field of a REQUEST survives the binary header: names (not ASCII too), dtypes, ranks from 0,
    inline and arena tensors, parameters, requested outputs and released blocks."""
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
        encode_request_entry(inputs, '{"temperature":0.5,"name":"ünï"}', ["b", "a"]),
        encode_request_entry(inputs[:1], "", ()),
    ]
    header = encode_message(REQUEST, 2**40, entries, [0, 64, 2**33], flags=DECOUPLED)
    message = decode_message(memoryview(header))
    assert (message.kind, message.flags, message.id, message.released) == (
        REQUEST,
        DECOUPLED,
        2**40,
        (0, 64, 2**33),
    )
    (first, parameters, outputs), (second, no_parameters, all_outputs) = message.entries
    assert (parameters, outputs, no_parameters, all_outputs) == (
        '{"temperature":0.5,"name":"ünï"}',
        ["b", "a"],
        "",
        None,
    )
    assert allocated == [first[4][4]] and first[4][3] and not first[0][3]
    for descriptor, (name, array) in zip(first, arrays.items(), strict=True):
        decoded = decode_tensor(descriptor, frames, arena)
        assert descriptor[0] == name and decoded.shape == array.shape and not decoded.flags.writeable
        if array.dtype == object:
            assert decoded.tolist() == [[b"a", b""], ["é".encode(), b"xyz"]]
        else:
            assert decoded.dtype == array.dtype and np.array_equal(decoded, array)
    assert second == first[:1]
    arena.close(unlink=True)


@pytest.mark.parametrize(
    "kind, text", [(HELLO, "/dev/shm/a.req\0/dev/shm/a.resp"), (ERROR, "ValueError: nö"), (FINAL, "")]
)
def test_a_header_without_entries_carries_its_text(kind, text):
    message = decode_message(memoryview(encode_message(kind, 9, released=[128], text=text)))
    assert (message.kind, message.id, message.released, message.entries, message.text) == (
        kind,
        9,
        (128,),
        [],
        text,
    )


def test_a_reply_header_carries_its_responses():
    frames: list = []
    outputs = [encode_tensor("y", np.full((3, 1), 2.5), frames, None, [])]
    message = decode_message(memoryview(encode_message(REPLY, 5, [encode_response_entry(outputs)] * 2)))
    assert message.kind == REPLY and message.released == () and len(message.entries) == 2
    for (descriptor,) in message.entries:
        assert descriptor[:3] == ("y", np.dtype(np.float64), (3, 1))
        assert decode_tensor(descriptor, frames, None).tolist() == [[2.5]] * 3
    control = decode_message(memoryview(encode_message(CONTROL, 5, flags=CANCEL)))
    assert (control.kind, control.flags, control.id) == (CONTROL, CANCEL, 5)


def test_a_dtype_that_cannot_cross_is_refused():
    with pytest.raises(TypeError, match="cannot cross"):
        encode_tensor("when", np.array(["2026-11-26"], dtype="datetime64[ns]"), [], None, [])
