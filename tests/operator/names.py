"""A DNS server for one name, on a local UDP port: the part of a cluster's DNS that the router reads.

A cluster's DNS answers the name of a headless Service with the address of each Ready pod; the test
changes `addresses` as pods come and go. It answers A queries for its name with them (NXDOMAIN while
there are none), any other type of query for its name with no records, and any other name with NXDOMAIN.
"""

from __future__ import annotations

import socket
import struct
import threading

A, IN = 1, 1
NOERROR, NXDOMAIN = 0, 3


def _question(packet: bytes) -> tuple[str, int, int]:
    """The queried name, its type, and where the question ends."""
    labels, at = [], 12
    while packet[at]:
        length = packet[at]
        labels.append(packet[at + 1 : at + 1 + length].decode().lower())
        at += 1 + length
    qtype = struct.unpack("!H", packet[at + 1 : at + 3])[0]
    return ".".join(labels), qtype, at + 5


class NameServer:
    """Answers `name` with `addresses` until stopped."""

    def __init__(self, name: str) -> None:
        self.name = name.lower().rstrip(".")
        self.addresses: list[str] = []
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.1)
        self.port = self.socket.getsockname()[1]
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> NameServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        self._thread.join()
        self.socket.close()

    def answer(self, packet: bytes) -> bytes:
        name, qtype, end = _question(packet)
        ident, flags = struct.unpack("!HH", packet[:4])
        records = [
            struct.pack("!HHHIH", 0xC00C, A, IN, 1, 4) + socket.inet_aton(address)
            for address in (list(self.addresses) if name == self.name and qtype == A else [])
        ]
        code = NOERROR if name == self.name and (records or qtype != A) else NXDOMAIN
        header = struct.pack("!HHHHHH", ident, 0x8480 | (flags & 0x0100) | code, 1, len(records), 0, 0)
        return header + packet[12:end] + b"".join(records)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                packet, sender = self.socket.recvfrom(4096)
            except TimeoutError:
                continue
            self.socket.sendto(self.answer(packet), sender)
