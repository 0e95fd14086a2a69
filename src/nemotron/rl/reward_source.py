"""Where the RL steps' rewards come from: the reward server over HTTP (a sibling process locally, the other
hetjob group on Slurm, or any URL), or a reward model loaded in-process."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from nemotron.rl.experience import ScoreFn


@contextmanager
def reward_source(
    source: Literal["server", "in_process"],
    model_path: str | None,
    url: str | None,
    token: str | None,
    timeout_s: float,
    retries: int,
    threads: int = 1,
    log_path: Path | None = None,
    device: str = "cpu",
) -> Iterator[tuple[ScoreFn, str]]:
    """Yield (score function, description). The score function sends token ids, as NeMo-Aligner's
    RemoteGPTRMClient does, so the reward model scores exactly the tokens the policy generated.

    `device` is the trainer's ("cpu" or "cuda:N"): an in-process reward model and a sibling server run there too.
    """
    if source == "in_process":
        if not model_path:
            raise ValueError("reward.source=in_process needs a reward model input")
        from nemotron.models.checkpoint import load_reward_model, load_tokenizer
        from nemotron.models.prompts import model_positions
        from nemotron.reward.scorer import scorer_from_reward_model

        model = load_reward_model(model_path, device=device)
        max_length = model_positions(model.config) or 4096
        scorer = scorer_from_reward_model(model, load_tokenizer(model_path), max_length=max_length)
        assert scorer.score_tokens is not None
        score_tokens = scorer.score_tokens

        def score_in_process(
            rows: list[list[int]], prompts: list[str], responses: list[str]
        ) -> Sequence[float]:
            return score_tokens(rows)

        yield score_in_process, f"in-process reward model {model_path}"
        return

    from nemotron.reward.client import RewardClient

    with _server(url, model_path, threads, log_path, device) as (server_url, server_token):
        client = RewardClient(server_url, token or server_token, timeout=timeout_s, retries=retries)

        def score_remote(rows: list[list[int]], prompts: list[str], responses: list[str]) -> Sequence[float]:
            return client.score_tokens(rows)

        yield score_remote, f"reward server {server_url}"


@contextmanager
def _server(
    url: str | None, model_path: str | None, threads: int, log_path: Path | None, device: str
) -> Iterator[tuple[str, str | None]]:
    from nemotron.reward.server import TOKEN_ENV
    from nemotron.reward.sibling import external_url, sibling_server

    given = external_url(url)
    if given:  # a hetjob's server group shares its token through the environment
        yield given, os.environ.get(TOKEN_ENV)
        return
    if not model_path:
        raise ValueError("no reward server URL and no reward model to serve")
    # The sibling inherits LOCAL_RANK, so "cuda" puts it on the trainer's own GPU.
    server_device = "cuda" if device.startswith("cuda") else "cpu"
    with sibling_server(model_path, threads=threads, log_path=log_path, device=server_device) as (
        sibling_url,
        sibling_token,
    ):
        yield sibling_url, sibling_token
