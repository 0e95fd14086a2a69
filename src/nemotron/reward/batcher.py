"""Dynamic batching: requests from many callers wait briefly in one queue and go through the model together.

One worker thread owns the model. Each request is cut into chunks of at most `max_batch_size` rows; the
worker takes the oldest chunk, waits until `preferred_batch_size` rows of the same kind are queued or the
oldest has waited `max_queue_delay_ms`, then scores up to `preferred_batch_size` rows (never more than
`max_batch_size`) in one call and hands each caller its own rows, in order.

`submit` returns a Future at once (the HTTP transport answers from it without a thread per request);
`score` blocks until the scores are there.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from nemotron.reward.prometheus import (
    BATCH_SIZE_BUCKETS,
    LATENCY_BUCKETS_S,
    Counter,
    Gauge,
    Histogram,
    Registry,
)

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
class BatchingConfig:
    max_batch_size: int = 64
    preferred_batch_size: int = 32
    max_queue_delay_ms: float = 5.0
    max_queue_rows: int = 65536

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 1 <= self.preferred_batch_size <= self.max_batch_size:
            raise ValueError(
                f"preferred_batch_size must be in [1, max_batch_size={self.max_batch_size}], "
                f"got {self.preferred_batch_size}"
            )
        if self.max_queue_delay_ms < 0:
            raise ValueError(f"max_queue_delay_ms must be >= 0, got {self.max_queue_delay_ms}")
        if self.max_queue_rows < self.max_batch_size:
            raise ValueError("max_queue_rows must be at least max_batch_size")


@dataclass(frozen=True)
class BatcherMetrics:
    batch_size: Histogram
    queue_seconds: Histogram
    inference_seconds: Histogram
    queued_rows: Gauge
    samples: Counter
    scorer_failures: Counter

    @classmethod
    def register(cls, registry: Registry, prefix: str) -> BatcherMetrics:
        return cls(
            batch_size=registry.histogram(f"{prefix}_batch_size", "Rows per model call.", BATCH_SIZE_BUCKETS),
            queue_seconds=registry.histogram(
                f"{prefix}_queue_seconds", "Time a chunk waited in the batching queue.", LATENCY_BUCKETS_S
            ),
            inference_seconds=registry.histogram(
                f"{prefix}_inference_seconds", "Time of one model call.", LATENCY_BUCKETS_S
            ),
            queued_rows=registry.gauge(f"{prefix}_queued_rows", "Rows waiting in the batching queue."),
            samples=registry.counter(f"{prefix}_samples_total", "Rows scored."),
            scorer_failures=registry.counter(f"{prefix}_scorer_failures_total", "Model calls that raised."),
        )


@dataclass
class _Chunk:
    kind: str
    items: list[Any]
    future: Future[list[float]]
    enqueued: float


class DynamicBatcher:
    """Queue + one worker thread calling `functions[kind](items) -> scores`, batching across callers."""

    def __init__(
        self,
        functions: Mapping[str, ScoreFn],
        config: BatchingConfig | None = None,
        metrics: BatcherMetrics | None = None,
    ) -> None:
        self.functions = dict(functions)
        self.config = config or BatchingConfig()
        self.metrics = metrics or BatcherMetrics.register(Registry(), "batcher")
        self._queue: list[_Chunk] = []
        self._queued_rows_by_kind: dict[str, int] = {}  # rows waiting, per kind (the worker batches one kind)
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
        if not items:
            empty: Future[list[float]] = Future()
            empty.set_result([])
            return empty
        step = self.config.max_batch_size
        now = time.monotonic()
        chunks = [_Chunk(kind, list(items[i : i + step]), Future(), now) for i in range(0, len(items), step)]
        with self._cond:
            if self._closed:
                raise BatcherClosed("the server is shutting down")
            queued = sum(self._queued_rows_by_kind.values())
            if queued + len(items) > self.config.max_queue_rows:
                raise QueueFull(f"{queued} rows already queued; the limit is {self.config.max_queue_rows}")
            self._queue += chunks
            rows_of_kind = self._queued_rows_by_kind.get(kind, 0) + len(items)
            self._queued_rows_by_kind[kind] = rows_of_kind
            self.metrics.queued_rows.set(queued + len(items))
            # Wake the worker only when that lets it start sooner: it waits for a first chunk, or for a
            # preferred batch to fill (until then the queue delay, its own timeout, wakes it). Waking it for
            # every request would cost a thread switch each, fighting the HTTP thread for the GIL.
            if len(self._queue) == len(chunks) or rows_of_kind >= self.config.preferred_batch_size:
                self._cond.notify()
        return chunks[0].future if len(chunks) == 1 else _joined([c.future for c in chunks])

    def score(self, kind: str, items: Sequence[Any], timeout: float | None = None) -> list[float]:
        """Score `items` with `functions[kind]`, batched with other callers'. Blocks until done."""
        future = self.submit(kind, items)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()  # chunks not yet running are dropped by the worker
            raise

    def close(self, timeout: float | None = None) -> None:
        """Take no new work, finish what is queued, then stop the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._worker.is_alive():
            self._worker.join(timeout)

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            started = time.monotonic()
            for chunk in batch:
                self.metrics.queue_seconds.observe(started - chunk.enqueued)
            self._execute(batch)

    def _ready_rows(self, kind: str) -> int:
        return self._queued_rows_by_kind.get(kind, 0)

    def _next_batch(self) -> list[_Chunk] | None:
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            first = self._queue[0]
            deadline = first.enqueued + self.config.max_queue_delay_ms / 1000.0
            # While closing, run what is queued at once instead of waiting for company.
            while not self._closed and self._ready_rows(first.kind) < self.config.preferred_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch: list[_Chunk] = []
            rows = 0
            for chunk in self._queue:
                if chunk.kind != first.kind:
                    continue
                if rows + len(chunk.items) > self.config.max_batch_size:
                    break
                batch.append(chunk)
                rows += len(chunk.items)
                if rows >= self.config.preferred_batch_size:
                    break
            taken = {id(c) for c in batch}
            self._queue = [c for c in self._queue if id(c) not in taken]
            self._queued_rows_by_kind[first.kind] -= rows
            self.metrics.queued_rows.set(sum(self._queued_rows_by_kind.values()))
        # A caller that timed out cancelled its chunks; skip them.
        return [c for c in batch if c.future.set_running_or_notify_cancel()]

    def _execute(self, batch: list[_Chunk]) -> None:
        if not batch:
            return
        items = [item for chunk in batch for item in chunk.items]
        started = time.perf_counter()
        try:
            scores = [float(s) for s in self.functions[batch[0].kind](items)]
            if len(scores) != len(items):
                raise ScorerFailed(f"the scorer returned {len(scores)} scores for {len(items)} inputs")
            if not all(math.isfinite(s) for s in scores):
                raise ScorerFailed("the scorer returned a non-finite score")
        except Exception as exc:
            self.metrics.scorer_failures.inc()
            if len(batch) > 1:
                # One bad request must not fail its batch-mates: rerun each chunk alone.
                logger.warning("batch of %d requests failed (%s); retrying them one by one", len(batch), exc)
                for chunk in batch:
                    self._execute([chunk])
                return
            if isinstance(exc, UnscorableInput):
                logger.info("refused %d rows: %s", len(items), exc)  # the caller's fault, not the model's
                batch[0].future.set_exception(exc)
                return
            logger.exception("scoring %d rows failed", len(items))
            error = exc if isinstance(exc, ScorerFailed) else ScorerFailed(f"{type(exc).__name__}: {exc}")
            batch[0].future.set_exception(error)
            return
        self.metrics.inference_seconds.observe(time.perf_counter() - started)
        self.metrics.batch_size.observe(len(items))
        self.metrics.samples.inc(len(items))
        offset = 0
        for chunk in batch:
            chunk.future.set_result(scores[offset : offset + len(chunk.items)])
            offset += len(chunk.items)


def _joined(futures: list[Future[list[float]]]) -> Future[list[float]]:
    """One Future for a request cut into chunks: all their scores in order, or the first failure.

    Cancelling it cancels the chunks; a failed chunk cancels the others (their caller gets an error anyway).
    """
    joined: Future[list[float]] = Future()

    def on_chunk(_: Future[list[float]]) -> None:
        if joined.done():
            return
        failed = [f for f in futures if f.done() and not f.cancelled() and f.exception() is not None]
        try:
            if failed:
                joined.set_exception(failed[0].exception())
            elif all(f.done() and not f.cancelled() for f in futures):
                joined.set_result([score for f in futures for score in f.result()])
        except InvalidStateError:  # cancelled meanwhile, from another thread
            pass

    def on_joined(_: Future[list[float]]) -> None:
        for future in futures:
            future.cancel()  # no-op for chunks already scored or running

    for future in futures:
        future.add_done_callback(on_chunk)
    joined.add_done_callback(on_joined)
    return joined
