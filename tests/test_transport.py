"""The hop between a proxy instance and its worker instance, over real Unix sockets."""

from __future__ import annotations

import socket

import pytest
from kubetriton.transport import HOP_DATAGRAM_BYTES, Hop


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
