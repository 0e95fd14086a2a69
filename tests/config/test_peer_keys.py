"""A peer's name for one of our keys, as its description states it, answers an unknown key: read from a schema made
here (what is taken and what is not), on every shipped schema, and through the CLI (exit 2, nothing written). The
names themselves are checked against the peers: TRL's against the configs of the TRL the lock installs (its removed
PPO against its source), NeMo-RL's and NeMo-Aligner's against the configs their pinned tags ship."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from nemotron.catalog import Catalog
from nemotron.config.fields import PeerKey, peer_hint, peer_keys, unknown_key_hint
from nemotron.config.strict import Strict


class Loss(Strict):
    beta: float = 0.1
    """the KL strength (TRL: beta)"""
    kl_penalty: float = 0.05
    """the penalty in the reward (NeMo-Aligner: initial_policy_kl_penalty; TRL RLOO: kl_coef)"""
    adam_beta1: float = 0.9
    """the first moment's decay (NeMo-Aligner: optim.betas[0])"""
    min_lr_ratio: float = 1.0
    """the floor of the schedule (NeMo-Aligner: optim.sched.min_lr / lr)"""
    max_steps: int = 10
    """the number of steps (NeMo-Aligner: trainer.{reinforce,ppo}.max_steps)"""


class Trainer(Strict):
    global_batch_size: int = Field(8, ge=1)
    """rows per step (NeMo-RL: policy.train_global_batch_size)"""
    clip: float = 1.0
    """gradient norm clip (NeMo-Aligner: gradient_clip_val)"""
    steps: int = 3
    """steps to run (NeMo-RL and NeMo-Aligner: trainer.steps)"""


class Critic(Strict):
    clip: float = 1.0
    """the critic's gradient norm clip (NeMo-Aligner: gradient_clip_val)"""


class Config(Strict):
    loss: Loss = Field(default_factory=Loss)
    trainer: Trainer = Field(default_factory=Trainer)
    critic: Critic = Field(default_factory=Critic)


def test_peer_names_are_read_from_the_descriptions_and_formulas_are_not() -> None:
    assert (
        peer_keys(Config)
        == [
            PeerKey("NeMo-Aligner", "initial_policy_kl_penalty", "loss.kl_penalty"),
            PeerKey("TRL RLOO", "kl_coef", "loss.kl_penalty"),
            PeerKey("NeMo-RL", "policy.train_global_batch_size", "trainer.global_batch_size"),
            PeerKey("NeMo-Aligner", "gradient_clip_val", "trainer.clip"),
            PeerKey("NeMo-Aligner", "gradient_clip_val", "critic.clip"),
        ]
    )  # beta and trainer.steps are our own names; optim.betas[0], min_lr / lr and {reinforce,ppo} are not keys


@pytest.mark.parametrize(
    ("unknown", "hint"),
    [
        ("loss.initial_policy_kl_penalty", " (NeMo-Aligner's initial_policy_kl_penalty is loss.kl_penalty here)"),
        ("initial_policy_kl_penalty", " (NeMo-Aligner's initial_policy_kl_penalty is loss.kl_penalty here)"),
        ("policy.train_global_batch_size", " (NeMo-RL's policy.train_global_batch_size is trainer.global_batch_size here)"),
        ("x.policy.train_global_batch_size", " (NeMo-RL's policy.train_global_batch_size is trainer.global_batch_size here)"),
        # a dotted peer name matches whole parts only, and a bare one the last part only
        ("train_global_batch_size", ""),
        ("policy.train_global_batch_size.x", ""),
        ("loss.kl_coeff", ""),
        # several keys carry the name: the one in the unknown key's own group, else all of them
        ("critic.gradient_clip_val", " (NeMo-Aligner's gradient_clip_val is critic.clip here)"),
        ("gradient_clip_val", " (NeMo-Aligner's gradient_clip_val is trainer.clip here; "
                              "NeMo-Aligner's gradient_clip_val is critic.clip here)"),
    ],
)  # fmt: skip
def test_an_unknown_key_is_matched_to_the_peer_name_it_ends_with(unknown: str, hint: str) -> None:
    assert peer_hint(Config, unknown) == hint


@pytest.mark.parametrize(
    ("loc", "value", "hint"),
    [
        (["loss", "bta"], 0.2, " (did you mean 'loss.beta'?)"),
        (["loss", "initial_policy_kl_penalty"], 0.2, " (NeMo-Aligner's initial_policy_kl_penalty is loss.kl_penalty here)"),
        # an unknown group comes as one error with the group as its value: each key typed under it is looked up
        (["policy"], {"train_global_batch_size": 4}, " (NeMo-RL's policy.train_global_batch_size is trainer.global_batch_size here)"),
        (["policy"], {"nothing": 4}, ""),
    ],
)  # fmt: skip
def test_a_peer_name_comes_before_the_close_names(loc: list[str], value: Any, hint: str) -> None:
    assert unknown_key_hint(Config, loc, value) == hint


def test_every_peer_name_of_the_shipped_schemas_finds_its_key() -> None:
    """The descriptions of the shipped steps state peers' names in one form: each name found there, typed as an
    unknown key, is answered with the key that states it."""
    catalog = Catalog()
    found = 0
    for step_id in catalog.steps:
        schema = catalog.get(step_id).config_schema()
        for peer in peer_keys(schema):
            assert f"{peer.peer}'s {peer.name} is {peer.key} here" in peer_hint(schema, peer.name), (
                step_id,
                peer,
            )
            found += 1
    assert found >= 40  # the RL steps and DPO name NeMo-RL's, NeMo-Aligner's and TRL's keys


def test_a_trl_users_keys_are_answered_through_the_cli(run_cli: Any, home: Path) -> None:
    r = run_cli(*"steps run rl/ppo -c tiny ppo.gamma=0.9 ppo.lam=0.9 ppo.cliprange=0.1 --dry-run".split())
    assert r.code == 2, r.err
    assert r.err.splitlines() == [
        "error: invalid config for step 'rl/ppo':",
        "  - ppo.gamma: unknown key (value 0.9) [from cli] (TRL PPO's gamma is ppo.discount_factor here)",
        "  - ppo.lam: unknown key (value 0.9) [from cli] (TRL PPO's lam is ppo.gae_lambda here)",
        "  - ppo.cliprange: unknown key (value 0.1) [from cli] (TRL PPO's cliprange is ppo.ratio_eps here)",
    ]
    assert not (home / "jobs").exists()


def test_a_nemo_rl_users_group_is_answered_through_the_cli(run_cli: Any, home: Path) -> None:
    r = run_cli("steps", "run", "rl/dpo", "-c", "tiny", "policy.train_global_batch_size=64", "dpo.beta=0.1")
    assert r.code == 2, r.err
    assert "(NeMo-RL's policy.train_global_batch_size is trainer.global_batch_size here)" in r.err
    assert (
        "dpo.beta: unknown key (value 0.1) [from cli] (TRL's beta is dpo.reference_policy_kl_penalty here)"
        in r.err
    )
    assert "Traceback" not in r.err and not (home / "jobs").exists()


# The TRL trainer each shipped step compares with (bench/ runs the installed TRL's), by its config class; rl/ppo's
# "TRL PPO" names are those of TRL's PPOConfig, read from TRL's source at the last tag here that has it.
TRL_CONFIGS = {
    "rl/rlhf": ("GRPO", "GRPOConfig"),
    "rl/reinforce": ("RLOO", "RLOOConfig"),
    "rl/dpo": ("DPO", "DPOConfig"),
    "sft": ("SFT", "SFTConfig"),
    "rm/train": ("Reward", "RewardConfig"),
}
TRL_MIRROR = Path("/work/.mirror/huggingface+trl/repo")
TRL_PPO = ("v1.9.0", "trl/experimental/ppo/ppo_config.py")


def _trl_names(catalog: Catalog, step_id: str) -> dict[str, set[str]]:
    """The TRL names the step's key descriptions state, by the label they carry ("TRL", "TRL GRPO", ...)."""
    names: dict[str, set[str]] = {}
    for peer in peer_keys(catalog.get(step_id).config_schema()):
        if peer.peer.startswith("TRL"):
            names.setdefault(peer.peer, set()).add(peer.name)
    return names


def test_trl_names_are_fields_of_the_installed_trls_configs() -> None:
    """Every TRL name a key's description states is a field of the config of the TRL trainer the step compares
    with, in the TRL the lock installs, and an algorithm's label is the step's own."""
    import dataclasses

    import trl
    from transformers import TrainingArguments

    catalog = Catalog()
    shared = {f.name for f in dataclasses.fields(TrainingArguments)}  # what every TRL config extends
    checked = 0
    for step_id in catalog.steps:
        names = _trl_names(catalog, step_id)
        if step_id == "rl/ppo":
            assert set(names) == {"TRL", "TRL PPO"}, names
            assert names["TRL"] <= shared
            continue
        if step_id not in TRL_CONFIGS:
            assert names == {}, (step_id, names)
            continue
        algorithm, config = TRL_CONFIGS[step_id]
        fields = {f.name for f in dataclasses.fields(getattr(trl, config))}
        assert set(names) <= {"TRL", f"TRL {algorithm}"}, (step_id, names)
        for label, stated in names.items():
            assert stated <= fields, (step_id, label, sorted(stated - fields), trl.__version__)
            checked += len(stated)
    assert checked >= 15


def test_trl_ppo_names_are_fields_of_trls_last_ppo_config() -> None:
    import ast
    import subprocess

    if not TRL_MIRROR.exists():
        pytest.skip("no TRL mirror on this machine; TRL 1.16, which the lock installs, has no PPO")
    tag, path = TRL_PPO
    source = subprocess.run(
        ["git", "-C", str(TRL_MIRROR), "show", f"{tag}:{path}"], capture_output=True, text=True, check=True
    ).stdout
    (config,) = [
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "PPOConfig"
    ]
    fields = {
        n.target.id for n in config.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    stated = _trl_names(Catalog(), "rl/ppo")["TRL PPO"]
    assert stated == {"gamma", "lam", "cliprange", "kl_coef", "cliprange_value"}
    assert stated <= fields, sorted(stated - fields)


def _keys_and_groups(texts: list[str]) -> set[str]:
    """Every dotted key of these YAML files, and every group above one."""
    import yaml

    from nemotron.config.configtree import flatten

    found = set()
    for text in texts:
        for key, _ in flatten(yaml.safe_load(text)):
            parts = key.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return found


@pytest.mark.parametrize("peer", ["NeMo-RL", "NeMo-Aligner"])
def test_nemo_names_are_keys_of_the_pinned_tags_configs(peer: str) -> None:
    """Every NeMo-RL or NeMo-Aligner name a key's description states is a key (or the end of one) of the configs
    the pinned tag ships for the recipes we compile to, read from its mirror."""
    from tests.engines import nemo_aligner_v070 as aligner
    from tests.engines import nemo_rl_v070 as rl
    from tests.engines.mirrors import git_show

    if peer == "NeMo-RL":
        mirror, tag = rl.MIRROR, rl.TAG
        files = [*rl.BASES.values(), "examples/configs/evals/eval.yaml", "examples/configs/grpo_rm_1B.yaml"]
    else:
        mirror, tag = aligner.MIRROR, aligner.TAG
        files = [f"{aligner.CONF}/{name}" for name in aligner.SCRIPTS.values()]
    if not mirror.exists():
        pytest.skip(f"no {peer} mirror on this machine")
    keys = _keys_and_groups([git_show(mirror, tag, path) for path in files])
    catalog = Catalog()
    stated = {
        (step_id, p.name)
        for step_id in catalog.steps
        for p in peer_keys(catalog.get(step_id).config_schema())
        if peer in p.peer
    }
    assert len(stated) >= 20
    unknown = sorted(s for s in stated if not any(k == s[1] or k.endswith("." + s[1]) for k in keys))
    assert unknown == []
