"""The longest prompt an RL step rolls out on, for the resource plan: its prompt files read here, each prompt counted
in tokens as the step feeds it to the policy (`format_prompt` text, or a conversation through the chat template),
without torch. Where the policy's tokenizer is not readable here, a bound on the count instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from nemotron.catalog.manifest_cache import cache_dir
from nemotron.core.atomic import write_atomic
from nemotron.models.prompts import format_prompt

CACHE_FILE = "prompt_lengths.json"
CACHE_ENTRIES = 64  # the newest counts kept

# A chat template's markers around one message (role header, end of turn): Llama 3's take 5 tokens, Qwen2's 5;
# the bound for a conversation counted without its tokenizer adds this many per message and the generation prompt.
TEMPLATE_TOKENS_PER_MESSAGE = 16


class PromptLength(NamedTuple):
    """The longest prompt of a step's prompt files, in tokens (None: none readable here), and how it was found."""

    tokens: int | None
    how: str  # for the plan's notes: which files, counted how


def longest_prompt(files: Sequence[Path], tokenizer_dir: Path | None) -> PromptLength:
    """The longest prompt over `files` (prompt JSON Lines), counted with the tokenizer in `tokenizer_dir` when it
    holds a tokenizer.json, else bounded by its UTF-8 bytes (a byte-level or byte-fallback tokenizer makes at most
    one token of each byte). Lines that are not prompt records are left to the record validation that reports them.
    Read once for the same files and tokenizer as they are: per process (a refusal re-plans the job once per
    remedy), and across dry runs in the cache dir (prompt_lengths.json: a dry run stays as quick as the last)."""
    stamps = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    tokenizer = tokenizer_dir / "tokenizer.json" if tokenizer_dir else None
    key = json.dumps([stamps, _stamp(tokenizer)])
    cache = cache_dir() / CACHE_FILE
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), dict):
        return PromptLength(known[key].get("tokens"), str(known[key].get("how", "")))
    found = _longest(stamps, tokenizer_dir)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        kept = dict(list(known.items())[-(CACHE_ENTRIES - 1) :]) if isinstance(known, dict) else {}
        write_atomic(cache, json.dumps({**kept, key: {"tokens": found.tokens, "how": found.how}}))
    except OSError:
        pass  # a read-only cache dir: the next dry run counts again
    return found


def _stamp(path: Path | None) -> list[Any] | None:
    if path is None or not path.is_file():
        return None
    st = path.stat()
    return [str(path), st.st_mtime_ns, st.st_size]


@lru_cache(maxsize=16)
def _longest(stamps: tuple[tuple[str, int, int], ...], tokenizer_dir: Path | None) -> PromptLength:
    files = [Path(s[0]) for s in stamps]
    prompts: list[str | list[dict[str, Any]]] = []
    for path in files:
        prompts.extend(_prompts(path))
    names = ", ".join(p.name for p in files)
    if not prompts:
        return PromptLength(None, f"no prompt in {names}")
    tokenizer = tokenizer_dir / "tokenizer.json" if tokenizer_dir else None
    if tokenizer is not None and tokenizer.is_file():
        counted = _counted(prompts, tokenizer)
        return PromptLength(max(counted), f"the longest of {len(prompts):,} prompts in {names}, counted with "
                                          f"the policy's tokenizer")  # fmt: skip
    return PromptLength(max(_byte_bound(p) for p in prompts),
                        f"a bound on the longest of {len(prompts):,} prompts in {names}: its UTF-8 bytes (the "
                        "policy's tokenizer is not readable here)")  # fmt: skip


def _prompts(path: Path) -> list[str | list[dict[str, Any]]]:
    return [prompt for _, prompt in _numbered_prompts(path)]


def _numbered_prompts(path: Path) -> list[tuple[int, str | list[dict[str, Any]]]]:
    """(line number, prompt) of every record of a JSONL file with a text or conversation prompt."""
    found: list[tuple[int, str | list[dict[str, Any]]]] = []
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    prompt = json.loads(line).get("prompt")
                except (ValueError, AttributeError):
                    continue
                if isinstance(prompt, str) or (
                    isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)
                ):
                    found.append((number, prompt))
    except OSError:
        return []
    return found


def first_prompt_at_least(path: Path, tokenizer_dir: Path, limit: int) -> tuple[int, int] | None:
    """(line number, tokens) of the first prompt of a JSONL file that takes at least `limit` tokens as the step
    encodes it, counted with `tokenizer_dir`'s tokenizer.json; None when every prompt is shorter, or the tokenizer
    is not readable here."""
    tokenizer = tokenizer_dir / "tokenizer.json"
    numbered = _numbered_prompts(path)
    if not numbered or not tokenizer.is_file():
        return None
    counts = _counted([prompt for _, prompt in numbered], tokenizer)
    return next(((line, n) for (line, _), n in zip(numbered, counts, strict=True) if n >= limit), None)


def _counted(prompts: list[str | list[dict[str, Any]]], tokenizer_json: Path) -> list[int]:
    """Each prompt's token count, in order, as the step encodes it (nemotron.models.tokenizer.encode_prompt):
    text through the tokenizer alone (the `tokenizers` library, fast and light); conversations through the chat
    template, which only transformers renders (loaded only then)."""
    from tokenizers import Tokenizer

    texts = [format_prompt(p) for p in prompts if isinstance(p, str)]
    encoded = Tokenizer.from_file(str(tokenizer_json)).encode_batch(texts, add_special_tokens=False)
    text_counts = iter([len(e.ids) for e in encoded])
    conversations = [p for p in prompts if not isinstance(p, str)]
    conversation_counts = iter(_conversation_counts(conversations, tokenizer_json))
    # in the prompts' order: a caller names the line of a count
    return [next(text_counts) if isinstance(p, str) else next(conversation_counts) for p in prompts]


def _conversation_counts(conversations: list[list[dict[str, Any]]], tokenizer_json: Path) -> list[int]:
    counts: list[int] = []
    if conversations:
        from transformers import PreTrainedTokenizerFast

        from nemotron.data.records import Message
        from nemotron.errors import UserError
        from nemotron.models.tokenizer import encode_prompt

        tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_json.parent), local_files_only=True)
        try:
            counts += [len(encode_prompt(tok, [Message.model_validate(m) for m in c])) for c in conversations]
        except (UserError, ValueError):  # no chat template, or a malformed message: the run says which
            counts += [_byte_bound(c) for c in conversations]
    return counts


def _byte_bound(prompt: str | list[dict[str, Any]]) -> int:
    if isinstance(prompt, str):
        return len(format_prompt(prompt).encode("utf-8"))
    text = sum(len(str(m.get("role", ""))) + len(str(m.get("content", "")).encode("utf-8")) for m in prompt)
    return text + TEMPLATE_TOKENS_PER_MESSAGE * (len(prompt) + 1)
