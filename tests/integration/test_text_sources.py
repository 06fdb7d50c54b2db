"""Plain-text sources (`format = "text"`, a document a line) against the real thing: Grain, a
real sentencepiece model, and a server on a Unix socket. The same documents in .txt, .txt.gz
or .txt.zst give the batches of their jsonl; a resume mid-file is exact; the server's budgets
refuse a line, a file and a glob by name; the format follows the names."""

from __future__ import annotations

import gzip
import json
import os

import grpc
import pytest

from input_client import InputClient, PipelineSpec, SpecError
from input_server.serving.server import Server, ServerConfig
from tests.support import (
    assert_same_batches,
    jsonl_bytes,
    run_pipeline,
    stream_status,
    write_bytes,
    zst_multiframe,
)


def one_line(doc: str) -> str:
    """A document fit for a line: its line breaks made spaces (the text is otherwise kept)."""
    return doc.replace("\r", " ").replace("\n", " ")


@pytest.fixture(scope="module")
def lines(some_docs) -> list[str]:
    out = [one_line(d) for d in some_docs]
    return [d for d in out if d.strip()]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("text")


@pytest.fixture(scope="module")
def as_jsonl(lines, folder) -> str:
    return write_bytes(folder / "same.jsonl", jsonl_bytes(lines))


@pytest.fixture(scope="module")
def jsonl_batches(make_spec, as_jsonl) -> list:
    out = run_pipeline(make_spec(source={"paths": [as_jsonl]}))
    assert len(out) > 10
    return out


def text_bytes(lines, newline: str = "\n") -> bytes:
    return "".join(d + newline for d in lines).encode()


def messy(lines) -> bytes:
    """CRLF endings, blank and whitespace-only lines before, between and after, no final
    newline: what an editor or a Windows tool leaves."""
    out = [b"\n", b"  \t\r\n"]
    for i, d in enumerate(lines):
        out.append(d.encode() + (b"\r\n" if i % 2 else b"\n"))
        if i % 9 == 0:
            out.append([b"\n", b"\r\n", b" \x0c \n", b"\t\n"][i % 4])
    out.append(b"\r\n \n")
    return b"".join(out)[:-1]


WRITERS = {
    "txt": ("d.txt", text_bytes),
    "txt-gz": ("d.txt.gz", lambda lines: gzip.compress(text_bytes(lines))),
    "txt-zst-multiframe": ("d.txt.zst", lambda lines: zst_multiframe(text_bytes(lines))),
    "txt-crlf-blank-lines": ("messy.txt", messy),
}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_text_gives_the_batches_of_the_same_documents_in_jsonl(
    kind, lines, make_spec, jsonl_batches, tmp_path
):
    """The format inferred from the name, each line a document: byte-identical batches."""
    name, write = WRITERS[kind]
    spec = make_spec(source={"paths": [write_bytes(tmp_path / name, write(lines))]})
    assert spec.source.format == "text"
    assert_same_batches(run_pipeline(spec), jsonl_batches)


def test_text_read_in_a_grain_worker_process_gives_the_same_batches(
    lines, make_spec, jsonl_batches, tmp_path
):
    """The reader pickled to a worker process reopens its file there (and decompresses it)."""
    path = write_bytes(tmp_path / "d.txt.gz", gzip.compress(text_bytes(lines)))
    spec = make_spec(source={"paths": [path]})
    assert_same_batches(run_pipeline(spec, processes=1), jsonl_batches)


def test_a_dropped_line_changes_the_batches_so_the_comparison_is_not_vacuous(
    lines, make_spec, jsonl_batches, tmp_path
):
    path = write_bytes(tmp_path / "d.txt", text_bytes(lines[:100] + lines[101:]))
    got = run_pipeline(make_spec(source={"paths": [path]}))
    assert any(
        a.arrays["inputs"].tobytes() != b.arrays["inputs"].tobytes()
        for a, b in zip(got, jsonl_batches, strict=False)
    )


# ---------------------------------------------------------------------------------------------
# Served: a real server on a Unix socket, with small budgets


@pytest.fixture(scope="module")
def server(folder, spm_model, lines):
    """Budgets small enough to pass with a few files: 64 KB documents, 1 MB decompressed,
    4 files a request."""
    config = ServerConfig(
        listen=[f"unix://{folder}/s.sock"],
        data_roots=[str(folder), os.path.dirname(spm_model)],
        max_document_mb=1 / 16,
        max_decompressed_mb=1,
        max_files=4,
        grace_s=1,
    )
    with Server(config) as srv:
        yield srv.targets[0]


@pytest.mark.parametrize("name", ["served.txt", "served.txt.zst"])
def test_served_text_matches_jsonl_and_resumes_mid_file_exactly(
    name, server, lines, make_spec, as_jsonl, folder
):
    """Served, the text source gives the jsonl batches; stopped after 7 batches (mid-file)
    and resumed from the state, the batches continue as if never stopped."""
    _, write = WRITERS["txt" if name.endswith(".txt") else "txt-zst-multiframe"]
    path = write_bytes(folder / name, write(lines))
    spec = make_spec(source={"paths": [path]})
    with InputClient(server, connect_timeout_s=10) as client:
        with client.batches(make_spec(source={"paths": [as_jsonl]})) as it:
            reference = list(it)
        with client.batches(spec) as it:
            first = [next(it) for _ in range(7)]
            state = it.get_state()
        state = json.loads(json.dumps(state))  # as a checkpoint keeps it
        with client.batches(spec, state=state) as it:
            rest = list(it)
    assert len(reference) > 10
    assert_same_batches(first + rest, reference)


def write_lines(path, rows: list[bytes]) -> str:
    return write_bytes(path, b"".join(r + b"\n" for r in rows))


def test_a_line_over_max_document_mb_is_refused_naming_file_and_line(
    server, lines, make_spec, folder
):
    rows = [d.encode() for d in lines[:60]]
    rows[40] = b"word " * 20_000  # 100 KB, over the server's 64 KB
    path = write_lines(folder / "long-line.txt", rows)
    code, details, _ = stream_status(server, make_spec(source={"paths": [path]}).to_proto())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "long-line.txt line 41" in details and "--max-document-mb 0.0625" in details


@pytest.mark.parametrize("where", ["mid-file", "first-line"])
def test_bad_utf8_is_refused_naming_file_and_line(where, server, lines, make_spec, folder):
    rows = [d.encode() for d in lines[:200]]
    at = 150 if where == "mid-file" else 0
    rows[at] = b"caf\xe9 au lait"  # Latin-1, not UTF-8
    path = write_lines(folder / f"latin1-{where}.txt", rows)
    code, details, _ = stream_status(server, make_spec(source={"paths": [path]}).to_proto())
    assert f"latin1-{where}.txt line {at + 1}: not UTF-8 text" in details, details
    # Mid-file the data is damaged (DATA_LOSS); a first line that cannot be read says the
    # spec does not fit the file (INVALID_ARGUMENT), as for every format.
    first = where == "first-line"
    assert code == (grpc.StatusCode.INVALID_ARGUMENT if first else grpc.StatusCode.DATA_LOSS)
    if first:  # only the keys that decide how a text file is read
        assert "(format='text')" in details and "text_field" not in details, details


def test_compressed_text_over_max_decompressed_mb_is_refused_naming_file(
    server, lines, make_spec, folder
):
    big = text_bytes(lines * 24)  # over 2 MB of text, past the server's 1 MB
    assert len(big) > 1 << 21
    path = write_bytes(folder / "big.txt.gz", gzip.compress(big))
    code, details, _ = stream_status(server, make_spec(source={"paths": [path]}).to_proto())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "big.txt.gz" in details and "--max-decompressed-mb 1" in details
    assert "plain .txt" in details  # the way out, in the file's own format


def test_a_glob_over_max_files_is_refused(server, lines, make_spec, folder):
    (folder / "many").mkdir()
    for i in range(5):
        write_bytes(folder / "many" / f"{i}.txt", text_bytes(lines[i * 10 : i * 10 + 10]))
    spec = make_spec(source={"paths": [str(folder / "many" / "*.txt")]})
    assert spec.source.format == "text"
    code, details, _ = stream_status(server, spec.to_proto())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "more than 4 files" in details and "--max-files" in details


# ---------------------------------------------------------------------------------------------
# The format and the names


def test_plain_text_read_as_jsonl_says_format_text(server, lines, make_spec, folder):
    """A name the format is not inferred from (no extension): the jsonl reader's refusal
    names the way out."""
    path = write_bytes(folder / "corpus", text_bytes(lines[:20]))
    spec = make_spec(source={"paths": [path]})
    assert spec.source.format == "jsonl"
    code, details, _ = stream_status(server, spec.to_proto())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "corpus line 1: not valid JSON" in details and 'format = "text"' in details


def test_json_lines_in_a_txt_file_are_read_with_format_jsonl(lines, make_spec, jsonl_batches):
    """An explicit format wins over the name, and a replace of the paths keeps it."""
    spec = PipelineSpec(
        source={"paths": ["x.txt"], "format": "jsonl"}, tokenizer={"model": "m.model"}
    )
    assert spec.replace(source={"paths": ["y.txt"]}).source.format == "jsonl"
    inferred = PipelineSpec(source={"paths": ["x.jsonl"]}, tokenizer={"model": "m.model"})
    assert inferred.replace(source={"paths": ["y.txt.zst"]}).source.format == "text"


def test_the_format_inferred_travels_in_the_proto_and_the_fingerprint(make_spec, as_jsonl):
    """A jsonl source keeps the fingerprint it had when jsonl was the only default; a text
    source's differs (its states never resume a jsonl stream)."""
    jsonl = make_spec(source={"paths": [as_jsonl]})
    explicit = make_spec(source={"paths": [as_jsonl], "format": "jsonl"})
    assert jsonl.data_fingerprint() == explicit.data_fingerprint()
    text = make_spec(source={"paths": ["/d/x.txt"]})
    assert PipelineSpec.from_proto(text.to_proto()).source.format == "text"
    proto = text.to_proto()
    proto.source.format = ""  # another client leaving it out: the server infers it too
    assert PipelineSpec.from_proto(proto).source.format == "text"
    assert text.data_fingerprint() != make_spec(source={"paths": ["/d/x.jsonl"]}).data_fingerprint()


@pytest.mark.parametrize(
    "source, key, says",
    [
        ({"paths": ["a.txt", "b.jsonl"]}, "source.format", "mix plain-text names"),
        ({"paths": ["a.txt"], "text_field": "body"}, "source.text_field", "means nothing"),
        ({"paths": ["a.txt.gz"], "token_field": "ids"}, "source.token_field", "means nothing"),
        ({"paths": ["a.jsonl"], "format": "text"}, None, None),  # explicit: any names
    ],
    ids=["mixed-names", "text_field", "token_field", "explicit-text"],
)
def test_spec_mistakes_with_text_are_refused_by_key(source, key, says):
    def build():
        return PipelineSpec(source=source, tokenizer={"model": "m.model"})

    if key is None:
        assert build().source.format == "text"
        return
    with pytest.raises(SpecError, match=f"`{key}` .*{says}"):
        build()
