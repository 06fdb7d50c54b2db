"""Autotune measurement: runs a pipeline at one parallelism and times its production.

The batches are counted and dropped, never served; the choice cannot change the data (the
batches are the same bytes for any processes and threads).
"""

from __future__ import annotations

import atexit
import bisect
import queue
import statistics
import threading
import time
from collections.abc import Callable, Sequence

from input_client.threads import Prefetcher
from input_server import cancel
from input_server.autotune.measurements import Measurement
from input_server.batching import grain_adapter
from input_server.batching.parallelism import Parallelism
from input_server.batching.pipeline import Pipeline

# Module-level alias so tests can stand in another clock.
clock = time.perf_counter

# Production is timed after the first batch and this warm-up (thread pools filled, worker
# processes started and importing), over a window of at least WINDOW_S and MIN_BATCHES.
WARMUP_S = 0.3
WINDOW_S = 1.0
MIN_BATCHES = 4
# Groups of documents arrive whole, their batches together; a gap this many times the median
# between batches marks a new burst. Warm-up lasts until the first such wait (at most
# MAX_WARMUP_S), and the window then spans BURSTS production cycles (at most MAX_WINDOW x
# WINDOW_S): a window shorter than a cycle times packing, not production.
BURST_GAP = 5.0
BURSTS = 3
MAX_WARMUP_S = 2.0
MAX_WINDOW = 3.0
_MIB = 1 << 20
_SLICE_S = 0.1
# How long `wait_closed` waits by default: Grain gives a worker process 10 s to stop before
# it kills it, and a candidate cut at its deadline may be starting several.
CLOSE_WAIT_S = 30.0

# Candidates' producers still closing their streams when `measure` returned (its deadline
# came first, e.g. while Grain was starting worker processes). A process that exits with one
# still running runs Grain's finalizers against half-started workers at interpreter exit
# (tracebacks, leaked shared memory), so `input-server tune` waits for them: `wait_closed`.
_closing: set[Prefetcher] = set()
_closing_lock = threading.Lock()
_at_exit: list[bool] = []  # whether `wait_closed` is registered with atexit (once)


def wait_closed(timeout: float = CLOSE_WAIT_S) -> bool:
    """Waits up to `timeout` s for every candidate's stream to have closed (its worker
    processes stopped, their shared memory freed); whether all have."""
    end = time.monotonic() + timeout
    with _closing_lock:
        pending = list(_closing)
    for producer in pending:
        producer.join(max(0.0, end - time.monotonic()))
    with _closing_lock:
        _closing.difference_update(p for p in pending if not p.is_alive())
        closed = not any(p.is_alive() for p in _closing)
    # The closed streams' last batches are freed on Grain's free thread: before an exit, wait.
    return grain_adapter.flush_shared_memory_frees(max(0.0, end - time.monotonic())) and closed


def _producer(
    pipeline: Pipeline, parallelism: Parallelism, stopped: Callable[[], bool]
) -> Callable[[Callable], None]:
    """Runs the stream from its start, again and again for short data, putting each batch's
    (arrival time, real tokens) until stopped."""

    def produce(put: Callable[[tuple[float, int]], bool]) -> None:
        while not stopped():  # no new pass (and its worker processes) once stopped
            produced = 0
            with pipeline.stream(None, parallelism=parallelism) as stream:
                for batch in stream:
                    produced += 1
                    if not put((clock(), batch.num_tokens)):
                        return
            if produced == 0:
                return

    return produce


def _burst_starts(times: Sequence[float]) -> list[int]:
    """Indices of batches that end a wait: a group's batches come together, then a pause."""
    if len(times) < 3:
        return []
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    median = statistics.median(gaps)
    return [i + 1 for i, g in enumerate(gaps) if _ends_a_wait(g, median)]


def _ends_a_wait(gap: float, median_gap: float) -> bool:
    """Whether a gap between batches is a wait for the next group, not packing's pace."""
    return gap > max(BURST_GAP * median_gap, 1e-3)


def _rate(
    times: Sequence[float], tokens: Sequence[int], *, aligned: bool = False
) -> tuple[float, float] | None:
    """(batches/s, tokens/s) from the arrival times and tokens of the window's batches.

    Over whole bursts when production is bursty (a burst's first batch to a later burst's
    first: a window cut mid-burst would count part of a group as if it took no time), else
    over the whole window (the batches after the first). `aligned`: batch 0 starts a burst.
    """
    starts = ([0] if aligned else []) + _burst_starts(times)
    n = len(times) - 1
    if len(starts) >= 2 and times[starts[-1]] - times[starts[0]] >= 0.5 * (times[n] - times[0]):
        a, b = starts[0], starts[-1]
        seconds = times[b] - times[a]
        return (b - a) / seconds, sum(tokens[a:b]) / seconds
    seconds = times[n] - times[0]
    if n < 1 or seconds <= 0:
        return None
    return n / seconds, sum(tokens[1:]) / seconds


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds so far of a process (default this one) and every process it started that
    still runs."""
    import psutil

    me = psutil.Process(pid)
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # ended meanwhile
            continue
    return total


def host_busy_seconds() -> float:
    """CPU seconds so far that the whole host spent busy (every process: a trainer's too), over
    all its cores; what is neither idle nor waiting on I/O, as psutil's `cpu_percent` counts."""
    import psutil

    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


def added_bytes(process) -> int:
    """The memory a worker process adds to the host: its resident pages less those of the
    files it maps (the interpreter, Grain's and the tokenizers' libraries, which every worker
    maps from the same files and the page cache holds once). A count by RSS would charge each
    worker for them again, and hold a host with many cores to a few. Linux says it in
    /proc/PID/status (anonymous and shared-memory pages); gVisor does not, and it is read there
    mapping by mapping, which costs milliseconds. Where neither can be read, RSS: an
    overcount, never an undercount that would let workers past the budget.

    Raises:
      psutil.NoSuchProcess: the process ended."""
    import psutil

    try:
        with open(f"/proc/{process.pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        if "RssAnon" in fields:
            return sum(int(fields.get(k, "0 kB").split()[0]) << 10 for k in ("RssAnon", "RssShmem"))
    except OSError:
        if not process.is_running():
            raise psutil.NoSuchProcess(process.pid) from None
    return mapped_added_bytes(process)


def mapped_added_bytes(process) -> int:
    """`added_bytes` read mapping by mapping (what gVisor reports): the resident pages of
    every mapping but a file's; RSS where the maps cannot be read.

    Raises:
      psutil.NoSuchProcess: the process ended."""
    import psutil

    try:
        return sum(m.rss for m in process.memory_maps(grouped=True) if not _library(m.path))
    except (psutil.AccessDenied, AttributeError):  # not ours to read; no maps on this OS
        return process.memory_info().rss


def _library(path: str) -> bool:
    """Whether a mapping's pages are a file's, shared through the page cache; shared memory
    (`/dev/shm`, memfd, SysV) is memory the processes made, counted."""
    return path.startswith("/") and not path.startswith(("/dev/shm/", "/memfd:", "/SYSV"))


def _process_usage(pids_before: set[int], memory: bool = True) -> tuple[float, float, int]:
    """CPU seconds, RSS bytes of this process, and the memory worker processes started since
    add (`added_bytes`; 0 without `memory`)."""
    import psutil

    me = psutil.Process()
    cpu = sum(me.cpu_times()[:2])
    child_rss = 0
    for child in me.children(recursive=True):
        if child.pid in pids_before:
            continue
        try:
            cpu += sum(child.cpu_times()[:2])
            child_rss += added_bytes(child) if memory else 0
        except psutil.Error:  # ended meanwhile
            continue
    return cpu, me.memory_info().rss, child_rss


def measure(
    pipeline: Pipeline,
    parallelism: Parallelism,
    *,
    warmup_s: float = WARMUP_S,
    window_s: float = WINDOW_S,
    max_warmup_s: float = MAX_WARMUP_S,
    deadline: float | None = None,
) -> Measurement | None:
    """Runs the pipeline's stream with `parallelism` and times its production.

    The batches are counted and dropped. The stream runs on its own thread, so the deadline
    holds even when one batch takes longer than the time left (that thread then ends, and
    closes its workers, after its batch).

    Args:
      pipeline: the stream's pipeline; the candidate runs its real stream from the start.
      parallelism: the candidate.
      warmup_s: seconds after the first batch before timing may start; it starts at the
        first wait for a batch after that, or at `max_warmup_s` at the latest.
      window_s: the timed window lasts at least this long and MIN_BATCHES batches (longer,
        up to `MAX_WINDOW` x, to span `BURSTS` cycles of bursty production).
      deadline: a `clock()` time at which to stop, timed or not.

    Returns:
      The measurement, or None when no batch was timed before the deadline.

    Raises:
      Whatever the pipeline raises (a bad record fails the tuning as it would the stream).
    """
    import psutil

    pids_before = {p.pid for p in psutil.Process().children(recursive=True)}
    rss_before = psutil.Process().memory_info().rss
    opened = clock()
    stop = threading.Event()
    producer = Prefetcher(
        _producer(pipeline, parallelism, stop.is_set),
        depth=256,
        name=f"autotune-{parallelism.processes}x{parallelism.threads}",
    )
    take = _taker(producer)
    try:
        first = take(deadline)
        if first is None:
            return None
        cap = max(warmup_s, min(max_warmup_s, 2 * (first[0] - opened)))
        warm = _warm_up(take, first, cap=cap, warmup_s=warmup_s, deadline=deadline)
        if warm is None:
            return None
        last, cycle = warm
        # The window: long enough for BURSTS production cycles when production is bursty;
        # it starts with the batch that ended the wait, a burst's first.
        length = min(max(window_s, BURSTS * cycle), MAX_WINDOW * window_s)
        cpu0 = _process_usage(pids_before, memory=False)[0]
        wall0 = clock()
        times, counts = _window(take, last, length=length, deadline=deadline)
        rate = _rate(times, counts, aligned=cycle > 0)
        if rate is None or times[-1] - times[0] < 0.25 * window_s:  # cut short by the deadline
            return None
        cpu1, rss, child_rss = _process_usage(pids_before)
        return Measurement(
            parallelism=parallelism,
            batches_per_s=rate[0],
            tokens_per_s=rate[1],
            rss_mb=(child_rss + max(0, rss - rss_before)) / _MIB,
            cpu_cores=(cpu1 - cpu0) / max(clock() - wall0, 1e-9),
            startup_s=first[0] - opened,
            seconds=times[-1] - times[0],
            batches=len(times) - 1,
        )
    finally:
        _stop(producer, stop, deadline)


Arrival = tuple[float, int]  # a batch's arrival time and real tokens


def _taker(producer: Prefetcher) -> Callable[[float | None], Arrival | None]:
    def take(until: float | None) -> Arrival | None:
        """The next batch; None at `until` (a `clock()` time) or the data's end. Raises what
        the pipeline raised."""
        while True:
            cancel.check()  # in slices: the client may leave mid-candidate
            if until is not None and until <= clock():
                return None
            try:
                return producer.get(_SLICE_S if until is None else min(_SLICE_S, until - clock()))
            except queue.Empty:
                continue
            except StopIteration:
                return None

    return take


def _warm_up(
    take: Callable[[float | None], Arrival | None],
    first: Arrival,
    *,
    cap: float,
    warmup_s: float,
    deadline: float | None,
) -> tuple[Arrival, float] | None:
    """Drops the batches after `first` until the consumer has waited once after `warmup_s`
    (the groups the workers finished together before the first batch are drained; timing
    them would measure packing, not production), or `cap` has passed (smooth flow).

    Returns:
      The last batch taken and the production cycle found (0 = none), or None at the
      deadline or the data's end.
    """
    last, gaps, cycle = first, [], 0.0
    while last[0] - first[0] < cap:
        item = take(deadline)
        if item is None:
            return None
        gap = item[0] - last[0]
        waited = len(gaps) >= 2 and _ends_a_wait(gap, gaps[len(gaps) // 2])
        bisect.insort(gaps, gap)
        last = item
        if waited and last[0] - first[0] >= warmup_s:
            cycle = last[0] - first[0]
            break
    return last, cycle


def _window(
    take: Callable[[float | None], Arrival | None],
    last: Arrival,
    *,
    length: float,
    deadline: float | None,
) -> tuple[list[float], list[int]]:
    """The arrival times and tokens of the batches from `last` on, over at least `length`
    seconds and MIN_BATCHES batches (fewer at the deadline or the data's end)."""
    times, counts = [last[0]], [last[1]]
    while times[-1] - times[0] < length or len(times) <= MIN_BATCHES:
        item = take(deadline)
        if item is None:
            break
        times.append(item[0])
        counts.append(item[1])
    return times, counts


def _stop(producer: Prefetcher, stop: threading.Event, deadline: float | None) -> None:
    """Unblocks the producer's put, then gives it a moment to close its workers; one still
    closing is left to `wait_closed`."""
    stop.set()
    producer.close(timeout=5.0 if deadline is None else max(0.0, min(5.0, deadline - clock())))
    with _closing_lock:
        _closing.difference_update([p for p in _closing if not p.is_alive()])
        if producer.is_alive():
            _closing.add(producer)
            if not _at_exit:
                # Also for any other program that tunes and exits (scripts, benchmarks):
                # registered after multiprocessing's own exit handler, so it runs first
                # (atexit runs in reverse order), while the workers can still stop cleanly.
                atexit.register(wait_closed)
                _at_exit.append(True)
