"""The same documents in every file format the server reads, and the bytes of each, for tests of
the readers and for the fuzz run's files."""

from __future__ import annotations

import os


def jsonl_bytes(docs, field="text", decoy=False, newline="\n") -> bytes:
    """One JSON object per line; `decoy` adds a wrong "text" beside `field` to catch mix-ups."""
    import json

    lines = []
    for i, doc in enumerate(docs):
        obj = {"id": i, field: doc}
        if decoy:
            obj["text"] = f"decoy {i}"
        lines.append(json.dumps(obj))
    return "".join(line + newline for line in lines).encode()


def write_bytes(path, data: bytes) -> str:
    """Writes `data` to `path`; returns the path as a string, as specs hold it."""
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def write_arrayrecord(path, records) -> str:
    """An ArrayRecord file of `records` (bytes), one a group so any record is read alone."""
    from array_record.python import array_record_module

    w = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
    for r in records:
        w.write(r)
    w.close()
    return str(path)


def example_bytes(doc: str, field="text", decoy=False) -> bytes:
    """A serialized tf.train.Example holding `doc` in `field` (and a decoy "text")."""
    from input_server import tf_example_pb2

    ex = tf_example_pb2.Example()
    ex.features.feature[field].bytes_list.value.append(doc.encode())
    if decoy:
        ex.features.feature["text"].bytes_list.value.append(b"decoy")
    return ex.SerializeToString()


def write_parquet(path, docs, field="text", decoy=False, row_group_size=64) -> str:
    """A Parquet file of `docs` in several row groups (and a decoy "text" column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {"id": list(range(len(docs))), field: list(docs)}
    if decoy:
        columns["text"] = [f"decoy {i}" for i in range(len(docs))]
    pq.write_table(pa.table(columns), str(path), row_group_size=row_group_size)
    return str(path)


def zst_multiframe(data: bytes) -> bytes:
    """Several concatenated zstd frames, as `cat a.zst b.zst` or pzstd produce."""
    import zstandard

    c = zstandard.ZstdCompressor()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    return b"".join(c.compress(data[a:b]) for a, b in zip(cut, cut[1:], strict=False))


def _tfrecord(path, records) -> str:
    from input_server.data.tfrecord import write_tfrecord

    write_tfrecord(path, records)
    return str(path)


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data)


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


# kind -> (file name, writer(docs, path) -> path, source keys besides paths)
FORMATS = {
    "jsonl-plain": ("d.jsonl", lambda docs, p: write_bytes(p, jsonl_bytes(docs)), {}),
    "jsonl-gz-text_field-body": (
        "d.jsonl.gz",
        lambda docs, p: write_bytes(p, _gzip(jsonl_bytes(docs, "body", decoy=True))),
        {"text_field": "body"},
    ),
    "jsonl-zst": ("d.jsonl.zst", lambda docs, p: write_bytes(p, _zstd(jsonl_bytes(docs))), {}),
    "jsonl-zst-multiframe": (
        "d.jsonl.zst",
        lambda docs, p: write_bytes(p, zst_multiframe(jsonl_bytes(docs))),
        {},
    ),
    "arrayrecord-json-text_field-body": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, jsonl_bytes(docs, "body", decoy=True).splitlines()),
        {"format": "arrayrecord", "record_format": "json", "text_field": "body"},
    ),
    "arrayrecord-text": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, [d.encode() for d in docs]),
        {"format": "arrayrecord", "record_format": "text"},
    ),
    "arrayrecord-tf_example": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, [example_bytes(d) for d in docs]),
        {"format": "arrayrecord", "record_format": "tf_example"},
    ),
    "arrayrecord-tf_example-text_field-body": (
        "d.arrayrecord",
        lambda docs, p: write_arrayrecord(p, [example_bytes(d, "body", True) for d in docs]),
        {"format": "arrayrecord", "record_format": "tf_example", "text_field": "body"},
    ),
    "tfrecord-text_field-body": (
        "d.tfrecord",
        lambda docs, p: _tfrecord(p, [example_bytes(d, "body", True) for d in docs]),
        {"format": "tfrecord", "text_field": "body"},
    ),
    "parquet-row-groups": (
        "d.parquet",
        lambda docs, p: write_parquet(p, docs),
        {"format": "parquet"},
    ),
    "parquet-text_field-body": (
        "d.parquet",
        lambda docs, p: write_parquet(p, docs, "body", decoy=True),
        {"format": "parquet", "text_field": "body"},
    ),
}


def write_format(kind, docs, directory) -> tuple[str, dict]:
    """Writes `docs` as `kind` in `directory`; returns the path and the spec's source table."""
    name, write, keys = FORMATS[kind]
    os.makedirs(directory, exist_ok=True)
    path = write(docs, os.path.join(directory, name))
    return path, {"paths": [path], **keys}
