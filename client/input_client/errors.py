"""The client's exceptions: every error a user's mistake raises is of a class defined here.

Their `__module__` is this public module, so a traceback names `input_client.errors.SpecError`
(also `input_client.SpecError`), never the private module that raised it.
"""

from __future__ import annotations

import re
from typing import Any

import grpc


class InputClientError(Exception):
    """Base of the client's errors."""


class SpecError(InputClientError, ValueError):
    """A spec key holds a value that cannot work; `key` is the dotted key, e.g. `batch.size`;
    `file` the spec file it was read from (`PipelineSpec.from_toml`), else None.

    A ValueError too: code written before the package base caught it as one.
    """

    def __init__(self, key: str, value: Any, reason: str, *, file: str | None = None):
        self.key = key
        self.value = value
        self.reason = reason
        self.file = file
        shown = repr(value)
        if len(shown) > 80:  # a 5,000-digit number is named, not printed
            shown = f"{shown[:40]}...{shown[-20:]} ({len(shown)} characters)"
        where = f"{file}: " if file else ""
        super().__init__(f"{where}`{key}` {reason}, got {shown}.")

    def in_file(self, file: str) -> SpecError:
        """This error, said of the spec file `file`, with no traceback of its own: the
        checks' frames say nothing to the user, whose mistake is the file's line."""
        return SpecError(self.key, self.value, self.reason, file=file)


class StreamError(InputClientError):
    """The server ended the stream with an error: `code` is the gRPC status, `details` its text."""

    def __init__(self, code: grpc.StatusCode, details: str):
        self.code = code
        self.details = details
        super().__init__(f"{code.name}: {details}")


# How the server names a spec key first in an INVALID_ARGUMENT's details (the same words as
# `SpecError`'s): "`tokenizer.model` ... is not a sentencepiece model", "`source[2]` does not fit".
_SPEC_KEY = re.compile(r"`((?:source|mixture|tokenizer|batch|order|shard|workers)[\w.\[\]]*)`")


class ServerSpecError(StreamError, SpecError):
    """The server refused the spec (INVALID_ARGUMENT naming a spec key): a value that cannot
    work with the server's files, e.g. a `tokenizer.model` that is no model. A `StreamError`
    (its `code` and `details`) and a `SpecError` (its `key`; `value` is None: the details
    name it), so `except input_client.SpecError` catches a spec mistake wherever it was found.
    """

    def __init__(self, code: grpc.StatusCode, details: str, *, key: str):
        self.key = key
        self.value = None
        self.code = code
        self.details = details
        # Not StreamError's __init__: its super() here is SpecError's, of other arguments.
        InputClientError.__init__(self, f"{code.name}: {details}")


def stream_error(code: grpc.StatusCode, details: str) -> StreamError:
    """The error of a stream the server ended with `code` and `details`: a `ServerSpecError`
    where the server refused a spec key's value, else a `StreamError`."""
    found = _SPEC_KEY.match(details or "")
    if code == grpc.StatusCode.INVALID_ARGUMENT and found:
        return ServerSpecError(code, details, key=found.group(1))
    return StreamError(code, details)


class SequenceError(InputClientError):
    """A batch arrived out of sequence (a gap or a repeat): data would be lost or duplicated."""


class ReconnectError(StreamError):
    """The stream broke and the server stayed unreachable for the whole reconnect deadline.

    `code` and `details` are those of the last failure; the iterator's `get_state()` still
    holds the position after the last batch yielded, to resume from once the server is back.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        *,
        address: str,
        waited_s: float,
        attempts: int,
        deadline_s: float,
    ):
        self.code = code
        self.details = details
        self.address = address
        self.waited_s = waited_s
        self.attempts = attempts
        InputClientError.__init__(
            self,
            f"gave up reconnecting to {address!r} after {waited_s:.1f} s and {attempts} "
            f"attempt{'' if attempts == 1 else 's'} (reconnect_deadline_s={deadline_s:g}); "
            f"the last error was "
            f"{code.name}: {details} Resume later with `state=` the iterator's "
            f"get_state(), or allow a longer `reconnect_deadline_s`.",
        )
