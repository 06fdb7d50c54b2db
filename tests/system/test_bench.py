"""`input-server bench` and the scripts/bench_*.py benchmarks run end to end, from any folder,
and report every figure (speed itself is not asserted: it is measured by the benchmark, side by
side, not by unit tests)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import cli_argv, script


def test_bench_command_reports_all_measurements(tmp_path, corpus, spm_model):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[source]\npaths = ["{corpus}"]\n[tokenizer]\nmodel = "{spm_model}"\n'
        f"[batch]\nseq_len = 256\nsize = 8\n"
    )
    out_json = tmp_path / "bench.json"
    out = subprocess.run(
        cli_argv(
            "bench", str(spec), "--json", str(out_json), "--min-tokens", "100000", "--rounds", "1"
        ),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out_json.read_text())
    assert set(result["reference"]) >= {"0", "1"}
    for figure in (
        result["sentencepiece_limit"],
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
    assert "in_process_over_limit" in out.stdout


@pytest.mark.parametrize("pace_ms", [0, 5])
def test_grpc_message_cost_script_reports_each_api(pace_ms, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            script("bench_grpc.py"),
            "--rows",
            "4",
            "--seq-len",
            "256",
            "--messages",
            "100" if pace_ms else "1000",
            "--pace-ms",
            str(pace_ms),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    # (Enough messages that each side's CPU spans several of psutil's 10 ms ticks.)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout[out.stdout.index("{") :])
    assert result["tokens_per_message"] == 1024
    assert result["message_bytes"] > 2 * 1024  # uint16 ids
    runs = {(r["server"], r["client"]) for r in result["results"]}
    assert runs == {("sync", "sync"), ("sync", "sync-single-threaded"), ("aio", "aio")}
    for r in result["results"]:
        assert r["messages_per_s"] > 0 and r["client_cpu_us_per_message"] > 0
        assert r["server_cpu_us_per_message"] > 0
        if pace_ms:  # spaced as asked: never faster than one message per pace
            assert r["messages_per_s"] <= 1000 / pace_ms


def test_tokenize_script_reports_each_comparison_and_the_cut(corpus, spm_model, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            script("bench_tokenize.py"),
            "--corpus",
            corpus,
            "--model",
            spm_model,
            "--seq-len",
            "32",
            "--seconds",
            "0.2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
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
    out = subprocess.run(
        [
            sys.executable,
            script("bench_message_size.py"),
            "--corpus",
            corpus,
            "--model",
            spm_model,
            "--batch-size",
            "2",
            "--seq-len",
            "64",
            "--sizes",
            "128,1024",
            "--rounds",
            "1",
            "--min-tokens",
            "300000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout[out.stdout.index("{") :])
    assert set(result["sizes"]) == {"128", "1024"}
    for v in result["sizes"].values():
        assert v["over_in_process"] > 0
        # The server's CPU is read in psutil's 10 ms ticks: a short run may show none.
        assert v["client_cpu_ns_per_token"] > 0 and v["server_cpu_ns_per_token"] >= 0


def test_bench_hostile_reports_each_attack_held(tmp_path):
    """The hostile-clients benchmark at small sizes: the bomb refused by name while the other
    stream flows, health and info answering beside silent calls, a file glob served under a
    descriptor limit of 1,024."""
    out = subprocess.run(
        [
            sys.executable,
            script("bench_hostile.py"),
            *("--bomb-mb", "64", "--decompressed-mb", "16", "--memory-gb", "2"),
            *("--silent", "24", "--files", "60"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    bomb = result["bomb"]
    assert bomb["status"] == "RESOURCE_EXHAUSTED" and "--max-decompressed-mb" in bomb["message"]
    assert bomb["server_alive"] and bomb["other_stream_batches_meanwhile"] > 0
    # Starved, they took the whole 5 s deadline; served, milliseconds (a loaded host: more).
    assert result["silent"]["health_max_s"] < 2.5 and result["silent"]["info_max_s"] < 2.5
    assert result["files"]["status"] == "OK"
    assert set(result["globs"]) == {"200_distinct_globs_cpu_s", "10000_copies_of_one_cpu_s"}


def test_bench_mixture_reports_each_stream_and_what_the_server_held(corpus, spm_model, tmp_path):
    out_json = tmp_path / "mixture.json"
    out = subprocess.run(
        [
            sys.executable, script("bench_mixture.py"), "--corpus", corpus, "--model", spm_model,
            "--components", "4", "--rounds", "1", "--min-tokens", "50000", "--seq-len", "256",
            "--batch-size", "8", "--json", str(out_json),
        ],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out_json.read_text())
    r = result["results"]
    for name in ("one_source", "mixture", "ids_parquet", "ids_jsonl", "ids_arrayrecord", "limit"):
        assert r[name]["tokens_per_s"] > 0, name
    for name in ("one_source", "mixture", "mixture_2_processes", "ids_parquet"):
        assert r[name]["server_rss_mb"] > 0 and r[name]["server_threads"] > 0, name
    assert r["mixture"]["server_worker_processes"] == 0
    assert r["mixture_2_processes"]["server_worker_processes"] >= 1
    # The mixture's components share the stream's threads: none of its own per component.
    assert r["mixture"]["server_threads"] <= r["one_source"]["server_threads"] + 2
    assert set(result["median_ratios"]) >= {
        "mixture_over_one_source",
        "ids_parquet_over_tokenizer_limit",
    }
    assert "mixture_over_one_source" in out.stdout
