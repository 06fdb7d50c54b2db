"""The client's exceptions."""

from __future__ import annotations

import grpc


class InputClientError(Exception):
    """Base of the client's errors."""


class StreamError(InputClientError):
    """The server ended the stream with an error: `code` is the gRPC status, `details` its text."""

    def __init__(self, code: grpc.StatusCode, details: str):
        self.code = code
        self.details = details
        super().__init__(f"{code.name}: {details}")


class SequenceError(InputClientError):
    """A batch arrived out of sequence (a gap or a repeat): data would be lost or duplicated."""
