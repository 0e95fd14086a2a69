"""Load test of the reward server: N concurrent clients for S seconds on loopback, every answer checked.

    python bench/load_reward_server.py                            # 64 clients for 30 s (docs/reliability.md)
    python bench/load_reward_server.py --clients 8 --seconds 3    # a quick look
    python bench/load_reward_server.py --compare --seconds 15     # batch size 1, then the defaults: the ratio

The server is its own process, started as a user starts it (`python -m nemotron.reward.server --model DIR`) on a
tiny random GPT-2 reward model built from a config and saved as safetensors, so its RSS is its own. The clients
are threads here, each on its own keep-alive connection, sending back to back with 1-4 rows per request: binary
KServe sentences (as tritonclient does), token ids, or JSON to /score. Every answer is compared with the reward
the server gave each row alone before the load began. The server's RSS is read from /proc before the load, after
a warm-up, every second, and at the end; then SIGTERM must stop it cleanly (exit 0).

Prints requests/s, p50/p99 latency, errors and RSS; `--json PATH` also writes them. Exits 1 on any error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

WORDS = "the a movie film was is great good bad awful fine plot acting boring fun loved hated it and but very".split()
VOCAB = len(WORDS) + 3  # [PAD], [UNK], [EOS], then the words
POOL = 64  # distinct sentences and token rows the clients draw from
MODES = ("binary sentences", "token ids", "json /score")


@dataclass
class Report:
    clients: int
    seconds: float
    requests: int
    rows: int
    min_client_requests: int  # the least served client: nobody may starve
    errors: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    rss_idle_mb: float  # before any load
    rss_warm_mb: float  # after the warm-up: every connection and handler thread exists
    rss_peak_mb: float
    rss_end_mb: float
    server_exit_code: int | None
    first_errors: list[str] = field(default_factory=list)
    requests_by_mode: dict[str, int] = field(default_factory=dict)


def save_tiny_reward_model(directory: Path) -> None:
    """A random 2-layer GPT-2 reward model and its word-level tokenizer, saved as a user's model directory."""
    from transformers.utils import logging as hf_logging

    from nemotron.models.tiny import tiny_model
    from nemotron.models.tokenizer import word_tokenizer

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tiny_model(VOCAB, "reward_model", eos_token_id=2).save_pretrained(directory, safe_serialization=True)
    word_tokenizer(WORDS).save_pretrained(directory)


BATCH_1 = ("--max-batch-size", "1", "--max-queue-delay-ms", "0")  # every request alone, at once


def start_server(
    model_dir: Path, work: Path, batching: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m nemotron.reward.server` on a free loopback port with its default batching (or `batching`'s
    flags); returns (process, url) once it serves."""
    ready = work / "ready.json"
    ready.unlink(missing_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "nemotron.reward.server", "--model", str(model_dir), "--host", "127.0.0.1",
         "--threads", "1", "--max-length", "64", *batching, "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, stderr=(work / "server.log").open("wb"),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the server did not start; see {work / 'server.log'}")
        time.sleep(0.1)
    return process, str(json.loads(ready.read_text())["url"])


def rss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Workload:
    """The sentence and token-row pools, and the reward each gets alone (the oracle for every answer)."""

    def __init__(self, url: str, seed: int = 0) -> None:
        from nemotron.reward.client import RewardClient

        rng = random.Random(seed)
        self.sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(POOL)]
        self.rows = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 12))] for _ in range(POOL)]
        with RewardClient(url, retries=0) as client:
            self.sentence_rewards = [client.score([s])[0] for s in self.sentences]
            self.row_rewards = [client.score_tokens([r])[0] for r in self.rows]


def client_loop(url: str, index: int, work: Workload, start: float, end: float, out: dict[str, Any]) -> None:
    """One client: requests back to back until `end`, each checked; latencies recorded from `start` on."""
    from nemotron.reward.client import RewardClient

    rng = random.Random(1000 + index)
    mode = MODES[index % len(MODES)]
    latencies: list[float] = []
    errors: list[str] = []
    requests = rows = 0
    with RewardClient(url, retries=0, timeout=30) as client:
        while (now := time.monotonic()) < end:
            picks = [rng.randrange(POOL) for _ in range(rng.randint(1, 4))]
            sent = time.perf_counter()
            try:
                if mode == "binary sentences":
                    got = client.score([work.sentences[i] for i in picks])
                    want = [work.sentence_rewards[i] for i in picks]
                elif mode == "token ids":
                    got = client.score_tokens([work.rows[i] for i in picks])
                    want = [work.row_rewards[i] for i in picks]
                else:
                    body = json.dumps({"sentences": [work.sentences[i] for i in picks]}).encode()
                    _, answer = client.request("POST", "/score", body, {"Content-Type": "application/json"})
                    got = json.loads(answer)["rewards"]
                    want = [work.sentence_rewards[i] for i in picks]
                if len(got) != len(want) or any(
                    abs(g - w) > 1e-4 * max(1.0, abs(w)) for g, w in zip(got, want, strict=False)
                ):
                    errors.append(f"{mode}: wrong rewards {got} for {want}")
            except Exception as exc:  # every failure counts; the load goes on
                errors.append(f"{mode}: {type(exc).__name__}: {exc}")
            if now >= start:
                latencies.append(time.perf_counter() - sent)
                requests += 1
                rows += len(picks)
    out[f"client {index}"] = {"mode": mode, "latencies": latencies, "errors": errors, "requests": requests,
                              "rows": rows}  # fmt: skip


def run(clients: int, seconds: float, warmup: float, batching: tuple[str, ...] = ()) -> Report:
    with tempfile.TemporaryDirectory(prefix="nemotron-load-") as tmp:
        work_dir = Path(tmp)
        save_tiny_reward_model(work_dir / "model")
        server, url = start_server(work_dir / "model", work_dir, batching)
        try:
            work = Workload(url)
            rss_idle = rss_mb(server.pid)
            start = time.monotonic() + warmup
            end = start + seconds
            results: dict[str, Any] = {}
            threads = [
                threading.Thread(target=client_loop, args=(url, i, work, start, end, results), daemon=True)
                for i in range(clients)
            ]
            for thread in threads:
                thread.start()
            time.sleep(max(0.0, start - time.monotonic()))
            rss_warm = rss_mb(server.pid)
            samples = [rss_warm]
            while time.monotonic() < end:
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
                samples.append(rss_mb(server.pid))
            for thread in threads:
                thread.join(timeout=60)
            rss_end = rss_mb(server.pid)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                exit_code: int | None = server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                exit_code = None
    latencies = sorted(t for r in results.values() for t in r["latencies"])
    errors = [e for r in results.values() for e in r["errors"]]
    by_mode: dict[str, int] = {}
    for r in results.values():
        by_mode[r["mode"]] = by_mode.get(r["mode"], 0) + r["requests"]
    count = len(latencies)
    return Report(
        clients=clients,
        seconds=seconds,
        requests=count,
        rows=sum(r["rows"] for r in results.values()),
        min_client_requests=min((r["requests"] for r in results.values()), default=0),
        errors=len(errors) + (clients - len(results)),  # a client thread that never finished is an error too
        requests_per_s=count / seconds,
        p50_ms=1000 * statistics.median(latencies) if latencies else float("nan"),
        p99_ms=1000 * latencies[min(count - 1, int(0.99 * count))] if latencies else float("nan"),
        max_ms=1000 * latencies[-1] if latencies else float("nan"),
        rss_idle_mb=rss_idle,
        rss_warm_mb=rss_warm,
        rss_peak_mb=max([*samples, rss_end]),
        rss_end_mb=rss_end,
        server_exit_code=exit_code,
        first_errors=errors[:5],
        requests_by_mode=by_mode,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured load, after the warm-up")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the clock starts")
    parser.add_argument("--json", dest="json_path", type=Path, help="also write the report here")
    parser.add_argument("--batch-1", action="store_true", help="serve every request alone (max batch size 1)")
    parser.add_argument(
        "--compare", action="store_true", help="run batch size 1, then the default batching; print the ratio"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.compare:
        single = run(args.clients, args.seconds, args.warmup, BATCH_1)
        batched = run(args.clients, args.seconds, args.warmup)
        for name, report in (("batch size 1", single), ("default batching", batched)):
            print(
                f"{name}: {report.requests_per_s:.0f} requests/s, p50 {report.p50_ms:.1f} ms, "
                f"p99 {report.p99_ms:.1f} ms, errors {report.errors}"
            )
        ratio = batched.requests_per_s / max(single.requests_per_s, 1e-9)
        print(f"{args.clients} clients: default batching serves {ratio:.1f}x the requests/s of batch size 1")
        if args.json_path:
            args.json_path.write_text(
                json.dumps({"batch_1": asdict(single), "batched": asdict(batched)}, indent=1)
            )
        return 0 if single.errors == batched.errors == 0 else 1
    report = run(args.clients, args.seconds, args.warmup, BATCH_1 if args.batch_1 else ())
    print(
        f"{report.clients} clients for {report.seconds:g} s on loopback: {report.requests} requests "
        f"({report.rows} rows; the least served client made {report.min_client_requests}), "
        f"{report.requests_per_s:.0f} requests/s, p50 {report.p50_ms:.1f} ms, "
        f"p99 {report.p99_ms:.1f} ms, max {report.max_ms:.1f} ms, errors {report.errors}"
    )
    print(
        f"server RSS: idle {report.rss_idle_mb:.1f} MB, after warm-up {report.rss_warm_mb:.1f} MB, "
        f"peak {report.rss_peak_mb:.1f} MB, end {report.rss_end_mb:.1f} MB "
        f"(growth under load {report.rss_end_mb - report.rss_warm_mb:+.1f} MB); "
        f"SIGTERM exit code {report.server_exit_code}"
    )
    for error in report.first_errors:
        print(f"error: {error}")
    if args.json_path:
        args.json_path.write_text(json.dumps(asdict(report), indent=1))
    return 0 if report.errors == 0 and report.server_exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
