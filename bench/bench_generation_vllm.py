"""Generation tokens per second: vLLM (in this process; its CPU build here) against nemotron's torch sampler, same
model, prompts, sampling settings and lengths, in one run.

Run (in vLLM's venv): .venv-vllm/bin/python bench/bench_generation_vllm.py --size small
                      .venv-vllm/bin/python bench/bench_generation_vllm.py --size large
A random Llama built from a config (head_dim >= 32: vLLM's CPU attention refuses 16), random prompts, temperature 1,
and every response runs to `new_tokens` (EOS ignored on both sides), so both generate exactly batch x new_tokens
tokens. The two alternate, repeat by repeat, so other load on the machine skews both alike; vLLM's start-up is
reported apart. Reports the median tokens/s of each and the ratio vLLM/torch.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

from nemotron.config.stepconfig import Generation
from nemotron.core.paths import shipped_root
from nemotron.models.checkpoint import load_policy, load_tokenizer, save_checkpoint
from nemotron.models.tiny import build_policy
from nemotron.rl.generation_backends import get_backend
from nemotron.rl.rollout import SamplingParams, generate


@dataclass(frozen=True)
class Size:
    layers: int
    width: int
    heads: int
    batch: int
    prompt_tokens: int
    new_tokens: int
    repeats: int


SIZES = {
    "small": Size(layers=2, width=64, heads=2, batch=64, prompt_tokens=8, new_tokens=32, repeats=5),
    "large": Size(layers=4, width=256, heads=4, batch=64, prompt_tokens=32, new_tokens=64, repeats=3),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    size = SIZES[args.size]
    torch.set_num_threads(args.threads)
    positions = size.prompt_tokens + size.new_tokens
    tokenizer = load_tokenizer(shipped_root() / "tiny" / "sft_policy")  # vLLM detokenizes with it
    vocab = len(tokenizer)
    model = build_policy(vocab, size.layers, size.width, size.heads, positions, seed=0, family="llama")
    tmp = tempfile.TemporaryDirectory(prefix="bench-vllm-")
    path = save_checkpoint(model, f"{tmp.name}/llama", tokenizer)
    policy = load_policy(path)
    prompts = torch.randint(
        3, vocab, (size.batch, size.prompt_tokens), generator=torch.Generator().manual_seed(0)
    )
    rows = [list(map(int, r)) for r in prompts]
    params = SamplingParams(
        max_new_tokens=size.new_tokens, temperature=1.0, eos_token_id=None, pad_token_id=0
    )
    backend = get_backend(Generation(backend="vllm", vllm_gpu_memory_utilization=0.15))
    t0 = time.perf_counter()
    backend.generate(policy, rows[:1], params, torch.Generator().manual_seed(0))  # engine start + warm-up
    start = time.perf_counter() - t0
    generate(policy, rows[:1], params, torch.Generator().manual_seed(0))  # warm-up
    ours, theirs = [], []
    tokens = size.batch * size.new_tokens
    for seed in range(size.repeats):
        t = time.perf_counter()
        a = generate(policy, rows, params, torch.Generator().manual_seed(seed))
        ours.append(tokens / (time.perf_counter() - t))
        t = time.perf_counter()
        b = backend.generate(policy, rows, params, torch.Generator().manual_seed(seed))
        theirs.append(tokens / (time.perf_counter() - t))
        assert int(a.response_mask.sum()) == int(b.response_mask.sum()) == tokens
    print(
        f"machine: {platform.processor() or platform.machine()}, {args.threads} thread(s), torch {torch.__version__}, "
        f"vllm {backend.vllm.__version__}"
    )  # type: ignore[attr-defined]
    print(
        f"size {args.size}: {size.layers} layers x {size.width} wide, {size.heads} heads, vocab {vocab}, "
        f"batch {size.batch}, prompt {size.prompt_tokens}, new tokens {size.new_tokens}, {size.repeats} repeats"
    )
    print(f"vLLM engine start + first request: {start:.1f} s")
    print(f"{'sampler':<12} {'tokens/s (median)':>18}")
    print(f"{'torch':<12} {statistics.median(ours):>18.0f}")
    print(f"{'vllm':<12} {statistics.median(theirs):>18.0f}")
    print(f"{'vllm/torch':<12} {statistics.median(theirs) / statistics.median(ours):>17.2f}x")


if __name__ == "__main__":
    main()
