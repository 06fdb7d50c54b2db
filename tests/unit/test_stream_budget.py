"""A stream's memory budget has one owner (`batching.budget.StreamBudget`, issue 52): its answers
from real specs, the admission built on them, the model found once, and the house rule that
`serving/` never names a tokenizer kind (the kind reports its own cost)."""

from __future__ import annotations

import ast
import math

import grpc
import pytest

from input_server.batching.budget import BYTES_PER_TOKEN, GROUP_MIB, MIB, StreamBudget
from input_server.batching.parallelism import Parallelism as P
from input_server.batching.pipeline import Pipeline
from input_server.data.roots import DataAccess
from input_server.data.tokenizers import registry
from input_server.data.tokenizers.huggingface import LOAD_BYTES_PER_FILE_BYTE
from input_server.errors import RefusedError
from input_server.serving.limits import Limits, access_for, admit
from input_server.serving.slots import ProcessPool, ProcessReservation
from tests.support import ROOT

KIND_NAMES = {"huggingface", "sentencepiece", "tiktoken", "tekken"}


def _budget(spec, limit_mb=math.inf, **kw) -> StreamBudget:
    return StreamBudget.of(spec, limit_mb=limit_mb, queue_depth=8, per_message=1, **kw)


def _limits(limit_mb: float, max_workers: int = 8) -> Limits:
    return Limits(access=DataAccess(), stream_memory_mb=limit_mb, max_workers=max_workers)


def _hf_model(tmp_path, size: int) -> str:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b" " * size)  # found and sized, never read: the budget needs no more
    return str(path)


# --- the house rule ---------------------------------------------------------------------------


def _kind_names(path) -> list[str]:
    """Where a module names a tokenizer kind: a string that is a kind's name, or an import of
    a kind's module (`data.tokenizers.<kind>`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.strip().lower() in KIND_NAMES:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for m in modules:
            parts = m.split(".")
            if "tokenizers" in parts and parts[-1] in KIND_NAMES:
                found.append(f"{path.name}:{node.lineno} imports {m}")
    return found


def test_the_kind_names_are_the_registrys():
    assert set(registry.KINDS) == KIND_NAMES


def test_serving_never_names_a_tokenizer_kind():
    """What a kind costs or needs is the kind's to say (`ModelTokenizer.process_bytes`,
    `resolve`); the serving path asks through the registry, whatever the kind."""
    found = [n for p in sorted((ROOT / "input_server" / "serving").glob("*.py"))
             for n in _kind_names(p)]  # fmt: skip
    assert not found, found


def test_the_rule_sees_a_kind_named(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from input_server.data.tokenizers import huggingface\n"
        "import input_server.data.tokenizers.tekken\n"
        "KIND = 'tiktoken'\n"
        "NOTE = 'from tiktoken ranks'\n"  # prose that mentions a kind is not a kind named
    )
    assert len(_kind_names(bad)) == 3


# --- what the stream holds --------------------------------------------------------------------


def test_a_stream_holds_its_batches_and_its_groups_in_flight(make_spec):
    spec = make_spec(batch={"size": 4, "seq_len": 128})
    budget = _budget(spec)
    batch_mb = 4 * 128 * BYTES_PER_TOKEN / MIB
    assert budget.held_mb() == pytest.approx((8 + 1 + 2) * batch_mb)  # queue, message, 2
    assert budget.held_mb(P(2, 3)) == pytest.approx(budget.held_mb() + 6 * GROUP_MIB)
    assert budget.held_mb(P(0, 3)) == pytest.approx(budget.held_mb() + 3 * GROUP_MIB)


@pytest.mark.parametrize(
    "workers, asked",
    [
        ({"count": "auto"}, P(0, 1)),  # the least: its tuning keeps within the rest
        ({"count": 2, "threads": 3}, P(2, 3)),
        ({"count": 0, "threads": 5}, P(0, 5)),
    ],
    ids=["auto-asks-the-least", "fixed-processes", "fixed-in-process"],
)
def test_the_admission_counts_the_parallelism_the_spec_asks_for(make_spec, workers, asked):
    assert _budget(make_spec(workers=workers)).asked == asked


def test_the_order_gets_what_the_batches_leave_once_per_process(make_spec):
    spec = make_spec(workers={"count": 2, "threads": 1})
    assert _budget(spec).order_budget() is None  # no limit
    budget = _budget(spec, limit_mb=100)
    order = budget.order_budget()
    assert order.copies == 3 and order.flag_mb == 100  # the server's copy and 2 workers'
    assert order.max_bytes == int((100 - budget.held_mb(P(2, 1))) * MIB)
    assert access_for(budget, DataAccess()).order_budget == order


# --- what fits --------------------------------------------------------------------------------


def test_the_groups_get_what_the_batches_and_the_servers_order_leave(make_spec):
    spec = make_spec(workers={"count": "auto", "ram_budget_mb": 1024}, order={"shuffle": True})
    pipeline = Pipeline(spec)
    try:
        budget = _budget(spec, limit_mb=60).reading(pipeline)
    finally:
        pipeline.close()
    held = pipeline.order.held_bytes()
    assert held > 0 and budget.order_bytes == budget.pipeline_order_bytes == held
    left = 60 - held / MIB - budget.held_mb()
    assert budget.groups_mb() == pytest.approx(left)  # under the spec's ram_budget_mb
    assert budget.threads_fit() == int(left / GROUP_MIB)
    assert budget.processes_fit() == int(left * MIB // held)
    # No server limit: the spec's ram_budget_mb bounds the groups, and the order's copies.
    free = _budget(spec).reading(pipeline)
    assert free.groups_mb() == 1024 and free.threads_fit() == 1024 // GROUP_MIB
    assert free.processes_fit() == (1024 << 20) // held


def test_a_reservation_holds_an_auto_stream_to_the_order_copies_that_fit():
    budget = StreamBudget(ram_budget_mb=45, order_bytes=20 << 20)  # 2 copies of 20 MiB
    mine = ProcessReservation(ProcessPool(8), budget)
    assert mine.free() == 2 and mine.take_up_to(5) == 2
    assert ProcessReservation(ProcessPool(8)).free() == 8  # no budget: as many as are free


def test_an_auto_stream_opens_on_the_threads_its_budget_fits(make_spec):
    from input_server.autotune.openings import Openings

    spec = make_spec(workers={"count": "auto", "ram_budget_mb": 8})  # one group's worth
    budget = _budget(spec)
    assert budget.threads_fit() == 1
    pipeline = Pipeline(spec)
    try:
        opening = Openings().choose(
            pipeline, processes=ProcessReservation(ProcessPool(4)), budget=budget
        )
    finally:
        pipeline.close()
    assert opening.parallelism == P(0, 1)


# --- what a candidate costs -------------------------------------------------------------------


def test_a_candidate_costs_its_groups_and_its_processes_at_their_measured_memory(make_spec):
    budget = _budget(make_spec(workers={"count": "auto"}))
    assert budget.candidate_mb(P(0, 4)) == 4 * GROUP_MIB
    assert budget.candidate_mb(P(2, 2)) == 4 * GROUP_MIB  # no process measured yet
    window = budget.window_mb(P(2, 2), added_mb=300)  # two processes added 300 MiB
    assert window == 300 + 4 * GROUP_MIB
    assert budget.candidate_mb(P(2, 2), (P(2, 2), window)) == window
    assert budget.candidate_mb(P(4, 2), (P(2, 2), window)) == 600 + 8 * GROUP_MIB
    assert budget.candidate_mb(P(0, 8), (P(2, 2), window)) == 8 * GROUP_MIB  # in process


# --- the model, found once, its cost its kind's -----------------------------------------------


def test_each_kind_reports_what_a_process_copy_of_its_model_costs(tmp_path, spm_model):
    from input_client.spec import TokenizerSpec

    hf = registry.find_model(
        DataAccess(), TokenizerSpec(model=_hf_model(tmp_path, 1 << 20), kind="huggingface")
    )
    assert (hf.file_bytes, hf.process_bytes) == (1 << 20, LOAD_BYTES_PER_FILE_BYTE << 20)
    spm = registry.find_model(DataAccess(), TokenizerSpec(model=spm_model))
    assert spm.file_bytes > 0 and spm.process_bytes == 0  # small: not counted


def test_worker_processes_copies_of_a_large_model_are_refused_by_name(make_spec, tmp_path):
    model = _hf_model(tmp_path, 4 << 20)  # 64 MiB a process loaded
    spec = make_spec(
        tokenizer={"model": model, "kind": "huggingface"}, workers={"count": 3, "threads": 1}
    )
    shape = {"queue_depth": 8, "message_tokens": 1 << 18}
    with pytest.raises(RefusedError) as e:  # 3 x 64 MiB beside 3 groups of 8: over 170
        admit(spec, _limits(170), **shape)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "3 worker processes at about 64 MB (16 x the file)" in str(e.value)
    assert "ask for at most 2 in `workers.count`" in str(e.value)
    two = spec.replace(workers={"count": 2, "threads": 1})
    budget, found = admit(two, _limits(170), **shape)
    need, fit = budget.with_model_copies()
    assert found.path == model and budget.model_copy_mb == 64 and fit == 2 and need <= 170


def test_the_model_is_found_once_from_admission_to_the_open_pipeline(make_spec, monkeypatch):
    calls = []
    kind = registry.KINDS["sentencepiece"]
    resolve = kind.resolve.__func__
    monkeypatch.setattr(
        kind, "resolve", classmethod(lambda cls, *a: calls.append(1) or resolve(cls, *a))
    )
    spec = make_spec()
    budget, found = admit(spec, _limits(2048), queue_depth=8, message_tokens=1 << 18)
    pipeline = Pipeline(spec, access_for(budget, DataAccess()), model=found)
    pipeline.close()
    assert len(calls) == 1 and pipeline.tokenizer.spec.model == found.path


def test_a_model_not_found_counts_nothing_and_the_pipeline_says_why(make_spec, tmp_path):
    from input_server.errors import InputServerError

    spec = make_spec(tokenizer={"model": str(tmp_path / "nowhere" / "tokenizer.json"),
                                "kind": "huggingface"}, workers={"count": 2})  # fmt: skip
    budget, found = admit(spec, _limits(2048), queue_depth=8, message_tokens=1 << 18)
    assert budget.model_copy_mb == 0 and (found is None or found.file_bytes == 0)
    with pytest.raises(InputServerError, match="nowhere"):
        Pipeline(spec, access_for(budget, DataAccess()), model=found)
