"""Every error the server reports, and the one place that maps an exception to a gRPC status.

README's status table is the contract: each class below has its status, and anything else a
stream meets is INTERNAL with the exception's type and message (never UNKNOWN, which is what
gRPC sends for an exception that escapes a servicer).
"""

from __future__ import annotations

import errno
import signal

import grpc

from input_client.spec import SpecError


class InputServerError(Exception):
    """Base of every error the server reports to a client by message (no traceback on the wire)."""


class InvalidSpecError(InputServerError):
    """The spec or resume state cannot work (INVALID_ARGUMENT)."""


class DataNotFoundError(InputServerError):
    """A named file, glob, model or pipeline does not exist (NOT_FOUND)."""


class UnreadableError(InputServerError):
    """A named file exists but the server may not read it (PERMISSION_DENIED)."""


class NotAFileError(UnreadableError, InvalidSpecError):
    """A path inside the data roots names a folder where a file is expected: the spec's
    mistake (INVALID_ARGUMENT, as InvalidSpecError comes first in `_STATUS`), not a
    permission. An UnreadableError too: code that looks for a file or a folder (a Hugging
    Face `tokenizer.model`) catches it as one."""


class RecordError(InputServerError):
    """A record failed to decode; the message names the file and the record (DATA_LOSS)."""


class CorruptFileError(RecordError):
    """A file's bytes are damaged (DATA_LOSS), as opposed to records that do not fit the spec."""


class WorkerDiedError(InputServerError):
    """A worker process of the stream died (INTERNAL); the message names it."""


class CancelledError(InputServerError):
    """The client left (cancelled, deadline passed) while the stream was being set up
    (CANCELLED); nobody reads this status, but the work for it stops."""


class OverBudgetError(InputServerError):
    """The data would take more of the server than a flag allows (RESOURCE_EXHAUSTED): a
    compressed file expanding past --max-decompressed-mb; the message names file and flag."""


class RefusedError(InputServerError):
    """A request the servicer refuses with a status of its choosing (RESOURCE_EXHAUSTED,
    UNAVAILABLE, FAILED_PRECONDITION): about the server's state, not the data."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


_STATUS: dict[type[BaseException], grpc.StatusCode] = {
    InvalidSpecError: grpc.StatusCode.INVALID_ARGUMENT,
    SpecError: grpc.StatusCode.INVALID_ARGUMENT,
    DataNotFoundError: grpc.StatusCode.NOT_FOUND,
    UnreadableError: grpc.StatusCode.PERMISSION_DENIED,
    RecordError: grpc.StatusCode.DATA_LOSS,
    WorkerDiedError: grpc.StatusCode.INTERNAL,
    CancelledError: grpc.StatusCode.CANCELLED,
    OverBudgetError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}

# The process (EMFILE) or the host (ENFILE) is out of file descriptors: the server's state,
# not the request's mistake, so a client may retry; wherever it happens (a reader, a worker's
# pipe, shared memory), never INTERNAL.
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


# A status message travels in the response's trailing metadata, which gRPC limits (8 KiB by
# default): a longer one reaches the client as RESOURCE_EXHAUSTED instead of its status. A
# request's own words (a 1 MB pipeline name, a long path) are echoed cut to fit.
MAX_MESSAGE_CHARS = 1000


def _fit(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return (
        f"{message[: MAX_MESSAGE_CHARS - 300]} ... {message[-200:]} (message cut from "
        f"{len(message)} characters)"
    )


def shorten(text: str, limit: int = 200) -> str:
    """A request's own words (a name, a path) cut to about `limit` characters for a message."""
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...{text[-(limit // 2 - 20) :]} ({len(text)} characters)"


def status_of(e: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and message a client sees for `e`: the error's own words, never a traceback,
    at most about MAX_MESSAGE_CHARS long.

    Unexpected exceptions are INTERNAL, named by type so the server's log can be searched.
    """
    if isinstance(e, RefusedError):
        return e.code, _fit(str(e))
    if _out_of_descriptors(e):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, _fit(
            f"the server is out of file descriptors ({_words(e)}); retry shortly, "
            f"or ask the operator to raise its `ulimit -n` or lower its --max-open-files."
        )
    for cls, code in _STATUS.items():
        if isinstance(e, cls):
            return code, _fit(str(e))
    return grpc.StatusCode.INTERNAL, _fit(_words(e))


def _words(e: BaseException) -> str:
    """An unexpected exception's type and message; an OSError's without the file it names
    (a real path, which may lie behind a link the client must not learn of)."""
    if isinstance(e, OSError) and e.strerror:
        return f"{type(e).__name__}: [Errno {e.errno}] {e.strerror}"
    return f"{type(e).__name__}: {e}"


def _out_of_descriptors(e: BaseException | None) -> bool:
    """Whether `e`, or an exception it was raised from (`raise ... from`), is EMFILE or ENFILE.

    Only the explicit cause: an error raised while an EMFILE was being handled (its
    `__context__`: a spec refused, a client that left) is that error, not the EMFILE.
    """
    for _ in range(8):  # a cause chain is short; a cycle must not loop forever
        if e is None:
            return False
        if isinstance(e, OSError) and e.errno in _OUT_OF_DESCRIPTORS:
            return True
        e = e.__cause__
    return False


def exit_words(code: int) -> str:
    """A process's exit code in words: `exit code -9 (killed by SIGKILL)`."""
    if code < 0:
        try:
            return f"exit code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"
