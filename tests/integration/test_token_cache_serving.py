"""`serve --token-cache`: a later epoch or a restarted server reads each document's ids back
instead of reading and tokenizing, with the same batches; a damaged entry is found and made
again; the cache stays within its bound. Real servers (`input-server serve`), real files, a real
sentencepiece model, a real SQLite cache folder."""

from __future__ import annotations

import os
import sqlite3
import subprocess

import pytest

from input_client import InputClient
from input_server.data.token_cache import DB_NAME, TokenCache
from input_server.testing.processes import cli_argv
from tests.support import assert_same_batches, serve_files


def _spec(make_spec, epochs: int = 1, processes: int = 0):
    return make_spec(order={"epochs": epochs}, workers={"count": processes})


def _served(tmp_path, corpus, spm_model, spec, *flags: str):
    """Every batch of `spec` from a new server of the corpus and model with `flags` (its
    socket and log named anew in `tmp_path`, stopped after), and the server's stage seconds
    once the stream ended."""
    name = f"s{len(os.listdir(tmp_path))}"
    child, target = serve_files(tmp_path, corpus, spm_model, flags=flags, name=name)
    try:
        with InputClient(target, connect_timeout_s=30) as client:
            with client.batches(spec) as it:
                batches = [{k: v.copy() for k, v in b.items()} for b in it]
            totals = client.info().totals
    finally:
        child.kill()
    return batches, {s.stage: s.seconds for s in totals.stages}


@pytest.fixture(scope="module")
def plain(tmp_path_factory, corpus, spm_model, make_spec):
    """Two epochs from a server without a cache: the batches a cache must not change."""
    tmp = tmp_path_factory.mktemp("plain")
    return _served(tmp, corpus, spm_model, _spec(make_spec, epochs=2))[0]


def test_a_restarted_server_reads_the_ids_back_and_tokenizes_nothing(
    tmp_path, corpus, spm_model, make_spec, plain
):
    cache = tmp_path / "cache"
    flags = ("--token-cache", str(cache))
    first, stages = _served(tmp_path, corpus, spm_model, _spec(make_spec, epochs=2), *flags)
    assert_same_batches(first, plain)  # the cache changes no batch
    assert stages["tokenize"] > 0
    kept = TokenCache(str(cache), 1 << 30).stats()["entries"]
    assert kept > 0
    # Restarted on the same folder: every group is found, none read from its file or tokenized.
    again, stages = _served(tmp_path, corpus, spm_model, _spec(make_spec, epochs=2), *flags)
    assert_same_batches(again, plain)
    assert stages["tokenize"] == 0.0, stages
    assert TokenCache(str(cache), 1 << 30).stats()["entries"] == kept


def test_damaged_entries_are_made_again_with_the_same_batches(
    tmp_path, corpus, spm_model, make_spec, plain
):
    cache = tmp_path / "cache"
    _served(tmp_path, corpus, spm_model, _spec(make_spec), "--token-cache", str(cache))
    with sqlite3.connect(cache / DB_NAME) as db:  # flip a byte of a third of the entries
        rows = db.execute("SELECT rowid, ids FROM tokens").fetchall()
        for rowid, blob in rows[::3]:
            if blob:
                bad = bytes([blob[0] ^ 0xFF]) + blob[1:]
                db.execute("UPDATE tokens SET ids = ? WHERE rowid = ?", (bad, rowid))
    # In worker processes too, which open the cache themselves.
    spec = _spec(make_spec, epochs=2, processes=2)
    flags = ("--token-cache", str(cache), "--max-workers", "2")
    again, stages = _served(tmp_path, corpus, spm_model, spec, *flags)
    assert_same_batches(again, plain)
    assert stages["tokenize"] > 0  # the damaged documents' groups were tokenized again
    check = TokenCache(str(cache), 1 << 30)
    assert check.stats()["entries"] == len(rows)
    # Every entry reads back whole: the damaged ones were made again, none is left damaged.
    with sqlite3.connect(cache / DB_NAME) as db:
        stored = db.execute("SELECT namespace, key FROM tokens").fetchall()
    for namespace in {ns for ns, _ in stored}:
        keys = [key for ns, key in stored if ns == namespace]
        assert all(x is not None for x in check.get_many(namespace, keys))
    assert check.stats()["corrupt"] == 0


def test_the_cache_stays_within_its_bound(tmp_path, corpus, spm_model, make_spec, plain):
    cache = tmp_path / "cache"
    bound_gb = 64 * 1024 / (1 << 30)  # 64 KiB: far below the corpus's ids
    flags = ("--token-cache", str(cache), "--token-cache-gb", repr(bound_gb))
    got, _ = _served(tmp_path, corpus, spm_model, _spec(make_spec, epochs=2), *flags)
    assert_same_batches(got, plain)
    assert 0 < TokenCache(str(cache), 1 << 30).stats()["bytes"] <= 64 * 1024


def test_a_bad_bound_is_one_line(tmp_path):
    argv = cli_argv("serve", "--token-cache", str(tmp_path / "c"), "--token-cache-gb", "0")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode != 0 and "token_cache_gb" in out.stderr.replace("-", "_"), out.stderr
    assert "Traceback" not in out.stderr, out.stderr
