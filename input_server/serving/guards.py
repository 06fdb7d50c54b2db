"""The servicer's one guard: every exception a call raises becomes its documented status
(`errors.status_of`), never UNKNOWN and never a traceback on the wire."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from input_server.errors import (
    InputServerError,
    InvalidSpecError,
    status_of,
)

log = logging.getLogger("input_server.serving.service")

# What a guard lets through: a generator being closed (the client left) and a stop asked of the
# process. Everything else, BaseException included (a Rust library's panic arrives as pyo3's
# PanicException, a BaseException, which gRPC would send as UNKNOWN), gets its status.
_PASS = (GeneratorExit, KeyboardInterrupt, SystemExit)


def _abort(context: grpc.ServicerContext, e: BaseException) -> None:
    code, message = status_of(e)
    unexpected = code == grpc.StatusCode.INTERNAL and not isinstance(e, InputServerError)
    # A call the client already left fails wherever it was (its request iterator raises):
    # nobody reads that status, and it is no server error worth a traceback.
    if unexpected and context.is_active():
        log.warning("request failed: %s", message, exc_info=e)
    context.abort(code, message)


def parsed(kind: type, request: Any) -> Any:
    """The request message; it arrives as bytes (`add_to_server`), parsed here so that one
    that does not parse gets its status from the guard."""
    if not isinstance(request, bytes):
        return request
    try:
        return kind.FromString(request)
    except DecodeError as e:
        raise InvalidSpecError(
            f"the request is not a valid {kind.DESCRIPTOR.name} message ({e})."
        ) from None


def guard_stream(method: Callable) -> Callable:
    """The choke point of a streaming method: any exception becomes its status."""

    @functools.wraps(method)
    def guarded(self, requests, context):
        try:
            yield from method(self, requests, context)
        except _PASS:
            raise
        except BaseException as e:  # noqa: BLE001 - every exception gets its status here
            _abort(context, e)

    return guarded


def guard_unary(kind: type) -> Callable[[Callable], Callable]:
    """The choke point of a unary method taking a `kind` message: any exception becomes its
    status."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def guarded(self, request, context):
            try:
                return method(self, parsed(kind, request), context)
            except _PASS:
                raise
            except BaseException as e:  # noqa: BLE001 - every exception gets its status here
                _abort(context, e)

        return guarded

    return wrap
