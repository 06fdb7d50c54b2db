"""What a plain-text reader calls a document: a line without its "\\n" or "\\r\\n", blank lines
skipped, exactly the documents `input-server tokenizer train` reads from the same file; and
the blank-line rule holds across the chunks a large file is looked at in."""

from __future__ import annotations

import gzip
import random

import pytest

from input_server.data.text_lines import TextReader
from input_server.data.tokenizers.corpus_trainer import texts
from input_server.errors import RecordError
from tests.support import write_bytes, zst_multiframe

MESSY = (
    b"\n  \t\r\n"
    b"first line\r\n"
    b"  leading and trailing spaces  \n"
    b"\x0c \n"
    b"tab\tinside\r\n"
    b"\r\n"
    b"\xc2\xa0\n"  # a no-break space: not ASCII whitespace, a document for both readers
    b"caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x99\x82\n"
    b"a \r in the middle\n"
    b"\n\n"
    b"no final newline"
)
DOCUMENTS = [
    "first line",
    "  leading and trailing spaces  ",
    "tab\tinside",
    "\u00a0",
    "caf\u00e9 \u2014 \U0001f642",
    "a \r in the middle",
    "no final newline",
]


@pytest.mark.parametrize("suffix", ["txt", "txt.gz", "txt.zst"])
def test_documents_are_lines_without_their_ending_blank_lines_skipped(suffix, tmp_path):
    data = {"txt": MESSY, "txt.gz": gzip.compress(MESSY), "txt.zst": zst_multiframe(MESSY)}
    path = write_bytes(tmp_path / f"messy.{suffix}", data[suffix])
    reader = TextReader(path, max_decompressed=1 << 20)
    assert reader.read_many(list(range(len(reader)))) == DOCUMENTS
    assert [reader[i] for i in range(len(reader))] == DOCUMENTS
    assert reader.where(0) == f"{path} line 3" and reader.where(6) == f"{path} line 13"


def test_tokenizer_train_reads_the_same_documents(tmp_path):
    """`tokenizer train` keeps each line's ending (it trains line by line); without it, its
    documents are the server's."""
    path = write_bytes(tmp_path / "messy.txt", MESSY)
    trained = [
        t.removesuffix("\n").removesuffix("\r") for t in texts(path, fmt="text", text_field="text")
    ]
    reader = TextReader(path)
    assert trained == reader.read_many(list(range(len(reader))))


def test_empty_and_blank_files_hold_no_documents(tmp_path):
    assert len(TextReader(write_bytes(tmp_path / "empty.txt", b""))) == 0
    assert len(TextReader(write_bytes(tmp_path / "blank.txt", b"\n \r\n\t\n"))) == 0


def test_blank_lines_across_chunk_boundaries_match_a_line_by_line_reading(tmp_path):
    """~12 MB of lines of every length, blank runs among them: the chunked rule (4 MiB at a
    time, lines cut across chunks) keeps exactly the lines `bytes.strip` finds non-blank."""
    rng = random.Random(7)
    rows = []
    size = 0
    while size < 12 << 20:
        kind = rng.random()
        if kind < 0.3:
            row = rng.choice([b"", b" ", b"\t \r", b"\x0b\x0c", b" " * rng.randrange(1, 3000)])
        elif kind < 0.35:
            row = b" " * rng.randrange(0, 2 << 20) + b"x" + b" " * rng.randrange(0, 3000)
        else:
            row = b"w" * rng.randrange(1, 200)
        rows.append(row)
        size += len(row) + 1
    data = b"\n".join(rows)
    path = write_bytes(tmp_path / "big.txt", data)
    reader = TextReader(path)
    want = [r.removesuffix(b"\r").decode() for r in data.split(b"\n") if r.strip()]
    assert len(reader) == len(want) and reader.read_many(list(range(len(reader)))) == want


def test_bad_utf8_names_the_file_and_line(tmp_path):
    path = write_bytes(tmp_path / "latin1.txt", b"fine\n\ncaf\xe9\n")
    reader = TextReader(path, name="data/latin1.txt")
    assert reader[0] == "fine"
    with pytest.raises(RecordError, match=r"^data/latin1.txt line 3: not UTF-8 text"):
        reader[1]
