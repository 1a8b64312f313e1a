"""Triton server URLs as PyTriton's clients accept them: the runtime's parser, with the client's error.

`kubetriton.endpoint` parses the URLs of clients and of the serving side alike; a URL it refuses becomes a
`PyTritonClientInvalidUrlError` here, as PyTriton's clients raise.
"""

from __future__ import annotations

from kubetriton import endpoint
from kubetriton.endpoint import Endpoint

from pytriton.client.exceptions import PyTritonClientInvalidUrlError

__all__ = ["Endpoint", "parse_url"]


def parse_url(url: str) -> Endpoint:
    """`localhost`, `host:port`, `http://host:port` or `grpc://host:port` (also `https`, `grpcs`), as
    `kubetriton.endpoint.parse_url` reads it; PyTritonClientInvalidUrlError for any other."""
    try:
        return endpoint.parse_url(url)
    except ValueError as error:
        raise PyTritonClientInvalidUrlError(str(error)) from None
