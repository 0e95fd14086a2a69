"""How each RL step maps onto NeMo-RL v0.7.0: one function per step, our validated config in, NeMo-RL sections out.

Each compiler reads the attributes of its step's pydantic Config (steps/rl/*/schema.py), so mypy checks every key
it maps. Every refusal goes to the shared `Refusals` collector, so the user sees all of them at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from nemotron.config.stepconfig import RLConfig
from nemotron.config.targets import NEMO_RL_VERSION
from nemotron.engines.nemo_rl import generation as gen
from nemotron.engines.nemo_rl import sections as sec
from nemotron.engines.nemo_rl.batches import whole_batches
from nemotron.engines.nemo_rl.compiled import Compiled
from nemotron.engines.nemo_rl.preference import compile_dpo
from nemotron.engines.nemo_rl.supervised import compile_rm, compile_sft
from nemotron.engines.refusals import Refusals

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time the catalog loads each schema.py itself
    from rl.ppo.schema import Config as PPOConfig
    from rl.reinforce.schema import Config as ReinforceConfig
    from rl.rlhf.schema import Config as RLHFConfig

CRITIC_CONVERT_FILE = "nemo_rl_critic_convert.yaml"
KL_TYPES = ("k1", "k2", "k3")  # loss_fn.reference_policy_kl_type at v0.7.0 (calculate_kl)
JUDGE_MODEL_KEY = "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model"


def _common_refusals(
    c: RLHFConfig | RLConfig,
    refuse: Refusals,
    *,
    generation: str,
    judge: bool,
    nodes: int,
    gpus_per_node: int,
    reward_model: bool,
) -> None:
    """What every RL step refuses; `generation` is the dotted key of its generation group, `judge` whether it has
    a judge group."""
    nemo = c.nemo_rl
    if c.runtime.device == "cpu":
        refuse("runtime.device", "NeMo-RL trains on GPUs only")
    if judge:
        refuse.unless_default(
            "judge.server", "NeMo-Gym serves the judge with its own vLLM (env.nemo_gym.genrm_model)"
        )
    refuse.unless_default(
        f"{generation}.vllm_gpu_memory_utilization", "NeMo-RL's vLLM takes nemo_rl.gpu_memory_utilization"
    )
    refuse.unless_default(
        f"{generation}.vllm_max_model_len", "NeMo-RL sizes vLLM to nemo_rl.max_prompt_tokens + max_new_tokens"
    )
    sec.refuse_builtin_training(c, refuse)
    refuse.unless_default("eval.task", "our ground-truth scorers do not run inside NeMo-RL")
    if nemo.policy_backend == "dtensor" and nemo.pipeline_parallel_size > 1:
        refuse("nemo_rl.pipeline_parallel_size", "pipeline parallelism needs nemo_rl.policy_backend=megatron")
    if reward_model and nodes == 1 and gpus_per_node <= nemo.reward_model_gpus:
        refuse("nemo_rl.reward_model_gpus", f"leaves none of the node's {gpus_per_node} GPUs to the policy")


def _validation(num_prompts: int, train: str, validation: str | None) -> tuple[dict[str, Any], str | None]:
    """Our before/after evaluation (eval.num_prompts) as NeMo-RL validation at the start and the end on the first
    N prompts."""
    n = num_prompts
    keys = {
        "val_at_start": n > 0,
        "val_at_end": n > 0,
        "max_val_samples": max(n, 1),
        "val_batch_size": max(n, 1),
    }
    return keys, (validation or train) if n > 0 else validation


def _need(refuse: Refusals, key: str, value: str | None) -> str:
    """The input `key` NeMo-RL cannot run without (its value `value`), refused when unset."""
    if not value:
        refuse(key, "NeMo-RL needs it set (an artifact ref or a path)")
        return ""
    return str(value)


# The loop keys GRPO and PPO share (grpo.* / ppo.* at v0.7.0), in the order the compiled YAML lists them.
def _rollouts(*, prompts: int, group: int, steps: int) -> dict[str, Any]:
    return {
        "num_prompts_per_step": prompts,
        "num_generations_per_prompt": group,
        "max_num_steps": steps,
        "max_num_epochs": steps,  # our prompt schedule cycles the file; steps, not epochs, end the run
        "max_rollout_turns": 1,
    }


def _sampling(seed: int) -> dict[str, Any]:
    return {"seed": seed, "overlong_filtering": False, "use_dynamic_sampling": False, "batch_multiplier": 1}


SHAPING_OFF = {"reward_shaping": {"enabled": False}, "reward_scaling": {"enabled": False}}


def _grpo(
    *, prompts: int, group: int, steps: int, seed: int, loo: bool, normalize: bool, kl: float,
    async_grpo: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """grpo.*: the GRPO loop with its group-relative advantages (RLOO when `loo`), synchronous or async."""
    return {
        **_rollouts(prompts=prompts, group=group, steps=steps),
        "normalize_rewards": normalize,
        "use_leave_one_out_baseline": loo,
        "adv_estimator": {"name": "grpo", "normalize_rewards": normalize, "use_leave_one_out_baseline": loo},
        **_sampling(seed),
        "advantage_clip_low": None,
        "advantage_clip_high": None,
        **SHAPING_OFF,
        "async_grpo": async_grpo,
        "skip_reference_policy_logprobs_calculation": kl == 0,
    }


def _loss(
    kl: float,
    kl_type: str,
    *,
    ratio_clip: tuple[float, float] = (0.2, 0.2),
    ratio_clip_c: float | None = None,
    token_level_loss: bool,
    disable_ppo_ratio: bool = False,
    use_kl_in_reward: bool = False,
) -> dict[str, Any]:
    """loss_fn.*: the clipped policy-gradient loss; the keyword arguments are NeMo-RL's keys, but for `ratio_clip`,
    the ratio's clip below and above 1 (ratio_clip_min, ratio_clip_max)."""
    return {
        "reference_policy_kl_penalty": kl,
        "reference_policy_kl_type": kl_type,
        "ratio_clip_min": ratio_clip[0],
        "ratio_clip_max": ratio_clip[1],
        "ratio_clip_c": ratio_clip_c,
        "token_level_loss": token_level_loss,
        "disable_ppo_ratio": disable_ppo_ratio,
        "use_kl_in_reward": use_kl_in_reward,
        "use_on_policy_kl_approximation": False,
        "use_importance_sampling_correction": False,
        "truncated_importance_sampling_type": None,
        "truncated_importance_sampling_ratio": None,
        "truncated_importance_sampling_ratio_min": None,
        "sequence_level_importance_ratios": False,
        "force_on_policy_ratio": False,
        "use_cispo": False,
        "positive_example_nll_weight": 0.0,
    }


def _kl_type(refuse: Refusals, key: str, value: str) -> str:
    if value not in KL_TYPES:
        refuse(
            key,
            f"NeMo-RL {NEMO_RL_VERSION}'s loss_fn.reference_policy_kl_type takes {'/'.join(KL_TYPES)} only",
        )
        return "k3"
    return value


def _policy(
    c: RLConfig, model: str, steps: int, global_batch: int, colocated: dict[str, Any], async_engine: bool
) -> dict[str, Any]:
    """policy.* of rl/reinforce and rl/ppo, from their optim, generation and trainer groups."""
    return sec.policy(
        model=model,
        optim=c.optim,
        generation=c.generation,
        nemo=c.nemo_rl,
        max_steps=steps,
        micro_batch=c.trainer.micro_batch_size,
        global_batch=global_batch,
        nemo_gym=False,
        runtime=c.runtime,
        colocated=colocated,
        async_engine=async_engine,
    )


def _runtime(c: RLHFConfig | RLConfig, job_dir: str, nodes: int, gpus: int, steps: int) -> dict[str, Any]:
    """cluster, logger and checkpointing: a checkpoint every checkpoint.save_interval steps, else at the end."""
    return sec.runtime(job_dir, nodes, gpus, c.checkpoint.save_interval or steps)


def _reward_model_step(c: RLConfig, refuse: Refusals, nodes: int, gpus: int) -> tuple[str, str, str]:
    """What rl/reinforce and rl/ppo share on NeMo-RL: the common refusals, a reward model scored by NeMo-RL's
    own workers, and the (policy, prompts, reward model) inputs."""
    _common_refusals(
        c, refuse, generation="generation", judge=False, nodes=nodes, gpus_per_node=gpus, reward_model=True
    )
    model = _need(refuse, "inputs.policy", c.inputs.policy)
    prompts = _need(refuse, "inputs.prompts", c.inputs.prompts)
    rm = _need(refuse, "inputs.reward_model", c.inputs.reward_model)
    refuse.unless_default("trainer.log_interval", "NeMo-RL logs every step")
    refuse.unless_default(
        "reward.server.url", "NeMo-RL scores with its own reward-model workers, not a server"
    )
    return model, prompts, rm


def compile_step(
    recipe: str, config: BaseModel, refuse: Refusals, job_dir: str, nodes: int, gpus: int
) -> Compiled:
    """`config` is the step's own Config, validated by the schema the catalog loaded from the step's schema.py
    (the module mypy knows as rl.<name>.schema); `recipe` is its manifest's `engines.nemo_rl`."""
    return RECIPES[recipe](config, refuse, job_dir, nodes, gpus)


def compile_rlhf(c: RLHFConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> Compiled:
    grpo, loss, pol, judge, nemo = c.grpo, c.loss_fn, c.policy, c.judge, c.nemo_rl
    gym = sec.nemo_gym(c)
    _common_refusals(
        c,
        refuse,
        generation="policy.generation",
        judge=True,
        nodes=nodes,
        gpus_per_node=gpus,
        reward_model=not gym,
    )
    model = _need(refuse, "policy.model_name", pol.model_name)
    train = _need(refuse, "data.train.data_path", c.data.train.data_path)
    judge_model = _need(
        refuse, JUDGE_MODEL_KEY, c.env.nemo_gym.genrm_model.responses_api_models.vllm_model.model
    )
    refuse.unless_default(
        "grpo.std_floor", "NeMo-RL divides by the group std + 1e-6 (a zero std stays unscaled)"
    )
    refuse.unless_default("judge.url", "NeMo-RL runs the judge itself; it cannot call a running server")
    cluster_nodes, judge_nodes = nodes, None  # a profile without GPUs sets nothing aside (a CPU Ray cluster)
    placed = True  # false where the profile has no room for NeMo-Gym's judge beside the policy
    if gym and gpus >= 1:
        split = sec.genrm_split(nodes, gpus)
        if split is None:
            placed = False
            shortfall = sec.genrm_shortfall(nodes, gpus, nemo, gen.separate(c), c.workload())
            refuse("env.should_use_nemo_gym", shortfall)
        else:
            cluster_nodes, judge_nodes = split
    if gym:
        if judge.kind != "generative":
            refuse(
                "env.should_use_nemo_gym",
                "NeMo-Gym judges with a generative model: set judge.kind=generative",
            )
        if judge.mode != "pairwise":
            refuse("judge.mode", "NeMo-Gym's GenRM judge (genrm_compare) compares responses in pairs only")
        refuse.all_unless_default(
            ("judge.prompt_template", "genrm_compare uses the GenRM's own judging prompt"),
            ("judge.pairwise_template", "genrm_compare uses the GenRM's own judging prompt"),
            ("judge.guided_choice", "genrm_compare parses free-form GenRM answers"),
        )
        if pol.generation.stop_strings:
            refuse(
                "policy.generation.stop_strings",
                "NeMo-Gym rollouts take no stop strings (setup_nemo_gym_config)",
            )
    elif judge.kind != "reward_model":
        refuse(
            "judge.kind", "a generative judge runs through NeMo-Gym only: set env.should_use_nemo_gym=true"
        )
    val_keys, val_path = _validation(c.eval.num_prompts, train, c.data.validation.data_path)
    if grpo.val_period > 0 and c.eval.num_prompts == 0:
        refuse(
            "grpo.val_period", "validation needs eval.num_prompts > 0 (how many prompts NeMo-RL validates)"
        )
    group = grpo.num_generations_per_prompt
    batch = pol.train_global_batch_size or grpo.num_prompts_per_step * group
    steps, kl = grpo.max_num_steps, loss.reference_policy_kl_penalty
    budget = sec.sequence_budget(nemo.max_prompt_tokens, pol.generation.max_new_tokens)
    gcfg = _grpo(
        prompts=grpo.num_prompts_per_step,
        group=group,
        steps=steps,
        seed=c.runtime.seed,
        loo=grpo.use_leave_one_out_baseline,
        normalize=grpo.normalize_rewards,
        kl=kl,
        async_grpo=gen.async_grpo(grpo.async_grpo, "grpo.async_grpo", refuse),
    )
    gcfg.update(val_keys, val_period=grpo.val_period)
    # vLLM on GPUs of its own for async GRPO: out of NeMo-RL's cluster as compiled (the GenRM's nodes already out)
    share = gen.policy_share(nemo, gen.separate(c), gen.trigger(c), cluster_nodes=cluster_nodes, gpus_per_node=gpus,
                             reward_model_gpus=sec.reward_model_gpus(c, nemo, nodes, gpus))  # fmt: skip
    colocated, set_batch = gen.colocated(), pol.train_global_batch_size
    if placed:  # no share to split or batch over otherwise: the judge's refusal is the one that applies
        colocated = gen.placement(share, refuse)
        whole_batches(refuse, nemo, share.train_gpus, ("grpo.num_prompts_per_step", grpo.num_prompts_per_step,
                                             "grpo.num_generations_per_prompt", group),
                       None if set_batch is None else ("policy.train_global_batch_size", set_batch),
                       ("policy.train_micro_batch_size", pol.train_micro_batch_size))  # fmt: skip
    if gym:  # run_grpo_nemo_gym.py refuses a max_val_samples and sets both from the validation file
        gcfg.update(max_val_samples=None, val_batch_size=None)
    config: dict[str, Any] = {
        "grpo": gcfg,
        # rl/rlhf's loss_fn keys carry NeMo-RL's own names and meaning
        "loss_fn": _loss(
            kl,
            _kl_type(refuse, "loss_fn.kl_estimator", loss.kl_estimator),
            ratio_clip=(loss.ratio_clip_min, loss.ratio_clip_max),
            ratio_clip_c=loss.ratio_clip_c,
            token_level_loss=loss.token_level_loss,
        )
        | gen.importance_sampling(loss),
        "policy": sec.policy(
            model=model,
            optim=pol.optimizer,
            generation=pol.generation,
            nemo=nemo,
            max_steps=steps,
            micro_batch=pol.train_micro_batch_size,
            global_batch=batch,
            nemo_gym=gym,
            runtime=c.runtime,
            colocated=colocated,
            async_engine=grpo.async_grpo.enabled,
        ),
        # NeMo-RL's cluster is the policy's share: the GenRM's nodes are kept out of it (sections.genrm_split)
        **_runtime(c, job_dir, cluster_nodes, gpus, steps),
    }
    if gym:
        config["data"] = sec.gym_data(train, val_path)
        config["env"] = sec.genrm_env(judge_model, judge, group, judge_nodes)
    else:
        config["data"] = sec.prompt_data(train, val_path, nemo.max_prompt_tokens, "reward_model")
        resources = sec.reward_model_resources(nodes, gpus, nemo.reward_model_gpus)
        config["env"] = sec.reward_model_env(
            judge_model, micro_batch=pol.train_micro_batch_size, budget=budget, resources=resources
        )
    entry = sec.GYM_ENTRY if gym else sec.GRPO_ENTRY
    megatron = nemo.policy_backend == "megatron"
    return Compiled(entry, sec.GRPO_BASE, config, [("policy", None, "policy")], {}, megatron)


def compile_reinforce(c: ReinforceConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> Compiled:
    r, t, nemo = c.reinforce, c.trainer, c.nemo_rl
    model, prompts, rm = _reward_model_step(c, refuse, nodes, gpus)
    refuse.all_unless_default(
        ("reinforce.kl_in", "NeMo-RL's RLOO (the GRPO estimator) puts the KL in the loss only"),
        ("reinforce.reinforce_epochs", "NeMo-RL's GRPO makes one pass over each rollout batch"),
        ("reinforce.truncated_responses", "NeMo-RL keeps truncated responses' rewards"),
    )
    group, steps, kl = r.num_rollouts_per_prompt, t.max_steps, r.initial_policy_kl_penalty
    budget = sec.sequence_budget(nemo.max_prompt_tokens, c.generation.max_new_tokens)
    val_keys, val_path = _validation(c.eval.num_prompts, prompts, None)
    gcfg = _grpo(
        prompts=t.num_prompts_per_step,
        group=group,
        steps=steps,
        seed=c.runtime.seed,
        loo=True,
        normalize=False,
        kl=kl,
        async_grpo=gen.async_grpo(r.async_grpo, "reinforce.async_grpo", refuse),
    )
    gcfg.update(val_keys, val_period=0)
    share = gen.policy_share(nemo, gen.separate(c), gen.trigger(c), cluster_nodes=nodes, gpus_per_node=gpus,
                             reward_model_gpus=sec.reward_model_gpus(c, nemo, nodes, gpus))  # fmt: skip
    colocated = gen.placement(share, refuse)
    whole_batches(refuse, nemo, share.train_gpus, ("trainer.num_prompts_per_step", t.num_prompts_per_step,
                                         "reinforce.num_rollouts_per_prompt", group),
                   None, ("trainer.micro_batch_size", t.micro_batch_size))  # fmt: skip
    config: dict[str, Any] = {
        "grpo": gcfg,
        # REINFORCE: -A * log pi with no probability ratio (disable_ppo_ratio makes the ratio clips inert).
        "loss_fn": _loss(
            kl,
            _kl_type(refuse, "reinforce.kl_estimator", r.kl_estimator),
            token_level_loss=r.loss_level == "token",
            disable_ppo_ratio=True,
        )
        | gen.importance_sampling(r),  # NeMo-RL weights -A·log π by the IS weights with the ratio off too
        "policy": _policy(c, model, steps, t.num_prompts_per_step * group, colocated, r.async_grpo.enabled),
        "data": sec.prompt_data(prompts, val_path, nemo.max_prompt_tokens, "reward_model"),
        "env": sec.reward_model_env(
            rm,
            micro_batch=t.micro_batch_size,
            budget=budget,
            resources=sec.reward_model_resources(nodes, gpus, nemo.reward_model_gpus),
        ),
        **_runtime(c, job_dir, nodes, gpus, steps),
    }
    megatron = nemo.policy_backend == "megatron"
    return Compiled(sec.GRPO_ENTRY, sec.GRPO_BASE, config, [("policy", None, "policy")], {}, megatron)


def _ppo(c: PPOConfig, val_keys: dict[str, Any], *, kl: float) -> dict[str, Any]:
    """ppo.*: the rollout loop of GRPO's shape with GAE advantages and PPO's own epochs and critic warm-up."""
    p, t = c.ppo, c.trainer
    return {
        **_rollouts(prompts=t.num_prompts_per_step, group=p.num_rollouts_per_prompt, steps=t.max_steps),
        "adv_estimator": {
            "name": "gae",
            "gae_lambda": p.gae_lambda,
            "gae_gamma": p.discount_factor,
            "normalize_advantages": p.whiten_advantages,
            "gae_lambda_value": None,
            "gae_lambda_policy": None,
            "length_adaptive_alpha": 0.0,
        },
        **_sampling(c.runtime.seed),
        **SHAPING_OFF,
        "skip_reference_policy_logprobs_calculation": kl == 0,
        **val_keys,
        "val_period": 0,
        "ppo_epochs": p.ppo_epochs,
        "policy_training_start_step": p.critic_warmup_steps,
    }


def compile_ppo(c: PPOConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> Compiled:
    p, t, nemo = c.ppo, c.trainer, c.nemo_rl
    model, prompts, rm = _reward_model_step(c, refuse, nodes, gpus)
    refuse.unless_default("ppo.entropy_bonus", "NeMo-RL's clipped PG loss only logs the entropy")
    refuse.unless_default(
        gen.GPUS_KEY, "NeMo-RL v0.7.0's PPO generates colocated only (ppo.py:371 asserts it)"
    )
    megatron = nemo.policy_backend == "megatron"
    if not megatron and nemo.context_parallel_size > 1:
        refuse(
            "nemo_rl.context_parallel_size",
            "NeMo-RL's DTensor value model (the critic) takes no context parallelism",
        )
    group, steps, kl = p.num_rollouts_per_prompt, t.max_steps, p.initial_policy_kl_penalty
    budget = sec.sequence_budget(nemo.max_prompt_tokens, c.generation.max_new_tokens)
    batch, micro = t.num_prompts_per_step * group, t.micro_batch_size
    val_keys, val_path = _validation(c.eval.num_prompts, prompts, None)
    # The critic starts from our reward model (backbone and head) as NeMo-RL's "regression" value model.
    value = {
        "model_name": rm,
        "tokenizer": {"name": rm, "chat_template": None, "chat_template_kwargs": None},
        "train_global_batch_size": batch,
        "train_micro_batch_size": micro,
        "max_total_sequence_length": budget,
        "reward_model_cfg": {"enabled": not megatron, "reward_model_type": "regression"},
        **sec.trainer(
            nemo, c.critic.optim, steps, packing=megatron and nemo.sequence_packing, runtime=c.runtime
        ),
    }
    # ppo.setup subtracts the reward model's GPUs only when a top-level data.env_name says so, which v0.7.0's
    # DataConfig does not carry: size the policy cluster to its share here instead (colocated: ppo.py:371).
    resources = sec.reward_model_resources(nodes, gpus, nemo.reward_model_gpus)
    share = gen.policy_share(nemo, False, gen.GPUS_KEY, cluster_nodes=nodes, gpus_per_node=gpus,
                             reward_model_gpus=sec.reward_model_gpus(c, nemo, nodes, gpus))  # fmt: skip
    cluster = {"num_nodes": share.nodes, "gpus_per_node": gpus - share.taken}
    # the policy and the critic take turns on the cluster, each over all of its GPUs with the same batches
    whole_batches(refuse, nemo, share.gpus,
                   ("trainer.num_prompts_per_step", t.num_prompts_per_step, "ppo.num_rollouts_per_prompt", group),
                   None, ("trainer.micro_batch_size", micro))  # fmt: skip
    config: dict[str, Any] = {
        "ppo": _ppo(c, val_keys, kl=kl),
        # NeMo-Aligner's PPO: per-token KL to the initial policy inside the reward (GAE's token rewards).
        "loss_fn": _loss(
            kl,
            _kl_type(refuse, "ppo.kl_estimator", p.kl_estimator),
            ratio_clip=(p.ratio_eps, p.ratio_eps),  # PPO's clip is symmetric
            ratio_clip_c=p.dual_clip,
            token_level_loss=p.loss_level == "token",
            use_kl_in_reward=True,
        ),
        "value_loss_fn": {"scale": 1.0, "cliprange": c.critic.loss_clip_val},
        "policy": _policy(c, model, steps, batch, gen.colocated(), async_engine=False),
        "value": value,
        "data": sec.prompt_data(prompts, val_path, nemo.max_prompt_tokens, "reward_model"),
        "env": sec.reward_model_env(rm, micro_batch=micro, budget=budget, resources=resources),
        **_runtime(c, job_dir, nodes, gpus, steps),
    }
    config["cluster"] = cluster
    # The converters build the HF config from `policy.model_name`: the critic's is the reward model.
    critic_cfg = {"policy": {"model_name": rm, "tokenizer": {"name": rm}}}
    conversions = [("policy", None, "policy"), ("value", CRITIC_CONVERT_FILE, "critic")]
    return Compiled(
        sec.PPO_ENTRY, sec.PPO_BASE, config, conversions, {CRITIC_CONVERT_FILE: critic_cfg}, megatron
    )


# recipe (a manifest's `engines.nemo_rl`) -> its compiler; eval is nemotron.engines.nemo_rl.evaluation's
RECIPES: dict[str, Callable[[Any, Refusals, str, int, int], Compiled]] = {
    "grpo": compile_rlhf,
    "grpo_rloo": compile_reinforce,
    "ppo": compile_ppo,
    "run_sft": compile_sft,
    "run_rm": compile_rm,
    "run_dpo": compile_dpo,
}
