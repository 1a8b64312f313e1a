"""The access token of a Triton whose endpoints a `TritonSecurityConfig` restricts, as request headers.

Triton checks a restricted endpoint's header by name: over HTTP the `triton-access-token` header, over gRPC
the metadata `triton-grpc-protocol-triton-access-token` (Triton prefixes the names it reads from gRPC
metadata). The clients build these headers from their `access_token`; code that calls `tritonclient`
itself can do the same with `create_auth_headers`.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubetriton.podenv import ACCESS_TOKEN_HEADER, GRPC_RESTRICTED_PREFIX

from pytriton.settings import carriable_token

GRPC_ACCESS_TOKEN_HEADER = GRPC_RESTRICTED_PREFIX + ACCESS_TOKEN_HEADER


def create_auth_headers(access_token: str | None, protocol: str) -> dict[str, str]:
    """The headers that carry `access_token` over `protocol` ("http" or "grpc"); ValueError for an empty
    token, one that a header cannot carry (the message does not show it: it would end in a log), or another
    protocol."""
    if not access_token:
        raise ValueError("access_token must be a non-empty string")
    if not carriable_token(access_token):
        raise ValueError(
            "access_token must be visible ASCII characters only (no space, no control character such as a "
            "newline): it is sent in an HTTP header or gRPC metadata"
        )
    if protocol.lower() == "http":
        return {ACCESS_TOKEN_HEADER: access_token}
    if protocol.lower() == "grpc":
        return {GRPC_ACCESS_TOKEN_HEADER: access_token}
    raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")


def extract_access_token_from_headers(headers: Mapping[str, str] | None) -> str | None:
    """The access token in headers made by `create_auth_headers` for either protocol, or None; ValueError
    when both forms are present with different tokens."""
    headers = headers or {}
    http_token, grpc_token = headers.get(ACCESS_TOKEN_HEADER), headers.get(GRPC_ACCESS_TOKEN_HEADER)
    if http_token is not None and grpc_token is not None and http_token != grpc_token:
        raise ValueError(f"{ACCESS_TOKEN_HEADER} and {GRPC_ACCESS_TOKEN_HEADER} carry different tokens")
    return http_token or grpc_token
