"""A policy whose tokenizer is not the reward model's (or judge's) is refused before anything is written, as a user
meets it: the CLI in a subprocess, a fresh $NEMOTRON_HOME. A tokenizer with the same vocabulary still runs, and a
reward server that is given ids outside its vocabulary is bad input (exit 2 with its reason), not "unreachable"."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.assertions import refused

from nemotron.core.paths import shipped_root

TINY = shipped_root() / "tiny"
SHIPPED_TOKENIZER = TINY / "reward_model" / "tokenizer.json"

# step -> the key that names its policy
STEPS = {
    "rl/reinforce": "inputs.policy",
    "rl/ppo": "inputs.policy",
    "rl/rlhf": "policy.model_name",
}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, make_tiny_model: Any) -> Path:
    """A tiny Llama with the shipped tokenizer, made the way the docs tell a user to."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "llama")


def _extend(tree: dict[str, Any]) -> None:
    """60 more tokens after the shipped 476 (ids 476-535)."""
    vocab: dict[str, int] = tree["model"]["vocab"]
    for k in range(60):
        vocab[f"extra{k}"] = len(vocab)


@pytest.fixture(scope="module")
def permuted(tiny_llama: Path, make_tokenizer_variant: Any, shuffle_vocab: Any) -> Path:
    return make_tokenizer_variant(tiny_llama, tiny_llama.parent / "permuted", shuffle_vocab)


@pytest.fixture(scope="module")
def larger(tiny_llama: Path, make_tokenizer_variant: Any) -> Path:
    return make_tokenizer_variant(tiny_llama, tiny_llama.parent / "larger", _extend)


def _reorder(tree: dict[str, Any]) -> None:
    """The same tokens with the same ids, listed in reverse order (and then written compactly): other bytes."""
    vocab: dict[str, int] = tree["model"]["vocab"]
    tree["model"]["vocab"] = dict(reversed(vocab.items()))


@pytest.fixture(scope="module")
def resaved(tiny_llama: Path, make_tokenizer_variant: Any) -> Path:
    out = make_tokenizer_variant(tiny_llama, tiny_llama.parent / "resaved", _reorder)
    assert (out / "tokenizer.json").read_bytes() != SHIPPED_TOKENIZER.read_bytes()  # compared token by token
    return out


def _refused(r: Any, home: Path, policy: Path, says: str) -> None:
    (line,) = refused(r, says, lines=1)
    assert f"{policy}/tokenizer.json" in line and str(SHIPPED_TOKENIZER) in line, line
    assert not home.exists(), "a refused job must write nothing: no job dir, no external.* artifact record"


@pytest.mark.parametrize("step", STEPS)
def test_a_permuted_vocabulary_is_refused_at_dry_run_and_at_submit(
    step: str, permuted: Path, home: Path, run_cli: Any
) -> None:
    policy = f"{STEPS[step]}={permuted}"
    # Token 3 of the shuffled tokenizer is another word than the shipped tokenizer's token 3.
    says = "vocabularies of 476 tokens each; token id 3 is"
    _refused(run_cli("steps", "run", step, "-c", "tiny", policy, "--dry-run"), home, permuted, says)
    _refused(run_cli("steps", "run", step, "-c", "tiny", policy), home, permuted, says)


def test_a_dpo_reference_with_another_tokenizer_is_refused(permuted: Path, home: Path, run_cli: Any) -> None:
    """rl/dpo's reference scores the policy's token ids (the manifest's reads_token_ids_of): the same check."""
    for submit in (["--dry-run"], []):
        r = run_cli("steps", "run", "rl/dpo", "-c", "tiny", f"inputs.reference={permuted}", *submit)
        (line,) = refused(r, "input 'reference' is given the token ids of input 'policy'", lines=1)
        assert f"{permuted}/tokenizer.json" in line and str(TINY / "sft_policy" / "tokenizer.json") in line, (
            line
        )
        assert "vocabularies of 476 tokens each; token id 3 is" in line
        assert not home.exists(), "a refused job must write nothing"


def test_a_larger_vocabulary_is_refused_before_the_first_reward_call(
    larger: Path, home: Path, run_cli: Any
) -> None:
    r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={larger}")
    _refused(r, home, larger, "vocabularies of 536 vs 476 tokens; ids from 476 exist in only one")


def test_other_special_tokens_are_refused(tiny_llama: Path, home: Path, run_cli: Any) -> None:
    policy = tiny_llama.parent / "other_eos"
    if not policy.exists():
        shutil.copytree(tiny_llama, policy)
        config = json.loads((policy / "tokenizer_config.json").read_text())
        (policy / "tokenizer_config.json").write_text(json.dumps(config | {"eos_token": "<unk>"}))
        generation = json.loads(
            (policy / "generation_config.json").read_text()
        )  # the policy agrees with itself
        (policy / "generation_config.json").write_text(json.dumps(generation | {"eos_token_id": 2}))
    r = run_cli("steps", "run", "rl/ppo", "-c", "tiny", f"inputs.policy={policy}", "--dry-run")
    _refused(r, home, policy, "special tokens eos_token '<unk>' vs '<eos>'")


def test_an_eos_set_by_special_tokens_map_is_the_eos_transformers_loads(
    tiny_llama: Path, home: Path, run_cli: Any
) -> None:
    """special_tokens_map.json beside a tokenizer_config.json without added_tokens_decoder wins, as transformers
    reads it (tests/models/test_tokenizer_precedence.py pins the rule); issue 42's run never stopped a response."""
    policy = tiny_llama.parent / "map_eos"
    if not policy.exists():
        shutil.copytree(tiny_llama, policy)
        (policy / "generation_config.json").unlink()
        (policy / "special_tokens_map.json").write_text(
            json.dumps({"eos_token": "<unk>", "pad_token": "<unk>"})
        )
    r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={policy}", "--dry-run")
    _refused(r, home, policy, "special tokens eos_token '<unk>' vs '<eos>', pad_token '<unk>' vs '<pad>'")


def test_a_generation_config_that_disagrees_with_its_tokenizer_is_refused(
    tiny_llama: Path, home: Path, run_cli: Any
) -> None:
    """vLLM and transformers' generate stop at generation_config.json's eos_token_id, training reads the
    tokenizer's: a checkpoint whose two disagree is refused before anything is written, naming both."""
    policy = tiny_llama.parent / "generation_eos"
    if not policy.exists():
        shutil.copytree(tiny_llama, policy)
        generation = json.loads((policy / "generation_config.json").read_text())
        (policy / "generation_config.json").write_text(json.dumps(generation | {"eos_token_id": [2, 5]}))
    for submit in ([], ["--dry-run"]):
        r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={policy}", *submit)
        refused(
            r,
            f"error: input 'policy' ({policy}) cannot load: generation_config.json's eos_token_id is 2 ('<unk>'), "
            "5 (",
            lines=1,
        )
        assert "the tokenizer's eos_token is '<eos>' (id 1); make them agree" in r.err
        assert not home.exists()


def test_a_generative_judge_reads_text_so_any_tokenizer_meets_it(
    permuted: Path, home: Path, run_cli: Any
) -> None:
    judge = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"  # a causal LM, as a generative one is
    r = run_cli(
        "steps", "run", "rl/rlhf", "-c", "tiny", f"policy.model_name={permuted}", "judge.kind=generative",
        f"{judge}={TINY / 'sft_policy'}", "--dry-run",
    )  # fmt: skip
    assert r.code == 0, r.err[-2000:]


@pytest.mark.parametrize("step", STEPS)
def test_the_same_tokens_saved_again_still_compile(
    step: str, resaved: Path, home: Path, run_cli: Any
) -> None:
    r = run_cli("steps", "run", step, "-c", "tiny", f"{STEPS[step]}={resaved}", "--dry-run")
    assert r.code == 0, r.err[-2000:]
    assert not home.exists()


@pytest.mark.slow
def test_the_same_tokens_saved_again_train(resaved: Path, home: Path, run_cli: Any) -> None:
    r = run_cli(
        "steps", "run", "rl/reinforce", "-c", "tiny", f"inputs.policy={resaved}", "trainer.max_steps=2",
        "trainer.num_prompts_per_step=4", "eval.num_prompts=0", "checkpoint.save_interval=0", timeout=600,
    )  # fmt: skip
    assert r.code == 0, r.err[-3000:]
    assert "tiny_reinforce_policy:v1" in r.out + r.err


@pytest.fixture(scope="module")
def small_reward_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reward model whose embedding has 100 rows: the shipped policy's ids go up to 475."""
    from nemotron.models.checkpoint import load_tokenizer, save_checkpoint
    from nemotron.models.tiny import build_model

    tokenizer = load_tokenizer(TINY / "reward_model")
    model = build_model("reward_model", 100, 1, 16, 2, 64, 0, pad_token_id=0, eos_token_id=1)
    return save_checkpoint(model, tmp_path_factory.mktemp("models") / "small_rm", tokenizer)


@pytest.mark.slow
def test_ids_outside_the_served_vocabulary_are_bad_input_not_an_unreachable_server(
    small_reward_model: Path, home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """reward.server.url names a server that serves another model than inputs.reward_model, so the preflight sees
    matching tokenizers; the server answers 400 and the step says so (exit 2), with the server's reason."""
    ready = tmp_path / "ready.json"
    serve = ["--model", str(small_reward_model), "--port", "0", "--threads", "1", "--ready-file", str(ready)]
    server = subprocess.Popen(
        [sys.executable, "-m", "nemotron.reward.server", *serve],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        url = json.loads(ready.read_text())["url"]
        r = run_cli(
            "steps", "run", "rl/reinforce", "-c", "tiny", f"reward.server.url={url}", "trainer.max_steps=1",
            "trainer.num_prompts_per_step=4", "eval.num_prompts=0", "reward.server.retries=3", timeout=600,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert r.code == 2, r.err[-3000:]
    assert "Traceback" not in r.err
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert f"the reward model at {url} refused the request as bad input (HTTP 400)" in line, line
    assert "has a token id outside [0, 100)" in line, line
    assert "unreachable" not in r.err.lower() and "resume" not in r.err
    assert "known error Token ids outside the reward model's vocabulary" in r.err
