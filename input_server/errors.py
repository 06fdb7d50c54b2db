"""The server's exceptions; the servicer maps each to one gRPC status code."""

from __future__ import annotations


class InputServerError(Exception):
    """Base of every error the server reports to a client by message (no traceback on the wire)."""


class InvalidSpecError(InputServerError):
    """The spec or resume state cannot work (INVALID_ARGUMENT)."""


class DataNotFoundError(InputServerError):
    """A named file, glob, model or pipeline does not exist (NOT_FOUND)."""


class RecordError(InputServerError):
    """A record failed to decode; the message names the file and the record (DATA_LOSS)."""
