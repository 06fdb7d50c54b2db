"""A request reads only inside the server's data roots: every path a spec names (directly, by
`../`, through a link, by glob; the tokenizer model too) resolves there, or the stream is
refused with PERMISSION_DENIED naming the path as written, and no token of the file leaves."""

from __future__ import annotations

import json
import os
import shutil

import grpc
import pytest

from input_client import PipelineSpec
from input_client.proto import pb, pb_grpc
from input_client.wire import PROTOCOL_VERSION, batches_of, decode_batch
from input_server.serving.server import Server, ServerConfig

SECRET = "the launch code is swordfish"


def stream(target: str, spec: pb.PipelineSpec) -> tuple[grpc.StatusCode, str, list[pb.Batch]]:
    """(status, details, messages) of a raw request, as any client could send it."""
    with grpc.insecure_channel(target) as channel:
        call = pb_grpc.InputServiceStub(channel).StreamBatches(
            iter([pb.StreamBatchesRequest(spec=spec, protocol_version=PROTOCOL_VERSION)]),
            timeout=60,
        )
        messages = []
        try:
            messages.extend(call)
        except grpc.RpcError as e:
            return e.code(), e.details(), messages
        return grpc.StatusCode.OK, "", messages


@pytest.fixture(scope="module")
def place(tmp_path_factory, corpus, spm_model):
    """A data root holding the corpus and model (and links out of it), a secret beside it."""
    top = tmp_path_factory.mktemp("roots")
    root, outside = top / "root", top / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    shutil.copy(corpus, root / "corpus.jsonl")
    shutil.copy(spm_model, root / "spm.model")
    secret = outside / "secret.jsonl"
    secret.write_text(json.dumps({"text": SECRET}) + "\n")
    secret.chmod(0o600)
    shutil.copy(spm_model, outside / "spm.model")
    (root / "link.jsonl").symlink_to(secret)
    (root / "link_dir").symlink_to(outside, target_is_directory=True)
    (root / "model_link.model").symlink_to(outside / "spm.model")
    (root / "sub" / "inner_link.jsonl").symlink_to(root / "corpus.jsonl")  # stays inside
    os.mkfifo(root / "pipe.jsonl")
    with Server(ServerConfig(listen=[f"unix://{top}/s.sock"], data_roots=[str(root)])) as srv:
        yield srv.targets[0], root, secret


def spec(paths, model="spm.model") -> pb.PipelineSpec:
    return PipelineSpec(
        source={"paths": paths},
        tokenizer={"model": model},
        batch={"seq_len": 64, "size": 2},
        workers={"count": 0},
    ).to_proto()


@pytest.mark.parametrize(
    "path",
    [
        "SECRET_ABS",
        "../outside/secret.jsonl",
        "sub/../../outside/secret.jsonl",
        "link.jsonl",
        "link_dir/secret.jsonl",
        "/etc/passwd",
        "/proc/self/environ",
        "/proc/self/root/etc/passwd",
        "/dev/zero",
        "../outside/*.jsonl",
        "link_dir/*.jsonl",
        "/proc/self/root/**/x",
    ],
    ids=[
        "absolute",
        "dotdot",
        "dotdot-deep",
        "file-link",
        "dir-link",
        "etc-passwd",
        "proc",
        "proc-root",
        "device",
        "glob-dotdot",
        "glob-dir-link",
        "glob-proc",
    ],
)
def test_a_path_outside_the_roots_is_permission_denied_naming_it(place, path):
    target, root, secret = place
    path = str(secret) if path == "SECRET_ABS" else path
    code, details, messages = stream(target, spec([path]))
    assert code == grpc.StatusCode.PERMISSION_DENIED, (code, details)
    assert repr(path) in details and "data roots" in details
    assert not messages
    # Named as the client wrote it, never as it resolved.
    assert str(secret) not in details or path == str(secret)


def test_a_glob_skips_links_out_of_the_roots_and_says_nothing_of_them(place):
    target, root, secret = place
    # `*.jsonl` matches corpus.jsonl (in) and link.jsonl (out, skipped) and the FIFO (not a
    # regular file, skipped); `**` does not enter link_dir.
    for pattern in ["*.jsonl", "**/*.jsonl"]:
        code, details, messages = stream(target, spec([pattern]))
        assert code == grpc.StatusCode.OK, details
        assert messages[-1].end_of_data
    code, details, _ = stream(target, spec(["link*.jsonl"]))
    assert code == grpc.StatusCode.NOT_FOUND and "matches no file" in details
    assert "secret" not in details and "link.jsonl" not in details


def test_no_token_of_a_file_outside_the_roots_reaches_the_client(place, spm_model):
    """The whole stream of every way in decodes to text without the secret."""
    import sentencepiece as spm

    target, root, secret = place
    sp = spm.SentencePieceProcessor(model_file=spm_model)
    # (A link inside the roots alone: with the file it leads to, one file named twice.)
    for paths in (["*.jsonl"], ["**/*.jsonl"], ["corpus.jsonl"], ["sub/inner_link.jsonl"]):
        code, details, messages = stream(target, spec(paths))
        assert code == grpc.StatusCode.OK, details
        text = [
            sp.decode(decode_batch(b.tensors)["inputs"].astype(int).tolist())
            for m in messages
            for b in batches_of(m)
            if not b.end_of_data
        ]
        assert text and not any("swordfish" in t for t in text)


def test_a_model_outside_the_roots_or_through_a_link_out_is_refused(place):
    target, root, secret = place
    for model in ["model_link.model", str(secret.parent / "spm.model"), "../outside/spm.model"]:
        code, details, _ = stream(target, spec(["corpus.jsonl"], model=model))
        assert code == grpc.StatusCode.PERMISSION_DENIED, (model, details)
        assert "tokenizer.model" in details and repr(model) in details


def test_a_fifo_inside_the_roots_is_refused_not_read(place):
    """A FIFO would block the reader forever (and a device is endless)."""
    target, root, _ = place
    code, details, _ = stream(target, spec(["pipe.jsonl"]))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not a regular file" in details


def test_a_missing_file_inside_the_roots_is_not_found_outside_permission_denied(place):
    """Outside, whether a file exists is not the client's to learn."""
    target, root, secret = place
    assert stream(target, spec(["nope.jsonl"]))[0] == grpc.StatusCode.NOT_FOUND
    there = stream(target, spec([str(secret)]))
    missing = stream(target, spec([str(secret.parent / "nope.jsonl")]))
    assert there[0] == missing[0] == grpc.StatusCode.PERMISSION_DENIED
    assert there[1].replace(str(secret), "X") == missing[1].replace(
        str(secret.parent / "nope.jsonl"), "X"
    )


def test_relative_paths_join_the_first_root_and_links_inside_are_followed(place):
    target, root, _ = place
    for paths in (
        ["corpus.jsonl"],
        [str(root / "corpus.jsonl")],
        ["sub/inner_link.jsonl"],
        ["sub/../corpus.jsonl"],
    ):
        code, details, messages = stream(target, spec(paths))
        assert code == grpc.StatusCode.OK and messages[-1].end_of_data, (paths, details)


def test_dotdot_after_a_link_outside_tells_nothing_of_the_link(place, tmp_path):
    """`..` applies to the path as written: after a link outside the roots it would say
    whether that path is a link (and how deep its target lies)."""
    target, root, secret = place
    outside = secret.parent
    (outside / "to_usr").symlink_to("/usr/share", target_is_directory=True)
    (outside / "plain").mkdir()
    answers = {
        stream(target, spec([f"{p}/../../root/corpus.jsonl"]))[0]
        for p in (str(outside / "to_usr"), str(outside / "plain"), str(outside / "missing"))
    }
    assert answers == {grpc.StatusCode.OK}  # each is root/corpus.jsonl, as written


@pytest.mark.parametrize(
    "pattern", ["**/**/**/**/**/**/**/**/*.jsonl", "sub/../*.jsonl", "./**/corpus.jsonl"]
)
def test_odd_globs_match_each_file_once(place, pattern):
    target, root, _ = place
    code, details, messages = stream(target, spec([pattern]))
    plain = stream(target, spec(["corpus.jsonl"]))
    assert code == grpc.StatusCode.OK, details
    # corpus.jsonl (and its link inside) once: as many batches (messages carry a varying
    # number, as many as were ready).
    assert _batches(messages) == _batches(plain[2])


def _batches(messages: list[pb.Batch]) -> int:
    return sum(1 + len(m.following) for m in messages if not m.end_of_data)


def test_a_glob_with_too_many_parts_is_refused_not_a_crash(place):
    target, root, _ = place
    code, details, _ = stream(target, spec(["*/" * 40 + "a.jsonl"]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "parts" in details
    code, details, _ = stream(target, spec(["**/" * 1200 + "a.jsonl"]))  # collapses to one
    assert code == grpc.StatusCode.NOT_FOUND, details


def test_a_glob_follows_links_to_folders_inside_the_roots(place):
    target, root, _ = place
    (root / "shards").mkdir(exist_ok=True)
    link = root / "shards" / "linked"
    if not link.exists():
        link.symlink_to(root / "sub", target_is_directory=True)
    code, details, messages = stream(target, spec(["shards/**/*.jsonl"]))
    assert code == grpc.StatusCode.OK, details  # sub/inner_link.jsonl, reached by the link
