"""The rollout phase: n responses per prompt, grouped by the prompt's index in the run's prompt set, scored on
the tokens and texts the reward source reads, with the reference's logprobs beside the sampler's."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nemotron.core.paths import shipped_root
from nemotron.models.checkpoint import load_policy, load_tokenizer
from nemotron.models.tokenizer import encode_prompt
from nemotron.rl.experience import PromptBatch, RolloutSetup, collect
from nemotron.rl.generation_backends import TorchBackend
from nemotron.rl.rollout import SamplingParams, generate


def test_collect_answers_each_prompt_n_times_in_its_group() -> None:
    path = shipped_root() / "tiny" / "sft_policy"
    tokenizer = load_tokenizer(path)
    policy, reference = load_policy(path), load_policy(path)
    texts = ["the movie was", "i watched it and"]
    ids = [encode_prompt(tokenizer, t) for t in texts]
    seen: list[tuple[list[list[int]], list[str], list[str]]] = []

    def score(rows: list[list[int]], prompts: list[str], responses: list[str]) -> Sequence[float]:
        seen.append((rows, prompts, responses))
        return [float(len(r)) for r in responses]

    params = SamplingParams(
        max_new_tokens=8, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    setup = RolloutSetup(
        backend=TorchBackend(),
        policy=policy,
        reference=reference,
        tokenizer=tokenizer,
        params=params,
        generator=torch.Generator().manual_seed(3),
        n=3,
        score=score,
    )
    # Prompts 7 and 2 of the prompt set: their responses' groups are those indices, not positions in the batch.
    exp = collect(setup, PromptBatch(texts, ids, [7, 2]))

    assert exp.group.tolist() == [7, 7, 7, 2, 2, 2]
    assert exp.prompts == [texts[0]] * 3 + [texts[1]] * 3
    # The same rollout as sampling the repeated prompts directly with the same stream.
    expected = generate(policy, [ids[0]] * 3 + [ids[1]] * 3, params, torch.Generator().manual_seed(3))
    assert exp.sequences.equal(expected.sequences) and exp.mask.equal(expected.response_mask)
    ((rows, prompts, responses),) = seen
    assert prompts == exp.prompts and responses == exp.responses
    # The reward source reads each row's prompt tokens and its response tokens up to EOS, no padding.
    for i, row in enumerate(rows):
        response = expected.responses[i][expected.response_mask[i]].tolist()
        assert row == ids[i // 3] + response and len(response) >= 1
    assert exp.scores.tolist() == [float(len(r)) for r in responses]
    # Before any update the reference is the policy: both sides of the KL agree.
    torch.testing.assert_close(exp.ref_logprobs, exp.logprobs, atol=1e-5, rtol=0)
