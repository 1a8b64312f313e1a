"""Triton server URLs as PyTriton's clients accept them, parsed into what tritonclient takes.

The runtime reaches its Triton by such URLs (`TritonControl`) and finds a local server by the one a
`RemoteTriton` was given (`server.find_published`); the clients parse theirs here too, through
`pytriton.client._url`, which turns a bad URL's ValueError into the client's own error. Only the standard
library is imported, so that the serving side needs no tritonclient.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "https": 443, "grpcs": 443}


@dataclass(frozen=True)
class Endpoint:
    """A parsed server URL: `protocol` is "http" or "grpc"; `address` is what tritonclient takes."""

    protocol: str
    host: str
    port: int
    path: str
    ssl: bool

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}{self.path}"

    @property
    def url(self) -> str:
        scheme = self.protocol + ("s" if self.ssl else "")
        return f"{scheme}://{self.address}"


def parse_url(url: str) -> Endpoint:
    """`localhost`, `host:port`, `http://host:port` or `grpc://host:port` (also `https`, `grpcs`).

    Without a scheme, HTTP is used; without a port, 8000 for HTTP and 8001 for gRPC (443 with TLS).
    ValueError says what is wrong with any other.
    """
    if not isinstance(url, str) or not url.strip() or any(char.isspace() for char in url.strip()):
        raise ValueError(f"Invalid Triton URL {url!r}: expected e.g. 'localhost:8000'")
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parsed = urllib.parse.urlsplit(text)
    scheme = parsed.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(
            f"Invalid Triton URL {url!r}: scheme {parsed.scheme!r} (use http, https, grpc, grpcs)"
        )
    try:
        port = parsed.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"Invalid Triton URL {url!r}: the port is not in 1-65535")
    if not parsed.hostname:
        raise ValueError(f"Invalid Triton URL {url!r}: no host")
    if parsed.query or parsed.fragment or parsed.username or parsed.password:
        raise ValueError(f"Invalid Triton URL {url!r}: credentials, query or fragment given")
    path = parsed.path.rstrip("/")
    protocol = "grpc" if scheme.startswith("grpc") else "http"
    if path and protocol == "grpc":
        raise ValueError(f"Invalid Triton URL {url!r}: a gRPC URL has no path")
    return Endpoint(
        protocol=protocol,
        host=parsed.hostname,
        port=port if port is not None else DEFAULT_PORTS[scheme],
        path=path,
        ssl=scheme.endswith("s"),
    )
