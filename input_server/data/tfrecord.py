"""TFRecord files of serialized tf.train.Example, read without TensorFlow: random access to each
record's text, or to its token ids (`token_field`).

A file is indexed once per reader (each record's offset and length, every length header's CRC
checked), then memory-mapped through `OPEN_FILES` (a bounded number open per process); each record
read has its data CRC checked. Picklable (Grain sends readers to worker processes); the file maps
lazily in the process that reads. Compressed TFRecord (GZIP, ZLIB) is refused, by name.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable, Sequence

import google_crc32c
import numpy as np

from input_server import cancel
from input_server.data.records import OPEN_FILES, check_size
from input_server.data.tf_example import example_ids, example_text
from input_server.errors import CorruptFileError, RecordError

# Framing of each record: uint64 length, uint32 masked crc32c of those 8 bytes, the data,
# uint32 masked crc32c of the data (all little-endian); TensorFlow's record_writer.cc.
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_FRAMING = _HEADER.size + _FOOTER.size
_MASK_DELTA = 0xA282EAD8
# Between two checks for a client that left while a file is indexed (and of the headers' CRCs):
# each record costs a header read (a page fault on a cold file), so a bound on records and one
# on bytes passed.
_CHECK_RECORDS = 1 << 14
_CHECK_BYTES = 64 << 20


def _masked_crc(data: bytes) -> int:
    """TFRecord's masked crc32c (a CRC over data holding CRCs is weak; rotated and offset)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _crc32c_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = (table >> 1) ^ np.where(table & 1, np.uint32(0x82F63B78), np.uint32(0))
    return table.astype(np.uint32)


_TABLE = _crc32c_table()


def _length_crcs(lengths: np.ndarray) -> np.ndarray:
    """The masked crc32c of each uint64 length's 8 little-endian bytes, for many at once (a
    call of google_crc32c per 8 bytes would cost as much as the rest of the index)."""
    crc = np.full(len(lengths), 0xFFFFFFFF, np.uint32)
    for k in range(8):
        byte = ((lengths >> np.uint64(8 * k)) & np.uint64(0xFF)).astype(np.uint32)
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)


def write_tfrecord(path: str | os.PathLike, payloads: Iterable[bytes]) -> int:
    """Writes `payloads` as an uncompressed TFRecord file at `path`, framed as TensorFlow frames
    them (for tests and tools).

    Returns:
      The number of records written.
    """
    n = 0
    with open(path, "wb") as f:
        for payload in payloads:
            data = bytes(payload)
            length = struct.pack("<Q", len(data))
            f.write(length + _FOOTER.pack(_masked_crc(length)))
            f.write(data + _FOOTER.pack(_masked_crc(data)))
            n += 1
    return n


def _compressed(head: bytes) -> str | None:
    """The compression a file's first bytes show: TensorFlow's GZIP or ZLIB TFRecord options."""
    if head[:2] == b"\x1f\x8b":
        return "GZIP"
    if len(head) >= 2 and head[0] & 0x0F == 8 and ((head[0] << 8) | head[1]) % 31 == 0:
        return "ZLIB"  # RFC 1950: deflate, and a header checksum
    return None


class TFRecordReader:
    """An uncompressed TFRecord file; each record is a tf.train.Example whose `text_field` is a
    `bytes_list` of one UTF-8 string, or with a `token_field` whose `int64_list` holds the
    record's token ids (int64 arrays; `text_field` is then unused)."""

    max_bytes: int | None = None

    def __init__(
        self, path: str, text_field: str, *, token_field: str | None = None, name: str | None = None
    ):
        self.path = path
        self.name = path if name is None else name  # in messages: the path as written
        self.text_field = text_field
        self.token_field = token_field
        self._offsets, self._lengths = self._index()

    def _index(self) -> tuple[np.ndarray, np.ndarray]:
        """Each record's data offset and length, found by walking the length headers."""
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return self._walk(buf, size)

    def _walk(self, buf: mmap.mmap, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Follows the length headers from the start; every so many records, checks the headers
        passed (their CRCs, in bulk: `_check_heads`) and whether the client left. A bad length
        sends the walk astray, so an error of the walk is reported only once the headers up to
        it are checked."""
        unpack = _HEADER.unpack_from
        if size < _HEADER.size or _masked_crc(buf[:8]) != unpack(buf, 0)[1]:
            why = f"it is {size} bytes long" if size < _HEADER.size else ""
            raise self._not_tfrecord(buf[:16], why or "its first length header fails its CRC")
        # Record starts kept as int64 arrays a chunk at a time (a list of ints is ~36 bytes a
        # record: 2 million 1-byte records held 145 MB).
        starts: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        done, at = 0, 0  # records in the chunks before this one
        while at < size:
            cancel.check()  # a large file takes a while; the client may have left
            heads: list[int] = []
            add, bytes_end = heads.append, at + _CHECK_BYTES
            for _ in range(_CHECK_RECORDS):
                if at >= size or at >= bytes_end or size - at < _HEADER.size:
                    break
                add(at)
                at += _FRAMING + unpack(buf, at)[0]
            chunk = np.array(heads, np.int64)
            lengths.append(self._check_heads(buf, chunk, done))
            starts.append(chunk)
            done += len(chunk)
            if at > size:
                length = int(lengths[-1][-1])
                raise CorruptFileError(
                    f"{self.name} record {done - 1} (byte {int(chunk[-1]):,}): the record's "
                    f"{length:,} bytes run past the end of the file ({size:,} bytes): it is "
                    f"truncated; rewrite it."
                )
            if at < size and size - at < _HEADER.size:
                raise CorruptFileError(
                    f"{self.name} record {done} (byte {at:,}): the file ends inside the "
                    f"record's header ({size - at} of {_HEADER.size} bytes): it is truncated; "
                    f"rewrite it."
                )
        return (
            np.concatenate(starts) + _HEADER.size,
            np.concatenate(lengths).astype(np.int64),
        )

    def _check_heads(self, buf: mmap.mmap, at: np.ndarray, first: int) -> np.ndarray:
        """The lengths in the headers at `at` (records `first` on), each header's CRC
        checked."""
        view = np.frombuffer(buf, np.uint8)
        try:  # the map cannot close while numpy holds its buffer
            raw = view[at[:, None] + np.arange(_HEADER.size)]
        finally:
            del view
        lengths = raw[:, :8].copy().view("<u8").ravel()
        bad = np.flatnonzero(_length_crcs(lengths) != raw[:, 8:].copy().view("<u4").ravel())
        if bad.size:
            n = int(bad[0])
            raise CorruptFileError(
                f"{self.name} record {first + n} (byte {int(at[n]):,}): the record's length "
                f"header fails its CRC: the file is damaged (or was written partly over); "
                f"rewrite it."
            )
        return lengths

    def _not_tfrecord(self, head: bytes, why: str) -> RecordError:
        kind = _compressed(head)
        if kind is not None:
            how = "gunzip" if kind == "GZIP" else "Python's zlib.decompress"
            return RecordError(
                f"{self.name} looks {kind}-compressed ({why}): compressed TFRecord is not "
                f"read; decompress it ({how}) to a plain TFRecord file (TensorFlow writes one with "
                f"`compression_type=''`)."
            )
        return RecordError(
            f"{self.name} is not a TFRecord file ({why}); if it is a compressed TFRecord "
            f"(GZIP, ZLIB), decompress it: compressed TFRecord is not read."
        )

    def __len__(self) -> int:
        return len(self._offsets)

    def where(self, index: int) -> str:
        return f"{self.name} record {index}"

    def release(self) -> None:
        """Unmaps the file (its descriptor with it) now; a later read maps it again."""
        OPEN_FILES.close(self)

    # Nothing else in memory but the index, which the reader needs.
    close = release

    def _map(self) -> mmap.mmap:
        with open(self.path, "rb") as f:  # the map keeps a duplicate of the descriptor
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def _buffer(self):
        """A context holding the file mapped (and kept open) within it (`OPEN_FILES`)."""
        return OPEN_FILES.use(self, self._map, mmap.mmap.close)

    def _read(self, buf: mmap.mmap, index: int, start: int, length: int) -> str | np.ndarray:
        """Record `index`'s text or ids, its data's CRC checked."""
        where = self.where(index)
        check_size(length, self.max_bytes, where)
        data = buf[start : start + length]
        footer = buf[start + length : start + length + _FOOTER.size]
        if len(footer) < _FOOTER.size:
            raise CorruptFileError(
                f"{where} (byte {start - _HEADER.size:,}): the file ends inside the record: "
                f"it was cut short since the stream opened it."
            )
        if _masked_crc(data) != _FOOTER.unpack(footer)[0]:
            raise CorruptFileError(
                f"{where} (byte {start - _HEADER.size:,}): the record's data fails its CRC: "
                f"the file is damaged (or changed since the stream opened it); rewrite it."
            )
        if self.token_field is not None:
            return example_ids(data, self.token_field, where)
        return example_text(data, self.text_field, where)

    def __getitem__(self, index: int) -> str | np.ndarray:
        index = range(len(self))[index]  # a negative index counts from the end, as in a list
        with self._buffer() as buf:
            return self._read(buf, index, int(self._offsets[index]), int(self._lengths[index]))

    def read_many(self, indices: Sequence[int]) -> list[str] | list[np.ndarray]:
        """The texts (or ids) of many records, the file mapped once for all."""
        starts = self._offsets[indices].tolist()
        lengths = self._lengths[indices].tolist()
        with self._buffer() as buf:
            return [
                self._read(buf, index, start, length)
                for index, start, length in zip(indices, starts, lengths, strict=True)
            ]
