"""A document's tokenizing memory is counted before it is paid: a line with no space (which no
cut makes shorter) whose tokenizing would take more than the server's --stream-memory-mb is
refused with RESOURCE_EXHAUSTED naming its file, record and size, in every format and every
tokenizer kind, and the stream's other documents and other streams go on; documents within the
budget are served as before, and those tokenized at once in the process hold no more than it.

Measured before (issue 50): a 60 MiB line of `a` took a server from ~200 MB to 2,474 MB; two
streams of a 64 MiB NUL line killed a 3 GB server. The full-size attack runs in a memory
cgroup: tests/system/test_spaceless_lines.py."""

from __future__ import annotations

import threading

import grpc
import pytest

from input_client import PipelineSpec
from input_server.data.builtin_corpora import write_jsonl
from input_server.data.tokenizers.memory import BYTES_PER_CHAR, TOKENIZING, TokenizingBudget
from input_server.data.tokenizers.trainers import (
    train_hf_tokenizer,
    write_tekken_model,
    write_tiktoken_model,
)
from input_server.serving.server import Server, ServerConfig
from input_server.testing.files import FORMATS, write_format
from tests.support import stream_status

BUDGET_MB = 64
# 1 MiB of one letter: 170-450 MiB to tokenize by the kinds' measured bytes a character.
SPACELESS = "x" * (1 << 20)


@pytest.fixture(scope="module")
def models(tmp_path_factory, docs, spm_model) -> dict[str, str]:
    d = tmp_path_factory.mktemp("models")
    return {
        "sentencepiece": spm_model,
        "huggingface": train_hf_tokenizer(docs[:300], d / "hf", vocab_size=500),
        "tiktoken": write_tiktoken_model(docs[:300], d / "t.tiktoken", vocab_size=500),
        "tekken": write_tekken_model(docs[:300], d / "tekken.json", vocab_size=500),
    }


def _server(tmp_path, budget_mb: float = BUDGET_MB) -> Server:
    return Server(
        ServerConfig(
            listen=[f"unix://{tmp_path}/s.sock"],
            stream_memory_mb=budget_mb,
            max_workers=2,
            grace_s=1,
        )
    )


def _spec(source: dict, model: str, kind: str, long_documents: str = "trim") -> PipelineSpec:
    return PipelineSpec(
        source=source,
        tokenizer={"model": model, "kind": kind},
        batch={"seq_len": 128, "size": 4, "long_documents": long_documents},
        order={"shuffle": False, "epochs": 1},
        workers={"count": 0},
    )


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_spaceless_line_over_the_budget_is_refused_by_name_in_every_format(
    tmp_path, some_docs, models, fmt
):
    docs = list(some_docs[:40]) + [SPACELESS] + list(some_docs[40:80])
    path, source = write_format(fmt, docs, tmp_path / "data")
    spec = _spec(source, models["sentencepiece"], "sentencepiece")
    with _server(tmp_path) as srv:
        code, details, _ = stream_status(srv.targets[0], spec.to_proto(), timeout=120)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        name = path.rsplit("/", 1)[1]
        for needle in (name, "1,048,576 characters", f"--stream-memory-mb {BUDGET_MB}"):
            assert needle in details, (needle, details)
        # The server goes on: the same data without the line is served whole.
        path, source = write_format(fmt, some_docs[:80], tmp_path / "ok")
        code, details, n = stream_status(
            srv.targets[0], _spec(source, models["sentencepiece"], "sentencepiece").to_proto()
        )
        assert code == grpc.StatusCode.OK and n > 0, details


@pytest.mark.parametrize("kind", sorted(BYTES_PER_CHAR))
@pytest.mark.parametrize("long_documents", ["trim", "chunk"])
def test_every_kind_counts_what_it_tokenizes_whole(
    tmp_path, some_docs, models, kind, long_documents
):
    # Over the budget with no space; the same characters with spaces every few letters are
    # cut before tokenizing under trim (and so served), and tokenized whole under chunk.
    # tiktoken's documents are tokenized in MaxText's pieces of fixed length, spaces or not:
    # under trim only as far as they are kept.
    chars = 2 * (BUDGET_MB << 20) // BYTES_PER_CHAR[kind]  # twice the budget, whole
    spaced = " ".join(["xyzzy"] * (chars // 6))
    trim = long_documents == "trim"
    for text, served in (("x" * chars, trim and kind == "tiktoken"), (spaced, trim)):
        corpus = write_jsonl([*some_docs[:20], text], tmp_path / f"{kind}.jsonl")
        spec = _spec({"paths": [corpus]}, models[kind], kind, long_documents)
        with _server(tmp_path) as srv:
            code, details, _ = stream_status(srv.targets[0], spec.to_proto(), timeout=120)
        if served:
            assert code == grpc.StatusCode.OK, details
        else:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert f"{kind}.jsonl line 21" in details and f"{kind} models" in details, details


def test_long_documents_of_two_streams_hold_no_more_than_the_budget_at_once(
    tmp_path, some_docs, spm_model
):
    # Each line takes ~0.6 x the budget: two at once would pass it, so one waits.
    budget_mb = 256
    line = "y" * int(0.6 * budget_mb * (1 << 20) / BYTES_PER_CHAR["sentencepiece"])
    seen, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            seen[0] = max(seen[0], TOKENIZING.held)
            stop.wait(0.002)

    results = []
    with _server(tmp_path, budget_mb) as srv:
        specs = []
        for i in range(2):
            corpus = write_jsonl([line, *some_docs[:10], line], tmp_path / f"s{i}.jsonl")
            specs.append(_spec({"paths": [corpus]}, spm_model, "sentencepiece"))
        watcher = threading.Thread(target=watch)
        watcher.start()
        callers = [
            threading.Thread(
                target=lambda s=s: results.append(
                    stream_status(srv.targets[0], s.to_proto(), timeout=120)
                )
            )
            for s in specs
        ]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        stop.set()
        watcher.join()
    assert [r[0] for r in results] == [grpc.StatusCode.OK] * 2, results
    assert all(r[2] > 0 for r in results), results
    one = len(line) * BYTES_PER_CHAR["sentencepiece"]
    assert one <= seen[0] <= budget_mb << 20, (seen[0], one)
    assert TOKENIZING.held == 0


@pytest.mark.parametrize("kind", ["sentencepiece", "huggingface", "tekken"])
def test_a_line_whose_first_cut_is_early_is_counted_as_it_grows(tmp_path, some_docs, models, kind):
    # One place to cut at the start, then none: the cut prefix holds too few tokens and grows
    # to the next place to cut, the end; counted as that, not as the first cut.
    chars = 2 * (BUDGET_MB << 20) // BYTES_PER_CHAR[kind]
    corpus = write_jsonl([*some_docs[:20], "lead in " + "x" * chars], tmp_path / "early.jsonl")
    spec = _spec({"paths": [corpus]}, models[kind], kind, "trim")
    with _server(tmp_path) as srv:
        code, details, _ = stream_status(srv.targets[0], spec.to_proto(), timeout=120)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "early.jsonl line 21" in details, details


def test_the_budget_makes_a_holder_wait_for_room_and_frees_it():
    budget = TokenizingBudget()
    first_in, release, second_in = threading.Event(), threading.Event(), threading.Event()

    def hold(n: int, entered: threading.Event, until: threading.Event | None) -> None:
        with budget.hold(n, 100):
            entered.set()
            if until is not None:
                until.wait(10)

    a = threading.Thread(target=hold, args=(60, first_in, release))
    a.start()
    assert first_in.wait(10)
    b = threading.Thread(target=hold, args=(60, second_in, None))
    b.start()
    assert not second_in.wait(0.3), "two holders of 60 within a budget of 100"
    assert budget.held == 60
    release.set()
    assert second_in.wait(10)
    a.join()
    b.join()
    assert budget.held == 0
    with budget.hold(150, 100):  # alone, more than the budget (a run of one document) enters
        assert budget.held == 150
