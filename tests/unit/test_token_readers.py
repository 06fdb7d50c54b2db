"""Pre-tokenized records (`token_field`) in every reader of one file: ids round-trip as 1-D
integer arrays, in bulk as one by one, through pickling; anything that is not a list of integer
ids is refused naming file, record and field; tf.train.Example ids equal protobuf's own."""

from __future__ import annotations

import gzip
import json
import pickle
import random
import re
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from input_server import tf_example_pb2
from input_server.data import jsonl
from input_server.data.array_record import ArrayRecordReader
from input_server.data.jsonl import JsonlReader, ids_of, json_ids
from input_server.data.parquet import ParquetReader
from input_server.data.records import loads_json
from input_server.data.tf_example import example_ids, example_text, make_example
from input_server.errors import InvalidSpecError, RecordError
from tests.support import write_arrayrecord, write_bytes

INT64 = (-(1 << 63), (1 << 63) - 1)


@pytest.fixture(scope="module")
def id_docs() -> list[list[int]]:
    """Documents of ids: empty ones, one id, long ones, 0 and 1 (a bool's values), large ids."""
    rng = random.Random(0)
    docs = [[rng.randrange(0, 256_000) for _ in range(rng.choice([0, 1, 7, 300, 2000]))]]
    docs += [[rng.randrange(0, 50_000) for _ in range(rng.randrange(0, 400))] for _ in range(150)]
    docs += [[], [0], [1], [0, 1, 1, 0], [2**31 - 1, 5]]
    return docs


def _jsonl(docs, field="ids") -> bytes:
    # A decoy "text" beside the ids: the reader must take the ids, not the text.
    return b"".join(
        json.dumps({"text": f"decoy {i}", field: d}).encode() + b"\n" for i, d in enumerate(docs)
    )


def _zst(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


def _parquet(path, docs, kind, row_group_size=40) -> str:
    column = pa.array(docs, kind)
    pq.write_table(
        pa.table({"text": [f"decoy {i}" for i in range(len(docs))], "ids": column}),
        str(path),
        row_group_size=row_group_size,
    )
    return str(path)


# kind -> (writer(docs, directory) -> reader, the dtype the ids come in)
READERS = {
    "jsonl-plain": (
        lambda docs, d: JsonlReader(
            write_bytes(d / "d.jsonl", _jsonl(docs)), "absent", token_field="ids"
        ),
        np.int64,
    ),
    "jsonl-gz": (
        lambda docs, d: JsonlReader(
            write_bytes(d / "d.jsonl.gz", gzip.compress(_jsonl(docs))), "text", token_field="ids"
        ),
        np.int64,
    ),
    "jsonl-zst": (
        lambda docs, d: JsonlReader(
            write_bytes(d / "d.jsonl.zst", _zst(_jsonl(docs))), "text", token_field="ids"
        ),
        np.int64,
    ),
    "parquet-list-int32": (
        lambda docs, d: ParquetReader(
            _parquet(d / "d.parquet", docs, pa.list_(pa.int32())), "absent", token_field="ids"
        ),
        np.int32,
    ),
    "parquet-list-int64": (
        lambda docs, d: ParquetReader(
            _parquet(d / "d.parquet", docs, pa.list_(pa.int64())), "text", token_field="ids"
        ),
        np.int64,
    ),
    "parquet-large_list-int32-one-row-group": (
        lambda docs, d: ParquetReader(
            _parquet(d / "d.parquet", docs, pa.large_list(pa.int32()), 10_000),
            "text",
            token_field="ids",
        ),
        np.int32,
    ),
    "arrayrecord-json": (
        lambda docs, d: ArrayRecordReader(
            write_arrayrecord(d / "d.arrayrecord", _jsonl(docs).splitlines()),
            "text",
            "json",
            token_field="ids",
        ),
        np.int64,
    ),
    "arrayrecord-tf_example": (
        lambda docs, d: ArrayRecordReader(
            write_arrayrecord(
                d / "d.arrayrecord",
                [make_example(text=f"decoy {i}", ids=doc) for i, doc in enumerate(docs)],
            ),
            "text",
            "tf_example",
            token_field="ids",
        ),
        np.int64,
    ),
}


def _same(got, want, dtype) -> None:
    assert isinstance(got, np.ndarray) and got.ndim == 1 and got.dtype == dtype, got
    assert got.tolist() == want


# ---------------------------------------------------------------------------------------------
# 1. Ids round-trip, one by one and in bulk


@pytest.mark.parametrize("kind", list(READERS))
def test_ids_round_trip_one_by_one_and_in_shuffled_bulk(kind, id_docs, tmp_path):
    """reader[i] is document i's ids as a 1-D array of the stored integer type (never object,
    never the decoy text); read_many in shuffled order gives the same arrays in that order."""
    make, dtype = READERS[kind]
    reader = make(id_docs, tmp_path)
    assert len(reader) == len(id_docs)
    for i, doc in enumerate(id_docs):
        _same(reader[i], doc, dtype)
    order = list(range(len(id_docs))) * 2
    random.Random(1).shuffle(order)
    many = reader.read_many(order)
    assert len(many) == len(order)
    for i, got in zip(order, many, strict=True):
        _same(got, id_docs[i], dtype)


@pytest.mark.parametrize("kind", list(READERS))
def test_used_ids_reader_pickles_and_reads_in_the_copy(kind, id_docs, tmp_path):
    """Grain ships readers to worker processes: a reader that has read pickles, and the copy
    reads every document's ids (and the original still reads)."""
    make, dtype = READERS[kind]
    reader = make(id_docs, tmp_path)
    _same(reader[len(reader) - 1], id_docs[-1], dtype)
    copy = pickle.loads(pickle.dumps(reader))
    assert len(copy) == len(id_docs)
    for got, doc in zip(copy.read_many(range(len(copy))), id_docs, strict=True):
        _same(got, doc, dtype)
    _same(reader[0], id_docs[0], dtype)


def test_parquet_ids_are_read_only_views_of_one_column(id_docs, tmp_path):
    """Parquet ids are views of the loaded column (no copy), which no caller may change."""
    reader = READERS["parquet-list-int32"][0](id_docs, tmp_path)
    a, b = reader.read_many([0, 0])
    assert np.shares_memory(a, b) and not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a[:1] = 7


@pytest.mark.parametrize(
    "ids",
    [[INT64[0], INT64[1], 0], [2**62, -1], [0, 1, 0, 1]],
    ids=["int64-extremes", "large-and-negative", "zeros-and-ones-are-not-bools"],
)
@pytest.mark.parametrize(
    "kind", ["jsonl-plain", "parquet-list-int64", "arrayrecord-json", "arrayrecord-tf_example"]
)
def test_every_int64_is_an_id(kind, ids, tmp_path):
    """The whole int64 range reads exactly (ids are range-checked by the pipeline, not here)."""
    reader = READERS[kind][0]([ids, []], tmp_path)
    _same(reader[0], ids, np.int64)
    _same(reader.read_many([1, 0])[1], ids, np.int64)


# ---------------------------------------------------------------------------------------------
# 2. What is not a list of integer ids, refused by name

NOT_IDS = [
    ('"a string"', r"holds \"a string\" \(a string\), not a list of token ids"),
    ("null", r"holds null, not a list of token ids"),
    ('{"ids": [1]}', r"\(an object\), not a list"),
    ("7", r"holds 7 \(an integer\), not a list"),
    ("[1, true, 3]", r"holds true \(a boolean\) at position 1"),
    ("[false]", r"holds false \(a boolean\) at position 0"),
    ("[1, 2.0]", r"holds 2.0 \(a number with a fraction.*\) at position 1"),
    ("[1, 2.5]", r"holds 2.5 \(a number with a fraction.*\) at position 1"),
    ('[1, "2"]', r"holds \"2\" \(a string\) at position 1"),
    ("[1, null]", r"holds null at position 1"),
    ("[[1, 2], [3, 4]]", r"holds \[1, 2\] \(a list\) at position 0"),
    ("[1, [2]]", r"holds \[2\] \(a list\) at position 1"),
    ("[9223372036854775808]", r"holds 9223372036854775808 at position 0, outside int64"),
    # orjson reads integers past 64 bits as floats: the message says so.
    ("[-9223372036854775809]", r"\(a number .* past 64 bits\) at position 0"),
    ("[0, 18446744073709551616]", r"\(a number .* past 64 bits\) at position 1"),
    ("[0, 340282366920938463463374607431768211456]", r"past 64 bits\) at position 1"),
]


@pytest.mark.parametrize(("value", "says"), NOT_IDS, ids=[v for v, _ in NOT_IDS])
@pytest.mark.parametrize("fmt", ["jsonl", "arrayrecord-json"])
def test_a_json_field_that_is_not_a_list_of_ids_is_refused_naming_record_and_field(
    fmt, value, says, tmp_path
):
    """RecordError (DATA_LOSS) from reader[i] and from read_many alike, naming the file and
    record, the field, and what it holds."""
    lines = [b'{"ids": [5, 6]}', b'{"ids": [7]}', b'{"text": "x", "ids": ' + value.encode() + b"}"]
    if fmt == "jsonl":
        path = write_bytes(tmp_path / "d.jsonl", b"\n".join(lines) + b"\n")
        reader, where = JsonlReader(path, "text", token_field="ids"), f"{path} line 3"
    else:
        path = write_arrayrecord(tmp_path / "d.arrayrecord", lines)
        reader = ArrayRecordReader(path, "text", "json", token_field="ids")
        where = f"{path} record 2"
    assert reader[1].tolist() == [7]
    for read in (lambda: reader[2], lambda: reader.read_many([0, 2, 1])):
        with pytest.raises(RecordError) as e:
            read()
        assert str(e.value).startswith(f"{where}: field 'ids' "), str(e.value)
        assert e.value.__class__ is RecordError
        assert re.search(says, str(e.value)), str(e.value)


@pytest.mark.parametrize("fmt", ["jsonl", "arrayrecord-json"])
def test_a_record_without_the_token_field_is_refused_listing_its_fields(fmt, tmp_path):
    lines = [b'{"ids": [1]}', b'{"text": "no ids here", "id": 4}']
    if fmt == "jsonl":
        path = write_bytes(tmp_path / "d.jsonl", b"\n".join(lines))
        reader, where = JsonlReader(path, "text", token_field="ids"), f"{path} line 2"
    else:
        path = write_arrayrecord(tmp_path / "d.arrayrecord", lines)
        reader = ArrayRecordReader(path, "text", "json", token_field="ids")
        where = f"{path} record 1"
    with pytest.raises(RecordError, match=f"^{where}: no field 'ids' \\(the record has: id, text"):
        reader.read_many([0, 1])


@pytest.mark.parametrize(
    ("kind", "shown"),
    [
        (pa.string(), "string"),
        (pa.int64(), "int64"),
        (pa.list_(pa.float64()), r"list<\w+: double>"),
        (pa.list_(pa.string()), r"list<\w+: string>"),
        (pa.list_(pa.uint64()), r"list<\w+: uint64>"),
        (pa.list_(pa.list_(pa.int64())), r"list<\w+: list<\w+: int64>>"),
    ],
    ids=["string", "int64", "list-float64", "list-string", "list-uint64", "list-of-lists"],
)
def test_a_parquet_token_column_of_another_type_is_a_spec_error(kind, shown, tmp_path):
    """INVALID_ARGUMENT at open, naming `source.token_field`, the column, the file and its type."""
    value = {"string": "x", "int64": 3}.get(str(kind), None)
    rows = [value] if value is not None else [[]]
    path = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"ids": pa.array(rows, kind)}), path)
    with pytest.raises(InvalidSpecError) as e:
        ParquetReader(path, "text", token_field="ids")
    message = str(e.value)
    assert message.startswith("`source.token_field` 'ids': column 'ids' of " + path), message
    assert re.search(f"of type {shown}, not token ids", message), message


def test_a_parquet_token_column_that_is_missing_is_a_spec_error(tmp_path):
    path = _parquet(tmp_path / "d.parquet", [[1]], pa.list_(pa.int64()))
    with pytest.raises(InvalidSpecError, match=r"`source.token_field` 'tokens' is not a column"):
        ParquetReader(path, "text", token_field="tokens")
    with pytest.raises(InvalidSpecError, match=r"`source.text_field` 'body' is not a column"):
        ParquetReader(path, "body")  # without token_field the text column is what must exist


@pytest.mark.parametrize("row_group_size", [2, 100], ids=["row-groups", "one-row-group"])
def test_parquet_nulls_are_refused_naming_the_row(row_group_size, tmp_path):
    """A null row, or a null among a row's ids, is DATA_LOSS naming the row (and the position),
    from reader[i] and read_many alike; the rows around them read."""
    docs = [[1, 2], None, [3, None, 4], [], [5], None]
    path = _parquet(tmp_path / "d.parquet", docs, pa.list_(pa.int32()), row_group_size)
    reader = ParquetReader(path, "text", token_field="ids")
    assert [reader[i].tolist() for i in (0, 3, 4)] == [[1, 2], [], [5]]
    assert [x.tolist() for x in reader.read_many([4, 0, 3])] == [[5], [1, 2], []]
    for row, says in [(1, "is null"), (2, "holds a null at position 1"), (5, "is null")]:
        want = f"^{path} row {row}: column 'ids' {says}, not a list of token ids"
        with pytest.raises(RecordError, match=want):
            reader[row]
        with pytest.raises(RecordError, match=want):
            reader.read_many([0, row, 3])


def test_arrayrecord_text_records_with_a_token_field_is_a_spec_error(tmp_path):
    path = write_arrayrecord(tmp_path / "d.arrayrecord", [b"some text"])
    with pytest.raises(InvalidSpecError, match=r"`source.token_field` 'ids'.*'text'.*not token"):
        ArrayRecordReader(path, "text", "text", token_field="ids")


@pytest.mark.parametrize(
    ("features", "says"),
    [
        ({"text": "x", "tokens": [1]}, r"the Example has no feature 'ids' \(it has: 'text' "),
        ({"ids": "a string"}, r"feature 'ids' holds a bytes_list .*, not an int64_list"),
        ({"ids": [1.5, 2.0]}, r"feature 'ids' holds a float_list .*, not an int64_list"),
    ],
    ids=["missing", "bytes_list", "float_list"],
)
def test_an_example_without_an_int64_list_is_refused_naming_feature_and_features(
    features, says, tmp_path
):
    records = [make_example(ids=[1, 2]), make_example(**features)]
    path = write_arrayrecord(tmp_path / "d.arrayrecord", records)
    reader = ArrayRecordReader(path, "text", "tf_example", token_field="ids")
    assert reader[0].tolist() == [1, 2]
    with pytest.raises(RecordError, match=f"^{path} record 1: {says}") as e:
        reader.read_many([0, 1])
    for name in features:  # it lists the features the Example has
        assert repr(name) in str(e.value)


def test_an_empty_feature_is_refused_as_holding_no_list(tmp_path):
    ex = tf_example_pb2.Example()
    ex.features.feature["ids"].SetInParent()  # a Feature with no kind set
    with pytest.raises(RecordError, match=r"^r 0: feature 'ids' holds no list at all"):
        example_ids(ex.SerializeToString(), "ids", "r 0")


@pytest.mark.parametrize("kind", ["jsonl-plain", "parquet-list-int32", "arrayrecord-tf_example"])
def test_the_document_size_bound_applies_to_ids(kind, tmp_path):
    """--max-document-mb refuses a document of too many ids (INVALID_ARGUMENT naming it) and
    lets the shorter ones through, one by one and in bulk."""
    make, _ = READERS[kind]
    reader = make([list(range(10)), list(range(5000))], tmp_path)
    reader.max_bytes = 4000  # 5000 ids take more however stored; 10 take less
    assert reader[0].tolist() == list(range(10))
    for read in (lambda: reader[1], lambda: reader.read_many([0, 1])):
        with pytest.raises(InvalidSpecError, match=r"over the server's --max-document-mb"):
            read()


# ---------------------------------------------------------------------------------------------
# 3. tf.train.Example: ids as protobuf parses them

int64s = st.integers(min_value=INT64[0], max_value=INT64[1])
near_edges = st.sampled_from([0, 1, -1, 2**62, -(2**62), 2**31, 2**32, INT64[0], INT64[1]])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(int64s, near_edges), max_size=300))
def test_example_ids_equal_protobufs_own_parsing(ids):
    """Every int64 list (negative, 0, 2**62, the extremes; short and long, both code paths)
    reads as protobuf itself reads the serialized Example."""
    raw = make_example(ids=ids, text="beside")
    parsed = tf_example_pb2.Example()
    parsed.ParseFromString(raw)
    want = list(parsed.features.feature["ids"].int64_list.value)
    got = example_ids(raw, "ids", "r")
    assert got.dtype == np.int64 and got.ndim == 1
    assert got.tolist() == want == ids


def test_example_ids_of_a_non_example_is_a_record_error():
    with pytest.raises(RecordError, match=r"^f record 3: not a serialized tf.train.Example"):
        example_ids(b"\xff\xff\xff garbage", "ids", "f record 3")


def test_example_text_refuses_text_that_is_not_utf8():
    raw = make_example(text=b"\xff\xfe")
    with pytest.raises(RecordError, match=r"^f record 0: feature 'text' is not valid UTF-8"):
        example_text(raw, "text", "f record 0")
    assert example_text(make_example(text="é ok"), "text", "w") == "é ok"


def test_make_example_refuses_what_is_neither_text_nor_numbers():
    with pytest.raises(TypeError, match=r"feature 'ids'.*\[1, True\]"):
        make_example(ids=[1, True])
    with pytest.raises(TypeError, match=r"feature 'ids'"):
        make_example(ids=7)
    assert example_ids(make_example(ids=[]), "ids", "w").tolist() == []  # present, 0 ids


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        int64s,
        near_edges,
        st.floats(allow_nan=False),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.text(max_size=8),
    ),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=12,
)
records = st.fixed_dictionaries(
    {"ids": st.one_of(st.lists(st.one_of(int64s, near_edges), max_size=40), json_values)},
    optional={"text": st.text(max_size=12), "meta": json_values},
)


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=6), st.sampled_from([(", ", ": "), (",", ":")]))
def test_jsonl_ids_read_in_bulk_as_one_by_one(tmp_path_factory, docs, separators):
    """read_many (simdjson where it reads a record exactly) gives each record what reader[i]
    (orjson) gives it: the same ids, or the same refusal naming the same line and field, for
    any JSON: other fields holding brackets, nested lists, booleans, floats, ints past int64."""
    path = tmp_path_factory.mktemp("j") / "d.jsonl"
    path.write_text("".join(json.dumps(d, separators=separators) + "\n" for d in docs))
    reader = JsonlReader(str(path), "text", token_field="ids")

    def outcome(read):
        try:
            ids = read()
        except RecordError as e:
            return str(e)
        except ValueError:  # not JSON: raised as such by both
            return "not JSON"
        assert ids.dtype == np.int64 and ids.ndim == 1
        return ids.tolist()

    for i in range(len(docs)):
        assert outcome(lambda i=i: reader.read_many([i])[0]) == outcome(lambda i=i: reader[i])
    for d in docs:  # ArrayRecord's JSON records read through the same call
        raw = json.dumps(d, separators=separators).encode()
        assert outcome(lambda raw=raw: json_ids(raw, "ids", "r")) == outcome(
            lambda raw=raw: ids_of(loads_json(raw), "ids", "r")
        )


@pytest.mark.parametrize(
    "line",
    [b'{"ids": [1, 2], "ids": 3}', b'{"ids": 3, "ids": [1, 2]}', b'{"\\u0069ds": [1], "ids": 3}'],
)
def test_a_repeated_token_field_reads_in_bulk_as_one_by_one(line, tmp_path):
    """A key given twice (or spelled with an escape) means what orjson reads: its last value."""
    path = write_bytes(tmp_path / "d.jsonl", line + b"\n")
    reader = JsonlReader(path, "text", token_field="ids")
    outcomes = []
    for read in (lambda: reader[0], lambda: reader.read_many([0])[0]):
        try:
            outcomes.append(read().tolist())
        except RecordError as e:
            outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0] == [1, 2] if line.endswith(b"]}") else "holds 3" in outcomes[0]


def test_a_record_past_the_json_parsers_capacity_reads_through_orjson(tmp_path, monkeypatch):
    """simdjson's parser holds buffers of the largest record it read; past its capacity a
    record is read by orjson instead, the same ids."""
    monkeypatch.setattr(jsonl, "PARSER_CAPACITY", 4096)
    monkeypatch.setattr(jsonl, "_PARSERS", threading.local())  # parsers made from now on
    ids = list(range(5000))
    lines = [json.dumps({"ids": ids}), json.dumps({"ids": [1, 2]})]
    path = write_bytes(tmp_path / "d.jsonl", ("\n".join(lines) + "\n").encode())
    reader = JsonlReader(path, "text", token_field="ids")
    big, small = reader.read_many([0, 1])
    assert big.tolist() == ids and small.tolist() == [1, 2]
