"""Builders of hostile inputs, shared by the tests that found each defect and by the fuzz run
(`scripts/tools/fuzz_hostile.py`, `scripts/tools/fuzz_client.py`), so both keep meeting the
same attacks: Parquet bombs (a few KB on disk, hundreds of MB decoded), hostile model files
(normalizers that multiply text, a charsmap entry of thousands of characters, a catastrophic
regex, tiktoken files past the ranks and line caps), and a fake server that sends crafted
batches to a client.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import struct
import time

import numpy as np

from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION, compact_arrays, encode_tensors

_MIB = 1 << 20

# --- Parquet bombs --------------------------------------------------------------------------------


def text_bomb(path, rows: int, value_mib: int = 1) -> str:
    """`rows` rows of one `value_mib` MiB string: one dictionary entry and its indices, a
    few hundred bytes of zstd Parquet (read back as plain strings: no stored arrow schema)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(rows, np.int32)), pa.array(["all work " * (value_mib * _MIB // 9)])
    )
    pq.write_table(pa.table({"text": column}), path, compression="zstd", store_schema=False)
    return str(path)


def ids_bomb(path, row_groups: int, rows: int = 500, ids_per_row: int = 2000) -> str:
    """`row_groups` row groups of `rows` x `ids_per_row` repeated int32 ids: one real row group
    whose bytes the footer names `row_groups` times (what an attacker writes; a few KB)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = pa.array(np.full(rows * ids_per_row, 7, np.int32))
    offsets = pa.array(np.arange(0, rows * ids_per_row + 1, ids_per_row, dtype=np.int32))
    table = pa.table({"ids": pa.ListArray.from_arrays(offsets, values)})
    one = io.BytesIO()
    pq.write_table(table, one, compression="zstd")
    raw = one.getvalue()
    body = raw[: -8 - struct.unpack("<i", raw[-8:-4])[0]]  # the file before its footer
    single = pq.ParquetFile(io.BytesIO(raw)).metadata
    meta = pq.ParquetFile(io.BytesIO(raw)).metadata
    for _ in range(row_groups - 1):
        meta.append_row_groups(single)
    footer = io.BytesIO()
    meta.write_metadata_file(footer)  # "PAR1", the footer, its length, "PAR1"
    with open(path, "wb") as f:
        f.write(body + footer.getvalue()[4:])
    return str(path)


# --- hostile model files --------------------------------------------------------------------------

# A Split pre-tokenizer whose regex makes Oniguruma give up (a Rust panic) on "a" * 60 + "c".
CATASTROPHIC_SPLIT = {
    "type": "Split",
    "pattern": {"Regex": "(a|aa)+$"},
    "behavior": "Isolated",
    "invert": False,
}
CATASTROPHIC_TEXT = "a" * 60 + "c"


def replace_normalizer(expansion: int) -> dict:
    """A Hugging Face normalizer replacing each space with `expansion` characters."""
    return {"type": "Replace", "pattern": {"String": " "}, "content": "x" * expansion}


def doubling_chain(links: int = 12) -> dict:
    """A Sequence of `links` Replace(" " -> "  "): each link small, the product 2^links."""
    link = {"type": "Replace", "pattern": {"String": " "}, "content": "  "}
    return {"type": "Sequence", "normalizers": [link] * links}


def hf_variant(folder, dest, **changes) -> str:
    """A copy of a Hugging Face model folder whose tokenizer.json has `changes` (normalizer=...,
    pre_tokenizer=...) set."""
    out = shutil.copytree(folder, dest)
    path = os.path.join(out, "tokenizer.json")
    with open(path) as f:
        model = json.load(f)
    model.update(changes)
    with open(path, "w") as f:
        json.dump(model, f)
    return str(out)


def charsmap_model(lines: list[str], prefix, expansion: int) -> str:
    """A small sentencepiece model whose precompiled charsmap maps "§" (U+00A7, absent from
    most training text, which keeps training fast) to `expansion` "N"s."""
    import sentencepiece as spm

    rule = f"{prefix}.rule.tsv"
    with open(rule, "w") as f:
        f.write("A7\t" + " ".join(["4E"] * expansion) + "\n")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        normalization_rule_tsv=rule,
        vocab_size=200,
        minloglevel=2,
        hard_vocab_limit=False,
        num_threads=1,
    )
    return f"{prefix}.model"


def tiktoken_ranks(path, lines: int) -> str:
    """A tiktoken ranks file of `lines` distinct lines (about 13 bytes each)."""
    with open(path, "w", encoding="ascii") as f:
        for r in range(lines):
            f.write(f"{base64.b64encode(r.to_bytes(3, 'big')).decode()} {r}\n")
    return str(path)


def tiktoken_long_line(path, mib: int = 4) -> str:
    """One line of `mib` MiB of valid base64 and no newline."""
    with open(path, "wb") as f:
        f.write(b"QUFB" * (mib * _MIB // 4))
    return str(path)


# --- a hostile server -----------------------------------------------------------------------------

SIZE, SEQ_LEN = 4, 128


def batch(seq: int, size: int = SIZE, seq_len: int = SEQ_LEN, **arrays) -> pb.Batch:
    """A well-formed compact batch (every row one full segment), its arrays replaced by
    `arrays` (name -> ndarray, or a ready `pb.Tensor`)."""
    good = compact_arrays(
        np.ones((size, seq_len), np.int32),
        np.full(size, seq_len, np.int32),
        np.ones(size, np.int32),
        None,
    )
    msg = pb.Batch(sequence_number=seq, state=b'{"seq":%d}' % (seq + 1), num_tokens=size * seq_len)
    for name, a in {**good, **arrays}.items():
        if isinstance(a, pb.Tensor):
            msg.tensors.append(a)
        else:
            encode_tensors({name: a}, into=msg.tensors)
    return msg


class HostileServer(pb_grpc.InputServiceServicer):
    """Answers GetInfo as a server of this release, then streams `messages` as they are."""

    def __init__(self, messages):
        self.messages = messages
        self.streams = 0

    def GetInfo(self, request, context):
        return pb.GetInfoResponse(server_version="hostile", protocol_version=PROTOCOL_VERSION)

    def StreamBatches(self, requests, context):
        self.streams += 1
        next(requests)  # the stream's first request: the spec
        yield from self.messages
        while context.is_active():  # hold the stream open: the client must end it
            time.sleep(0.05)


def with_state(seq: int, state: bytes) -> pb.Batch:
    msg = batch(seq)
    msg.state = state
    return msg


def raw(name: str, dtype: str, shape, data: bytes) -> pb.Tensor:
    return pb.Tensor(name=name, dtype=dtype, shape=shape, data=data)


# Each crafted second batch, and what the refusal must say of it.
CRAFTED = {
    "shape_2x64": (lambda: batch(1, 2, 64), "`inputs` of shape [2, 64]; this stream's is [4, 128]"),
    "shape_9x4096": (
        lambda: batch(1, 9, 4096),
        "`inputs` of shape [9, 4096]; this stream's is [4, 128]",
    ),
    "float32_ids": (
        lambda: batch(1, inputs=np.full((SIZE, SEQ_LEN), 3.7, np.float32)),
        "`inputs` of dtype 'float32'",
    ),
    "int64_ids": (
        lambda: batch(1, inputs=np.full((SIZE, SEQ_LEN), -(2**40), np.int64)),
        "`inputs` of dtype 'int64'",
    ),
    "object_dtype": (
        lambda: batch(1, inputs=raw("inputs", "object", [SIZE, SEQ_LEN], b"\0" * 4096)),
        "`inputs` of dtype 'object'",
    ),
    "overrunning_segments": (
        lambda: batch(1, segment_lengths=np.array([200, 128, 128, 128], np.int32)),
        "row 0 whose segments hold 200 tokens, more than its 128",
    ),
    "segment_counts_past_lengths": (
        lambda: batch(1, segments_per_row=np.array([2, 1, 1, 1], np.int32)),
        "`segments_per_row` counting 5 segments for 4 `segment_lengths`",
    ),
    "bytes_short_of_shape": (
        lambda: batch(1, inputs=raw("inputs", "int32", [SIZE, SEQ_LEN], b"\0" * 12)),
        "`inputs` of 12 bytes for shape [4, 128]",
    ),
    "missing_tensor": (
        lambda: pb.Batch(sequence_number=1, tensors=batch(1).tensors[:1], state=b'{"seq":2}'),
        "the tensors ['inputs']",
    ),
    "non_utf8_state": (lambda: with_state(1, b'{"seq":2,"x":"\xff\xfe"}'), "not UTF-8 JSON"),
    "oversized_state": (
        lambda: with_state(1, json.dumps({"seq": 2, "pad": "x" * (100 << 10)}).encode()),
        "a resume state of 102",
    ),
    "forged_state_seq": (lambda: with_state(1, b'{"seq":99}'), "'seq' is 99, not 2"),
    "state_not_an_object": (lambda: with_state(1, b"[2]"), "not UTF-8 JSON of an object"),
}
