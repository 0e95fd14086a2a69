"""Fair batching through the real server: another client's one-row request is scored between the slices of a large
request, not after it. Evidence by the order of the model's calls, not by wall-clock (bench/fair_batching.py
measures the latency)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from nemotron.reward.batcher import BatchingConfig
from nemotron.reward.metrics import parse_samples
from nemotron.reward.server import serve


def test_a_one_row_request_is_scored_between_the_slices_of_a_large_one() -> None:
    calls: list[list[str]] = []
    entered, gate = threading.Event(), threading.Event()

    def scorer(texts: list[str]) -> list[float]:
        calls.append(list(texts))
        if len(calls) == 1:  # hold the large request's first slice until the small request has queued
            entered.set()
            gate.wait(10)
        return [float(len(t)) for t in texts]

    large_rows = ["x" * (i % 7 + 1) for i in range(40)]  # ten slices of 4
    batching = BatchingConfig(max_batch_size=4, preferred_batch_size=4, max_queue_delay_ms=0.0)
    with serve(scorer, batching=batching) as handle, ThreadPoolExecutor(2) as pool:
        try:
            url = handle.url + "/score"
            large = pool.submit(httpx.post, url, json={"sentences": large_rows}, timeout=30)
            assert entered.wait(10)
            small = pool.submit(httpx.post, url, json={"sentences": ["one row"]}, timeout=30)
            deadline = time.monotonic() + 10
            while True:  # 36 rows of the large request and the small one's wait for the model
                metrics = parse_samples(httpx.get(handle.url + "/metrics", timeout=10).text)
                if metrics.get("nemotron_reward_queued_rows") == 37.0:
                    break
                assert time.monotonic() < deadline, metrics.get("nemotron_reward_queued_rows")
                time.sleep(0.02)
        finally:
            gate.set()
        assert small.result().json() == {"rewards": [7.0]}
        assert large.result().json() == {"rewards": [float(len(t)) for t in large_rows]}
    # First come first served would score it in the eleventh call, after every slice of the large request.
    assert "one row" in calls[1] and len(calls[1]) == 4, calls
    assert [
        t for call in calls for t in call if t != "one row"
    ] == large_rows  # the large one's rows in order
