"""What `input-server info` reports of a running stream."""

from __future__ import annotations

from input_client.proto import pb
from input_server.autotune import report
from input_server.serving.credit import Credit
from input_server.serving.retune import StreamTuner
from input_server.serving.session import StreamSession


def stream_info(s: StreamSession, credit: Credit, live: StreamTuner | None) -> pb.StreamInfo:
    parallelism = s.stream.parallelism
    # A client that reports what its loop takes gives its real pace; for one that does not
    # (None), what gRPC let the server send is all there is.
    rate = credit.taken_per_s()
    tuning = live.search.tuning if live is not None else None  # a fixed count has none
    info = pb.StreamInfo(
        stream_id=s.stream_id,
        pipeline=s.label,
        worker_processes=parallelism.processes,
        worker_threads=parallelism.threads,
        worker_reason=live.reason if live else s.reason,
        batches_sent=s.batches_sent,
        batches_produced=s.batches_produced,
        worker_tuning=report.tuning_proto(tuning) if tuning else None,
        consumed_batches_per_s=(s.consumed_batches_per_s() if rate is None else rate),
        batches_taken=credit.taken_or(s.batches_sent),
    )
    if live is not None:
        info.tuning_state = live.state
        info.demand_batches_per_s = live.demand
        info.switches.extend(report.switch_proto(w) for w in list(live.history))
    return info
