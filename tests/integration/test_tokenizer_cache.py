"""What is derived from a model file is kept on disk (`serve --tokenizer-cache`,
`tokenizers/keep.py`): a restarted server reads the derived tokenizer.json and the probes'
verdict back instead of computing them; a damaged entry is found and rebuilt; two writers at
once leave a whole entry; another model digest or library version computes its own; without
the cache the gate runs in every process.

Each "fresh process" is a real one: the derived text, the verdict and the loaded backend are
also remembered in a process's memory, which a restart loses."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

from input_client import InputClient, PipelineSpec
from input_server.data.builtin_corpora import stdlib_docstrings, write_jsonl
from input_server.data.tokenizers import fast
from input_server.data.tokenizers.keep import SUFFIX, ModelKeep
from input_server.data.tokenizers.trainers import write_tiktoken_model
from input_server.serving.config import ServerConfig
from input_server.serving.server import Server
from tests.support import serve_files

FROM_CACHE = "read from the tokenizer cache"
DERIVED = "its tokenizer.json derived from the ranks"
VERDICT = "their verdict read from the tokenizer cache"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return stdlib_docstrings(1200)


@pytest.fixture(scope="module")
def model(texts, tmp_path_factory) -> str:
    """Llama-3-style ranks: a token no two tokens make (b"\\x01\\x02\\x03"), which fastokens'
    own loader refuses, so a tokenizer.json is derived from them."""
    folder = tmp_path_factory.mktemp("cache-model")
    path = write_tiktoken_model(texts[:400], folder / "m.tiktoken", vocab_size=600)
    return _with_rank(path, folder / "llama3ish.tiktoken", b"\x01\x02\x03")


def _with_rank(source: str, path, token: bytes) -> str:
    lines = pathlib.Path(source).read_text(encoding="ascii").splitlines()
    line = f"{base64.b64encode(token).decode()} {len(lines)}"
    pathlib.Path(path).write_text("\n".join([*lines, line]) + "\n", encoding="ascii")
    return os.fspath(path)


# What a fresh process chooses for the model, with the cache in FOLDER (or none): its why.
_CHOOSE = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    from input_client.spec import TokenizerSpec
    from input_server.data.tokenizers import fast, load_tokenizer
    from input_server.data.tokenizers.keep import ModelKeep
    model, folder, version, derive_format, docs = json.loads(sys.argv[1])
    if version:  # as after an upgrade of fastokens
        fast.Fastokens.version = version
    if derive_format:  # as after a change of the derivation, the server's version the same
        fast.DERIVE_FORMAT = derive_format
    keep = ModelKeep(folder) if folder else None
    tok = load_tokenizer(TokenizerSpec(model=model, kind="tiktoken"), keep=keep)
    choice = tok.choose_backend(docs)
    print(json.dumps([choice.backend, choice.why]))
""")


def _choose(
    model: str, folder, texts, version: str = "", derive_format: int = 0
) -> tuple[str, str]:
    """(why, log) of the backend choice of `model` in a fresh process."""
    arg = json.dumps([model, folder and os.fspath(folder), version, derive_format, texts[:16]])
    out = subprocess.run(
        [sys.executable, "-c", _CHOOSE, arg], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    backend, why = json.loads(out.stdout.strip().splitlines()[-1])
    assert backend == "fastokens", why
    return why, out.stderr


def _entries(folder) -> list[pathlib.Path]:
    return sorted(pathlib.Path(folder).glob("*" + SUFFIX))


def test_a_restarted_server_reads_what_its_first_start_derived(model, texts, tmp_path):
    """`serve` SIGKILLed and started again on the same cache: its stream says the derived
    tokenizer.json and the probes' verdict were read from the cache; the first start's
    derived and probed."""
    data = write_jsonl(texts, tmp_path / "docs.jsonl")
    cache = tmp_path / "cache"
    spec = PipelineSpec(
        source={"paths": [data]},
        tokenizer={"model": model, "kind": "tiktoken"},
        batch={"seq_len": 128, "size": 4},
        workers={"count": 0},
    )
    flags = ("--tokenizer-cache", str(cache), "--data-root", os.path.dirname(model))
    whys = []
    for start in ("first", "restart"):
        child, target = serve_files(tmp_path, data, flags=flags, name=start)
        try:
            with InputClient(target) as client, client.batches(spec) as it:
                next(it)
                deadline = time.monotonic() + 60  # the backend loads behind the stream
                while (stream := client.info().streams[0]).tokenizer_backend_why.startswith(
                    "while "
                ):
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                assert stream.tokenizer_backend == "fastokens", stream.tokenizer_backend_why
                whys.append(stream.tokenizer_backend_why)
        finally:
            child.kill()  # SIGKILL, as a preempted sidecar
    assert FROM_CACHE not in whys[0]
    assert len(_entries(cache)) == 2  # the derived tokenizer.json and the verdict
    assert f"{FROM_CACHE}: {DERIVED}" in whys[1] and VERDICT in whys[1], whys[1]


def test_a_damaged_entry_is_found_and_rebuilt(model, texts, tmp_path):
    why, _ = _choose(model, tmp_path, texts)
    assert FROM_CACHE not in why and VERDICT not in why
    for entry in _entries(tmp_path):  # one byte of each payload changed: lengths still agree
        blob = bytearray(entry.read_bytes())
        blob[-2] ^= 0x01
        entry.write_bytes(bytes(blob))
    why, log = _choose(model, tmp_path, texts)
    assert log.count("is damaged") == 2 and "SHA-256" in log, log
    assert FROM_CACHE not in why and VERDICT not in why, why  # derived and probed again
    why, log = _choose(model, tmp_path, texts)  # and put back whole
    assert "damaged" not in log and DERIVED in why and VERDICT in why, (why, log)


def test_another_digest_or_library_version_keeps_its_own(model, texts, tmp_path):
    _choose(model, tmp_path, texts)
    # The same ranks and one more: another digest.
    other = _with_rank(model, tmp_path / "other.tiktoken", b"\x04\x05\x06")
    why, _ = _choose(other, tmp_path, texts)
    assert FROM_CACHE not in why and VERDICT not in why, why
    why, _ = _choose(model, tmp_path, texts, version="99.0.0-upgraded")
    assert FROM_CACHE not in why and VERDICT not in why, why
    assert len(_entries(tmp_path)) == 6  # two entries for each
    why, _ = _choose(model, tmp_path, texts)  # the first's still read back
    assert DERIVED in why and VERDICT in why, why
    # A new derivation: its tokenizer.json derived again, and the probes run on it again.
    why, _ = _choose(model, tmp_path, texts, derive_format=fast.DERIVE_FORMAT + 1)
    assert FROM_CACHE not in why and VERDICT not in why, why


def test_without_the_cache_every_process_runs_the_gate(model, texts, tmp_path):
    _choose(model, tmp_path, texts)  # kept: a process without the cache must not read it
    for _ in range(2):
        why, _ = _choose(model, None, texts)
        assert FROM_CACHE not in why and VERDICT not in why, why
        assert "gave the reference's ids on" in why


# Writes its own payload under one key, over and over, as a second server would.
_WRITE = textwrap.dedent("""
    import sys
    from input_server.data.tokenizers.keep import ModelKeep
    folder, tag = sys.argv[1], sys.argv[2].encode()
    keep = ModelKeep(folder)
    for i in range(40):
        keep.put("race", {"digest": "d"}, tag * (200_000 + 1_000 * i))
""")


def test_two_writers_at_once_leave_a_whole_entry(tmp_path, caplog):
    """Two processes put one key's entry 40 times each while this one reads it: every read
    is none yet or one writer's whole payload, never a torn or damaged one, and no temporary
    file is left."""
    writers = [subprocess.Popen([sys.executable, "-c", _WRITE, str(tmp_path), tag]) for tag in "ab"]
    keep, seen = ModelKeep(str(tmp_path)), set()
    while any(w.poll() is None for w in writers):
        got = keep.get("race", {"digest": "d"})
        if got is not None:
            assert set(got) <= {ord("a")} or set(got) <= {ord("b")}, got[:20]
            seen.add(got[:1])
    assert all(w.wait(timeout=60) == 0 for w in writers)
    final = keep.get("race", {"digest": "d"})
    assert final is not None and len(final) == 200_000 + 1_000 * 39
    assert "damaged" not in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == [_entries(tmp_path)[0].name]


def test_a_cache_folder_others_may_write_into_is_refused(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(ValueError, match="others can write into it"):
        Server(ServerConfig(listen=[f"unix://{tmp_path}/s.sock"], tokenizer_cache=str(folder)))


def test_a_later_streams_tokenizer_shares_the_loaded_ranks(model, tmp_path):
    """Each stream of a request's spec makes a new tokenizer: the Encoding read from the
    ranks is shared within the process while the file stands, read anew once it changes."""
    from input_client.spec import TokenizerSpec
    from input_server.data.tokenizers import load_tokenizer

    path = tmp_path / "m.tiktoken"
    path.write_bytes(pathlib.Path(model).read_bytes())
    first, second = (load_tokenizer(TokenizerSpec(model=str(path), kind="tiktoken")) for _ in "ab")
    assert first.model() is second.model()
    _with_rank(str(path), path, b"\x04\x05\x06")  # rewritten in place: another model
    third = load_tokenizer(TokenizerSpec(model=str(path), kind="tiktoken"))
    assert third.model() is not first.model()
    assert third.info().vocab_size == first.info().vocab_size + 1


def test_an_entry_another_user_owns_or_may_write_is_not_read(tmp_path, caplog):
    """An entry planted by another user, or made writable by others after it was written, is
    not served from (it would decide the ids); a killed writer's old temporary file is removed
    when the next entry is written."""
    keep = ModelKeep(str(tmp_path))
    keep.put("what", {"digest": "d"}, b"payload")
    (entry,) = _entries(tmp_path)
    assert keep.get("what", {"digest": "d"}) == b"payload"
    os.chmod(entry, 0o666)
    assert keep.get("what", {"digest": "d"}) is None
    os.chmod(entry, 0o600)
    os.chown(entry, 65534, 65534)  # tests run as root: another user's file
    assert keep.get("what", {"digest": "d"}) is None
    assert sum("is not this server's user's alone" in r.getMessage() for r in caplog.records) == 2
    old = tmp_path / ".killed.tmp"
    old.write_bytes(b"half")
    os.utime(old, (1, 1))
    fresh = tmp_path / ".writing.tmp"
    fresh.write_bytes(b"half")
    keep.put("what", {"digest": "d"}, b"payload")  # replaces the planted entry
    assert keep.get("what", {"digest": "d"}) == b"payload"
    assert not old.exists() and fresh.exists()  # a live writer's file stays
