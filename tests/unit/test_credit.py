"""The client's credit reports (`input_client.credit.Taken`): one request a change, several
batches taken between two sends as one report with the latest wait, the end ends them."""

from __future__ import annotations

import threading

from input_client.credit import Taken
from input_client.proto import pb


def test_reports_follow_the_batches_taken_and_end_with_the_call():
    taken = Taken()
    first = pb.StreamBatchesRequest(window=3)
    requests = taken.requests(first)
    assert next(requests) is first
    taken.took(0.5)
    report = next(requests)
    assert (report.batches_taken, report.data_wait_s) == (1, 0.5)
    taken.took(0.75)
    taken.took(1.25)  # two before the request thread looks: one report, the latest figures
    report = next(requests)
    assert (report.batches_taken, report.data_wait_s) == (3, 1.25)
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(requests), daemon=True)
    reader.start()  # waits for a change
    taken.end()
    reader.join(5)
    assert not reader.is_alive() and got == []


def test_each_report_waits_for_the_hold_first():
    """`hold` (the loop's dispatch window, `input_client.quiet`) runs before each report is
    read, so batches the loop takes meanwhile go in the same report; never before the first
    request, and not once the call ended."""
    events: list = []
    taken = Taken(hold=lambda: events.append("hold"))
    requests = taken.requests(pb.StreamBatchesRequest(window=3))
    next(requests)
    assert events == []
    taken.took(0.5)
    events.append(next(requests).batches_taken)
    taken.took(0.6)
    events.append(next(requests).batches_taken)
    assert events == ["hold", 1, "hold", 2]
    taken.end()
    assert list(requests) == [] and events == ["hold", 1, "hold", 2]


def test_batches_taken_during_the_hold_join_its_report():
    def hold():  # the loop takes two more batches while the request thread is held
        taken.took(0.7)
        taken.took(0.8)

    taken = Taken(hold=hold)
    requests = taken.requests(pb.StreamBatchesRequest(window=3))
    next(requests)
    taken.took(0.5)
    report = next(requests)
    assert (report.batches_taken, report.data_wait_s) == (3, 0.8)
