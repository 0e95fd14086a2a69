"""Benchmark the reward server: 64 concurrent clients on loopback, dynamic batching against batch size 1.

    python bench/bench_reward_server.py            # full size (~36 s on 2 cores)
    python bench/bench_reward_server.py --small    # CI size (< 30 s)

The server runs in this process; the clients run in a child process, as 64 keep-alive connections on one
asyncio loop, each sending one-sentence KServe v2 infer requests (binary tensors, as `RewardClient` sends
them) back to back and timing each answer. Raw HTTP/1.1 keeps the clients' own CPU cost small, so that they
are not what limits throughput. Two scorers, each served with batch size 1 and with dynamic batching, on the
same requests:

- `gpt2-cpu`: a random GPT-2 reward model built from a config, on one CPU thread. On a CPU the cost of a
  forward pass grows with the rows in it, so batching can win only the fixed per-call overhead.
- `fixed-cost`: a model call that takes `--call-ms` whatever the batch size (up to the maximum) and
  releases the GIL while it waits, like a forward pass on an accelerator. This measures the server's
  batching itself: its ceiling is then the HTTP path, not the model.

Prints throughput, p50/p99 latency and the CPU time per request of the server process and of the clients,
per run, and the dynamic/batch-1 throughput ratio per scorer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import multiprocessing
import random
import statistics
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit
from urllib.request import urlopen

WORDS = "the a movie film was is great good bad awful fine plot acting boring fun loved hated it and but very".split()


@dataclass(frozen=True)
class Result:
    scorer: str
    mode: str
    max_batch_size: int
    requests: int
    seconds: float
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    mean_batch_size: float
    server_cpu_ms: float  # CPU time of the server process per request (all its threads)
    client_cpu_ms: float  # CPU time of the client process per request


def sentences(count: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(words // 2, words))) for _ in range(count)]


def infer_request(host: str, sentence: str) -> bytes:
    """The bytes of one KServe v2 infer request for one sentence, binary in and out, as RewardClient sends it."""
    import numpy as np

    from nemotron.reward.kserve import HEADER_LENGTH, encode_infer_request

    array = np.empty(1, dtype=object)
    array[:] = [sentence.encode("utf-8")]
    body, json_length = encode_infer_request(
        {"sentences": array}, binary_inputs=True, binary_data_output=True
    )
    head = (
        f"POST /v2/models/reward_model/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/octet-stream\r\n{HEADER_LENGTH}: {json_length}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class KeepAliveClient:
    """One keep-alive connection speaking raw HTTP/1.1; checks that each answer is 200 with one finite reward."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, host: str, port: int) -> KeepAliveClient:
        return cls(*await asyncio.open_connection(host, port))  # asyncio sets TCP_NODELAY

    async def exchange(self, request: bytes) -> None:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/1.1 200 "):
            raise RuntimeError(f"the server answered {lines[0]!r}")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await self.reader.readexactly(int(headers["content-length"]))
        json_length = int(headers["inference-header-content-length"])
        (reward,) = struct.unpack("<f", body[json_length:])  # one FP32 reward after the JSON header
        if not math.isfinite(reward):
            raise RuntimeError(f"a non-finite reward: {reward}")

    async def timed(self, requests: list[bytes]) -> list[float]:
        """Send `requests` back to back; the latency of each, in seconds."""
        latencies = []
        for request in requests:
            started = time.perf_counter()
            await self.exchange(request)
            latencies.append(time.perf_counter() - started)
        self.writer.close()
        await self.writer.wait_closed()
        return latencies


async def run_clients(url: str, clients: int, per_client: int, words: int, out: Any) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", int(parts.port or 80)
    requests = [
        [infer_request(host, s) for s in sentences(per_client, words, seed=i)] for i in range(clients)
    ]
    connections = await asyncio.gather(*(KeepAliveClient.connect(host, port) for _ in range(clients)))
    # One request each opens the connections and warms both sides up before the clock starts.
    await asyncio.gather(*(c.exchange(r[0]) for c, r in zip(connections, requests, strict=True)))
    out.put("start")
    cpu, started = time.process_time(), time.perf_counter()
    results = await asyncio.gather(*(c.timed(r) for c, r in zip(connections, requests, strict=True)))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    out.put({"seconds": seconds, "client_cpu_s": cpu, "latencies": [x for r in results for x in r]})


def client_worker(url: str, clients: int, per_client: int, words: int, out: Any) -> None:
    """Child process: `clients` concurrent keep-alive connections on one asyncio loop; reports latencies."""
    try:
        asyncio.run(run_clients(url, clients, per_client, words, out))
    except Exception as exc:  # tell the parent at once instead of letting it wait for a report
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def gpt2_scorer(layers: int, width: int, max_length: int) -> Callable[[list[str]], Sequence[float]]:
    from nemotron.models.tiny import tiny_model
    from nemotron.models.tokenizer import word_tokenizer
    from nemotron.reward.scorer import scorer_from_reward_model

    tokenizer = word_tokenizer(WORDS)
    model = tiny_model(
        len(tokenizer),
        "reward_model",
        n_positions=max_length,
        n_embd=width,
        n_layer=layers,
        n_head=4,
        eos_token_id=2,
    )
    return scorer_from_reward_model(model, tokenizer, max_length).score_sentences


def fixed_cost_scorer(call_ms: float) -> Callable[[list[str]], Sequence[float]]:
    def score(texts: list[str]) -> list[float]:
        time.sleep(call_ms / 1000)  # like waiting on an accelerator: the GIL is free meanwhile
        return [float(len(t)) for t in texts]

    return score


def run_mode(
    name: str, mode: str, scorer: Callable[[list[str]], Sequence[float]], args: argparse.Namespace
) -> Result:
    from nemotron.reward.batcher import BatchingConfig
    from nemotron.reward.client import RewardClient
    from nemotron.reward.metrics import parse_samples
    from nemotron.reward.server import serve

    max_batch = 1 if mode == "batch size 1" else args.max_batch_size
    batching = BatchingConfig(
        max_batch_size=max_batch,
        preferred_batch_size=max(1, max_batch // 2),
        max_queue_delay_ms=0.0 if max_batch == 1 else args.max_queue_delay_ms,
    )
    handle = serve(scorer, batching=batching)
    try:
        RewardClient(handle.url).score(sentences(8, args.words, seed=-1))  # warm up
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(
            target=client_worker, args=(handle.url, args.clients, args.requests_per_client, args.words, queue)
        )
        child.start()
        started = queue.get(timeout=120)
        # While the clients run, this process's only busy threads are the server's (this one waits here).
        cpu = time.process_time()
        report = queue.get(timeout=600) if started == "start" else started
        server_cpu = time.process_time() - cpu
        child.join()
        if "error" in report:
            raise RuntimeError(f"the clients failed: {report['error']}")
        with urlopen(handle.url + "/metrics") as response:
            samples = parse_samples(response.read().decode())
    finally:
        handle.stop()
    latencies = sorted(report["latencies"])
    count = len(latencies)
    batches = samples["nemotron_reward_batch_size_count"]
    return Result(
        scorer=name,
        mode=mode,
        max_batch_size=max_batch,
        requests=count,
        seconds=report["seconds"],
        throughput_rps=count / report["seconds"],
        p50_ms=1000 * statistics.median(latencies),
        p99_ms=1000 * latencies[min(count - 1, int(0.99 * count))],
        mean_batch_size=samples["nemotron_reward_batch_size_sum"] / batches if batches else 0.0,
        server_cpu_ms=1000 * server_cpu / count,
        client_cpu_ms=1000 * report["client_cpu_s"] / count,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="CI size: fewer requests per client")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=None, help="default 40, or 8 with --small")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-queue-delay-ms", type=float, default=5.0)
    parser.add_argument(
        "--scorers", default="gpt2-cpu,fixed-cost", help="comma-separated: gpt2-cpu, fixed-cost"
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--words", type=int, default=12, help="longest sentence, in words")
    parser.add_argument("--call-ms", type=float, default=10.0, help="cost of one fixed-cost model call")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the inference worker")
    parser.add_argument("--min-speedup", type=float, default=0.0, help="exit 1 if fixed-cost gains less")
    parser.add_argument("--json", dest="json_path", help="also write the results here")
    args = parser.parse_args(argv)
    if args.requests_per_client is None:
        args.requests_per_client = 8 if args.small else 40
    logging.basicConfig(level=logging.WARNING)

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    builders = {
        "gpt2-cpu": lambda: gpt2_scorer(args.layers, args.width, max_length=64),
        "fixed-cost": lambda: fixed_cost_scorer(args.call_ms),
    }
    results: list[Result] = []
    speedups: dict[str, float] = {}
    for name in args.scorers.split(","):
        scorer = builders[name]()
        pair = [run_mode(name, mode, scorer, args) for mode in ("batch size 1", "dynamic batching")]
        speedups[name] = pair[1].throughput_rps / pair[0].throughput_rps
        results += pair

    print(
        f"{args.clients} clients x {args.requests_per_client} one-sentence requests (<= {args.words} words); "
        f"gpt2-cpu = GPT-2 {args.layers}x{args.width} on {args.threads} thread(s); "
        f"fixed-cost = {args.call_ms:g} ms per call"
    )
    print(
        f"{'scorer':<12}{'mode':<18}{'max batch':>10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'mean batch':>12}"
        f"{'server CPU ms/req':>19}{'client CPU ms/req':>19}"
    )
    for r in results:
        print(
            f"{r.scorer:<12}{r.mode:<18}{r.max_batch_size:>10}{r.throughput_rps:>9.0f}{r.p50_ms:>9.1f}"
            f"{r.p99_ms:>9.1f}{r.mean_batch_size:>12.1f}{r.server_cpu_ms:>19.3f}{r.client_cpu_ms:>19.3f}"
        )
    for name, speedup in speedups.items():
        print(f"{name}: dynamic batching gives {speedup:.1f}x the throughput of batch size 1")
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(
                {"results": [asdict(r) for r in results], "speedup": speedups, "args": vars(args)}, handle
            )
    return 0 if speedups.get("fixed-cost", float("inf")) >= args.min_speedup else 1


if __name__ == "__main__":
    sys.exit(main())
