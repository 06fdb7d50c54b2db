"""`serve --log-format json`: one JSON object a line, stream events with their fields.

A stream event is a record logged with `extra={"event": NAME, "fields": {...}}` (`stream_open`,
`stream_switch`, `stream_verdict`, `stream_end`): its line carries `event` and the fields beside
the standard keys (`time`, `level`, `logger`, `message`, and `traceback` with an exception).
"""

from __future__ import annotations

import datetime
import json
import logging

FORMATS = ("text", "json")
STANDARD = ("time", "level", "logger", "message")


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
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if event is not None:
            line["event"] = str(event)
            fields = getattr(record, "fields", None) or {}
            line.update((str(k), v) for k, v in fields.items() if k not in line)
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["traceback"] = record.exc_text
        # default=str: a field of another type (a path, an enum) is written as its text.
        return json.dumps(line, default=str, ensure_ascii=False)


def configure(log_format: str) -> None:
    """Formats every record of the root logger's handlers (`main`'s basicConfig) as
    `log_format`; json also routes Python's warnings through logging, so that no plain line
    is left on stderr among the JSON ones."""
    if log_format not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}, got {log_format!r}.")
    if log_format == "text":
        return
    formatter = JsonFormatter()
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig()
    for handler in root.handlers:
        handler.setFormatter(formatter)
    logging.captureWarnings(True)
