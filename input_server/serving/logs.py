"""`serve --log-format text|json`: one record a line, stream events with their fields, and
every value a client may have written quoted (`input_server.quoting`).

A stream event is a record logged with `extra={"event": NAME, "fields": {...}}` (`stream_open`,
`stream_switch`, `stream_verdict`, `stream_end`): its line carries `event` and the fields beside
the standard keys (`time`, `level`, `logger`, `message`, and `traceback` with an exception).

Both formats show a record's arguments quoted (a stream's label, a path, a peer), and its
traceback with each exception message on one quoted line: a client's glob once wrote a forged
line and a raw ESC into the text log. JSON may carry U+2028, U+2029 and NEL raw, which line
splitters (and JavaScript before ES2019) take for line ends: the JSON lines escape them, and
every other character `quote` would, as JSON escapes.
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import re
import sys
import threading
from typing import TextIO

from input_server import quoting

FORMATS = ("text", "json")
STANDARD = ("time", "level", "logger", "message")
# The text log's lines (`input_server.cli.main` configures logging with it).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """The text log's lines: `main`'s format, with the record's arguments and its traceback's
    exception messages quoted."""

    def format(self, record: logging.LogRecord) -> str:
        # What `logging.Formatter.format` does, but quoting where it would call getMessage
        # and formatException (the record itself is left as it is for other handlers).
        record.message = quoting.message(record.msg, record.args)
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = self.formatMessage(record)
        if record.exc_info:
            text += "\n" + quoting.exception_lines(record.exc_info)
        elif record.exc_text:
            text += "\n" + quoting.quote(record.exc_text)
        if record.stack_info:  # the server's own frames
            text += "\n" + self.formatStack(record.stack_info)
        return text

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return quoting.exception_lines(ei)


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON; a field named like a standard key is dropped (the
    standard keys are what every reader of the log relies on)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": quoting.message(record.msg, record.args),
        }
        event = getattr(record, "event", None)
        if event is not None:
            line["event"] = str(event)
            fields = getattr(record, "fields", None) or {}
            line.update(
                (quoting.quote(k), quoting.quote_value(v))
                for k, v in fields.items()
                if k not in line
            )
        if record.exc_info:
            line["traceback"] = quoting.exception_lines(record.exc_info)
        elif record.exc_text:
            line["traceback"] = quoting.quote(record.exc_text)
        # default=str: a field of another type (a path, an enum) is written as its text.
        return json_escaped(json.dumps(line, default=str, ensure_ascii=False))


def json_escaped(line: str) -> str:
    """A JSON text with every character `quote` escapes written as a JSON escape: json.dumps
    leaves U+2028, U+2029, NEL and the other C1 and format controls raw (JSON allows them).
    Outside strings a JSON text has only ASCII punctuation, so each is inside a string, where
    the escape means the same character."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else _json_escape(c) for c in line)


def _json_escape(c: str) -> str:
    n = ord(c)
    if n < 0x10000:
        return f"\\u{n:04x}"
    n -= 0x10000  # beyond the BMP: a surrogate pair, as JSON spells it
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def configure(log_format: str) -> None:
    """Formats every record of the root logger's handlers (`main`'s basicConfig) as
    `log_format`, quoted; Python's warnings go through logging too (quoted, and no plain line
    is left on stderr among the JSON ones).

    With "json", whatever else Python writes to `sys.stderr` is a JSON line too: the CLI's
    one-line refusals (`input-server: ...`), a drain cut short, an uncaught exception's
    traceback (one record, logged). What C code writes to file descriptor 2 itself (gRPC's
    core at GRPC_VERBOSITY=ERROR) does not pass through Python and is not rewritten.
    """
    if log_format not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}, got {log_format!r}.")
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig()
    for handler in root.handlers:
        if log_format == "json":
            handler.setFormatter(JsonFormatter())
        else:
            handler.setFormatter(TextFormatter(TEXT_FORMAT))
    logging.captureWarnings(True)
    if log_format == "json":
        json_stderr()


def json_stderr() -> None:
    """Makes every line Python writes to `sys.stderr` a JSON line (`JsonLines`), and an
    uncaught exception one logged record; the CLI calls it before parsing its arguments when
    they ask for JSON, so even a usage error is JSON. Idempotent."""
    if isinstance(sys.stderr, JsonLines):
        return
    sys.stderr = JsonLines(sys.stderr)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


# A glog-style line (gRPC's and absl's C++ logs, absl's Python handler): its level's letter.
_GLOG = re.compile(r"[IWEF]\d{4} ")
_GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
STRAY_LOGGER = "stderr"


def json_line(line: str) -> str:
    """`line` if it is a JSON object already, else a JSON record of it (logger "stderr"):
    a glog line's letter gives its level, the CLI's `input-server: ...` lines are errors
    (refusals, a drain cut short), any other WARNING."""
    if line.startswith("{"):
        try:
            if isinstance(json.loads(line), dict):
                return line
        except ValueError:
            pass
    if _GLOG.match(line):
        level = _GLOG_LEVELS[line[0]]
    elif line.startswith("input-server: "):
        level = "ERROR"
    else:
        level = "WARNING"
    record = {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
        "level": level,
        "logger": STRAY_LOGGER,
        "message": line,
    }
    return json_escaped(json.dumps(record, ensure_ascii=False))


class JsonLines(io.TextIOBase):
    """`sys.stderr` under `--log-format json`: each line written is passed through
    `json_line` to `target`, at once (a process that ends with `os._exit` loses none)."""

    def __init__(self, target: TextIO):
        self._target = target
        self._partial = ""  # a line's start, until its newline
        self._lock = threading.Lock()  # lines written by several threads stay whole

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            for line in lines:
                if line.strip():
                    self._target.write(json_line(line.rstrip("\r")) + "\n")
            if lines:
                self._target.flush()
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def fileno(self) -> int:  # faulthandler writes there itself, plain: a dying process
        return self._target.fileno()

    def isatty(self) -> bool:
        return self._target.isatty()

    @property
    def encoding(self) -> str:
        return self._target.encoding


def _log_uncaught(exc_type, exc, tb) -> None:
    logging.getLogger("input_server").critical("uncaught exception", exc_info=(exc_type, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("input_server").error(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )
