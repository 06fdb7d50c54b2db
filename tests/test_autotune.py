"""The autotuner: its policy on synthetic tables, and its choices on real pipelines.

Real runs are compared side by side in the same test (the best of a few interleaved windows
per configuration), never against fixed numbers: the host may be busy.
"""

from __future__ import annotations

import json
import math
import time

import pytest

from input_client import PipelineSpec
from input_client.spec import SpecError, validate
from input_client.wire import FIELDS
from input_server import autotune
from input_server.autotune import Measurement, decide, next_candidate
from input_server.batching.pipeline import Pipeline, Workers
from input_server.data.sources import DocumentSource
from input_server.testing import SlowSource
from input_server.tools.corpus import write_jsonl

# Shorter windows than the server's defaults for the side-by-side checks, to bound test time.
WINDOW = {"warmup_s": 0.2, "window_s": 0.6}
DELAY_S = 0.002  # per record: remote storage's latency, scaled down


def row(processes, threads, rate, *, rss=0.0, cpu=1.0) -> Measurement:
    return Measurement(processes=processes, threads=threads, batches_per_s=rate,
                       tokens_per_s=1000.0 * rate, rss_mb=rss, cpu_cores=cpu, seconds=1.0,
                       batches=max(1, int(rate)))


def search(curve, *, cpus, **settings) -> list[Measurement]:
    """Runs the search policy against a synthetic throughput curve (no pipeline)."""
    rows: list[Measurement] = []
    while (c := next_candidate(rows, cpus=cpus, **settings)) is not None:
        if c.skip:
            rows.append(Measurement(processes=c.processes, threads=c.threads, skipped=c.skip))
        else:
            rows.append(curve(c.processes, c.threads))
        assert len(rows) < 30, rows
    return rows


def side_by_side(pipeline, configs, rounds, **window) -> dict[tuple[int, int], float]:
    """Batches/s of each (processes, threads): the best of `rounds` interleaved windows."""
    best = dict.fromkeys(configs, 0.0)
    for _ in range(rounds):
        for c in configs:
            m = autotune.measure(pipeline, *c, **{**WINDOW, **window})
            best[c] = max(best[c], m.batches_per_s)
    return best


def best_of_ratios(pipeline, choice, others, rounds, **window):
    """For each other configuration: the choice's best rate over interleaved rounds / its best.

    Rounds interleave the configurations, so a burst of load elsewhere on the host hits each
    of them in some round; a shared host only ever slows a measurement down, so each keeps its
    fastest round.
    """
    def rate(c):
        return autotune.measure(pipeline, *c, **{**WINDOW, **window}).batches_per_s

    rates: dict[tuple[int, int], list[float]] = {c: [] for c in (choice, *others)}
    for _ in range(rounds):
        for c in rates:
            rates[c].append(rate(c))
    best = {c: max(r) for c, r in rates.items()}
    spread = min(rates[choice]) / max(rates[choice])
    return {c: best[choice] / best[c] for c in others}, spread


def same_bytes(a, b) -> bool:
    return len(a) == len(b) and all(
        x.seq == y.seq and all(x.arrays[k].tobytes() == y.arrays[k].tobytes() for k in FIELDS)
        for x, y in zip(a, b, strict=True))


def first(pipeline, n, workers=None):
    with pipeline.stream(workers=workers) as stream:
        return [b for _, b in zip(range(n), stream, strict=False)]


# --- The decision, on synthetic tables ------------------------------------------------------


def test_plateau_picks_the_fewest_workers_within_a_few_percent_of_the_best():
    rows = [row(0, 1, 100), row(0, 2, 190), row(0, 4, 392), row(0, 8, 395), row(0, 16, 398)]
    t = decide(rows, cpus=16)
    assert (t.processes, t.threads, t.reason) == (0, 4, "plateau")
    assert t.chosen.batches_per_s >= 0.98 * 398
    # 5 % below the best is within the search's plateau but too far to choose: a noisy window
    # hides a real difference that size.
    rows[2] = row(0, 4, 380)
    assert decide(rows, cpus=16).threads == 8


@pytest.mark.parametrize("gain_past_cores, threads", [(1.10, 2), (2.0, 8)],
                         ids=["cpu-bound-stays-within-cores", "latency-bound-goes-past"])
def test_more_workers_than_cores_need_a_large_gain(gain_past_cores, threads):
    rows = [row(0, 1, 100), row(0, 2, 180), row(0, 4, 180 * gain_past_cores ** 0.5),
            row(0, 8, 180 * gain_past_cores)]
    assert decide(rows, cpus=2).threads == threads


def test_target_picks_the_fewest_workers_that_meet_it_with_headroom():
    rows = [row(0, 1, 10), row(0, 2, 20), row(0, 4, 40), row(0, 8, 80)]
    t = decide(rows, target_batches_per_s=15, cpus=2)
    assert (t.threads, t.reason) == (2, "target met")  # 20 >= 1.2 x 15
    t = decide(rows, target_batches_per_s=17, cpus=2)
    assert t.threads == 4  # 20 < 1.2 x 17
    t = decide(rows, target_batches_per_s=500, cpus=2)
    assert t.threads == 8 and "not reached" in t.detail


@pytest.mark.parametrize("k", [1, 2, 3])
def test_ram_budget_that_fits_k_workers_yields_at_most_k(k):
    per_process = 300.0
    rows = [row(0, 1, 100, rss=2), row(2, 1, 200, rss=2 * per_process),
            row(4, 1, 390, rss=4 * per_process), row(8, 1, 700, rss=8 * per_process)]
    t = decide(rows, ram_budget_mb=(k + 0.5) * per_process, cpus=8)
    assert t.workers <= k
    assert t.reason == "ram cap" and "ram cap" in t.detail


def test_max_workers_caps_the_choice():
    rows = [row(0, 1, 100), row(0, 2, 200), row(0, 4, 400)]
    t = decide(rows, max_workers=2, cpus=8)
    assert t.workers == 2 and t.reason == "max workers"


def test_second_look_takes_close_candidates_and_the_best_within_the_cores():
    rows = [row(0, 1, 100), row(0, 2, 150), row(0, 4, 170), row(0, 8, 260), row(0, 16, 250)]
    t = decide(rows, cpus=2)
    assert t.threads == 8  # 260 > 1.2 x 150: past the cores, on one window each
    again = autotune.contenders(rows, t, cpus=2)
    assert [m.threads for m in again] == [2, 16]  # the comparison that allowed it, then 16
    # Pooled with a second, slower window each, more threads no longer beat the cores by 20 %.
    rows[3] = autotune.pool(rows[3], row(0, 8, 100))
    rows[4] = autotune.pool(rows[4], row(0, 16, 100))
    assert rows[3].batches_per_s == 180 and rows[3].samples == 2
    assert decide(rows, cpus=2).threads == 2


def test_nothing_measured_is_an_error_that_says_what_to_do():
    with pytest.raises(ValueError, match="tune_seconds"):
        decide([Measurement(processes=0, threads=1, skipped="time limit")])


# --- The search, on synthetic curves --------------------------------------------------------


def test_search_on_a_cpu_bound_curve_stops_at_the_cores_without_processes():
    def curve(p, t):  # scales to the 8 cores, then flat; the cores are busy
        w = max(1, p) * t
        return row(p, t, 100 * min(w, 8), cpu=min(w, 8))

    rows = search(curve, cpus=8)
    assert [(m.processes, m.threads) for m in rows] == [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16)]
    assert decide(rows, cpus=8).workers == 8


def test_search_on_a_latency_bound_curve_goes_past_the_cores():
    def curve(p, t):  # each worker waits on I/O; the 2 cores saturate at 64 workers
        w = max(1, p) * t
        return row(p, t, 10 * min(w, 64), cpu=2 * min(w, 64) / 64)

    rows = search(curve, cpus=2)
    t = decide(rows, cpus=2)
    assert t.workers == 64 and t.processes == 0
    assert max(m.threads for m in rows) == 128  # one doubling past the plateau, then stop


def test_search_tries_processes_when_python_work_holds_the_gil():
    def curve(p, t):  # in-process: one core at most (the GIL); processes scale
        if p == 0:
            return row(0, t, 100, cpu=1.0)
        return row(p, t, 100 * p, cpu=float(p), rss=150.0 * p)

    rows = search(curve, cpus=8)
    assert [m.processes for m in rows if m.processes] == [2, 4, 8]
    t = decide(rows, cpus=8)
    assert t.processes == 8


def test_search_skips_processes_predicted_over_the_ram_budget():
    def curve(p, t):
        if p == 0:
            return row(0, t, 100, cpu=1.0)
        return row(p, t, 100 * p, cpu=float(p), rss=150.0 * p)

    rows = search(curve, cpus=8, ram_budget_mb=500)
    assert [(m.processes, m.skipped) for m in rows if m.processes] == [(2, ""), (4, "ram cap")]
    t = decide(rows, cpus=8, ram_budget_mb=500)
    assert t.processes == 2 and t.reason == "ram cap"


def test_search_stops_as_soon_as_the_target_is_met():
    rows = search(lambda p, t: row(p, t, 10 * t, cpu=0.1 * t), cpus=2, target_batches_per_s=30)
    assert [m.threads for m in rows] == [1, 2, 4]  # 40 >= 1.2 x 30


# --- The spec keys --------------------------------------------------------------------------


@pytest.mark.parametrize("keys, key", [
    ({"max_workers": -1}, "workers.max_workers"),
    ({"target_batches_per_s": -1.0}, "workers.target_batches_per_s"),
    ({"target_batches_per_s": math.nan}, "workers.target_batches_per_s"),
    ({"tune_seconds": 0}, "workers.tune_seconds"),
    ({"tune_seconds": 10_000}, "workers.tune_seconds"),
])
def test_bad_workers_keys_are_refused_by_name(keys, key):
    spec = PipelineSpec(source={"paths": ["a.jsonl"]}, tokenizer={"model": "m"})
    with pytest.raises(SpecError) as e:
        validate(spec.replace(workers=keys))
    assert e.value.key == key


def test_workers_keys_survive_toml_and_proto(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text('[source]\npaths = ["a.jsonl"]\n[tokenizer]\nmodel = "m"\n[workers]\n'
                    'count = "auto"\nmax_workers = 6\ntarget_batches_per_s = 2.5\n'
                    'tune_seconds = 8\n')
    spec = PipelineSpec.from_toml(path)
    validate(spec)
    w = spec.workers
    assert (w.max_workers, w.target_batches_per_s, w.tune_seconds) == (6, 2.5, 8)
    assert PipelineSpec.from_proto(spec.to_proto()) == spec
    assert spec.data_fingerprint() == spec.replace(workers={"max_workers": 1}).data_fingerprint()


# --- Real pipelines -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_pipeline(make_spec):
    return Pipeline(make_spec(batch={"seq_len": 512, "size": 8}, order={"epochs": 0}))


@pytest.fixture(scope="module")
def long_docs(docs, tmp_path_factory) -> str:
    """The docstrings joined into ~4 KB documents (web pages' size), ~60 to a group."""
    joined, part = [], []
    for doc in docs:
        part.append(doc)
        if sum(map(len, part)) >= 4000:
            joined.append("\n\n".join(part))
            part = []
    return write_jsonl(joined, tmp_path_factory.mktemp("long") / "long.jsonl")


@pytest.fixture(scope="module")
def slow_pipeline(make_spec, long_docs):
    spec = make_spec(source={"paths": [long_docs]}, batch={"seq_len": 512, "size": 8},
                     order={"epochs": 0})
    return Pipeline(spec, source=SlowSource(DocumentSource.from_spec(spec.source), DELAY_S))


@pytest.fixture(scope="module")
def slow_tuning(slow_pipeline):
    return autotune.tune(slow_pipeline, ram_budget_mb=1024, tune_seconds=12)


def test_cpu_bound_choice_is_within_the_cores_and_5_percent_of_the_best(cpu_pipeline):
    cpus = autotune.cpu_count()
    # Longer windows than the default: the comparison below needs steadier readings.
    t = autotune.tune(cpu_pipeline, ram_budget_mb=1024, window_s=1.5)
    assert t.workers <= cpus, autotune.table(t)
    assert t.tune_seconds <= autotune.TUNE_SECONDS + 2
    choice = (t.processes, t.threads)
    others = sorted({(0, 1), (0, cpus), (0, 2 * cpus)} - {choice})
    # Windows several groups long, so the bursts in which batches arrive (a group at a time)
    # average out.
    ratios, spread = best_of_ratios(cpu_pipeline, choice, others, rounds=3, window_s=1.5,
                                    max_warmup_s=0.5)
    for (processes, threads), ratio in ratios.items():
        # Past the cores the tuner wants 20 % (OVERSUBSCRIBE_GAIN) before it takes CPU from
        # the trainer; on a busy host that is all extra threads win: a share of the CPU.
        bar = 0.95 if max(1, processes) * threads <= cpus else 1 / 1.2
        # Within 5 % beyond what repeating the choice's own measurement varies by (`spread`,
        # its slowest round over its fastest): no finer difference is measurable on this host.
        assert ratio >= bar * spread, (ratios, spread, autotune.table(t))


def test_latency_bound_choice_exceeds_the_cores_and_doubles_grain(slow_pipeline, slow_tuning):
    t = slow_tuning
    assert t.workers > autotune.cpu_count(), autotune.table(t)
    grain = autotune.grain_choice(slow_pipeline)
    choice = (t.processes, t.threads)
    rates = side_by_side(slow_pipeline, [choice, grain], rounds=1)
    assert rates[choice] >= 2 * rates[grain], (rates, grain, autotune.table(t))


def test_demand_far_below_capacity_gets_fewer_workers_and_is_still_met(slow_pipeline,
                                                                        slow_tuning):
    target = slow_tuning.chosen.batches_per_s / 10
    t = autotune.tune(slow_pipeline, target_batches_per_s=target, ram_budget_mb=1024)
    assert t.reason == "target met", autotune.table(t)
    assert t.workers < slow_tuning.workers
    rate = side_by_side(slow_pipeline, [(t.processes, t.threads)], rounds=2)
    assert rate[(t.processes, t.threads)] >= target


def test_ram_budget_for_k_processes_is_enforced_with_measured_rss(cpu_pipeline):
    one = autotune.measure(cpu_pipeline, 1, 1, **WINDOW)
    assert one.rss_mb > 20  # a real worker process, measured (imports alone are more)
    k = 2
    t = autotune.tune(cpu_pipeline, candidates=[(1, 1), (2, 1), (3, 1)],
                      ram_budget_mb=(k + 0.5) * one.rss_mb, **WINDOW)
    assert t.workers <= k, autotune.table(t)
    three = next(m for m in t.measurements if m.processes == 3)
    assert three.skipped == "ram cap"  # predicted from the measured ones, never started


def test_auto_gives_the_same_batches_as_the_chosen_count_fixed(make_spec):
    spec = make_spec(batch={"seq_len": 512, "size": 8}, order={"epochs": 0},
                     workers={"count": "auto", "tune_seconds": 5})
    pipeline = Pipeline(spec)
    tuner = autotune.Tuner()
    workers, tuning = tuner.workers_for(pipeline)
    with pipeline.stream(workers=workers) as stream:
        auto = [b for _, b in zip(range(40), stream, strict=False)]
    assert workers.reason.startswith("auto: ") and tuning is not None
    assert (tuning.processes, tuning.threads) == (workers.processes, workers.threads)
    fixed = first(pipeline, 40, Workers(workers.processes, workers.threads, "fixed"))
    assert same_bytes(auto, fixed)
    assert same_bytes(auto, first(pipeline, 40, Workers(0, 1, "one thread")))
    # The decision is kept: a second stream, even one that sends the spec again (a new
    # Pipeline, as every request-spec stream and every reconnect builds), starts without tuning.
    assert tuner.workers_for(pipeline)[0] is workers
    start = time.monotonic()
    assert tuner.workers_for(Pipeline(spec))[0] is workers
    assert time.monotonic() - start < 2  # no second tuning (this one took seconds)
    # The choices are the tuner's own: another server's tuner has none yet.
    assert autotune.Tuner()._decided == {}


def test_info_reports_the_decision_and_its_measurements(tmp_path, make_spec):
    from input_client import InputClient
    from input_server.serving.coalesce import MAX_BATCHES_PER_MESSAGE
    from input_server.serving.server import Server, ServerConfig

    spec = make_spec(order={"epochs": 0}, workers={"count": "auto", "tune_seconds": 3})
    with Server(ServerConfig(listen=[f"unix://{tmp_path}/a.sock"],
                             pipelines={"auto": spec})) as srv, \
            InputClient(srv.targets[0]) as client, client.batches("auto") as it:
        # More batches than one message holds: the demand is known once a second one went.
        for _ in range(MAX_BATCHES_PER_MESSAGE + 4):
            next(it)
        (stream,) = client.info().streams
    assert stream.worker_reason.startswith("auto: ")
    assert stream.consumed_batches_per_s > 0  # the consumer's demand, learned from the stream
    tuning = stream.worker_tuning
    assert tuning.reason in autotune.REASONS
    assert (tuning.processes, tuning.threads) == (stream.worker_processes,
                                                  stream.worker_threads)
    assert len(tuning.measurements) >= 1 and tuning.measurements[0].batches_per_s > 0
    assert 0 < tuning.tune_seconds <= 3 + 2


def test_tune_command_prints_the_table_and_writes_json(tmp_path, corpus, spm_model, capsys):
    from input_server import cli

    spec = tmp_path / "spec.toml"
    spec.write_text(f'[source]\npaths = ["{corpus}"]\n[tokenizer]\nmodel = "{spm_model}"\n'
                    f'[batch]\nseq_len = 256\nsize = 4\n[order]\nepochs = 0\n')
    out = tmp_path / "tune.json"
    args = ["tune", str(spec), "--tune-seconds", "3", "--max-workers", "4", "--json", str(out)]
    try:
        import matplotlib  # noqa: F401

        args += ["--plot", str(tmp_path / "tune.png")]
    except ImportError:
        pass
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "batches/s" in printed and "tokens/s" in printed and "RSS/worker" in printed
    assert "choice:" in printed
    result = json.loads(out.read_text())
    assert result["reason"] in autotune.REASONS and result["workers"] <= 4
    assert result["measurements"] and result["cpu_count"] == autotune.cpu_count()
    if "--plot" in args:
        assert (tmp_path / "tune.png").stat().st_size > 1000
    assert cli.main(["tune", str(spec), "--max-workers", "-1"]) == 2
    assert "workers.max_workers" in capsys.readouterr().err


def test_first_process_candidate_is_measured_not_predicted_from_threads():
    # A thread's memory says nothing of a process's (a whole interpreter): the first process
    # candidate runs even when threads took much per worker; later ones are predicted from it.
    rows = [row(0, 1, 100, rss=300.0, cpu=1.0), row(0, 2, 101, rss=600.0, cpu=1.0),
            row(0, 4, 100, rss=1200.0, cpu=1.0)]
    c = next_candidate(rows, cpus=8, ram_budget_mb=500)  # 2 x 300 from threads: over
    assert (c.processes, c.skip) == (2, "")
    rows.append(row(2, 1, 200, rss=400.0, cpu=2.0))
    assert next_candidate(rows, cpus=8, ram_budget_mb=500).skip == "ram cap"  # 4 x 200
