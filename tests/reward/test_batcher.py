"""Dynamic batching: callers get their own rows in order, batches form and respect the limits, failures stay local."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import Counter

from nemotron.reward.batcher import (
    BatcherClosed,
    BatchingConfig,
    DynamicBatcher,
    QueueFull,
    ScorerFailed,
)


class RecordingScorer:
    """Scores x -> 10 * x and records every call's batch."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[list[int]] = []
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def __call__(self, items: list[int]) -> list[float]:
        with self.lock:
            self.calls.append(list(items))
        time.sleep(self.delay_s)
        return [10.0 * x for x in items]


@pytest.fixture
def recording() -> RecordingScorer:
    return RecordingScorer(delay_s=0.005)


def _count(counter: Counter) -> float:
    """A counter's value, read through prometheus_client's collection API."""
    return sum(s.value for family in counter.collect() for s in family.samples if s.name.endswith("_total"))


def _started(functions: dict[str, object], **config: float) -> DynamicBatcher:
    return DynamicBatcher(functions, BatchingConfig(**config)).start()  # type: ignore[arg-type]


@pytest.fixture
def batcher(recording: RecordingScorer) -> Iterator[DynamicBatcher]:
    b = _started({"n": recording}, max_batch_size=8, preferred_batch_size=6, max_queue_delay_ms=30.0)
    yield b
    b.close(5.0)


def test_concurrent_callers_get_their_own_rows_in_order(
    batcher: DynamicBatcher, recording: RecordingScorer
) -> None:
    requests = [[100 * c + i for i in range(1 + c % 3)] for c in range(24)]
    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(lambda items: batcher.score("n", items, timeout=10), requests))
    assert results == [[10.0 * x for x in items] for items in requests]
    sizes = [len(call) for call in recording.calls]
    assert max(sizes) <= 8
    assert max(sizes) > 1, "no batch formed across callers"
    assert sum(sizes) == sum(len(r) for r in requests)  # every row scored exactly once


def test_a_large_request_is_scored_in_slices_of_the_preferred_batch_size(
    batcher: DynamicBatcher, recording: RecordingScorer
) -> None:
    items = list(range(20))
    assert batcher.score("n", items, timeout=10) == [10.0 * x for x in items]
    # 20 rows alone in the queue: slices of preferred_batch_size (6), the rest last.
    assert recording.calls == [items[0:6], items[6:12], items[12:18], items[18:20]]


def test_a_small_request_is_scored_between_the_slices_of_a_large_one() -> None:
    """Order of the model's calls, not wall-clock: under first-come-first-served the one-row request would be
    scored after every slice of the 40-row request that came before it."""
    gate, _scored, gated = _gated_scorer()
    calls: list[list[int]] = []

    def recorded(items: list[int]) -> list[float]:
        calls.append(list(items))
        return gated(items)

    b = _started({"n": recorded}, max_batch_size=4, preferred_batch_size=4, max_queue_delay_ms=0.0)
    try:
        finished: list[str] = []
        large = b.submit("n", list(range(40)))  # ten slices of 4; the worker holds the first at the gate
        large.add_done_callback(lambda _: finished.append("large"))
        small = b.submit("n", [1000])
        small.add_done_callback(lambda _: finished.append("small"))
        gate.set()
        assert small.result(10) == [1000.0] and large.result(10) == [float(x) for x in range(40)]
        assert finished == ["small", "large"]
        # The one row rides in the first or second call (beside a slice of the large request), never later.
        assert 1000 in calls[0] + calls[1]
        assert [x for call in calls for x in call if x != 1000] == list(range(40))  # its rows in order
        assert max(len(call) for call in calls) <= 4
    finally:
        gate.set()
        b.close(5.0)


def test_two_large_requests_take_turns() -> None:
    gate, scored, gated = _gated_scorer()
    busy = threading.Event()

    def entered(items: list[int]) -> list[float]:
        busy.set()
        return gated(items)

    b = _started({"n": entered}, max_batch_size=4, preferred_batch_size=4, max_queue_delay_ms=0.0)
    try:
        blocker = b.submit("n", [-1])  # holds the worker while both large requests queue whole
        assert busy.wait(10)
        first = b.submit("n", list(range(0, 12)))
        second = b.submit("n", list(range(100, 112)))
        gate.set()
        assert blocker.result(10) == [-1.0]
        assert first.result(10) == [float(x) for x in range(12)]
        assert second.result(10) == [float(x) for x in range(100, 112)]
        # One slice each in turn (a slice fills a whole batch here), oldest first.
        assert scored[1:] == [*range(0, 4), *range(100, 104), *range(4, 8), *range(104, 108),
                              *range(8, 12), *range(108, 112)]  # fmt: skip
    finally:
        gate.set()
        b.close(5.0)


def test_a_full_preferred_batch_does_not_wait_for_the_delay(recording: RecordingScorer) -> None:
    b = _started({"n": recording}, max_batch_size=8, preferred_batch_size=4, max_queue_delay_ms=10_000.0)
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda x: b.score("n", [x], timeout=20), range(4)))
        assert results == [[0.0], [10.0], [20.0], [30.0]]
        assert time.monotonic() - started < 5.0  # far below the 10 s delay
    finally:
        b.close(5.0)


def test_a_lone_request_waits_at_most_the_delay(recording: RecordingScorer) -> None:
    b = _started({"n": recording}, max_batch_size=8, preferred_batch_size=8, max_queue_delay_ms=100.0)
    try:
        started = time.monotonic()
        assert b.score("n", [1], timeout=10) == [10.0]
        waited = time.monotonic() - started
        assert 0.09 <= waited < 3.0
    finally:
        b.close(5.0)


def test_kinds_are_never_mixed_in_one_call() -> None:
    seen: list[set[str]] = []

    def tagger(tag: str):  # type: ignore[no-untyped-def]
        def score(items: list[str]) -> list[float]:
            seen.append({tag} | {item[0] for item in items})
            return [float(len(item)) for item in items]

        return score

    b = _started(
        {"a": tagger("a"), "b": tagger("b")},
        max_batch_size=16,
        preferred_batch_size=16,
        max_queue_delay_ms=20.0,
    )
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: b.score("ab"[i % 2], ["ab"[i % 2] * (i + 1)]), range(8)))
        assert results == [[float(i + 1)] for i in range(8)]
        assert all(len(tags) == 1 for tags in seen)
    finally:
        b.close(5.0)


def test_one_bad_request_does_not_fail_its_batch_mates() -> None:
    def picky(items: list[str]) -> list[float]:
        if "bad" in items:
            raise ValueError("cannot score 'bad'")
        return [float(len(s)) for s in items]

    b = _started({"s": picky}, max_batch_size=16, preferred_batch_size=16, max_queue_delay_ms=50.0)
    try:

        def call(items: Sequence[str]) -> object:
            try:
                return b.score("s", items, timeout=10)
            except ScorerFailed as exc:
                return exc

        with ThreadPoolExecutor(3) as pool:
            good1, bad, good2 = pool.map(call, [["a"], ["x", "bad"], ["abc"]])
        assert good1 == [1.0] and good2 == [3.0]
        assert isinstance(bad, ScorerFailed) and "cannot score 'bad'" in str(bad)
        # The shared batch failed once, then the bad request failed again alone: 2 failures, not 1.
        assert _count(b.metrics.scorer_failures) == 2
    finally:
        b.close(5.0)


@pytest.mark.parametrize(
    ("output", "message"), [([1.0], "returned 1 scores for 2"), ([1.0, float("nan")], "non-finite")]
)
def test_unusable_scorer_output_is_a_scorer_failure(output: list[float], message: str) -> None:
    b = _started(
        {"s": lambda items: output}, max_batch_size=4, preferred_batch_size=2, max_queue_delay_ms=0.0
    )
    try:
        with pytest.raises(ScorerFailed, match=message):
            b.score("s", ["a", "b"], timeout=10)
        assert _count(b.metrics.scorer_failures) == 1
    finally:
        b.close(5.0)


def test_queue_limit_and_close_drains_queued_work() -> None:
    gate = threading.Event()

    def gated(items: list[int]) -> list[float]:
        gate.wait(10)
        return [float(x) for x in items]

    b = _started(
        {"n": gated}, max_batch_size=2, preferred_batch_size=1, max_queue_delay_ms=0.0, max_queue_rows=4
    )
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(b.score, "n", [1], 10)  # taken by the worker, which blocks on the gate
        time.sleep(0.2)
        queued = pool.submit(b.score, "n", [2, 3, 4], 10)  # waits in the queue: 3 of 4 rows
        time.sleep(0.2)
        with pytest.raises(QueueFull):
            b.score("n", [5, 6], timeout=1)
        closer = pool.submit(b.close, 10.0)
        time.sleep(0.2)
        with pytest.raises(BatcherClosed):
            b.score("n", [7], timeout=1)
        gate.set()
        assert running.result(10) == [1.0]
        assert queued.result(10) == [2.0, 3.0, 4.0]  # queued before close: still served
        closer.result(10)


def _gated_scorer() -> tuple[threading.Event, list[int], Callable[[list[int]], list[float]]]:
    """A scorer that blocks until the gate opens, then records what it scored."""
    gate = threading.Event()
    scored: list[int] = []

    def gated(items: list[int]) -> list[float]:
        gate.wait(10)
        scored.extend(items)
        return [float(x) for x in items]

    return gate, scored, gated


def test_timed_out_chunks_are_not_scored() -> None:
    gate, scored, gated = _gated_scorer()
    b = _started({"n": gated}, max_batch_size=1, preferred_batch_size=1, max_queue_delay_ms=0.0)
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(b.score, "n", [1], 10)
            time.sleep(0.2)
            with pytest.raises(TimeoutError):
                b.score("n", [2], timeout=0.2)
            gate.set()
            assert first.result(10) == [1.0]
        b.close(5.0)
        assert scored == [1]
    finally:
        gate.set()
        b.close(5.0)


@pytest.mark.parametrize(
    "config",
    [
        {"max_batch_size": 0},
        {"max_batch_size": 4, "preferred_batch_size": 5},
        {"max_queue_delay_ms": -1.0},
        {"max_batch_size": 8, "preferred_batch_size": 8, "max_queue_rows": 4},
    ],
)
def test_invalid_batching_config(config: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BatchingConfig(**config)  # type: ignore[arg-type]


def test_every_broken_batching_rule_is_in_one_error() -> None:
    with pytest.raises(ValueError) as caught:
        BatchingConfig(max_batch_size=4, preferred_batch_size=5, max_queue_delay_ms=-1.0, max_queue_rows=2)
    assert str(caught.value) == (
        "preferred_batch_size must be in [1, max_batch_size=4], got 5; max_queue_delay_ms must be >= 0, got -1.0; "
        "max_queue_rows must be at least max_batch_size=4, got 2"
    )


def test_submit_returns_at_once_and_its_future_holds_the_rows_in_order(recording: RecordingScorer) -> None:
    b = _started({"n": recording}, max_batch_size=4, preferred_batch_size=4, max_queue_delay_ms=10_000.0)
    try:
        # 10 rows in chunks of at most 4: 4 + 4 run at once (each a full preferred batch); the last 2 wait
        # for company, up to the 10 s delay, so the request is not done until close() runs them.
        future = b.submit("n", list(range(10)))
        time.sleep(0.3)
        assert [len(c) for c in recording.calls] == [4, 4] and not future.done()
        b.close(5.0)
        assert future.result(5) == [10.0 * x for x in range(10)]
        assert [len(c) for c in recording.calls] == [4, 4, 2]
        assert b.submit("n", []).result(0) == []
    finally:
        b.close(5.0)


def test_a_cancelled_submission_is_never_scored() -> None:
    gate, scored, gated = _gated_scorer()
    b = _started({"n": gated}, max_batch_size=2, preferred_batch_size=1, max_queue_delay_ms=0.0)
    try:
        running = b.submit("n", [1])
        time.sleep(0.2)  # the worker holds [1] at the gate
        waiting = b.submit("n", [2, 3, 4, 5, 6])  # queued whole: the worker takes it a slice at a time
        assert waiting.cancel()
        gate.set()
        assert running.result(10) == [1.0]
        b.close(5.0)
        assert scored == [1]  # the rows of the cancelled request were dropped
    finally:
        gate.set()
        b.close(5.0)


def test_a_failed_chunk_fails_its_request_and_drops_the_rest() -> None:
    calls: list[list[str]] = []

    def picky(items: list[str]) -> list[float]:
        calls.append(items)
        if "bad" in items:
            raise ValueError("cannot score 'bad'")
        return [1.0] * len(items)

    gate = threading.Event()
    b = _started(
        {"s": picky, "g": lambda items: [float(gate.wait(10))] * len(items)},
        max_batch_size=2,
        preferred_batch_size=1,
        max_queue_delay_ms=0.0,
    )
    try:
        blocker = b.submit("g", ["x"])  # keeps the worker busy while the next request queues up whole
        time.sleep(0.2)
        future = b.submit("s", ["bad", "a", "b", "c"])  # slices of preferred_batch_size: one row each
        gate.set()
        with pytest.raises(ScorerFailed, match="cannot score 'bad'"):
            future.result(10)
        assert blocker.result(10) == [1.0]
        b.close(5.0)
        assert calls == [["bad"]]  # the failure dropped the request's rows still queued
    finally:
        gate.set()
        b.close(5.0)
