"""`serve --token-cache`: a later epoch or a restarted server reads each document's ids back
instead of reading and tokenizing, with the same batches; a damaged entry is found and made
again; the cache stays within its bound. Real servers (`input-server serve`), real files, a real
sentencepiece model, a real SQLite cache folder."""

from __future__ import annotations

import os
import sqlite3
import subprocess

import numpy as np
import pytest

from input_client import InputClient
from input_server.data.token_cache import DB_NAME, TokenCache
from input_server.testing.processes import cli_argv
from tests.support import serve_cli


def _spec(make_spec, epochs: int = 1, processes: int = 0):
    return make_spec(order={"epochs": epochs}, workers={"count": processes})


def _served(tmp_path, corpus, spm_model, *flags: str):
    """A server of the corpus and model with `flags`; (child, its Unix socket target)."""
    child, targets = serve_cli(
        "--listen",
        f"unix://{tmp_path}/s{len(os.listdir(tmp_path))}.sock",
        "--data-root",
        os.path.dirname(corpus),
        "--data-root",
        os.path.dirname(spm_model),
        *flags,
        log=str(tmp_path / f"serve{len(os.listdir(tmp_path))}.log"),
    )
    return child, targets[0]


def _all_batches(target: str, spec) -> tuple[list[dict], dict[str, float]]:
    """Every batch of the stream, and the server's stage seconds once it ended."""
    with InputClient(target, connect_timeout_s=30) as client:
        with client.batches(spec) as it:
            batches = [{k: v.copy() for k, v in b.items()} for b in it]
        totals = client.info().totals
    return batches, {s.stage: s.seconds for s in totals.stages}


def _same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory, corpus, spm_model, make_spec):
    """Two epochs from a server without a cache: the batches a cache must not change."""
    tmp = tmp_path_factory.mktemp("plain")
    child, target = _served(tmp, corpus, spm_model)
    try:
        return _all_batches(target, _spec(make_spec, epochs=2))[0]
    finally:
        child.kill()


def test_a_restarted_server_reads_the_ids_back_and_tokenizes_nothing(
    tmp_path, corpus, spm_model, make_spec, plain
):
    cache = tmp_path / "cache"
    child, target = _served(tmp_path, corpus, spm_model, "--token-cache", str(cache))
    try:
        first, stages = _all_batches(target, _spec(make_spec, epochs=2))
    finally:
        child.kill()
    assert _same(first, plain), "the cache changed the batches"
    assert stages["tokenize"] > 0
    kept = TokenCache(str(cache), 1 << 30).stats()["entries"]
    assert kept > 0
    # Restarted on the same folder: every group is found, none read from its file or tokenized.
    child, target = _served(tmp_path, corpus, spm_model, "--token-cache", str(cache))
    try:
        again, stages = _all_batches(target, _spec(make_spec, epochs=2))
    finally:
        child.kill()
    assert _same(again, plain)
    assert stages["tokenize"] == 0.0, stages
    assert TokenCache(str(cache), 1 << 30).stats()["entries"] == kept


def test_damaged_entries_are_made_again_with_the_same_batches(
    tmp_path, corpus, spm_model, make_spec, plain
):
    cache = tmp_path / "cache"
    child, target = _served(tmp_path, corpus, spm_model, "--token-cache", str(cache))
    try:
        _all_batches(target, _spec(make_spec))
    finally:
        child.kill()
    with sqlite3.connect(cache / DB_NAME) as db:  # flip a byte of a third of the entries
        rows = db.execute("SELECT rowid, ids FROM tokens").fetchall()
        for rowid, blob in rows[::3]:
            if blob:
                bad = bytes([blob[0] ^ 0xFF]) + blob[1:]
                db.execute("UPDATE tokens SET ids = ? WHERE rowid = ?", (bad, rowid))
    child, target = _served(
        tmp_path, corpus, spm_model, "--token-cache", str(cache), "--max-workers", "2"
    )
    try:  # in worker processes too, which open the cache themselves
        again, stages = _all_batches(target, _spec(make_spec, epochs=2, processes=2))
    finally:
        child.kill()
    assert _same(again, plain)
    assert stages["tokenize"] > 0  # the damaged documents' groups were tokenized again
    check = TokenCache(str(cache), 1 << 30)
    assert check.stats()["entries"] == len(rows)
    keys = [int(i).to_bytes(8, "little") for i in range(3)]
    assert check.stats()["corrupt"] == 0 and keys  # read below: all good again
    with sqlite3.connect(cache / DB_NAME) as db:
        namespaces = [r[0] for r in db.execute("SELECT DISTINCT namespace FROM tokens")]
    got = check.get_many(namespaces[0], keys)
    assert all(x is not None for x in got) and check.stats()["corrupt"] == 0


def test_the_cache_stays_within_its_bound(tmp_path, corpus, spm_model, make_spec, plain):
    cache = tmp_path / "cache"
    bound_gb = 64 * 1024 / (1 << 30)  # 64 KiB: far below the corpus's ids
    child, target = _served(
        tmp_path,
        corpus,
        spm_model,
        "--token-cache",
        str(cache),
        "--token-cache-gb",
        repr(bound_gb),
    )
    try:
        got, _ = _all_batches(target, _spec(make_spec, epochs=2))
    finally:
        child.kill()
    assert _same(got, plain)
    assert 0 < TokenCache(str(cache), 1 << 30).stats()["bytes"] <= 64 * 1024


def test_a_bad_bound_is_one_line(tmp_path):
    argv = cli_argv("serve", "--token-cache", str(tmp_path / "c"), "--token-cache-gb", "0")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode != 0 and "token_cache_gb" in out.stderr.replace("-", "_"), out.stderr
    assert "Traceback" not in out.stderr, out.stderr
