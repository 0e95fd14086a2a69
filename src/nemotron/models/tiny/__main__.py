"""`python -m nemotron.models.tiny --family llama OUT`: a random tiny model in Hugging Face layout with the shipped
tokenizer. Here, not in the builder (`nemotron.models.tiny`), because it saves a checkpoint: the checkpoint module
loads critics from `models.reward`, which builds on the builder."""

from __future__ import annotations

import argparse

from nemotron.core.paths import shipped_root
from nemotron.models.checkpoint import load_tokenizer, save_checkpoint
from nemotron.models.reward import build_reward_model
from nemotron.models.tiny import FAMILIES, build_policy, count_parameters


def main(argv: list[str] | None = None) -> int:
    """`python -m nemotron.models.tiny --family llama OUT`: a random tiny model in HF layout with the shipped
    tokenizer, e.g. to try a step on another family (`inputs.policy=OUT`)."""
    parser = argparse.ArgumentParser(prog="python -m nemotron.models.tiny", description=main.__doc__)
    parser.add_argument("out", help="directory to write (replaced if it exists)")
    parser.add_argument("--family", choices=FAMILIES, default="llama")
    parser.add_argument("--kind", choices=("policy", "reward_model"), default="policy")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2, help="attention heads (head_dim = hidden / heads)")
    parser.add_argument("--positions", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-shard-size", default="5GB", help='e.g. "100KB" to write shards with an index')
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(shipped_root() / "tiny" / "sft_policy")
    build = build_reward_model if args.kind == "reward_model" else build_policy
    model = build(
        len(tokenizer), args.layers, args.hidden, args.heads, args.positions, args.seed,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, family=args.family,
    )  # fmt: skip
    path = save_checkpoint(model, args.out, tokenizer, max_shard_size=args.max_shard_size)
    print(f"{path}: {args.family} {type(model).__name__}, {count_parameters(model)} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
