"""The measured spaceless lines at full size against `input-server serve` in a 3 GB memory cgroup,
its limits the defaults (--max-document-mb 64, --stream-memory-mb 2048), another client's stream
flowing: two streams at once of a 64 MiB NUL line in plain text and a 60 MiB line of `a` in
jsonl are each refused by name before they are tokenized, and the server lives on.

Measured before (issue 50, finding 1): one stream of 60 MiB of `a` took the server from ~200 MB
to 2,474 MB (~38 bytes a character); two streams of the 64 MiB NUL file OOM-killed it in 16 s.
Only inside a cgroup (a failure must kill the server, not the host); skipped where none can be
made.
"""

from __future__ import annotations

import json
import os
import threading

import grpc
import pytest

from tests.support import (
    assert_peak_within,
    assert_still_flowing,
    bounded_server,
    flowing_stream,
    needs_memory_cgroup,
    other_stream_spec,
    stream_status,
)

_MIB = 1 << 20


@pytest.mark.timeout(300)
def test_two_streams_of_spaceless_lines_are_refused_and_the_server_lives(tmp_path, docs):
    needs_memory_cgroup("a 64 MiB spaceless line took 2.4 GB a stream")
    root = str(tmp_path)
    nul = os.path.join(root, "nul.txt")
    with open(nul, "wb") as f:
        f.write(b"a short first line\n" + b"\0" * (64 * _MIB - 1024) + b"\n")
    letters = os.path.join(root, "letters.jsonl")
    with open(letters, "w") as f:
        f.write(json.dumps({"text": "a" * (60 * _MIB)}) + "\n")
    good = other_stream_spec(docs, tmp_path)
    attacks = [
        (good.replace(source={"paths": [nul], "format": "text"}), "nul.txt line 2"),
        (good.replace(source={"paths": [letters]}), "letters.jsonl line 1"),
    ]
    with (
        bounded_server(root, gb=3, log=os.path.join(root, "server.log")) as server,
        flowing_stream(server.target, good.to_proto(), timeout=600, started=5) as flowing,
    ):
        before = server.peak.bytes
        results: dict[str, tuple] = {}

        def call(spec, name):
            results[name] = stream_status(server.target, spec.to_proto(), timeout=120)

        # Two streams of each at once, told apart by index.
        callers = [
            threading.Thread(target=call, args=(spec, f"{name}#{i}"))
            for i, (spec, name) in enumerate(attacks * 2)
        ]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        assert server.process.poll() is None, "the server died"
        for name, (code, details, _) in results.items():
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (name, details)
            assert name.split("#")[0] in details, (name, details)
            assert "--stream-memory-mb 2048" in details, details
        assert_still_flowing(flowing)
        # Refused before tokenizing: what is left is reading the lines (64 MiB of text in
        # each group a stream's threads have in flight: +741 MB measured for the four), not
        # the ~10 GB each would take to tokenize.
        peak = assert_peak_within(server, before, 1536)
    print(f"peak {before >> 20} MB before the attacks, {peak >> 20} MB after")
