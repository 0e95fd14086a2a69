"""Dynamic batching: requests from many callers wait briefly in one queue and go through the model together.

One worker thread owns the model. It picks the waiting request that has had the fewest rows scored so far
(then the oldest), waits until `preferred_batch_size` rows of its kind are queued or it has waited
`max_queue_delay_ms`, then fills one batch from the requests of that kind in the same order, at most
`preferred_batch_size` rows from each and never more than `max_batch_size` in all, and hands each caller its own
rows, in order. So a large request goes through a slice per batch, and a small one that arrives meanwhile is in
the next batch: it waits about one batch's compute, not the whole of the large request.

`submit` returns a Future at once (the HTTP transport answers from it without a thread per request);
`score` blocks until the scores are there.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nemotron.reward.batching import BatchingConfig
from nemotron.reward.metrics import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS_S

logger = logging.getLogger(__name__)

ScoreFn = Callable[[list[Any]], Sequence[float]]


class QueueFull(RuntimeError):
    """More rows are waiting than `max_queue_rows`; the caller should back off (HTTP 503)."""


class BatcherClosed(RuntimeError):
    """The batcher is shutting down and takes no new work (HTTP 503)."""


class ScorerFailed(RuntimeError):
    """The scoring function raised or returned something unusable for this request (HTTP 500)."""


class UnscorableInput(ValueError):
    """Raised by a scoring function when the input itself is at fault, e.g. a text with no tokens (HTTP 400)."""


@dataclass(frozen=True)
class BatcherMetrics:
    batch_size: Histogram
    queue_seconds: Histogram
    inference_seconds: Histogram
    queued_rows: Gauge
    samples: Counter
    scorer_failures: Counter

    @classmethod
    def register(cls, registry: CollectorRegistry, prefix: str) -> BatcherMetrics:
        return cls(
            batch_size=Histogram(
                f"{prefix}_batch_size", "Rows per model call.", buckets=BATCH_SIZE_BUCKETS, registry=registry
            ),
            queue_seconds=Histogram(
                f"{prefix}_queue_seconds",
                "Time a request waited in the batching queue before its first rows went to the model.",
                buckets=LATENCY_BUCKETS_S,
                registry=registry,
            ),
            inference_seconds=Histogram(
                f"{prefix}_inference_seconds",
                "Time of one model call.",
                buckets=LATENCY_BUCKETS_S,
                registry=registry,
            ),
            queued_rows=Gauge(
                f"{prefix}_queued_rows", "Rows waiting in the batching queue.", registry=registry
            ),
            samples=Counter(f"{prefix}_samples_total", "Rows scored.", registry=registry),
            scorer_failures=Counter(
                f"{prefix}_scorer_failures_total", "Model calls that raised.", registry=registry
            ),
        )


@dataclass(eq=False)
class _Request:
    """One caller's rows, taken by the worker a slice at a time; its place in the queue is how many of its rows
    went to the model already (`taken`), then when it came (`seq`)."""

    kind: str
    items: list[Any]
    future: Future[list[float]]
    enqueued: float
    seq: int
    taken: int = 0
    scores: list[float] = field(default_factory=list)
    dropped: bool = False  # cancelled or failed with rows still queued; those rows are no longer counted

    @property
    def left(self) -> int:
        return len(self.items) - self.taken

    @property
    def order(self) -> tuple[int, int]:
        return self.taken, self.seq


@dataclass(frozen=True)
class _Slice:
    request: _Request
    items: list[Any]


class DynamicBatcher:
    """Queue + one worker thread calling `functions[kind](items) -> scores`, batching across callers.

    Fair: each batch is filled from the waiting requests that have had the fewest rows scored so far (then the
    oldest), at most `preferred_batch_size` rows from each. A large request is thus scored a slice per batch,
    and a request that arrives meanwhile joins the next batch instead of waiting for all of the large one.
    """

    def __init__(
        self,
        functions: Mapping[str, ScoreFn],
        config: BatchingConfig | None = None,
        metrics: BatcherMetrics | None = None,
    ) -> None:
        self.functions = dict(functions)
        self.config = config or BatchingConfig()
        self.metrics = metrics or BatcherMetrics.register(CollectorRegistry(), "batcher")
        # Per kind (the worker batches one kind at a time), a heap of (taken, seq, request).
        self._waiting: dict[str, list[tuple[int, int, _Request]]] = {kind: [] for kind in self.functions}
        self._queued_rows_by_kind: dict[str, int] = dict.fromkeys(self.functions, 0)
        self._seq = itertools.count()
        self._closed = False
        self._cond = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="reward-inference", daemon=True)

    def start(self) -> DynamicBatcher:
        self._worker.start()
        return self

    def submit(self, kind: str, items: Sequence[Any]) -> Future[list[float]]:
        """Queue `items` for `functions[kind]`; the Future resolves to their scores, in order.

        Raises QueueFull or BatcherClosed at once. Cancelling the Future drops its rows not yet being scored.
        """
        if kind not in self.functions:
            raise KeyError(kind)
        future: Future[list[float]] = Future()
        if not items:
            future.set_result([])
            return future
        with self._cond:
            if self._closed:
                raise BatcherClosed("the server is shutting down")
            queued = sum(self._queued_rows_by_kind.values())
            if queued + len(items) > self.config.max_queue_rows:
                raise QueueFull(f"{queued} rows already queued; the limit is {self.config.max_queue_rows}")
            was_empty = queued == 0
            request = _Request(kind, list(items), future, time.monotonic(), next(self._seq))
            heapq.heappush(self._waiting[kind], (*request.order, request))
            rows_of_kind = self._queued_rows_by_kind[kind] + len(items)
            self._queued_rows_by_kind[kind] = rows_of_kind
            self.metrics.queued_rows.set(queued + len(items))
            # Wake the worker only when that lets it start sooner: it waits for a first request, or for a
            # preferred batch to fill (until then the queue delay, its own timeout, wakes it). Waking it for
            # every request would cost a thread switch each, fighting the HTTP thread for the GIL.
            if was_empty or rows_of_kind >= self.config.preferred_batch_size:
                self._cond.notify()
        future.add_done_callback(lambda _: self._drop(request))
        return future

    def score(self, kind: str, items: Sequence[Any], timeout: float | None = None) -> list[float]:
        """Score `items` with `functions[kind]`, batched with other callers'. Blocks until done."""
        future = self.submit(kind, items)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()  # rows not yet taken by the worker are dropped
            raise

    def close(self, timeout: float | None = None) -> None:
        """Take no new work, finish what is queued, then stop the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._worker.is_alive():
            self._worker.join(timeout)

    def _drop(self, request: _Request) -> None:
        """A request that ended (cancelled, failed) with rows still queued: stop counting them."""
        with self._cond:
            if request.left and not request.dropped:
                request.dropped = True
                self._queued_rows_by_kind[request.kind] -= request.left
                self.metrics.queued_rows.set(sum(self._queued_rows_by_kind.values()))

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._execute([s for s in batch if not s.request.future.done()])  # cancelled meanwhile: skip

    def _head(self) -> _Request | None:
        """The request whose rows go next: the fewest rows scored so far, then the oldest, over all kinds."""
        best: _Request | None = None
        for heap in self._waiting.values():
            while heap and heap[0][2].dropped:
                heapq.heappop(heap)
            if heap and (best is None or heap[0][2].order < best.order):
                best = heap[0][2]
        return best

    def _next_batch(self) -> list[_Slice] | None:
        config = self.config
        with self._cond:
            while (first := self._head()) is None:
                if self._closed:
                    return None
                self._cond.wait()
            kind = first.kind
            deadline = first.enqueued + config.max_queue_delay_ms / 1000.0
            # While closing, run what is queued at once instead of waiting for company.
            while not self._closed and self._queued_rows_by_kind[kind] < config.preferred_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            heap, batch, rows, again = self._waiting[kind], [], 0, []
            started = time.monotonic()
            while heap and rows < config.preferred_batch_size:
                request = heapq.heappop(heap)[2]
                if request.dropped:
                    continue
                n = min(request.left, config.preferred_batch_size, config.max_batch_size - rows)
                if request.taken == 0:
                    self.metrics.queue_seconds.observe(started - request.enqueued)
                batch.append(_Slice(request, request.items[request.taken : request.taken + n]))
                request.taken += n
                rows += n
                if request.left:
                    again.append(request)
            for request in again:  # back in line, behind those with fewer rows scored
                heapq.heappush(heap, (*request.order, request))
            self._queued_rows_by_kind[kind] -= rows
            self.metrics.queued_rows.set(sum(self._queued_rows_by_kind.values()))
        return batch

    def _execute(self, batch: list[_Slice]) -> None:
        if not batch:
            return
        items = [item for piece in batch for item in piece.items]
        started = time.perf_counter()
        try:
            scores = [float(s) for s in self.functions[batch[0].request.kind](items)]
            if len(scores) != len(items):
                raise ScorerFailed(f"the scorer returned {len(scores)} scores for {len(items)} inputs")
            if not all(math.isfinite(s) for s in scores):
                raise ScorerFailed("the scorer returned a non-finite score")
        except Exception as exc:
            self.metrics.scorer_failures.inc()
            if len(batch) > 1:
                # One bad request must not fail its batch-mates: rerun each slice alone.
                logger.warning("batch of %d requests failed (%s); retrying them one by one", len(batch), exc)
                for piece in batch:
                    self._execute([piece])
                return
            if isinstance(exc, UnscorableInput):
                logger.info("refused %d rows: %s", len(items), exc)  # the caller's fault, not the model's
                _settle(batch[0].request.future, exc)
                return
            logger.exception("scoring %d rows failed", len(items))
            error = exc if isinstance(exc, ScorerFailed) else ScorerFailed(f"{type(exc).__name__}: {exc}")
            _settle(batch[0].request.future, error)  # its rows still queued are dropped with it
            return
        self.metrics.inference_seconds.observe(time.perf_counter() - started)
        self.metrics.batch_size.observe(len(items))
        self.metrics.samples.inc(len(items))
        offset = 0
        for piece in batch:
            request = piece.request
            request.scores += scores[offset : offset + len(piece.items)]
            offset += len(piece.items)
            if len(request.scores) == len(request.items):
                _settle(request.future, request.scores)


def _settle(future: Future[list[float]], outcome: list[float] | BaseException) -> None:
    """Resolve a request's Future, unless its caller cancelled it meanwhile (from another thread)."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass
