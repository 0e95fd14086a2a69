"""The built-in RL plan reads its prompts (issue 43): the longest prompt of the step's prompt inputs, counted as the
step encodes it with the policy's tokenizer (or bounded by its bytes where that tokenizer is not here), sizes the
rollouts' sequences, cut to the model's positions as the step cuts them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from nemotron.core.paths import shipped_root
from nemotron.models.prompt_lengths import longest_prompt

TINY_POLICY = shipped_root() / "tiny" / "sft_policy"
PROMPTS = [
    "the movie was",
    "  overall the tour was  ",  # format_prompt strips it
    "Ünïcödé and CAPITALS, digits 12345 and punctuation !?; the food was",  # characters outside the tiny vocabulary
    "the food was " * 8,  # more characters than the one above, fewer tokens
]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _write(path: Path, prompts: list[Any]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts) + "\n")  # a blank line too
    return path


def test_text_prompts_are_counted_as_the_step_encodes_them(tmp_path: Path) -> None:
    from nemotron.models.checkpoint import load_tokenizer
    from nemotron.models.tokenizer import encode_prompt

    tokenizer = load_tokenizer(TINY_POLICY)  # what the step loads, through transformers
    counts = [len(encode_prompt(tokenizer, p)) for p in PROMPTS]
    found = longest_prompt([_write(tmp_path / "a.jsonl", PROMPTS[:2]), _write(tmp_path / "b.jsonl", PROMPTS[2:])],
                           TINY_POLICY)  # fmt: skip
    # the longest in tokens, not in characters: a prompt of characters outside the vocabulary takes more
    assert len(PROMPTS[3]) > len(PROMPTS[2]) and counts[3] < counts[2], counts
    assert found.tokens == max(counts) == counts[2], counts
    assert "the longest of 4 prompts in a.jsonl, b.jsonl, counted with the policy's tokenizer" == found.how


def test_conversations_are_counted_through_the_chat_template(tmp_path: Path) -> None:
    from nemotron.data.records import Message
    from nemotron.models.checkpoint import load_tokenizer
    from nemotron.models.tokenizer import encode_prompt

    policy = tmp_path / "policy"
    shutil.copytree(TINY_POLICY, policy)
    config = json.loads((policy / "tokenizer_config.json").read_text())
    (policy / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "the food was " * 30},
    ]
    tokenizer = load_tokenizer(policy)
    expected = len(encode_prompt(tokenizer, [Message.model_validate(m) for m in conversation]))
    found = longest_prompt([_write(tmp_path / "p.jsonl", ["the movie was", conversation])], policy)
    assert (
        found.tokens == expected > len(encode_prompt(tokenizer, "the food was " * 30))
    )  # the template's own


def test_without_the_tokenizer_the_bound_is_never_below_the_count(tmp_path: Path) -> None:
    from nemotron.models.checkpoint import load_tokenizer
    from nemotron.models.tokenizer import encode_prompt

    tokenizer = load_tokenizer(TINY_POLICY)
    for prompt in PROMPTS:
        bound = longest_prompt([_write(tmp_path / "p.jsonl", [prompt])], None)
        assert bound.tokens is not None and bound.tokens >= len(encode_prompt(tokenizer, prompt)), prompt
        assert "its UTF-8 bytes (the policy's tokenizer is not readable here)" in bound.how
    assert longest_prompt([_write(tmp_path / "e.jsonl", [])], TINY_POLICY).tokens is None


def _llama(tmp_path: Path, positions: int) -> Path:
    from nemotron.models.checkpoint import load_tokenizer, save_checkpoint
    from nemotron.models.tiny import build_policy

    tokenizer = load_tokenizer(TINY_POLICY)
    model = build_policy(
        len(tokenizer), 2, 64, 4, positions, 0, family="llama", pad_token_id=0, eos_token_id=1
    )
    return save_checkpoint(model, tmp_path / f"llama{positions}", tokenizer)


def test_the_plan_sizes_the_rollouts_by_the_longest_prompt(
    home: Path, tmp_path: Path, run_cli: Any, run_cli_imports: Any
) -> None:
    """rl/reinforce planned on this machine from a dry run: its sequences are the longest prompt (counted here as
    the step counts it) + max_new_tokens, cut to the model's positions; the activations follow them. Counting text
    prompts keeps the dry run off torch and transformers."""
    from nemotron.models.checkpoint import load_tokenizer
    from nemotron.models.tokenizer import encode_prompt
    from nemotron.plan.shapes import shape_from_checkpoint
    from nemotron.plan.terms import activations_mb

    policy = _llama(tmp_path, 512)
    tokenizer = load_tokenizer(policy)
    short, long = "the food was " * 20, "the food was " * 300
    plans = {}
    for name, prompt in (("short", short), ("long", long)):
        prompts = _write(tmp_path / f"{name}.jsonl", ["the movie was", prompt])
        args = ("steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={policy}", f"inputs.prompts={prompts}",
                "generation.max_new_tokens=16", "trainer.micro_batch_size=2", "--dry-run", "--json")  # fmt: skip
        r = run_cli(*args)
        assert r.code == 0, r.err
        (group,) = [g for g in json.loads(r.out)["resource_plan"]["groups"] if g["name"] == "policy training"]
        plans[name] = group
    _, imported = run_cli_imports(*args)
    assert "nemotron.models.prompt_lengths" in imported and not {"torch", "transformers"} & imported
    shape = shape_from_checkpoint(policy)
    assert shape is not None
    tokens = len(encode_prompt(tokenizer, short))
    assert 16 < tokens + 16 < 512
    assert (
        f"prompts: {tokens:,} tokens (the longest of 2 prompts in short.jsonl" in plans["short"]["notes"][0]
    )
    assert f"{tokens + 16}-token sequences" in plans["short"]["notes"][0]
    assert (
        plans["short"]["terms_mb"]["activations"]
        == activations_mb(shape, 2, tokens + 16, "fp32", False)["activations"]
    )
    assert "cut to the model's 512 positions: 512-token sequences" in plans["long"]["notes"][0]
    assert (
        plans["long"]["terms_mb"]["activations"]
        == activations_mb(shape, 2, 512, "fp32", False)["activations"]
    )


def test_prompts_not_readable_here_are_assumed_and_said_so(home: Path, run_cli: Any) -> None:
    r = run_cli("steps", "run", "rl/reinforce", "-c", "default", "-b", "slurm_rlhf", "--dry-run")
    assert r.code == 0, r.err
    assert (
        "prompts: 512 tokens (assumed: no prompt file readable here; the step cuts a longer prompt" in r.out
    )


def test_a_count_is_kept_until_its_files_change(tmp_path: Path, monkeypatch: Any) -> None:
    """The cache dir keeps each count (a dry run stays as quick as the last): the same files give the same count
    from the cache, a changed file is counted afresh."""
    monkeypatch.setenv("NEMOTRON_CACHE_DIR", str(tmp_path / "cache"))
    prompts = _write(tmp_path / "p.jsonl", PROMPTS[:2])
    first = longest_prompt([prompts], TINY_POLICY)
    cached = json.loads((tmp_path / "cache" / "prompt_lengths.json").read_text())
    assert [v["tokens"] for v in cached.values()] == [first.tokens]
    (entry,) = cached
    cached[entry]["tokens"] = 12345  # what the cache says is what a dry run of the same files reads
    (tmp_path / "cache" / "prompt_lengths.json").write_text(json.dumps(cached))
    assert longest_prompt([prompts], TINY_POLICY).tokens == 12345
    _write(prompts, PROMPTS)  # a changed file: counted again
    assert longest_prompt([prompts], TINY_POLICY).tokens not in (None, 12345, first.tokens)
