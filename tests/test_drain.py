"""What a stopping worker counts as clients still connected to Triton, read from the kernel's TCP tables."""

from __future__ import annotations

import socket
from pathlib import Path

from kubetriton.drain import client_connections, request_sidecar_stop

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _table(path: Path, *rows: tuple[str, str, str]) -> Path:
    lines = [
        f"   {n}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  1000 0 1"
        for n, (local, remote, state) in enumerate(rows)
    ]
    path.write_text(HEADER + "\n".join(lines) + "\n")
    return path


def test_counts_established_connections_from_other_hosts_to_the_ports(tmp_path: Path) -> None:
    ipv4 = _table(
        tmp_path / "tcp",
        ("00000000:1F40", "00000000:0000", "0A"),  # Triton listening on 8000
        ("0201000A:1F40", "0501000A:C350", "01"),  # 10.0.1.2:8000 <- 10.0.1.5: a client
        ("0201000A:1F41", "0601000A:C351", "01"),  # gRPC from another pod
        ("0100007F:1F40", "0100007F:D000", "01"),  # the worker's own, over loopback
        ("0201000A:1F40", "0701000A:C352", "06"),  # TIME_WAIT: gone already
        ("0201000A:1F42", "0501000A:C353", "01"),  # metrics (8002) are not a client of the model
    )
    ipv6 = _table(
        tmp_path / "tcp6",
        ("00000000000000000000000000000000:1F40", "00000000000000000000000001000000:D001", "01"),  # ::1
        ("0000000000000000FFFF00000201000A:1F40", "0000000000000000FFFF00000100007F:D002", "01"),  # loopback
        ("0000000000000000FFFF00000201000A:1F41", "0000000000000000FFFF00000501000A:D003", "01"),  # mapped
    )
    assert client_connections([8000, 8001], [ipv4, ipv6]) == 3
    assert client_connections([8000], [ipv4, ipv6]) == 1


def test_unknown_when_no_table_can_be_read(tmp_path: Path) -> None:
    assert client_connections([8000], [tmp_path / "absent"]) is None


def test_sees_a_real_connection_from_another_address_but_not_over_loopback() -> None:
    with socket.create_server(("0.0.0.0", 0)) as server:
        port = server.getsockname()[1]
        before = client_connections([port])
        with socket.create_connection(("127.0.0.1", port)):
            assert client_connections([port]) == before == 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as route:
            route.connect(("10.255.255.255", 1))
            address = route.getsockname()[0]
        with socket.create_connection((address, port), source_address=(address, 0)):
            accepted, _ = server.accept()
            with accepted:
                assert client_connections([port]) == (0 if address.startswith("127.") else 1)


def test_asking_a_sidecar_that_is_not_there_to_stop(tmp_path: Path) -> None:
    assert request_sidecar_stop(tmp_path / "absent") is False
