"""The one prompt format every step uses (`format_prompt`, here without transformers so that the resource plan can
count a prompt's tokens in a dry run), and prompts that fit the model: a prompt plus `max_new_tokens` must fit the
model's positions. Longer prompts keep their last tokens (the side a continuation depends on, as TRL truncates RL
prompts), with a counted warning at start-up, instead of a ValueError in the middle of a rollout."""

from __future__ import annotations

from typing import Any

from nemotron.errors import UserError

PROMPT_TEMPLATE = "{prompt} =>"


def format_prompt(text: str) -> str:
    """The prompt as the model sees it: `format_prompt("the movie was") == "the movie was =>"`."""
    return PROMPT_TEMPLATE.format(prompt=text.strip())


def model_positions(config: Any) -> int | None:
    """The model's context length (`max_position_embeddings`, GPT-2's `n_positions`), if it states one."""
    value = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return int(value) if value else None


def left_truncate(prompt_ids: list[list[int]], room: int) -> tuple[list[list[int]], int]:
    """Each prompt's last `room` token ids; returns (prompts, how many were cut). Prompts that fit are the same
    list objects."""
    out = [ids[-room:] if len(ids) > room else ids for ids in prompt_ids]
    return out, sum(len(ids) > room for ids in prompt_ids)


def fit_prompts(prompt_ids: list[list[int]], positions: int | None, max_new_tokens: int) -> list[list[int]]:
    """`prompt_ids` cut to fit `positions - max_new_tokens` (a warning says how many were cut); exit 2 when no
    prompt token fits at all."""
    if positions is None:
        return prompt_ids
    room = positions - max_new_tokens
    if room < 1:
        raise UserError(
            f"max_new_tokens={max_new_tokens} (the generation settings) leaves no room for a prompt in the "
            f"model's {positions} positions: lower it below {positions}"
        )
    fitted, cut = left_truncate(prompt_ids, room)
    if cut:
        import logging  # here, not at import: a dry run counts prompts through this module and logs nothing

        logging.getLogger("nemotron").warning(
            "%d of %d prompts are longer than %d tokens (the model's %d positions minus max_new_tokens %d): "
            "each keeps its last %d tokens",
            cut,
            len(prompt_ids),
            room,
            positions,
            max_new_tokens,
            room,
        )
    return fitted
