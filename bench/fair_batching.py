"""Fair batching: how long a one-row request waits while another client's 60,000-row request is in flight, against
the same request on the idle server, measured in one run.

    python bench/fair_batching.py                      # 60,000 rows (docs/benchmarks.md)
    python bench/fair_batching.py --rows 6000          # a quick look
    PYTHONPATH=/path/to/older/src python bench/fair_batching.py   # the same against another checkout's server

The server is its own process, started as a user starts it (`python -m nemotron.reward.server --model DIR`, its
default batching: 64 rows per batch, 5 ms queue delay) on the tiny random GPT-2 reward model of
`load_reward_server.py`. First `--probes` one-row token-id requests, one after another, on the idle server; then
one client sends `--rows` rows of 8 token ids in one binary KServe request, and once the server has queued them a
second client sends one-row requests back to back until the large request is answered. Every answer is compared
with the reward the same row got alone. Prints the median and worst latency of each phase and their ratio (loaded
over idle), the large request's time, and the server's peak RSS (VmHWM); `--json PATH` also writes them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from load_reward_server import VOCAB, save_tiny_reward_model, start_server

ROW_TOKENS = 8


def status_kb(pid: int, field: str) -> int:
    """A field of /proc/PID/status in kB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def queued_rows(url: str) -> float:
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    line = next(line for line in text.splitlines() if line.startswith("nemotron_reward_queued_rows "))
    return float(line.split()[1])


def probe(client: Any, row: list[int], want: float) -> float:
    """One one-row request; its latency in seconds. Raises if the reward is not the row's own."""
    sent = time.perf_counter()
    got = client.score_tokens([row])
    took = time.perf_counter() - sent
    if len(got) != 1 or abs(got[0] - want) > 1e-4 * max(1.0, abs(want)):
        raise RuntimeError(f"wrong reward {got} for {want}")
    return took


def run(rows: int, probes: int) -> dict[str, Any]:
    from nemotron.reward.client import RewardClient

    rng = random.Random(0)
    large_rows = [[rng.randrange(3, VOCAB) for _ in range(ROW_TOKENS)] for _ in range(rows)]
    row = [rng.randrange(3, VOCAB) for _ in range(ROW_TOKENS)]
    with tempfile.TemporaryDirectory(prefix="nemotron-fair-") as tmp:
        work = Path(tmp)
        save_tiny_reward_model(work / "model")
        server, url = start_server(work / "model", work)
        try:
            with RewardClient(url, retries=0, timeout=120) as client:
                want = client.score_tokens([row])[0]
                for _ in range(5):  # warm-up: connections, the model's first calls
                    probe(client, row, want)
                idle = [probe(client, row, want) for _ in range(probes)]

            answer: dict[str, Any] = {}

            def send_large() -> None:
                with RewardClient(url, retries=0, timeout=300) as big:
                    started = time.perf_counter()
                    try:
                        answer["rewards"] = big.score_tokens(large_rows)
                    except Exception as exc:  # reported below
                        answer["error"] = f"{type(exc).__name__}: {exc}"
                    answer["seconds"] = time.perf_counter() - started

            sender = threading.Thread(target=send_large, daemon=True)
            sender.start()
            deadline = time.monotonic() + 120
            while queued_rows(url) < rows / 2:  # the large request has arrived and waits for the model
                if not sender.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the large request never queued: {answer}")
                time.sleep(0.01)
            loaded = []
            with RewardClient(url, retries=0, timeout=120) as client:
                while sender.is_alive():
                    loaded.append(probe(client, row, want))
            sender.join()
            if "error" in answer or len(answer["rewards"]) != rows:
                raise RuntimeError(f"the large request failed: {answer.get('error')}")
            peak_mb = status_kb(server.pid, "VmHWM") / 1024
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    idle_p50, loaded_p50 = statistics.median(idle), statistics.median(loaded)
    return {
        "rows": rows,
        "idle_ms": {"p50": 1000 * idle_p50, "max": 1000 * max(idle), "n": len(idle)},
        "loaded_ms": {"p50": 1000 * loaded_p50, "max": 1000 * max(loaded), "n": len(loaded)},
        "ratio_p50": loaded_p50 / idle_p50,
        "ratio_max": max(loaded) / max(idle),
        "large_request_s": answer["seconds"],
        "server_peak_rss_mb": peak_mb,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=60_000, help="rows of the large request")
    parser.add_argument("--probes", type=int, default=50, help="one-row requests on the idle server")
    parser.add_argument("--json", dest="json_path", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report = run(args.rows, args.probes)
    idle, loaded = report["idle_ms"], report["loaded_ms"]
    print(
        f"idle server: one-row request p50 {idle['p50']:.1f} ms, max {idle['max']:.1f} ms ({idle['n']} requests)"
    )
    print(
        f"beside a {args.rows:,}-row request ({report['large_request_s']:.1f} s): p50 {loaded['p50']:.1f} ms, "
        f"max {loaded['max']:.1f} ms ({loaded['n']} requests)"
    )
    print(
        f"loaded / idle: {report['ratio_p50']:.2f}x at the median, {report['ratio_max']:.2f}x at the worst; "
        f"server peak RSS {report['server_peak_rss_mb']:.0f} MB"
    )
    if args.json_path:
        args.json_path.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
