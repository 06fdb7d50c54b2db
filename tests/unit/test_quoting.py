"""The one quoting rule (`input_server.quoting`) and the log formatters that apply it: every
control, separator and format character escaped, nothing else touched, quoting twice the same
as once, and a JSON line that splits nowhere but reads back as the same record."""

from __future__ import annotations

import json
import logging
import sys
import unicodedata

from input_client.proto import pb
from input_server.quoting import exception_lines, message, quote, quote_message
from input_server.serving.logs import TEXT_FORMAT, JsonFormatter, TextFormatter

LINE_BREAKERS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def test_every_control_separator_and_format_character_is_escaped():
    unsafe = [
        chr(n)
        for n in range(sys.maxunicode + 1)
        if unicodedata.category(chr(n)) in ("Cc", "Cf", "Zl", "Zp", "Cs")
    ]
    assert len(unsafe) > 2000  # surrogates alone are 2,048
    for c in unsafe:
        assert quote(c).startswith("\\") and quote(c).isascii(), repr(c)
    text = "".join(LINE_BREAKERS) + "\x1b[31m\u202e\u200b"
    assert len(quote(text).splitlines()) == 1 and "\x1b" not in quote(text)


def test_printable_text_is_left_alone_and_quoting_twice_is_quoting_once():
    for text in ("docs/part-0001.jsonl", "données/中文 語料.parquet", "a\\nb", "x y"):
        assert quote(text) == text
    hostile = "docs.json[l\nI1206 FAKE-LOG-LINE \x1b[31m]\u2028"
    assert quote(hostile) == "docs.json[l\\nI1206 FAKE-LOG-LINE \\x1b[31m]\\u2028"
    assert quote(quote(hostile)) == quote(hostile)


def test_log_arguments_are_quoted_and_numbers_keep_their_formats():
    got = message("stream %d (%s) %r %.1f %s", (3, "a\nb", "c\x1bd", 2.25, None))
    assert got == "stream 3 (a\\nb) 'c\\x1bd' 2.2 None"
    assert message("%(who)s", {"who": "p\u2029"}) == "p\\u2029"


def test_a_traceback_keeps_each_exception_message_on_one_quoted_line():
    try:
        try:
            raise ValueError("no file\nI1206 FAKE-LOG-LINE")
        except ValueError as e:
            raise KeyError("k\x1b") from e
    except KeyError:
        text = exception_lines(sys.exc_info())
    lines = text.split("\n")
    assert "ValueError: no file\\nI1206 FAKE-LOG-LINE" in lines
    assert not any(line.startswith("I1206") for line in lines) and "\x1b" not in text


def _record(msg, *args, exc_info=None, **extra) -> logging.LogRecord:
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, msg, args, exc_info)
    record.__dict__.update(extra)
    return record


def test_the_text_log_writes_a_hostile_record_on_one_line():
    line = TextFormatter(TEXT_FORMAT).format(_record("stream 1 (%s)", "a\nI1206 x\x1b\u2028"))
    assert len(line.splitlines()) == 1 and line.endswith("(a\\nI1206 x\\x1b\\u2028)")


def test_a_json_line_escapes_the_separators_and_reads_back_as_the_record():
    fields = {"pipeline": "a\u2028b\x85c\u2029\x1b", "n": 3, "paths": ["p\n"]}
    line = JsonFormatter().format(_record("stream %s", "\u2028", event="e", fields=fields))
    assert len(line.splitlines()) == 1 and not any(c in line for c in LINE_BREAKERS), line
    record = json.loads(line)
    assert record["pipeline"] == quote(fields["pipeline"]) and record["n"] == 3
    assert record["paths"] == ["p\\n"] and record["message"] == "stream \\u2028"


def test_a_message_is_quoted_throughout_map_keys_and_repeated_fields_too():
    info = pb.GetInfoResponse(streams=[pb.StreamInfo(pipeline="a\nb", worker_reason="ok")])
    info.pipelines["p\x1b"].source.paths.extend(["x\u2028y", "fine"])
    quote_message(info)
    assert info.streams[0].pipeline == "a\\nb" and info.streams[0].worker_reason == "ok"
    assert list(info.pipelines) == ["p\\x1b"]
    assert list(info.pipelines["p\\x1b"].source.paths) == ["x\\u2028y", "fine"]
