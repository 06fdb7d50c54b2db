"""Document sources through the pipeline: every file format gives the same batches, many files
and globs, messy lines, and errors that name the file and the record."""

from __future__ import annotations

import gzip
import json
import os
import random
import re

import pytest

from input_server.batching.pipeline import Pipeline
from input_server.data.jsonl import JsonlReader
from input_server.errors import DataNotFoundError, InvalidSpecError, RecordError
from tests.support import (
    FORMATS,
    assert_same_batches,
    example_bytes,
    jsonl_bytes,
    run_pipeline,
    split3,
    write_arrayrecord,
    write_bytes,
    write_format,
    write_parquet,
    zst_multiframe,
)


@pytest.fixture(scope="module")
def plain(some_docs, tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("plain")
    return write_bytes(d / "plain.jsonl", jsonl_bytes(some_docs))


@pytest.fixture(scope="module")
def plain_batches(make_spec, plain):
    out = run_pipeline(make_spec(source={"paths": [plain]}))
    assert len(out) > 10
    return out


# ---------------------------------------------------------------------------------------------
# 1. Every format, the same batches


@pytest.mark.parametrize("kind", [k for k in FORMATS if k != "jsonl-plain"])
def test_format_gives_byte_identical_batches_to_plain_jsonl(
    kind, some_docs, make_spec, plain_batches, tmp_path
):
    """Same documents in any format (shuffled, custom text_field) -> the plain-jsonl batches."""
    _, source = write_format(kind, some_docs, tmp_path)
    assert_same_batches(run_pipeline(make_spec(source=source)), plain_batches)


def test_shuffle_seed_changes_batches_so_format_comparison_is_not_vacuous(
    make_spec, plain, plain_batches
):
    """Another seed gives other batches: the format comparison would notice a reordering."""
    other = run_pipeline(make_spec(source={"paths": [plain]}, order={"seed": 1}))
    assert any(
        a.arrays["inputs"].tobytes() != b.arrays["inputs"].tobytes()
        for a, b in zip(other, plain_batches, strict=False)
    )


# ---------------------------------------------------------------------------------------------
# 2. Many files and globs


@pytest.mark.parametrize(
    "how", ["glob-sorted-by-path", "explicit-list", "recursive-glob", "glob-with-an-empty-file"]
)
def test_files_read_in_path_order_match_one_file(how, some_docs, make_spec, plain, tmp_path):
    """Docs split over 3 files (written out of order) read as one file with all docs in order."""
    parts = split3(some_docs)
    names = ["b-0.jsonl", "b-1.jsonl", "b-2.jsonl"]
    if how == "recursive-glob":
        names = ["x/b-0.jsonl", "x/y/b-1.jsonl", "z/b-2.jsonl"]
    paths = [str(tmp_path / n) for n in names]
    for i in (2, 0, 1):  # creation order differs from path order
        os.makedirs(os.path.dirname(paths[i]), exist_ok=True)
        write_bytes(paths[i], jsonl_bytes(parts[i]))
    if how == "glob-with-an-empty-file":
        write_bytes(tmp_path / "b-0a.jsonl", b"")  # sorts between b-0 and b-1, holds nothing
    source_paths = {
        "glob-sorted-by-path": [str(tmp_path / "b-*.jsonl")],
        "explicit-list": paths,
        "recursive-glob": [str(tmp_path / "**" / "*.jsonl")],
        "glob-with-an-empty-file": [str(tmp_path / "b-*.jsonl")],
    }[how]
    order = {"shuffle": False}
    got = run_pipeline(make_spec(source={"paths": source_paths}, order=order))
    assert_same_batches(got, run_pipeline(make_spec(source={"paths": [plain]}, order=order)))


# ---------------------------------------------------------------------------------------------
# 3. Blank lines, CRLF, no final newline


def messy_jsonl(docs) -> bytes:
    """CRLF endings, blank lines ("\\n", "\\r\\n") at the start, between and at the end."""
    out = [b"\r\n", b"\n"]
    for i, line in enumerate(jsonl_bytes(docs, newline="\r\n").splitlines(keepends=True)):
        out.append(line)
        if i % 7 == 0:
            out.append(b"\r\n" if i % 2 else b"\n\n")
    out.append(b"\r\n\n")
    return b"".join(out)


@pytest.mark.parametrize("compress", ["plain", "gz"])
def test_blank_lines_and_crlf_are_skipped(compress, some_docs, make_spec, plain_batches, tmp_path):
    """A file with blank lines and CRLF endings gives the batches of the clean file."""
    data = messy_jsonl(some_docs)
    name = "messy.jsonl"
    if compress == "gz":
        data, name = gzip.compress(data), name + ".gz"
    path = write_bytes(tmp_path / name, data)
    assert len(JsonlReader(path, "text")) == len(some_docs)
    assert_same_batches(run_pipeline(make_spec(source={"paths": [path]})), plain_batches)


@pytest.mark.parametrize("ending", ["lf", "crlf"])
def test_last_line_without_newline_is_read(ending, some_docs, make_spec, plain_batches, tmp_path):
    """A final line with no newline after it is still a record."""
    nl = "\r\n" if ending == "crlf" else "\n"
    data = jsonl_bytes(some_docs, newline=nl)[: -len(nl)]
    assert not data.endswith(b"\n")
    path = write_bytes(tmp_path / "no-final-newline.jsonl", data)
    reader = JsonlReader(path, "text")
    assert len(reader) == len(some_docs)
    assert reader[len(reader) - 1] == some_docs[-1]
    assert_same_batches(run_pipeline(make_spec(source={"paths": [path]})), plain_batches)


# ---------------------------------------------------------------------------------------------
# 4. Errors name the file and the record


def test_corrupt_json_line_mid_file_raises_record_error_with_line(some_docs, make_spec, tmp_path):
    """A bad line in the middle: RecordError naming the path and the file's line number."""
    lines = jsonl_bytes(some_docs[:100]).splitlines(keepends=True)
    lines[40] = b'{"id": 40, "text": "unterminated\n'
    data = b"\n\n" + b"".join(lines)  # two blank lines first: the bad line is line 43
    path = write_bytes(tmp_path / "corrupt.jsonl", data)
    with pytest.raises(RecordError, match=re.escape(f"{path} line 43:")) as info:
        run_pipeline(make_spec(source={"paths": [path]}))
    assert "not valid JSON" in str(info.value)


def test_record_missing_text_field_mid_file_names_field(some_docs, make_spec, tmp_path):
    """A record without the text field: RecordError naming path, line, field and its keys."""
    lines = jsonl_bytes(some_docs[:100]).splitlines(keepends=True)
    lines[57] = json.dumps({"id": 57, "title": "no text here"}).encode() + b"\n"
    path = write_bytes(tmp_path / "missing-field.jsonl", b"".join(lines))
    with pytest.raises(RecordError) as info:
        run_pipeline(make_spec(source={"paths": [path]}))
    msg = str(info.value)
    assert f"{path} line 58:" in msg and "'text'" in msg and "id, title" in msg


def test_non_string_text_mid_file_is_a_record_error(some_docs, make_spec, tmp_path):
    """A text field holding a number: RecordError naming the line and the type."""
    lines = jsonl_bytes(some_docs[:100]).splitlines(keepends=True)
    lines[10] = b'{"id": 10, "text": 12345}\n'
    path = write_bytes(tmp_path / "number.jsonl", b"".join(lines))
    with pytest.raises(RecordError, match=re.escape(f"{path} line 11:") + ".*int"):
        run_pipeline(make_spec(source={"paths": [path]}))


def test_bad_first_record_is_invalid_spec_at_construction(some_docs, make_spec, tmp_path):
    """A first line that is not JSON: InvalidSpecError from Pipeline(spec), naming source/file."""
    data = b"this is not json\n" + jsonl_bytes(some_docs[:20])
    path = write_bytes(tmp_path / "bad-first.jsonl", data)
    with pytest.raises(InvalidSpecError) as info:
        Pipeline(make_spec(source={"paths": [path]}))
    msg = str(info.value)
    assert "`source`" in msg and f"{path} line 1" in msg and "not valid JSON" in msg


def test_wrong_text_field_is_invalid_spec_naming_field(make_spec, plain):
    """text_field absent from the first record: InvalidSpecError naming the field and keys."""
    with pytest.raises(InvalidSpecError) as info:
        Pipeline(make_spec(source={"paths": [plain], "text_field": "body"}))
    msg = str(info.value)
    assert "`source`" in msg and "'body'" in msg and plain in msg and "id, text" in msg


def test_missing_file_is_data_not_found_naming_path(make_spec, tmp_path):
    """A path that is no file: DataNotFoundError naming it."""
    path = str(tmp_path / "nowhere.jsonl")
    with pytest.raises(DataNotFoundError, match=re.escape(repr(path))):
        Pipeline(make_spec(source={"paths": [path]}))


def test_glob_matching_nothing_is_data_not_found_naming_glob(make_spec, plain, tmp_path):
    """A glob with no match, even beside a good file: DataNotFoundError naming the glob."""
    pattern = str(tmp_path / "none-*.jsonl")
    with pytest.raises(DataNotFoundError, match=re.escape(repr(pattern))):
        Pipeline(make_spec(source={"paths": [plain, pattern]}))


def test_parquet_without_column_names_column_and_lists_columns(some_docs, make_spec, tmp_path):
    """Parquet lacking the text column: InvalidSpecError naming it and the columns there are."""
    path = write_parquet(tmp_path / "d.parquet", some_docs[:20], field="body")
    with pytest.raises(InvalidSpecError) as info:
        Pipeline(make_spec(source={"paths": [path], "format": "parquet"}))
    msg = str(info.value)
    assert "'text'" in msg and path in msg and "columns: id, body" in msg


@pytest.mark.parametrize("bad", ["not-a-proto", "missing-feature"])
def test_bad_tf_example_mid_file_names_file_and_record(bad, some_docs, make_spec, tmp_path):
    """A corrupt or featureless tf.train.Example record: RecordError naming file and index."""
    records = [example_bytes(d) for d in some_docs[:100]]
    records[63] = b"\xff\xff\xff garbage" if bad == "not-a-proto" else example_bytes("x", "body")
    path = write_arrayrecord(tmp_path / "d.arrayrecord", records)
    spec = make_spec(
        source={"paths": [path], "format": "arrayrecord", "record_format": "tf_example"}
    )
    with pytest.raises(RecordError, match=re.escape(f"{path} record 63:")) as info:
        run_pipeline(spec)
    want = "not a serialized tf.train.Example" if bad == "not-a-proto" else "no feature 'text'"
    assert want in str(info.value)


def test_invalid_utf8_text_record_names_record(some_docs, make_spec, tmp_path):
    """ArrayRecord text that is not UTF-8: RecordError naming file and record."""
    records = [d.encode() for d in some_docs[:100]]
    records[70] = b"caf\xe9"
    path = write_arrayrecord(tmp_path / "d.arrayrecord", records)
    spec = make_spec(source={"paths": [path], "format": "arrayrecord", "record_format": "text"})
    with pytest.raises(RecordError, match=re.escape(f"{path} record 70:") + " not valid UTF-8"):
        run_pipeline(spec)


@pytest.mark.parametrize("alone", [True, False], ids=["alone", "beside-a-good-file"])
@pytest.mark.parametrize("content", ["jsonl-text", "random-bytes-200k"])
def test_non_arrayrecord_file_is_a_clear_error_naming_file(
    content, alone, some_docs, make_spec, tmp_path
):
    """A file that is not ArrayRecord fails at Pipeline(spec) naming it, never reads as empty."""
    data = (
        jsonl_bytes(some_docs[:50])
        if content == "jsonl-text"
        else random.Random(0).randbytes(200_000)
    )
    bad = write_bytes(tmp_path / "bad.arrayrecord", data)
    good = write_arrayrecord(tmp_path / "good.arrayrecord", [d.encode() for d in some_docs[:50]])
    paths = [bad] if alone else [good, bad]
    with pytest.raises(RecordError, match=re.escape(bad) + ": not a readable ArrayRecord file"):
        Pipeline(
            make_spec(source={"paths": paths, "format": "arrayrecord", "record_format": "text"})
        )


@pytest.mark.parametrize("damage", ["gz-truncated", "zst-truncated", "zst-garbage"])
def test_damaged_compressed_jsonl_is_record_error_naming_file(
    damage, some_docs, make_spec, tmp_path
):
    """A truncated or corrupt .gz/.zst file: RecordError naming it, not a silent short read."""
    data = jsonl_bytes(some_docs)
    if damage == "gz-truncated":
        name, blob = "d.jsonl.gz", gzip.compress(data)[:-100]
    elif damage == "zst-truncated":
        name, blob = "d.jsonl.zst", zst_multiframe(data)[:-100]
    else:
        name, blob = "d.jsonl.zst", b"this is not zstd" * 100
    path = write_bytes(tmp_path / name, blob)
    with pytest.raises(RecordError, match=re.escape(path) + ": cannot decompress"):
        Pipeline(make_spec(source={"paths": [path]}))


# ---------------------------------------------------------------------------------------------
# 5. Readers in Grain's worker processes


@pytest.mark.parametrize(
    "kind", ["jsonl-gz-text_field-body", "arrayrecord-tf_example", "parquet-row-groups"]
)
def test_readers_in_a_grain_worker_process_give_the_same_batches(
    kind, some_docs, make_spec, plain_batches, tmp_path
):
    """Readers shipped to a spawned Grain worker process read the same data as in-process."""
    _, source = write_format(kind, some_docs, tmp_path)
    spec = make_spec(source=source)
    assert_same_batches(run_pipeline(spec, processes=1, threads=1), plain_batches)
