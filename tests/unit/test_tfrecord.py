"""TFRecord files without TensorFlow: framing byte for byte as TensorFlow writes it, the index of
a file of many records, text and ids, and damage (a flipped byte, a cut file, a compressed or a
foreign file) refused naming file and record."""

from __future__ import annotations

import gzip
import pickle
import random
import threading
import zlib

import google_crc32c
import numpy as np
import pytest

from input_server import cancel
from input_server.data.records import OPEN_FILES
from input_server.data.tf_example import make_example
from input_server.data.tfrecord import TFRecordReader, write_tfrecord
from input_server.errors import CancelledError, CorruptFileError, InvalidSpecError, RecordError
from tests.support import write_bytes

# Written by TensorFlow: Grain's testdata/morris_sequence_first_5.tfrecord (Grain 0.2.18), the
# records b"1", b"1 1", b"2 1", b"1 2 1 1", b"1 1 1 2 2 1".
TENSORFLOW_WROTE = bytes.fromhex(
    "0100000000000000 0175de41 31 c30c4ad6"
    "0300000000000000 b099490e 312031 59bed8de"
    "0300000000000000 b099490e 322031 b4f2345f"
    "0700000000000000 bbd79f11 31203220312031 9886ebb8"
    "0b00000000000000 8615f504 3120312031203220322031 61692698".replace(" ", "")
)
MORRIS = [b"1", b"1 1", b"2 1", b"1 2 1 1", b"1 1 1 2 2 1"]


def _crc32c(data: bytes) -> int:
    """crc32c bit by bit (Castagnoli, reflected): a check of google_crc32c independent of it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_google_crc32c_is_crc32c():
    """The known test vector, in the library and in the bitwise reference."""
    assert google_crc32c.value(b"123456789") == 0xE3069283 == _crc32c(b"123456789")


def test_write_tfrecord_frames_records_byte_for_byte_as_tensorflow(tmp_path):
    path = tmp_path / "morris.tfrecord"
    assert write_tfrecord(path, MORRIS) == 5
    assert path.read_bytes() == TENSORFLOW_WROTE


def test_a_file_tensorflow_wrote_passes_every_crc(tmp_path):
    """Indexed (length CRCs) and read (data CRCs) without a CorruptFileError: its records are
    plain text, not Examples, so decoding is what fails, naming the record."""
    path = write_bytes(tmp_path / "tf.tfrecord", TENSORFLOW_WROTE)
    reader = TFRecordReader(path, "text")
    assert len(reader) == 5
    for i in range(5):
        with pytest.raises(
            RecordError, match=f"^{path} record {i}: (not a serialized|the Ex)"
        ) as e:
            reader[i]
        assert not isinstance(e.value, CorruptFileError)


# ---------------------------------------------------------------------------------------------
# 1. Reading


def _docs(n: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    """Texts of a few non-ASCII characters, and 0 to 96 ids (some negative, some past 2**32)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(-5, 2**40, n * 48 + 97).tolist()
    return [(f"document {i} " + "é" * (i % 40), ids[i * 48 : i * 48 + i % 97]) for i in range(n)]


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> tuple[str, list]:
    """More records than are checked in one bulk (16,384), some with a decoy feature."""
    docs = _docs(40_000)
    path = str(tmp_path_factory.mktemp("tfr") / "many.tfrecord")
    write_tfrecord(path, (make_example(body=t, ids=ids, text="decoy") for t, ids in docs))
    return path, docs


def test_a_file_of_many_records_is_indexed_and_read_in_any_order(many):
    path, docs = many
    text, ids = TFRecordReader(path, "body"), TFRecordReader(path, "body", token_field="ids")
    assert len(text) == len(ids) == len(docs)
    order = list(range(len(docs)))
    random.Random(2).shuffle(order)
    order = order[:5000] + [0, len(docs) - 1, 0]
    assert text.read_many(order) == [docs[i][0] for i in order]
    assert [text[i] for i in order[:500]] == [docs[i][0] for i in order[:500]]
    got = ids.read_many(order)
    for i, a in zip(order, got, strict=True):
        assert a.dtype == np.int64 and a.ndim == 1 and a.tolist() == docs[i][1]
    assert [ids[i].tolist() for i in order[:500]] == [docs[i][1] for i in order[:500]]
    assert text[-1] == docs[-1][0]
    assert text.where(7) == f"{path} record 7"


def test_a_used_reader_pickles_and_reads_in_the_copy(tmp_path):
    docs = _docs(300)
    path = str(tmp_path / "d.tfrecord")
    write_tfrecord(path, (make_example(text=t, ids=i) for t, i in docs))
    reader = TFRecordReader(path, "text", token_field="ids")
    assert reader[299].tolist() == docs[299][1]  # maps the file
    copy = pickle.loads(pickle.dumps(reader))
    assert [a.tolist() for a in copy.read_many(range(300))] == [i for _, i in docs]
    assert reader[0].tolist() == docs[0][1]


def test_release_unmaps_and_a_later_read_maps_again(tmp_path):
    path = str(tmp_path / "d.tfrecord")
    write_tfrecord(path, [make_example(text="a"), make_example(text="b")])
    reader = TFRecordReader(path, "text")
    before = len(OPEN_FILES)
    assert reader[1] == "b"
    assert len(OPEN_FILES) == before + 1
    reader.release()
    assert len(OPEN_FILES) == before
    assert reader.read_many([1, 0]) == ["b", "a"]
    reader.close()
    assert len(OPEN_FILES) == before


def test_an_empty_file_holds_no_records(tmp_path):
    assert len(TFRecordReader(write_bytes(tmp_path / "e.tfrecord", b""), "text")) == 0


def test_a_first_length_that_looks_like_gzip_is_still_tfrecord(tmp_path):
    """A record of 0x8b1f bytes starts the file with gzip's magic; its header's CRC passes, so
    it is read as the TFRecord it is."""
    text = "x" * (0x8B1F - (len(make_example(text="x" * 30_000)) - 30_000))
    record = make_example(text=text)
    assert len(record) == 0x8B1F
    path = str(tmp_path / "d.tfrecord")
    write_tfrecord(path, [record])
    assert open(path, "rb").read(2) == b"\x1f\x8b"
    assert TFRecordReader(path, "text")[0] == text


def test_feature_mistakes_name_the_record_and_the_feature(tmp_path):
    path = str(tmp_path / "d.tfrecord")
    write_tfrecord(path, [make_example(text="a", ids=[1]), make_example(body="b", ids="no")])
    with pytest.raises(RecordError, match=rf"^{path} record 1: the Example has no feature 'text'"):
        TFRecordReader(path, "text").read_many([0, 1])
    with pytest.raises(RecordError, match=rf"^{path} record 1: feature 'ids' holds a bytes_list"):
        TFRecordReader(path, "text", token_field="ids")[1]


def test_the_document_size_bound_applies(tmp_path):
    path = str(tmp_path / "d.tfrecord")
    write_tfrecord(path, [make_example(ids=[1]), make_example(ids=list(range(5000)))])
    reader = TFRecordReader(path, "text", token_field="ids")
    reader.max_bytes = 1000
    assert reader[0].tolist() == [1]
    with pytest.raises(InvalidSpecError, match=rf"^{path} record 1: .*--max-document-mb"):
        reader.read_many([0, 1])


def test_indexing_stops_when_the_client_leaves(many):
    left = threading.Event()
    left.set()
    with cancel.scope(left), pytest.raises(CancelledError):
        TFRecordReader(many[0], "body")


# ---------------------------------------------------------------------------------------------
# 2. Damage


def _file(tmp_path, n=30_000) -> tuple[str, bytearray, TFRecordReader]:
    path = str(tmp_path / "d.tfrecord")
    write_tfrecord(path, (make_example(text=f"record {i}") for i in range(n)))
    data = bytearray(open(path, "rb").read())
    return path, data, TFRecordReader(path, "text")


def test_a_flipped_byte_in_a_records_data_fails_its_crc_when_read(tmp_path):
    path, data, good = _file(tmp_path)
    k = 20_000
    data[int(good._offsets[k]) + 3] ^= 0x01
    write_bytes(path, bytes(data))
    reader = TFRecordReader(path, "text")  # the index reads no data
    assert reader[k - 1] == f"record {k - 1}" and reader[k + 1] == f"record {k + 1}"
    want = rf"^{path} record {k} \(byte {int(good._offsets[k]) - 12:,}\): the record's data fails"
    with pytest.raises(CorruptFileError, match=want):
        reader[k]
    with pytest.raises(CorruptFileError, match=want):
        reader.read_many([0, k, 1])


@pytest.mark.parametrize(
    ("k", "byte"),
    [(20_000, 0), (20_000, 7), (20_000, 9), (1, 0), (29_999, 2)],
    ids=["length-low-byte", "length-high-byte", "crc-byte", "second-record", "last-record"],
)
def test_a_flipped_byte_in_a_length_header_is_caught_at_the_index(k, byte, tmp_path):
    """The record named is the damaged one, even where its bad length sends the walk astray
    (past the end of the file, or into the middle of other records)."""
    path, data, good = _file(tmp_path)
    head = int(good._offsets[k]) - 12
    data[head + byte] ^= 0x40
    write_bytes(path, bytes(data))
    want = rf"^{path} record {k} \(byte {head:,}\): the record's length header fails its CRC"
    with pytest.raises(CorruptFileError, match=want):
        TFRecordReader(path, "text")


@pytest.mark.parametrize(
    ("cut", "says"),
    [(-3, "run past the end of the file"), (-20, "run past the end of the file")],
    ids=["in-the-crc", "in-the-data"],
)
def test_a_file_cut_inside_its_last_record_is_caught(cut, says, tmp_path):
    path, data, good = _file(tmp_path, 100)
    write_bytes(path, bytes(data[:cut]))
    with pytest.raises(CorruptFileError, match=rf"^{path} record 99 \(byte [\d,]+\): .*{says}"):
        TFRecordReader(path, "text")


def test_a_file_cut_inside_a_header_is_caught(tmp_path):
    path, data, good = _file(tmp_path, 100)
    head = int(good._offsets[60]) - 12
    write_bytes(path, bytes(data[: head + 5]))
    want = rf"^{path} record 60 \(byte {head:,}\): the file ends inside the record's header"
    with pytest.raises(CorruptFileError, match=want):
        TFRecordReader(path, "text")


def test_a_file_cut_after_it_was_indexed_is_caught_when_read(tmp_path):
    path, data, reader = _file(tmp_path, 100)
    write_bytes(path, bytes(data[: len(data) - 2]))
    assert reader[98] == "record 98"
    with pytest.raises(CorruptFileError, match=rf"^{path} record 99 .*ends inside the record"):
        reader[99]


@pytest.mark.parametrize("kind", ["GZIP", "ZLIB"])
def test_a_compressed_tfrecord_is_refused_saying_to_decompress_it(kind, tmp_path):
    path = str(tmp_path / "plain.tfrecord")
    write_tfrecord(path, [make_example(text=f"r {i}") for i in range(50)])
    plain = open(path, "rb").read()
    packed = gzip.compress(plain) if kind == "GZIP" else zlib.compress(plain)
    path = write_bytes(tmp_path / "d.tfrecord", packed)
    with pytest.raises(RecordError) as e:
        TFRecordReader(path, "text")
    assert not isinstance(e.value, CorruptFileError)
    message = str(e.value)
    assert message.startswith(f"{path} looks {kind}-compressed"), message
    assert "compressed TFRecord is not read" in message and "decompress" in message, message


@pytest.mark.parametrize(
    "data",
    [b'{"text": "a json line"}\n' * 20, b"tiny", b"\x00" * 40],
    ids=["jsonl", "shorter-than-a-header", "zeros"],
)
def test_a_file_that_is_not_tfrecord_is_refused_naming_it(data, tmp_path):
    path = write_bytes(tmp_path / "d.tfrecord", data)
    with pytest.raises(RecordError, match=rf"^{path} is not a TFRecord file \(") as e:
        TFRecordReader(path, "text")
    assert not isinstance(e.value, CorruptFileError)
