"""What the operator's log says about an API server that stops answering for a while: one WARNING
when it starts, one INFO when it ends, no ERROR for the retries that succeed; and the operator
carries on with what changed meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import eventually
from emulator import ClusterEmulator
from test_operator_cli import write_kubeconfig
from test_operator_reconciler import create_model, model_document, stored

pytestmark = pytest.mark.asyncio

UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class FlakyProxy:
    """A TCP proxy in front of the emulator that can play an API server outage: every open
    connection is cut, and every new one answered 503, until the outage ends."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.down = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> FlakyProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        self.outage_starts()

    def outage_starts(self) -> None:
        self.down = True
        for writer in list(self._writers):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            await reader.read(65536)
            writer.write(UNAVAILABLE)
            await writer.drain()
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)
        self._writers -= {writer, up_writer}


@contextlib.asynccontextmanager
async def operator_through(url: str, tmp_path: Path) -> AsyncIterator[list[str]]:
    """The operator as a process whose API server is at `url`; yields its log lines once stopped."""
    config = write_kubeconfig(tmp_path / "kubeconfig", url)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubetriton.cli",
        "operator",
        env={**os.environ, "KUBECONFIG": str(config)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    lines: list[str] = []
    try:
        yield lines
    finally:
        process.send_signal(signal.SIGTERM)
        _, errors = await asyncio.wait_for(process.communicate(), 30)
        lines.extend(errors.decode().splitlines())
        print("\n".join(lines))  # shown by pytest when the test fails


async def test_an_outage_is_one_warning_and_one_info(cluster: ClusterEmulator, tmp_path: Path) -> None:
    async with FlakyProxy(cluster.servers[0].port) as proxy, operator_through(proxy.url, tmp_path) as log:
        await create_model(cluster, model_document("before"))
        await eventually(lambda: stored(cluster, "v1/services", "before"), timeout=30)
        proxy.outage_starts()
        await create_model(cluster, model_document("during"))
        await asyncio.sleep(6)
        proxy.down = False
        await eventually(
            lambda: stored(cluster, "v1/services", "during"),
            timeout=30,
            message="the model created during the outage is reconciled after it",
        )
    warnings = [line for line in log if "WARNING" in line and "does not answer" in line]
    infos = [line for line in log if "INFO" in line and "answers again" in line]
    assert len(warnings) == 1 and len(infos) == 1, "\n".join(log)
    assert log.index(warnings[0]) < log.index(infos[0])
    assert [line for line in log if "ERROR" in line or "Traceback" in line] == []
    assert not any("Request attempt" in line for line in log)
    # The emulator has no ServiceMonitor CRD: a fact of the cluster, said at INFO.
    assert not any("Unresolved resources" in line for line in log), "\n".join(log)
    monitors = "servicemonitors.monitoring.coreos.com is not installed"
    assert any("INFO" in line and monitors in line for line in log), "\n".join(log)
