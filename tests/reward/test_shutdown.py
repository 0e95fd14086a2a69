"""`python -m nemotron.reward.server` serves a saved reward model and exits 0 on SIGTERM after finishing its work."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tests.processes import start_module
from transformers import GPT2ForSequenceClassification, PreTrainedTokenizerFast

from nemotron.reward.client import RewardClient
from nemotron.reward.metrics import parse_samples
from nemotron.reward.scorer import Scorer

from .test_server import http_call


def _wait_for(path: Path, process: Any, log: Path, timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return dict(json.loads(path.read_text()))
        assert process.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    raise AssertionError("the server never wrote its ready file")


def test_sigterm_finishes_in_flight_request_and_exits_0(
    tmp_path: Path,
    reward_model: GPT2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerFast,
    model_scorer: Scorer,
) -> None:
    model_dir = tmp_path / "rm"
    reward_model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    ready, log = tmp_path / "ready.json", tmp_path / "server.log"
    cmd = [sys.executable, "-m", "nemotron.reward.server", "--model", str(model_dir), "--ready-file", str(ready),
           "--max-length", "32", "--max-batch-size", "8", "--threads", "1"]  # fmt: skip
    with log.open("wb") as out:
        process = start_module(cmd, {**os.environ, "NEMOTRON_REWARD_TOKEN": ""}, out)
    try:
        info = _wait_for(ready, process, log, timeout=60)
        url = str(info["url"])
        assert info["pid"] == process.pid
        sentences = [" ".join(["good", "movie", "bad"][: 1 + i % 3]) for i in range(4000)]
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(RewardClient(url, retries=0, timeout=60).score, sentences)
            # Signal only once the server is part-way through the 500 model calls of this request.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                samples = parse_samples(http_call(url, "/metrics")[2].decode())
                if samples.get("nemotron_reward_samples_total", 0) > 0:
                    break
                time.sleep(0.01)
            done_before_signal = samples.get("nemotron_reward_samples_total", 0)
            process.send_signal(signal.SIGTERM)
            rewards = in_flight.result(60)
        assert 0 < done_before_signal < len(sentences), "the request was not in flight when SIGTERM arrived"
        assert process.wait(60) == 0
        expected = model_scorer.score_sentences(sentences[:3])
        np.testing.assert_allclose(rewards[:3], expected, rtol=1e-5, atol=1e-6)
        assert len(rewards) == len(sentences)
        assert "received SIGTERM" in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
