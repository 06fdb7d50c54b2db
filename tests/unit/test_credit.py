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
