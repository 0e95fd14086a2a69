"""Tokens per second of nemotron's rollout sampler against transformers' `model.generate`, same model and settings.

Run: python bench/bench_generation.py --size small    (CI runs this; well under 30 s)
     python bench/bench_generation.py --size large --top-k 50 --top-p 0.95
     python bench/bench_generation.py --size large --samples-per-prompt 4
     python bench/bench_generation.py --size large --mode greedy    (also checks both give the same tokens)
Two workloads from the same left-padded random prompts: every row generates the full `new_tokens` (no EOS), and
rows end at random lengths (a set of EOS ids, about 1 in 16 tokens), as RL responses do.
The two samplers run alternately, seed by seed, so that other load on the machine skews both alike.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

from nemotron.rl.rollout import SamplingParams, generate, left_pad, sequence_logprobs

PAD = 0


@dataclass(frozen=True)
class BenchSize:
    layers: int
    width: int
    heads: int
    vocab: int
    batch: int
    prompt_tokens: int
    new_tokens: int
    repeats: int


SIZES = {
    "small": BenchSize(
        layers=2, width=64, heads=4, vocab=256, batch=16, prompt_tokens=16, new_tokens=32, repeats=10
    ),
    "large": BenchSize(
        layers=4, width=256, heads=4, vocab=512, batch=32, prompt_tokens=32, new_tokens=64, repeats=5
    ),
}


def generated_tokens(responses: torch.Tensor, eos_ids: tuple[int, ...]) -> int:
    """Tokens up to and including each row's first EOS (all of them when it has none); responses ``(B, N)``."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, dtype=torch.long))
    ended = is_eos.any(dim=1)
    lengths = torch.where(ended, is_eos.int().argmax(dim=1) + 1, responses.shape[1])
    return int(lengths.sum())


def hf_generate(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig
) -> torch.Tensor:
    """transformers' own sampler; ``(B, P + N)``."""
    with torch.inference_mode():
        out: torch.Tensor = model.generate(input_ids, attention_mask=attention_mask, generation_config=config)
    return out


def tokens_per_second(runs: dict[str, Callable[[int], int]], repeats: int) -> dict[str, float]:
    """Generated tokens / seconds of each run over ``repeats`` seeds; the runs alternate, seed by seed.

    A run takes a seed and returns how many tokens it generated. With EOS, lengths depend on the draws, so
    every run sees the same seeds and the totals are compared, not single runs.
    """
    for run in runs.values():
        run(0)  # warm-up: allocator, kernels, lazy imports
    tokens = dict.fromkeys(runs, 0)
    seconds = dict.fromkeys(runs, 0.0)
    for seed in range(1, repeats + 1):
        for name, run in runs.items():
            start = time.perf_counter()
            tokens[name] += run(seed)
            seconds[name] += time.perf_counter() - start
    return {name: tokens[name] / seconds[name] for name in runs}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--mode", choices=["sample", "greedy"], default="sample")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (tiny models gain nothing from more)"
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off (the on-policy RL default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    parser.add_argument(
        "--samples-per-prompt",
        type=int,
        default=1,
        help="responses per prompt, as RLOO/GRPO sample (divides batch)",
    )
    args = parser.parse_args()
    size = SIZES[args.size]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    config = GPT2Config(
        n_layer=size.layers,
        n_embd=size.width,
        n_head=size.heads,
        vocab_size=size.vocab,
        n_positions=size.prompt_tokens + size.new_tokens,
        # No EOS in the model config, or transformers would stop on it while nemotron, told no EOS, would not.
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=PAD,
    )
    model = GPT2LMHeadModel(config)
    model.train(False)
    # Prompt lengths from half to full width, so most rows are left-padded.
    distinct = size.batch // args.samples_per_prompt
    lengths = torch.randint(size.prompt_tokens // 2, size.prompt_tokens + 1, (distinct,)).tolist()
    prompts = [
        torch.randint(3, size.vocab, (n,)).tolist() for n in lengths for _ in range(args.samples_per_prompt)
    ]
    input_ids, attention_mask = left_pad(prompts, PAD)

    greedy = args.mode == "greedy"
    # Greedy keeps SamplingParams' neutral temperature, top_k and top_p (1.0, 0, 1.0).
    sampling = {} if greedy else {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    fixed = SamplingParams(max_new_tokens=size.new_tokens, greedy=greedy, pad_token_id=PAD, **sampling)
    temperature, top_k, top_p = fixed.temperature, fixed.top_k, fixed.top_p
    # A random-init model spreads its probability thinly, so 1/16 of the vocabulary as EOS ends ~1/16 of steps.
    varied = replace(fixed, eos_token_id=tuple(range(3, 3 + size.vocab // 16)))
    print(
        f"size={args.size} mode={args.mode} layers={size.layers} width={size.width} vocab={size.vocab} "
        f"batch={size.batch} prompt<={size.prompt_tokens} new_tokens={size.new_tokens} threads={args.threads} "
        f"temperature={temperature} top_k={top_k} top_p={top_p} samples_per_prompt={args.samples_per_prompt}"
    )
    for workload, params in (("fixed length", fixed), ("varied lengths", varied)):
        hf_config = GenerationConfig.from_dict(
            {
                "do_sample": not greedy,
                "max_new_tokens": size.new_tokens,
                "temperature": temperature,
                "top_k": top_k,
                "top_p": top_p,
                "pad_token_id": PAD,
                "eos_token_id": list(params.eos_token_ids) or None,
            }
        )

        def ours(seed: int, params: SamplingParams = params) -> int:
            return int(
                generate(model, prompts, params, torch.Generator().manual_seed(seed)).response_lengths.sum()
            )

        def theirs(
            seed: int, hf_config: GenerationConfig = hf_config, params: SamplingParams = params
        ) -> int:
            torch.manual_seed(seed)
            out = hf_generate(model, input_ids, attention_mask, hf_config)
            return generated_tokens(out[:, input_ids.shape[1] :], params.eos_token_ids)

        speeds = tokens_per_second({"transformers": theirs, "nemotron": ours}, size.repeats)
        print(f"[{workload}]")
        print(f"  transformers generate : {speeds['transformers']:9.0f} tokens/s")
        print(f"  nemotron generate     : {speeds['nemotron']:9.0f} tokens/s")
        print(f"  speed-up              : {speeds['nemotron'] / speeds['transformers']:9.2f}x")

    if greedy:
        ours_greedy = generate(model, prompts, fixed, None).sequences
        hf_config = GenerationConfig.from_dict(
            {"do_sample": False, "max_new_tokens": size.new_tokens, "pad_token_id": PAD, "eos_token_id": None}
        )
        if not ours_greedy.equal(hf_generate(model, input_ids, attention_mask, hf_config)):
            raise SystemExit("greedy outputs differ between nemotron and transformers")

    rollout = generate(model, prompts, fixed, torch.Generator().manual_seed(1))

    def logprob_pass(seed: int) -> int:
        with torch.no_grad():
            sequence_logprobs(
                model, rollout.sequences, rollout.attention_mask, temperature, rollout.prompt_width
            )
        return size.batch * size.new_tokens

    print(
        f"sequence_logprobs (one forward, no grad): {tokens_per_second({'pass': logprob_pass}, size.repeats)['pass']:.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
