"""Document sources: every file format gives the same batches, random access, pickling, errors."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from array_record.python import array_record_module

from input_client.spec import SourceSpec
from input_client.wire import FIELDS
from input_server import tf_example_pb2
from input_server.batching.pipeline import Pipeline, Workers
from input_server.data.sources import (
    ArrayRecordReader,
    DocumentSource,
    JsonlReader,
    ParquetReader,
    open_reader,
)
from input_server.errors import DataNotFoundError, InvalidSpecError, RecordError

N = 300  # documents per test file: enough for ~50 batches, fast to tokenize


# ---------------------------------------------------------------------------------------------
# Writers: the same documents in every format the server reads.


def jsonl_bytes(docs, field="text", decoy=False, newline="\n") -> bytes:
    """One JSON object per line; `decoy` adds a wrong "text" beside `field` to catch mix-ups."""
    lines = []
    for i, doc in enumerate(docs):
        obj = {"id": i, field: doc}
        if decoy:
            obj["text"] = f"decoy {i}"
        lines.append(json.dumps(obj))
    return "".join(line + newline for line in lines).encode()


def write_bytes(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def write_arrayrecord(path, records) -> str:
    w = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
    for r in records:
        w.write(r)
    w.close()
    return str(path)


def example_bytes(doc: str, field="text", decoy=False) -> bytes:
    ex = tf_example_pb2.Example()
    ex.features.feature[field].bytes_list.value.append(doc.encode())
    if decoy:
        ex.features.feature["text"].bytes_list.value.append(b"decoy")
    return ex.SerializeToString()


def write_parquet(path, docs, field="text", decoy=False, row_group_size=64) -> str:
    columns = {"id": list(range(len(docs))), field: list(docs)}
    if decoy:
        columns["text"] = [f"decoy {i}" for i in range(len(docs))]
    pq.write_table(pa.table(columns), str(path), row_group_size=row_group_size)
    return str(path)


def zst_multiframe(data: bytes) -> bytes:
    """Several concatenated zstd frames, as `cat a.zst b.zst` or pzstd produce."""
    c = zstandard.ZstdCompressor()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    return b"".join(c.compress(data[a:b]) for a, b in zip(cut, cut[1:], strict=False))


# kind -> (file name, writer(docs, path) -> path, source keys besides paths)
FORMATS = {
    "jsonl-plain": (
        "d.jsonl", lambda docs, p: write_bytes(p, jsonl_bytes(docs)), {}),
    "jsonl-gz-text_field-body": (
        "d.jsonl.gz",
        lambda docs, p: write_bytes(p, gzip.compress(jsonl_bytes(docs, "body", decoy=True))),
        {"text_field": "body"}),
    "jsonl-zst": (
        "d.jsonl.zst",
        lambda docs, p: write_bytes(p, zstandard.ZstdCompressor().compress(jsonl_bytes(docs))),
        {}),
    "jsonl-zst-multiframe": (
        "d.jsonl.zst", lambda docs, p: write_bytes(p, zst_multiframe(jsonl_bytes(docs))), {}),
    "arrayrecord-json-text_field-body": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(
            p, jsonl_bytes(docs, "body", decoy=True).splitlines()),
        {"format": "arrayrecord", "record_format": "json", "text_field": "body"}),
    "arrayrecord-text": (
        "d.arrayrecord", lambda docs, p: write_arrayrecord(p, [d.encode() for d in docs]),
        {"format": "arrayrecord", "record_format": "text"}),
    "arrayrecord-tf_example": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, [example_bytes(d) for d in docs]),
        {"format": "arrayrecord", "record_format": "tf_example"}),
    "arrayrecord-tf_example-text_field-body": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, [example_bytes(d, "body", True) for d in docs]),
        {"format": "arrayrecord", "record_format": "tf_example", "text_field": "body"}),
    "parquet-row-groups": (
        "d.parquet", lambda docs, p: write_parquet(p, docs), {"format": "parquet"}),
    "parquet-text_field-body": (
        "d.parquet", lambda docs, p: write_parquet(p, docs, "body", decoy=True),
        {"format": "parquet", "text_field": "body"}),
}


def write_format(kind, docs, directory) -> tuple[str, dict]:
    """Writes `docs` as `kind` in `directory`; returns the path and the spec's source table."""
    name, write, keys = FORMATS[kind]
    os.makedirs(directory, exist_ok=True)
    path = write(docs, os.path.join(directory, name))
    return path, {"paths": [path], **keys}


# ---------------------------------------------------------------------------------------------
# Helpers


def batches(spec):
    """Every batch of the spec, read in the server process with two tokenizer threads."""
    with Pipeline(spec).stream(workers=Workers(0, 2, "test")) as stream:
        return [p.arrays for p in stream]


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for k in FIELDS:
            assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape, (i, k)
            assert g[k].tobytes() == w[k].tobytes(), f"batch {i} array {k} differs"


def drain(spec):
    """Iterates a whole stream (for tests that expect it to raise part-way)."""
    with Pipeline(spec).stream(workers=Workers(0, 2, "test")) as stream:
        for _ in stream:
            pass


@pytest.fixture(scope="module")
def some_docs(docs) -> list[str]:
    return docs[:N]


@pytest.fixture(scope="module")
def plain(some_docs, tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("plain")
    return write_bytes(d / "plain.jsonl", jsonl_bytes(some_docs))


@pytest.fixture(scope="module")
def plain_batches(make_spec, plain):
    out = batches(make_spec(source={"paths": [plain]}))
    assert len(out) > 10
    return out


# ---------------------------------------------------------------------------------------------
# 1. Every format, the same batches


@pytest.mark.parametrize("kind", [k for k in FORMATS if k != "jsonl-plain"])
def test_format_gives_byte_identical_batches_to_plain_jsonl(
        kind, some_docs, make_spec, plain_batches, tmp_path):
    """Same documents in any format (shuffled, custom text_field) -> the plain-jsonl batches."""
    _, source = write_format(kind, some_docs, tmp_path)
    assert_same_batches(batches(make_spec(source=source)), plain_batches)


def test_shuffle_seed_changes_batches_so_format_comparison_is_not_vacuous(
        make_spec, plain, plain_batches):
    """Another seed gives other batches: the format comparison would notice a reordering."""
    other = batches(make_spec(source={"paths": [plain]}, order={"seed": 1}))
    assert any(a["inputs"].tobytes() != b["inputs"].tobytes()
               for a, b in zip(other, plain_batches, strict=False))


# ---------------------------------------------------------------------------------------------
# 2. Many files and globs


def split3(docs):
    k = len(docs) // 3
    return [docs[:k], docs[k:2 * k], docs[2 * k:]]


@pytest.mark.parametrize("how", ["glob-sorted-by-path", "explicit-list", "recursive-glob",
                                 "glob-with-an-empty-file"])
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
    got = batches(make_spec(source={"paths": source_paths}, order=order))
    assert_same_batches(got, batches(make_spec(source={"paths": [plain]}, order=order)))


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
def test_blank_lines_and_crlf_are_skipped(compress, some_docs, make_spec, plain_batches,
                                          tmp_path):
    """A file with blank lines and CRLF endings gives the batches of the clean file."""
    data = messy_jsonl(some_docs)
    name = "messy.jsonl"
    if compress == "gz":
        data, name = gzip.compress(data), name + ".gz"
    path = write_bytes(tmp_path / name, data)
    assert len(JsonlReader(path, "text")) == len(some_docs)
    assert_same_batches(batches(make_spec(source={"paths": [path]})), plain_batches)


@pytest.mark.parametrize("ending", ["lf", "crlf"])
def test_last_line_without_newline_is_read(ending, some_docs, make_spec, plain_batches,
                                           tmp_path):
    """A final line with no newline after it is still a record."""
    nl = "\r\n" if ending == "crlf" else "\n"
    data = jsonl_bytes(some_docs, newline=nl)[:-len(nl)]
    assert not data.endswith(b"\n")
    path = write_bytes(tmp_path / "no-final-newline.jsonl", data)
    reader = JsonlReader(path, "text")
    assert len(reader) == len(some_docs)
    assert reader[len(reader) - 1] == some_docs[-1]
    assert_same_batches(batches(make_spec(source={"paths": [path]})), plain_batches)


# ---------------------------------------------------------------------------------------------
# 4. Errors name the file and the record


def test_corrupt_json_line_mid_file_raises_record_error_with_line(some_docs, make_spec,
                                                                 tmp_path):
    """A bad line in the middle: RecordError naming the path and the file's line number."""
    lines = jsonl_bytes(some_docs[:100]).splitlines(keepends=True)
    lines[40] = b'{"id": 40, "text": "unterminated\n'
    data = b"\n\n" + b"".join(lines)  # two blank lines first: the bad line is line 43
    path = write_bytes(tmp_path / "corrupt.jsonl", data)
    with pytest.raises(RecordError, match=re.escape(f"{path} line 43:")) as info:
        drain(make_spec(source={"paths": [path]}))
    assert "not valid JSON" in str(info.value)


def test_record_missing_text_field_mid_file_names_field(some_docs, make_spec, tmp_path):
    """A record without the text field: RecordError naming path, line, field and its keys."""
    lines = jsonl_bytes(some_docs[:100]).splitlines(keepends=True)
    lines[57] = json.dumps({"id": 57, "title": "no text here"}).encode() + b"\n"
    path = write_bytes(tmp_path / "missing-field.jsonl", b"".join(lines))
    with pytest.raises(RecordError) as info:
        drain(make_spec(source={"paths": [path]}))
    msg = str(info.value)
    assert f"{path} line 58:" in msg and "'text'" in msg and "id, title" in msg


def test_non_string_text_mid_file_is_a_record_error(some_docs, make_spec, tmp_path):
    """A text field holding a number: RecordError naming the line and the type."""
    lines = jsonl_bytes(some_docs[:100]).splitlines(keepends=True)
    lines[10] = b'{"id": 10, "text": 12345}\n'
    path = write_bytes(tmp_path / "number.jsonl", b"".join(lines))
    with pytest.raises(RecordError, match=re.escape(f"{path} line 11:") + ".*int"):
        drain(make_spec(source={"paths": [path]}))


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
    spec = make_spec(source={"paths": [path], "format": "arrayrecord",
                             "record_format": "tf_example"})
    with pytest.raises(RecordError, match=re.escape(f"{path} record 63:")) as info:
        drain(spec)
    want = "not a serialized tf.train.Example" if bad == "not-a-proto" else "no feature 'text'"
    assert want in str(info.value)


def test_invalid_utf8_text_record_names_record(some_docs, make_spec, tmp_path):
    """ArrayRecord text that is not UTF-8: RecordError naming file and record."""
    records = [d.encode() for d in some_docs[:100]]
    records[70] = b"caf\xe9"
    path = write_arrayrecord(tmp_path / "d.arrayrecord", records)
    spec = make_spec(source={"paths": [path], "format": "arrayrecord", "record_format": "text"})
    with pytest.raises(RecordError, match=re.escape(f"{path} record 70:") + " not valid UTF-8"):
        drain(spec)


@pytest.mark.parametrize("alone", [True, False], ids=["alone", "beside-a-good-file"])
@pytest.mark.parametrize("content", ["jsonl-text", "random-bytes-200k"])
def test_non_arrayrecord_file_is_a_clear_error_naming_file(content, alone, some_docs, make_spec,
                                                           tmp_path):
    """A file that is not ArrayRecord fails at Pipeline(spec) naming it, never reads as empty."""
    data = jsonl_bytes(some_docs[:50]) if content == "jsonl-text" else random.Random(0).randbytes(
        200_000)
    bad = write_bytes(tmp_path / "bad.arrayrecord", data)
    good = write_arrayrecord(tmp_path / "good.arrayrecord", [d.encode() for d in some_docs[:50]])
    paths = [bad] if alone else [good, bad]
    with pytest.raises(RecordError, match=re.escape(bad) + ": not a readable ArrayRecord file"):
        Pipeline(make_spec(source={"paths": paths, "format": "arrayrecord",
                                   "record_format": "text"}))


@pytest.mark.parametrize("damage", ["gz-truncated", "zst-truncated", "zst-garbage"])
def test_damaged_compressed_jsonl_is_record_error_naming_file(damage, some_docs, make_spec,
                                                              tmp_path):
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
# 5. Random access


@pytest.mark.parametrize("kind", list(FORMATS))
def test_document_source_random_access_over_three_files(kind, some_docs, tmp_path):
    """len = records in all files; source[i] = doc i in any access order; where() names it."""
    parts = split3(some_docs)
    paths = []
    for i, part in enumerate(parts):
        path, source = write_format(kind, part, tmp_path / f"part-{i}")
        paths.append(path)
    keys = {k: v for k, v in source.items() if k != "paths"}
    src = DocumentSource.from_spec(SourceSpec(paths=tuple(paths), **keys))
    assert len(src) == len(some_docs)
    order = list(range(len(src)))
    random.Random(0).shuffle(order)
    assert {i: src[i] for i in order} == dict(enumerate(some_docs))
    first_of_last = len(parts[0]) + len(parts[1])
    assert src.where(0).startswith(paths[0] + " ")
    assert src.where(first_of_last).startswith(paths[2] + " ")
    assert src.where(first_of_last - 1).startswith(paths[1] + " ")
    last = len(parts[2]) - 1
    unit = {"jsonl": f"line {last + 1}", "arrayrecord": f"record {last}",
            "parquet": f"row {last}"}[keys.get("format", "jsonl")]
    assert src.where(len(src) - 1) == f"{paths[2]} {unit}"


# ---------------------------------------------------------------------------------------------
# 6. Pickling (Grain ships readers to worker processes)


@pytest.mark.parametrize("kind", list(FORMATS))
def test_used_reader_pickles_and_reads_every_record(kind, some_docs, tmp_path):
    """A reader that has already read (open handles, buffers) pickles and reads all records."""
    path, source = write_format(kind, some_docs, tmp_path)
    spec = SourceSpec(**{**source, "paths": (path,)})
    reader = open_reader(path, spec)
    assert isinstance(reader, (JsonlReader, ArrayRecordReader, ParquetReader))
    assert reader[len(reader) - 1] == some_docs[-1]  # opens the file / fills the buffers
    copy = pickle.loads(pickle.dumps(reader))
    assert len(copy) == len(some_docs)
    assert [copy[i] for i in range(len(copy))] == some_docs
    assert reader[0] == some_docs[0]  # the original still reads after being pickled


def test_gz_reader_pickle_omits_the_decompressed_buffer(some_docs, tmp_path):
    """The pickle of a used .gz reader holds the line index, not the decompressed text."""
    data = jsonl_bytes(some_docs)
    path = write_bytes(tmp_path / "d.jsonl.gz", gzip.compress(data))
    reader = JsonlReader(path, "text")
    assert reader[5] == some_docs[5]
    blob = pickle.dumps(reader)
    assert len(blob) < len(data) / 5, (len(blob), len(data))
    assert json.dumps(some_docs[5])[1:60].encode() not in blob
    assert [pickle.loads(blob)[i] for i in range(len(some_docs))] == some_docs


def test_document_source_pickles_with_all_its_readers(some_docs, tmp_path):
    """The chained source round-trips through pickle and reads the same documents."""
    path, _ = write_format("jsonl-zst-multiframe", some_docs, tmp_path)
    src = DocumentSource.from_spec(SourceSpec(paths=(path, path)))
    copy = pickle.loads(pickle.dumps(src))
    assert len(copy) == 2 * len(some_docs)
    assert [copy[i] for i in range(len(copy))] == some_docs + some_docs
    assert copy.where(len(some_docs)) == f"{path} line 1"


@pytest.mark.parametrize("kind", ["jsonl-gz-text_field-body", "arrayrecord-tf_example",
                                  "parquet-row-groups"])
def test_readers_in_a_grain_worker_process_give_the_same_batches(
        kind, some_docs, make_spec, plain_batches, tmp_path):
    """Readers shipped to a spawned Grain worker process read the same data as in-process."""
    _, source = write_format(kind, some_docs, tmp_path)
    spec = make_spec(source=source)
    with Pipeline(spec).stream(workers=Workers(1, 1, "test")) as stream:
        got = [p.arrays for p in stream]
    assert_same_batches(got, plain_batches)
