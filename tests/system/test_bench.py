"""`input-server bench` and the scripts/bench/bench_*.py benchmarks run end to end, from any folder,
and report every figure (speed itself is not asserted: it is measured by the benchmark, side by
side, not by unit tests)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from input_client.spec import TokenizerSpec
from input_server.benchmark.kinds import limit_threads
from tests.support import cli_argv, script


def test_bench_command_reports_all_measurements(tmp_path, corpus, spm_model):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[source]\npaths = ["{corpus}"]\n[tokenizer]\nmodel = "{spm_model}"\n'
        f"[batch]\nseq_len = 256\nsize = 8\n"
    )
    stdout, result = _bench(tmp_path, str(spec), min_tokens=100_000)
    assert result["kind"] == "sentencepiece"
    assert set(result["reference"]) >= {"0", "1"}
    for figure in (
        result["limit"],
        result["pipeline_in_process"],
        result["server"]["unix"],
        result["server"]["tcp"],
        *result["reference"].values(),
    ):
        assert figure["tokens_per_s"] > 0
    assert result["pipeline_in_process"]["tokens"] >= 100_000
    ratios = result["ratios"]
    assert ratios["in_process_over_limit"] > 0 and ratios["server_unix_over_in_process"] > 0
    # Same algorithm on the same document order: the same packing.
    assert (
        ratios["packing_efficiency_same_order"] == ratios["reference_packing_efficiency_same_order"]
    )
    # The compact wire form: uint16 inputs (the fixture's vocabulary is 1000) plus a little
    # per segment.
    assert 2.0 <= result["server"]["unix"]["wire_bytes_per_token"] < 3.0
    assert "in_process_over_limit" in stdout


@pytest.fixture(scope="module")
def kind_models(docs, tmp_path_factory) -> dict[str, str]:
    """A model of each kind other than sentencepiece, trained on the corpus's documents."""
    from input_server.data.tokenizers.trainers import train_hf_tokenizer, write_tiktoken_model

    d = tmp_path_factory.mktemp("kinds")
    return {
        "huggingface": train_hf_tokenizer(docs, d / "hf", vocab_size=1000),
        "tiktoken": write_tiktoken_model(docs, d / "bpe.tiktoken", vocab_size=1000),
    }


def _spec_file(path, corpus, model, kind="sentencepiece"):
    path.write_text(
        f'[source]\npaths = ["{corpus}"]\n[tokenizer]\nkind = "{kind}"\nmodel = "{model}"\n'
        f"[batch]\nseq_len = 256\nsize = 8\n"
    )
    return str(path)


def _bench(tmp_path, *args, min_tokens: int = 30_000):
    """`input-server bench ARGS --json OUT` at small sizes; (stdout, the JSON)."""
    out_json = tmp_path / "bench.json"
    bench = ("bench", *args, "--json", str(out_json), "--min-tokens", str(min_tokens))
    out = subprocess.run(
        cli_argv(*bench, "--rounds", "1"),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout, json.loads(out_json.read_text())


def _run_script(tmp_path, name: str, *args: str, timeout: float = 300) -> str:
    """`python scripts/bench/NAME ARGS` run from `tmp_path` (a benchmark runs from any folder); its
    stdout, once it has exited 0."""
    out = subprocess.run(
        [sys.executable, script(f"bench/{name}"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_bench_kinds_reports_a_row_per_kind(tmp_path, corpus, spm_model):
    """`--kinds all`: the spec's sentencepiece model and a Hugging Face, a tiktoken and a
    tekken model trained on its corpus, each against its own limit and reference, in one
    table."""
    spec = _spec_file(tmp_path / "spec.toml", corpus, spm_model)
    stdout, result = _bench(tmp_path, spec, "--kinds", "all", "--reference-processes", "0")
    rows = {r["kind"]: r for r in result["kinds"]}
    assert list(rows) == ["sentencepiece", "huggingface", "tiktoken", "tekken"]
    assert result["models"] == {
        "sentencepiece": "the spec's",
        "huggingface": "trained here",
        "tiktoken": "trained here",
        "tekken": "trained here",
    }
    for kind, r in rows.items():
        for k in (
            "limit_tokens_per_s",
            "in_process_tokens_per_s",
            "server_unix_tokens_per_s",
            "best_reference_tokens_per_s",
            "in_process_over_limit",
            "in_process_over_best_reference",
        ):
            assert r[k] > 0, (kind, k)
        # The same vocabulary size (tiktoken's file holds it, the 256 special tokens follow;
        # tekken's special tokens come first).
        assert r["vocab_size"] - {"tiktoken": 256, "tekken": 1000}.get(kind, 0) <= 1000
        assert any(line.startswith(kind) for line in stdout.splitlines()), kind
        assert set(result["results"][kind]["server"]) == {"unix"}
    assert "transformers" in rows["huggingface"]["reference_encode"]
    assert "ours/limit" in stdout


@pytest.mark.parametrize("kind", ["huggingface", "tiktoken"])
def test_bench_measures_a_spec_of_each_kind(kind, tmp_path, corpus, kind_models, docs):
    spec = _spec_file(tmp_path / "spec.toml", corpus, kind_models[kind], kind)
    stdout, result = _bench(tmp_path, spec, "--reference-processes", "0")
    assert result["kind"] == kind
    for figure in (
        result["limit"],
        result["pipeline_in_process"],
        result["server"]["unix"],
        result["server"]["tcp"],
        result["reference"]["0"],
    ):
        assert figure["tokens_per_s"] > 0
    # The limit is the fastest of the kind's batch calls (Hugging Face and tiktoken have two)
    # at each thread count up to the cores (`limit_threads`), and says which.
    tried = result["limit_calls_tried"]
    per_count = 1 if kind == "sentencepiece" else 2
    assert result["limit"]["call"] in tried
    assert len(tried) == per_count * len(limit_threads(os.cpu_count() or 1)), tried
    assert result["limit"]["tokens_per_s"] > 0 and result["limit"]["threads"] >= 1
    ratios = result["ratios"]
    # The reference tokenizes as MaxText's class of the kind, the pipeline gives the same ids:
    # the same packing on the same order.
    assert (
        ratios["packing_efficiency_same_order"] == ratios["reference_packing_efficiency_same_order"]
    )
    assert f"{kind} batch encode (limit)" in stdout and result["limit"]["call"] in stdout
    # Who tokenized, and every document of the corpus compared with the reference.
    backend = result["tokenizer_backend"]
    fast = {"huggingface": "fastokens", "tiktoken": "fastokens", "sentencepiece": "reference"}
    assert backend["backend"] == fast[kind], backend  # the fixture's NFKC model fails kitoken
    assert backend["documents_differing"] == 0
    assert backend["documents_compared"] == (0 if kind == "sentencepiece" else len(docs))
    assert f"tokenizer backend: {backend['backend']}" in stdout
    # Served, what the reference verified of the backend's groups (none made: none to say).
    # A short stream may be made whole by the reference while the backend loads behind it.
    served = result["server"]["unix"]
    if backend["backend"] == "reference":
        assert served["backend_groups"] == 0, served
    assert served["audited_groups"] <= served["backend_groups"]
    assert ("audited by the reference, unix:" in stdout) == (served["backend_groups"] > 0)


def test_token_cache_script_reports_each_epoch_and_the_same_batches(corpus, spm_model, tmp_path):
    spec = _spec_file(tmp_path / "spec.toml", corpus, spm_model)
    stdout = _run_script(tmp_path, "bench_token_cache.py", "--spec", spec, "--rounds", "1")
    result = json.loads(stdout)
    assert result["same_batches"] is True
    assert set(result["tokens_per_s"]) == {
        "no_cache",
        "first_epoch_cached",
        "second_epoch_cached",
        "second_epoch_cached_2_processes",
    }
    assert all(r > 0 for r in result["tokens_per_s"].values())


def test_bench_kinds_names_the_kinds_it_knows(tmp_path):
    out = subprocess.run(
        cli_argv("bench", "x.toml", "--kinds", "sentencepiece,bpe"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "--kinds" in out.stderr and "sentencepiece, huggingface, tiktoken" in out.stderr


def test_the_reference_encodes_each_document_as_the_pipeline(docs, spm_model, kind_models):
    """The reference's per-document encode (MaxText's, picklable for Grain's workers) and the
    pipeline's tokenizer give the same ids, long runs and special-token text included."""
    from input_server.benchmark.kinds import DocumentEncoder
    from input_server.data.tokenizers import load_tokenizer

    texts = [*docs[:200], "a" * 30_000 + " b", " " * 26_000 + "x", "<|begin_of_text|> <|bos|>"]
    for kind, model in {"sentencepiece": spm_model, **kind_models}.items():
        spec = TokenizerSpec(kind=kind, model=model)
        encode = pickle.loads(pickle.dumps(DocumentEncoder(spec)))
        group = load_tokenizer(spec).encode(texts)
        ours = [
            group.tokens[s : s + n].tolist()
            for s, n in zip(group.starts, group.lengths, strict=True)
        ]
        assert [encode(t) for t in texts] == ours, kind


@pytest.mark.parametrize("pace_ms", [0, 5])
def test_grpc_message_cost_script_reports_each_api(pace_ms, tmp_path):
    # (Enough messages that the server's CPU, read in the kernel's 10 ms ticks, spans several.)
    messages = "200" if pace_ms else "1000"
    stdout = _run_script(
        tmp_path, "bench_grpc.py", "--rows", "4", "--seq-len", "256", "--messages", messages,
        "--pace-ms", str(pace_ms),
    )  # fmt: skip
    result = json.loads(stdout[stdout.index("{") :])
    assert result["tokens_per_message"] == 1024
    assert result["message_bytes"] > 2 * 1024  # uint16 ids
    runs = {(r["server"], r["client"]) for r in result["results"]}
    assert runs == {
        ("sync", "sync"),
        ("sync", "sync-single-threaded"),
        ("sync", "sync-window"),
        ("aio", "aio"),
    }
    for r in result["results"]:
        assert r["messages_per_s"] > 0 and r["client_cpu_us_per_message"] > 0
        assert r["server_cpu_us_per_message"] > 0
        if pace_ms:  # spaced as asked: never faster than one message per pace
            assert r["messages_per_s"] <= 1000 / pace_ms


def test_tokenize_script_reports_each_comparison_and_the_cut(corpus, spm_model, tmp_path):
    stdout = _run_script(
        tmp_path, "bench_tokenize.py", "--corpus", corpus, "--model", spm_model,
        "--seq-len", "32", "--seconds", "0.2",
    )  # fmt: skip
    result = json.loads(stdout)
    assert set(result["ratios"]) == {
        "numpy_over_ints",
        "two_threads_over_one",
        "threads_x1_over_x2",
        "pipeline_group_over_64",
    }
    assert all(r > 0 for r in result["ratios"].values())
    cut = result["cut"]
    # Cutting at seq_len 32 tokenizes far less than the whole text, and never less than the
    # text the kept tokens span (the cut never drops a kept token).
    assert cut["characters_kept_tokens_span"] <= cut["characters_tokenized"]
    assert cut["characters_tokenized"] < cut["characters_in_all"]
    reading = result["reading"]
    assert reading["seconds_per_epoch"] > 0 and reading["cut_tokenizing_seconds_per_epoch"] > 0
    assert reading["over_cut_tokenizing"] > 0


def test_message_size_script_compares_each_size_through_the_server(corpus, spm_model, tmp_path):
    stdout = _run_script(
        tmp_path, "bench_message_size.py", "--corpus", corpus, "--model", spm_model,
        "--batch-size", "2", "--seq-len", "64", "--sizes", "128,1024", "--rounds", "1",
        "--min-tokens", "300000",
    )  # fmt: skip
    result = json.loads(stdout[stdout.index("{") :])
    assert set(result["sizes"]) == {"128", "1024"}
    for v in result["sizes"].values():
        assert v["over_in_process"] > 0
        # The server's CPU is read in psutil's 10 ms ticks: a short run may show none.
        assert v["client_cpu_ns_per_token"] > 0 and v["server_cpu_ns_per_token"] >= 0


def test_bench_hostile_reports_each_attack_held(tmp_path):
    """The hostile-clients benchmark at small sizes: the bomb refused by name while the other
    stream flows, health and info answering beside silent calls, a file glob served under a
    descriptor limit of 1,024."""
    stdout = _run_script(
        tmp_path, "bench_hostile.py",
        *("--bomb-mb", "64", "--decompressed-mb", "16", "--memory-gb", "2"),
        *("--silent", "24", "--files", "60"),
        timeout=600,
    )  # fmt: skip
    result = json.loads(stdout)
    bomb = result["bomb"]
    assert bomb["status"] == "RESOURCE_EXHAUSTED" and "--max-decompressed-mb" in bomb["message"]
    assert bomb["server_alive"] and bomb["other_stream_batches_meanwhile"] > 0
    # Starved, they took the whole 5 s deadline; served, milliseconds (a loaded host: more).
    assert result["silent"]["health_max_s"] < 2.5 and result["silent"]["info_max_s"] < 2.5
    assert result["files"]["status"] == "OK"
    assert set(result["globs"]) == {"200_distinct_globs_cpu_s", "10000_copies_of_one_cpu_s"}


def test_bench_mixture_reports_each_stream_and_what_the_server_held(corpus, spm_model, tmp_path):
    out_json = tmp_path / "mixture.json"
    stdout = _run_script(
        tmp_path, "bench_mixture.py", "--corpus", corpus, "--model", spm_model,
        "--components", "6", "--rounds", "1", "--min-tokens", "50000", "--seq-len", "256",
        "--batch-size", "8", "--json", str(out_json),
        timeout=900,
    )  # fmt: skip
    result = json.loads(out_json.read_text())
    r = result["results"]
    for name in ("one_source", "mixture", "ids_parquet", "ids_jsonl", "ids_arrayrecord", "limit"):
        assert r[name]["tokens_per_s"] > 0, name
    for name in ("one_source", "mixture", "mixture_2_processes", "ids_parquet"):
        assert r[name]["server_rss_mb"] > 0 and r[name]["server_threads"] > 0, name
    assert r["mixture"]["server_worker_processes"] == 0
    assert r["mixture_2_processes"]["server_worker_processes"] >= 1
    # The mixture's components share the stream's threads: none of its own per component (6
    # components would add 5 or more). The peaks are sampled, and a call answered meanwhile
    # (a gRPC pool thread, started on demand) can add a few to either.
    assert r["mixture"]["server_threads"] <= r["one_source"]["server_threads"] + 4
    assert set(result["median_ratios"]) >= {
        "mixture_over_one_source",
        "ids_parquet_over_tokenizer_limit",
    }
    assert "mixture_over_one_source" in stdout


def test_bench_fanin_compares_one_server_two_servers_and_tls(corpus, spm_model, tmp_path):
    out_json = tmp_path / "fanin.json"
    stdout = _run_script(
        tmp_path, "bench_fanin.py", "--corpus", corpus, "--model", spm_model,
        "--rounds", "1", "--min-tokens", "20000", "--seq-len", "256", "--batch-size", "4",
        "--json", str(out_json),
        timeout=600,
    )  # fmt: skip
    result = json.loads(out_json.read_text())
    for case in ("one_server", "two_servers", "two_servers_arrival", "tcp_plaintext", "tcp_tls"):
        assert result["tokens_per_s"][case] > 0, case
        assert result["runs"][case][0]["client_cpu_ns_per_token"] > 0, case
    assert result["two_over_one"] > 0 and result["tls_over_plaintext"] > 0
    assert "two servers / one" in stdout
