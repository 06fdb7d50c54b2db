"""The one rule for showing text a client wrote (paths, labels, spec fields, peer names) in
the server's log, `GetInfo`, `info` and `stats`: every character Python's `repr` would escape
is written as its escape, so no client can start a line, move a terminal's cursor or hide
text in what an operator reads.

A glob such as `docs.json[l\\nI1206 FAKE-LOG-LINE \\x1b[31m]` still matches its file, and its
stream's label once wrote a forged log line and a raw ESC byte into the text log; U+2028,
U+2029 and NEL split a JSON record for line splitters. Escaped: C0 and C1 controls (ESC, CR,
LF, NEL...), the line and paragraph separators, format controls (bidi overrides, zero-width
characters), surrogates, unassigned and private-use code points and spaces other than
U+0020 (everything `str.isprintable` rejects).
"""

from __future__ import annotations

import numbers
import traceback
from collections.abc import Mapping
from typing import Any

from google.protobuf.message import Message

# The short forms an operator reads at a glance; everything else is \xNN, \uNNNN, \UNNNNNNNN.
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote(text: object) -> str:
    """`text` (or `str(text)`) with every unprintable character escaped.

    A backslash is left as it is, so quoting is idempotent: each output (the log, GetInfo,
    `info`) may quote what it shows without doubling what another already quoted. A client can
    make a literal `\\n` look like an escaped newline, never a line.
    """
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():  # the common case, at C speed
        return s
    return "".join(c if c.isprintable() else _escape(c) for c in s)


def _escape(c: str) -> str:
    short = _SHORT.get(c)
    if short is not None:
        return short
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


class Quoted:
    """A log argument shown quoted: `%s` gives `quote(str(value))`, `%r` `quote(repr(value))`."""

    __slots__ = ("value",)

    def __init__(self, value: object):
        self.value = value

    def __str__(self) -> str:
        return quote(self.value)

    def __repr__(self) -> str:
        return quote(repr(self.value))


def safe_arg(value: Any) -> Any:
    """A log record's argument as the log shows it: numbers as they are (`%d`, `%.1f` still
    apply), anything else quoted."""
    if value is None or isinstance(value, numbers.Number):
        return value
    return Quoted(value)


def message(msg: object, args: Any) -> str:
    """A log record's message (`LogRecord.getMessage`) with its arguments quoted. The format
    string is the server's own code; a message that is not a string is quoted whole."""
    text = msg if isinstance(msg, str) else quote(msg)
    if not args:
        return text
    if isinstance(args, Mapping):  # `log.info("%(name)s", {"name": ...})`
        return text % {k: safe_arg(v) for k, v in args.items()}
    return text % tuple(safe_arg(a) for a in args)


def exception_lines(exc_info) -> str:
    """A traceback whose exception messages (which may repeat a client's path) are one quoted
    line each, and whose other lines (the server's own frames) are quoted line by line: no
    line of it can pass for a log record."""
    _, exc, _ = exc_info
    chunks = traceback.format_exception(*exc_info)
    messages = set()
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # every exception the chain prints
        seen.add(id(exc))
        messages.update(traceback.format_exception_only(type(exc), exc))
        exc = exc.__cause__ or exc.__context__
    out = []
    for chunk in chunks:
        if chunk in messages:
            out.append(quote(chunk.rstrip("\n")))
        else:
            out.extend(quote(line) for line in chunk.rstrip("\n").split("\n"))
    return "\n".join(out)


def quote_value(value: Any) -> Any:
    """A JSON log field's value with its text quoted, inside lists and mappings too."""
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, Mapping):
        return {quote(k): quote_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [quote_value(v) for v in value]
    if value is None or isinstance(value, bool | numbers.Number):
        return value
    return quote(value)  # a path, an enum: its text, as `json.dumps(default=str)` wrote it


def quote_message(message: Message) -> Message:
    """A protobuf `message` with every string in it quoted, in place (nested messages, repeated
    fields and map keys and values too); returns it. `GetInfo` answers with it and `info` and
    `stats` show it, whatever the server they ask."""
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _quote_map(field, value)
        elif isinstance(value, Message):
            quote_message(value)
        elif isinstance(value, str):
            if not value.isprintable():
                setattr(message, field.name, quote(value))
        elif field.message_type is not None:  # a repeated message field
            for m in value:
                quote_message(m)
        elif field.type == field.TYPE_STRING:  # a repeated string field
            quoted = [quote(v) for v in value]
            if quoted != list(value):
                del value[:]
                value.extend(quoted)
    return message


def quoted_copy(message: Message) -> Message:
    """A copy of `message` with every string quoted (`quote_message`); `message` unchanged."""
    copy = type(message)()
    copy.CopyFrom(message)
    return quote_message(copy)


def _quote_map(field, value) -> None:
    value_field = field.message_type.fields_by_name["value"]
    is_message = value_field.message_type is not None
    for key in list(value):
        if is_message:
            quote_message(value[key])
        elif value_field.type == value_field.TYPE_STRING:
            value[key] = quote(value[key])
        if isinstance(key, str) and not key.isprintable():
            if is_message:
                value[quote(key)].CopyFrom(value[key])
            else:
                value[quote(key)] = value[key]
            del value[key]
