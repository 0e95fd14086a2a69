"""generation.backend=vllm for real, on vLLM's CPU build: the rollout layout, logprobs that match the trainer's,
weights that change inside the engine after an optimizer step (synced in memory), and bad settings as exit 2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.vllm.runs_beside import Run, RunsBeside

from nemotron.config.stepconfig import Generation, Optim
from nemotron.core.paths import shipped_root
from nemotron.models.checkpoint import load_policy, load_tokenizer
from nemotron.rl.experience import token_mult_prob_error
from nemotron.rl.generation_backends import get_backend
from nemotron.rl.optim import build_optimizer
from nemotron.rl.rollout import SamplingParams, generate, sequence_logprobs

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
REFUSED = [
    ("generation.vllm_max_model_len=3", "needs"),  # prompt + max_new_tokens longer than the model length
    ("generation.vllm_max_model_len=20", "max_new_tokens needs"),  # vLLM would cut the responses silently
    ("generation.vllm_gpu_memory_utilization=1.0", "the vLLM engine could not start"),  # all of the memory
]
Refused = dict[str, Run]


@pytest.fixture(scope="module")
def llama_dir(tiny_llama: Callable[[str, int, int], Path]) -> Path:
    return tiny_llama("vllm", 64, 0)


@pytest.fixture(scope="module", autouse=True)
def refused_runs(llama_dir: Path, runs_beside: RunsBeside) -> Refused:
    """The step runs of test_settings_vllm_refuses_are_exit_2, started with the module, so they compute beside the
    in-process engine tests; each test then reads its run's result. One engine per process (a second one in the same
    process would count the first's memory as taken), hence processes."""
    chosen = {
        item.callspec.params["setting"]
        for item in runs_beside.selected("test_settings_vllm_refuses_are_exit_2")
    }
    args = ("steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={llama_dir}", "generation.backend=vllm",
            "trainer.max_steps=1", "eval.num_prompts=0", "reward.source=in_process")  # fmt: skip
    return {
        setting: runs_beside.start("refused", *args, setting, timeout=600)[1]
        for setting, _ in REFUSED
        if setting in chosen
    }


@pytest.fixture(scope="module")
def backend() -> object:
    return get_backend(Generation(backend="vllm", vllm_gpu_memory_utilization=0.15))


def _params(**kw: object) -> SamplingParams:
    tokenizer = load_tokenizer(shipped_root() / "tiny" / "sft_policy")
    base: dict[str, object] = {"max_new_tokens": 12, "eos_token_id": tokenizer.eos_token_id,
                               "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    return SamplingParams(**{**base, **kw})  # type: ignore[arg-type]


def test_rollout_layout_and_logprobs_match_the_trainer(llama_dir: Path, backend: object) -> None:
    policy = load_policy(llama_dir)
    rollout = backend.generate(policy, PROMPTS, _params(), torch.Generator().manual_seed(0))  # type: ignore[attr-defined]
    assert rollout.prompt_width == 4 and rollout.sequences.shape[0] == 3
    assert rollout.sequences[1, :2].tolist() == [0, 0] and rollout.sequences[1, 2:4].tolist() == [8, 9]
    mask = rollout.response_mask
    assert torch.equal(
        mask, torch.arange(mask.shape[1])[None] < rollout.response_lengths[:, None]
    )  # a prefix
    assert torch.equal(rollout.attention_mask[:, rollout.prompt_width :].bool(), mask)
    trainer = sequence_logprobs(policy, rollout.sequences, rollout.attention_mask, 1.0, rollout.prompt_width)
    assert token_mult_prob_error(rollout.logprobs, trainer, mask) < 1.0001
    # the same generator seed gives the same rollout; another seed another one
    again = backend.generate(policy, PROMPTS, _params(), torch.Generator().manual_seed(0))  # type: ignore[attr-defined]
    other = backend.generate(policy, PROMPTS, _params(), torch.Generator().manual_seed(1))  # type: ignore[attr-defined]
    assert torch.equal(again.sequences, rollout.sequences) and not torch.equal(
        other.sequences, rollout.sequences
    )


def test_greedy_matches_our_sampler_and_eos(llama_dir: Path, backend: object) -> None:
    policy = load_policy(llama_dir)
    ours = generate(policy, PROMPTS, _params(greedy=True), None)
    theirs = backend.generate(policy, PROMPTS, _params(greedy=True), None)  # type: ignore[attr-defined]
    assert torch.equal(theirs.sequences, ours.sequences) and torch.equal(theirs.is_end, ours.is_end)


def test_a_stop_string_ends_each_row_where_its_unstopped_run_first_contains_it(
    llama_dir: Path, backend: object
) -> None:
    policy = load_policy(llama_dir)
    tokenizer = load_tokenizer(llama_dir)
    decode = lambda ids: str(tokenizer.decode(ids))  # noqa: E731
    prompts = [*PROMPTS, [14], [20, 21, 22, 23], [30, 31]]
    width = 12
    free = backend.generate(policy, prompts, _params(temperature=1.0), torch.Generator().manual_seed(3))  # type: ignore[attr-defined]
    rows = [free.responses[r][free.response_mask[r]].tolist() for r in range(len(prompts))]
    stop = decode(rows[1][3:5])  # two tokens of row 1's text
    # Each row draws from its own seed, so a stopped row is its unstopped run up to the token completing the first
    # match (kept), or the whole run where the text never contains it (ending on EOS or at max_new_tokens).
    expected = [
        next((k for k in range(1, len(ids) + 1) if stop in decode(ids[:k])), len(ids)) for ids in rows
    ]
    matched = [stop in decode(ids) for ids in rows]
    assert any(matched) and not all(matched), "the seed should leave rows with and without a match"
    params = _params(temperature=1.0, stop_strings=(stop,), decode=decode)
    out = backend.generate(policy, prompts, params, torch.Generator().manual_seed(3))  # type: ignore[attr-defined]
    assert out.response_lengths.tolist() == expected, (stop, [decode(ids) for ids in rows])
    for row, ids in enumerate(rows):
        got = out.responses[row][out.response_mask[row]].tolist()
        assert got == ids[: expected[row]]
        # a stopped row ends on the stop string; any other ended as its unstopped run did (EOS or the length cap)
        assert bool(out.is_end[row]) == (matched[row] or bool(free.is_end[row]))
        if not matched[row]:
            assert stop not in decode(got) and expected[row] == len(ids) <= width


def test_weights_change_inside_the_engine_after_an_optimizer_step(llama_dir: Path, backend: object) -> None:
    policy = load_policy(llama_dir)
    greedy = _params(greedy=True, max_new_tokens=6)
    before = backend.generate(policy, PROMPTS[:1], greedy, None)  # type: ignore[attr-defined]
    optimizer = build_optimizer(policy.parameters(), Optim(lr=0.05))  # the steps' fused AdamW
    target = (int(before.responses[0, 0]) + 1) % policy.config.vocab_size
    for _ in range(5):  # make another first token the most likely
        logits = policy(torch.tensor([PROMPTS[0]])).logits[0, -1]
        loss = -torch.log_softmax(logits, -1)[target]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    after = backend.generate(policy, PROMPTS[:1], greedy, None)  # type: ignore[attr-defined]
    assert int(after.responses[0, 0]) == target != int(before.responses[0, 0])
    trainer = sequence_logprobs(policy, after.sequences, after.attention_mask, 1.0, after.prompt_width)
    assert (
        token_mult_prob_error(after.logprobs, trainer, after.response_mask) < 1.0001
    )  # the engine has them all


@pytest.mark.parametrize(("setting", "message"), REFUSED)
def test_settings_vllm_refuses_are_exit_2(setting: str, message: str, refused_runs: Refused) -> None:
    """Each run (started with the module, `refused_runs`) stops with exit 2 and the message, no traceback."""
    r = refused_runs[setting].result()
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr and "Traceback" not in r.stderr
