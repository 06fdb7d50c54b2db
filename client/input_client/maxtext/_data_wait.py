"""The trainer's exposed data wait in MaxText's own step metrics (`perf/data_wait_seconds`) and
log (a `data_wait` line after each step's), without changing MaxText.

MaxText 0.2.5 loads a step's batch synchronously (`MultiHostDataLoadIterator` has no prefetch
thread), then dispatches the step and calls `MetricLogger.record_train_metrics(metrics, step,
step_time)`, which adds the step's `perf/*` scalars; `write_metrics` then logs the step and
sends the same scalars to TensorBoard, its `metrics_file`, GCS and wandb. So a scalar added
before `record_train_metrics` goes everywhere MaxText's step time goes, and the wait the train
source counted since the previous step is that step's wait for its batch. On several JAX
processes each step's worst host is gathered beside it (`_pod_wait`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from input_client.maxtext._hook import MaxTextHookError, metric_logger
from input_client.maxtext._pod_wait import PodWait

log = logging.getLogger(__name__)

# The metric writers this module installed: hooking twice would log every line twice.
_INSTALLED: set[Any] = set()
SCALAR = "perf/data_wait_seconds"


class _TrainWait:
    """The train source whose wait each step reports, and its total at the previous step."""

    source: Any = None
    last_s = 0.0
    # One a process: every process gathers the same steps from its first.
    pod: PodWait | None = None

    def take(self) -> float | None:
        """Seconds the train loop waited since the previous step; None without a source."""
        if self.source is None:
            return None
        now = self.source.wait_time_s
        waited, self.last_s = max(0.0, now - self.last_s), now
        return waited


_train = _TrainWait()


def report_train_wait(source: Any, badput_path: str | None = None) -> None:
    """Makes `source` (its float `wait_time_s`: the train loop's wait in all) the one whose
    per-step increase MaxText's metrics show, with the worst host's on several processes and
    the run's badput appended to `badput_path` (`_pod_wait.PodWait`); hooks MaxText's metric
    logger the first time. A MaxText without the hook point trains on, said once in the log,
    without the figure."""
    _train.source, _train.last_s = source, source.wait_time_s
    if _train.pod is None:
        _train.pod = PodWait(badput_path)
    try:
        logger = metric_logger().MetricLogger
    except MaxTextHookError as e:
        log.warning("input_client.maxtext: no data_wait in MaxText's metrics: %s", e)
        return
    if logger.record_train_metrics in _INSTALLED:
        return
    _hook_metric_logger(logger, metric_logger().max_logging)


def _hook_metric_logger(logger: type, max_logging: Any) -> None:
    record, write = logger.record_train_metrics, logger.write_metrics
    flush = logger.flush_metrics_and_cleanup

    @functools.wraps(record)
    def record_train_metrics(self, metrics, step, step_time):
        waited = _train.take()
        if waited is not None:
            metrics["scalar"][SCALAR] = waited
        out = record(self, metrics, step, step_time)
        if waited is not None:  # after MaxText's own: its small op goes ahead of the gather
            _train.pod.record(int(step), waited, float(step_time))
        return out

    @functools.wraps(write)
    def write_metrics(self, metrics, step, metric_type="train"):
        scalars = (metrics or {}).get("scalar", {})
        ours = metric_type == "train" and SCALAR in scalars
        pod = _train.pod
        worst = pod.worst(int(step)) if ours else None
        if worst is not None:
            pod.add_scalars(scalars, worst)
        out = write(self, metrics, step, metric_type)
        if ours:
            # Next to MaxText's "completed step" line, in its log, in the same units.
            words = pod.words(worst) if worst is not None else ""
            max_logging.log(f"data_wait: {float(scalars[SCALAR]):.3f} s, step: {step}{words}")
        return out

    @functools.wraps(flush)
    def flush_metrics_and_cleanup(self):
        out = flush(self)  # writes the last step's metrics
        if _train.pod is not None:
            _train.pod.write_badput()
        return out

    _INSTALLED.add(record_train_metrics)
    logger.record_train_metrics, logger.write_metrics = record_train_metrics, write_metrics
    logger.flush_metrics_and_cleanup = flush_metrics_and_cleanup
