"""Compile rl/reinforce, rl/ppo and rm/serve configs into NeMo-Aligner v0.7.0's scripts and Hydra overrides.

Pure: a validated step config in, one `Script` per heterogeneous-job group out (servers first, the actor last).
Every key of our schemas is mapped to a key of the tag's YAMLs (examples/nlp/gpt/conf/*.yaml), has no effect there
(docs/nemo-aligner.md says which), or is refused when set to a value NeMo-Aligner cannot express; the refusals are
raised together as one UserError. The servers' addresses reach the actor as OmegaConf resolvers of environment
variables the executor exports (`${oc.env:...}`), so every override is a fixed word the shell never expands."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from nemotron.config.offpolicy import ASYNC_KEYS, CORRECTION_KEYS, refusing
from nemotron.config.stepconfig import Generation, RLConfig, ServeRuntime, TrainRuntime
from nemotron.config.targets import NEMO_ALIGNER_VERSION
from nemotron.engines.base import recipe_for
from nemotron.engines.nemo_aligner.megatron_batch import batch_problems
from nemotron.engines.nemo_aligner.preference import compile_dpo
from nemotron.engines.nemo_aligner.scripts import (
    PRECISION,
    SCRIPTS,
    AlignerRun,
    Env,
    Script,
    nemo_path,
    optim_overrides,
    placement,
    runtime_overrides,
    threads,
)
from nemotron.engines.nemo_aligner.supervised import RECIPES as SUPERVISED
from nemotron.engines.refusals import Refusals, builtin_refusals
from nemotron.engines.remote_tracking import RunLabels, aligner_exp_manager
from nemotron.plan.placement import Placement

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time the catalog loads each schema.py itself
    from rl.ppo.schema import PPO
    from rl.ppo.schema import Config as PPOConfig
    from rl.reinforce.schema import Config as ReinforceConfig
    from rl.reinforce.schema import Reinforce
    from rm.serve.schema import Config as ServeConfig

REWARD_PORT_ENV = "NEMOTRON_REWARD_PORT"  # the executor exports both ports and hosts before the groups start
CRITIC_PORT_ENV = "NEMOTRON_CRITIC_PORT"
REWARD_HOST_ENV = "NEMOTRON_REWARD_HOST"
CRITIC_HOST_ENV = "NEMOTRON_CRITIC_HOST"
# the final .nemo: NeMo's NeMoModelCheckpoint writes <explicit_log_dir>/checkpoints/<exp_manager.name>.nemo on
# train end (save_nemo_on_train_end: True in the actors' YAMLs) or at every save (always_save_nemo, which the
# critic gets); the names are the YAMLs' exp_manager.name
ACTOR_NAME = {"reinforce": "megatron_gpt_reinforce_actor", "ppo": "megatron_gpt_ppo_actor"}  # by recipe
CRITIC_NAME = "megatron_gpt_critic"


# ----------------------------------------------------------------------------- shared mappings


KL = {"k1": False, "abs": True}  # -> use_absolute_kl (calculate_kl_penalty: log-ratio, or its absolute value)


def _generation(g: Generation, refuse: Refusals, algo: str) -> list[tuple[str, Any]]:
    sampler = g.backend  # who samples rollouts (torch or vllm), not the engine
    if sampler != "torch":
        refuse("generation.backend", "NeMo-Aligner generates with Megatron (or TensorRT-LLM), not vLLM")
    out: list[tuple[str, Any]] = [
        (f"model.{algo}.sampling_params.temperature", g.temperature),
        (f"model.{algo}.sampling_params.top_k", g.top_k),
        (f"model.{algo}.sampling_params.top_p", g.top_p),
        (f"model.{algo}.length_params.max_length", g.max_new_tokens),
    ]
    if g.stop_strings:  # empty keeps the YAML's end strings (the NeMo chat template's turn end)
        out.append((f"model.{algo}.sampling_params.end_strings", list(g.stop_strings)))
    return out


def _actor_common(
    c: RLConfig, refuse: Refusals, algo: str, job_dir: str, batch: int
) -> list[tuple[str, Any]]:
    t, ck, ev, rw = c.trainer, c.checkpoint, c.eval, c.reward
    refuse.unless_default("trainer.log_interval", "NeMo-Aligner logs every step")
    if rw.source != "server":
        refuse("reward.source", "NeMo-Aligner scores through its reward-model server only")
    refuse.all_unless_default(
        ("reward.server.url", "the job serves the reward model itself and passes its address"),
        ("reward.server.token_file", "NeMo-Aligner's PyTriton servers take no token"),
        ("reward.server.timeout_s", "NeMo-Aligner's client has its own timeouts"),
        ("reward.server.retries", "NeMo-Aligner's client does not retry"),
        ("checkpoint.resume", "NeMo-Aligner resumes only from its own log dir in this job"),
        ("checkpoint.resume_from", "NeMo-Aligner resumes only from its own log dir in this job"),
        ("checkpoint.force", "NeMo-Aligner has no check to force past"),
        ("eval.task", "our ground-truth scorers do not run inside NeMo-Aligner"),
        ("eval.seed", "NeMo-Aligner validates with the run's seed"),
    )
    if ev.num_prompts == 0:
        refuse(
            "eval.num_prompts", "NeMo-Aligner validates at every save (its checkpoints rank by val_rewards)"
        )
    prompts = c.inputs.prompts or ""
    every = ck.save_interval or t.max_steps
    return [
        ("pretrained_checkpoint.restore_from_path", c.inputs.policy or ""),
        ("model.data.data_impl", "jsonl"),
        # our eval uses the first N training prompts: the same file is the validation set
        ("model.data.data_prefix", {"train": [prompts], "validation": [prompts], "test": [prompts]}),
        ("exp_manager.explicit_log_dir", f"{job_dir}/actor_results"),
        (f"trainer.{algo}.max_steps", t.max_steps),
        (f"trainer.{algo}.val_check_interval", every),
        (f"trainer.{algo}.save_interval", every),
        (f"trainer.{algo}.gradient_clip_val", c.optim.clip_grad),
        (f"model.{algo}.num_rollout_samples", t.num_prompts_per_step),
        (f"model.{algo}.num_val_samples", max(ev.num_prompts, 1)),
        ("model.micro_batch_size", t.micro_batch_size),
        ("model.global_batch_size", batch),
        *optim_overrides(c.optim, refuse, "optim"),
        *_generation(c.generation, refuse, algo),
        *runtime_overrides(c.runtime, refuse),
    ]


def _kl(a: Reinforce | PPO, refuse: Refusals, algo: str) -> list[tuple[str, Any]]:
    """The KL penalty of the algorithm group `a` (reinforce.* or ppo.*, named `algo`)."""
    if a.kl_estimator not in KL:
        refuse(f"{algo}.kl_estimator", "NeMo-Aligner's KL is the log-ratio (k1) or its absolute value (abs)")
    return [
        (f"trainer.{algo}.initial_policy_kl_penalty", a.initial_policy_kl_penalty),
        (f"trainer.{algo}.use_absolute_kl", KL.get(a.kl_estimator, True)),
    ]


def _reward_server(
    rm: str,
    port: Any,
    nodes: int,
    gpus: int,
    runtime: TrainRuntime | ServeRuntime,
    inference: Sequence[tuple[str, Any]] = (),
) -> Script:
    """serve_reward_model.py on `rm`; `inference` adds rm/serve's own `inference.*` overrides."""
    precision = PRECISION.get(runtime.precision, ("bf16", True))[0]
    return Script(
        "reward",
        f"{SCRIPTS}/serve_reward_model.py",
        "inference_rm.yaml",
        [
            ("rm_model_file", rm),
            ("inference.port", port),
            *inference,
            *placement(nodes, gpus),
            ("trainer.precision", precision),
        ],
        nodes,
        threads(runtime),
    )


def _actor(
    c: RLConfig,
    refuse: Refusals,
    algo: str,
    a: Reinforce | PPO,
    job_dir: str,
    batch: int,
    nodes: int,
    gpus: int,
    wiring: list[tuple[str, Any]],
    servers: tuple[tuple[str, str], ...],
) -> Script:
    """The actor's group, `a` its algorithm's group (`algo`): each server takes one node (as in the tag's docs),
    the actor the rest, at least one."""
    actor_nodes = max(1, nodes - len(servers))
    overrides = [*_actor_common(c, refuse, algo, job_dir, batch), *_kl(a, refuse, algo), *wiring]
    return Script(
        "actor",
        f"{SCRIPTS}/train_gpt_{algo}_actor.py",
        f"gpt_{algo}_actor.yaml",
        [*overrides, *placement(actor_nodes, gpus)],
        actor_nodes,
        threads(c.runtime),
        servers,
    )


# ----------------------------------------------------------------------------- the steps


def compile_reinforce(
    c: ReinforceConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int
) -> AlignerRun:
    r = c.reinforce
    refuse.all_unless_default(
        ("reinforce.kl_in", "NeMo-Aligner subtracts beta times the mean token KL from each reward"),
        ("reinforce.reinforce_epochs", "NeMo-Aligner's REINFORCE makes one pass over each rollout batch"),
        ("reinforce.loss_level", "NeMo-Aligner averages the loss over the tokens"),
        ("reinforce.truncated_responses", "NeMo-Aligner keeps truncated responses' rewards"),
        *refusing("reinforce.", ASYNC_KEYS, "NeMo-Aligner's REINFORCE generates and trains in turn"),
        *refusing("reinforce.", CORRECTION_KEYS, "NeMo-Aligner's REINFORCE loss has no importance weights"),
    )
    batch = c.trainer.num_prompts_per_step * r.num_rollouts_per_prompt
    rm = _reward_server(c.inputs.reward_model or "", Env(REWARD_PORT_ENV, True), 1, gpus, c.runtime)
    wiring = [
        ("trainer.reinforce.num_rollouts_per_prompt", r.num_rollouts_per_prompt),
        ("remote_rm.reward_model.ip", Env(REWARD_HOST_ENV)),
        ("remote_rm.reward_model.port", Env(REWARD_PORT_ENV, True)),
    ]
    servers = ((REWARD_HOST_ENV, REWARD_PORT_ENV),)
    actor = _actor(c, refuse, "reinforce", r, job_dir, batch, nodes, gpus, wiring, servers)
    outputs = {"policy": nemo_path(job_dir, "actor_results", ACTOR_NAME["reinforce"])}
    return AlignerRun([rm, actor], outputs, {REWARD_PORT_ENV: 0}, [])


def compile_ppo(c: PPOConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> AlignerRun:
    p, t, critic = c.ppo, c.trainer, c.critic
    refuse.all_unless_default(
        ("ppo.num_rollouts_per_prompt", "NeMo-Aligner's PPO samples one response per prompt"),
        ("ppo.dual_clip", "NeMo-Aligner's PPO loss has no dual clip"),
        ("ppo.ppo_epochs", "NeMo-Aligner's PPO makes one pass over each rollout batch"),
        ("ppo.loss_level", "NeMo-Aligner averages the losses over the tokens"),
    )
    rm_path = c.inputs.reward_model or ""
    batch = t.num_prompts_per_step
    precision, o2 = PRECISION.get(c.runtime.precision, ("bf16", True))
    critic_server = Script(
        "critic",
        f"{SCRIPTS}/serve_ppo_critic.py",
        "gpt_ppo_critic.yaml",
        [
            ("pretrained_checkpoint.restore_from_path", rm_path),
            ("trainer.ppo.port", Env(CRITIC_PORT_ENV, True)),
            # the reward model has a server of its own (group 1), as the three groups ask
            ("trainer.ppo.combine_rm_and_critic_server", False),
            ("trainer.ppo.max_steps", t.max_steps),
            ("trainer.ppo.gradient_clip_val", critic.optim.clip_grad),
            ("exp_manager.explicit_log_dir", f"{job_dir}/critic_results"),
            # the critic server never ends training itself (save_nemo_on_train_end never fires): write the .nemo
            # at each save the actor asks for, the last one included
            ("exp_manager.checkpoint_callback_params.always_save_nemo", True),
            ("model.loss_clip_val", critic.loss_clip_val),
            ("model.micro_batch_size", t.micro_batch_size),
            ("model.global_batch_size", batch),
            *optim_overrides(critic.optim, refuse, "critic.optim"),
            ("trainer.precision", precision),
            ("model.megatron_amp_O2", o2),
            ("model.seed", c.runtime.seed),
            *placement(1, gpus),
        ],
        1,
        threads(c.runtime),
    )
    rm = _reward_server(rm_path, Env(REWARD_PORT_ENV, True), 1, gpus, c.runtime)
    wiring = [
        ("trainer.ppo.discount_factor", p.discount_factor),
        ("trainer.ppo.gae_lambda", p.gae_lambda),
        ("trainer.ppo.normalize_advantages", p.whiten_advantages),
        ("trainer.ppo.critic_warmup_steps", p.critic_warmup_steps),
        ("model.ppo.ratio_eps", p.ratio_eps),
        ("model.ppo.entropy_bonus", p.entropy_bonus),
        ("remote_critic_rm.combine_rm_and_critic_server", False),
        ("remote_critic_rm.reward_model.ip", Env(REWARD_HOST_ENV)),
        ("remote_critic_rm.reward_model.port", Env(REWARD_PORT_ENV, True)),
        ("remote_critic_rm.critic.ip", Env(CRITIC_HOST_ENV)),
        ("remote_critic_rm.critic.port", Env(CRITIC_PORT_ENV, True)),
    ]
    servers = ((CRITIC_HOST_ENV, CRITIC_PORT_ENV), (REWARD_HOST_ENV, REWARD_PORT_ENV))
    actor = _actor(c, refuse, "ppo", p, job_dir, batch, nodes, gpus, wiring, servers)
    outputs = {
        "policy": nemo_path(job_dir, "actor_results", ACTOR_NAME["ppo"]),
        "critic": nemo_path(job_dir, "critic_results", CRITIC_NAME),
    }
    ports = {REWARD_PORT_ENV: 0, CRITIC_PORT_ENV: 1}
    return AlignerRun([critic_server, rm, actor], outputs, ports, [])


def compile_serve(c: ServeConfig, refuse: Refusals, job_dir: str, nodes: int, gpus: int) -> AlignerRun:
    refuse.all_unless_default(
        ("server.mode", "serve_reward_model.py serves a reward model only (KServe v2 through PyTriton)"),
        ("server.host", "PyTriton listens on every interface"),
        ("server.token_file", "PyTriton takes no token"),
        ("server.max_batch_size", "PyTriton's batcher is sized by inference.inference_micro_batch_size"),
        ("server.max_queue_rows", "PyTriton has no such limit"),
        ("server.max_request_tokens", "PyTriton has no such limit"),
        ("server.max_queue", "PyTriton has no such limit"),
        ("server.read_timeout_s", "PyTriton has no such limit"),
        ("server.request_deadline_s", "PyTriton has no such limit"),
        ("server.max_connections", "PyTriton has no such limit"),
        ("server.max_body_bytes", "PyTriton has no such limit"),
    )
    s = c.server
    inference = [
        ("inference.model_name", s.model_name),
        ("inference.max_queue_delay_microseconds", round(s.max_queue_delay_ms * 1000)),
        ("inference.inference_micro_batch_size", s.preferred_batch_size),
    ]
    server = _reward_server(c.inputs.reward_model or "", s.port, nodes, gpus, c.runtime, inference)
    if c.runtime.device == "cpu":
        refuse("runtime.device", "NeMo-Aligner serves on GPUs only")
    notes = [
        f"server.max_length={s.max_length} has no effect: NeMo-Aligner's server scores the token sequences "
        "its client sends, cut to the model's encoder_seq_length"
    ]
    return AlignerRun([server], {}, {}, notes)


# recipe (a manifest's `engines.nemo_aligner`) -> its compiler, which reads the step's own Config: the one the
# catalog loaded from the step's schema.py, whose class mypy knows as rl.<name>.schema's or rm.serve.schema's
RECIPES: dict[str, Callable[[Any, Refusals, str, int, int], AlignerRun]] = {
    "reinforce": compile_reinforce,
    "ppo": compile_ppo,
    "reward_server": compile_serve,
    "dpo": compile_dpo,
}


def compile_aligner(
    step_id: str,
    config: BaseModel,
    where: Placement,
    labels: RunLabels | None = None,
) -> AlignerRun:
    """Our resolved step config (compile's validated config, input refs already paths: `Job.step_model`) -> the
    groups of NeMo-Aligner's heterogeneous job, for the job dir, nodes and GPUs per node the executor gives (`where`).
    Raises one UserError listing every setting NeMo-Aligner cannot express. `labels` name the tracker runs (default:
    the job dir's name)."""
    job_dir = where.job_dir
    recipe = recipe_for(step_id, "nemo_aligner", "NeMo-Aligner mapping")
    refuse = Refusals.of(
        step_id,
        config,
        engine=f"backend=nemo_aligner (NeMo-Aligner {NEMO_ALIGNER_VERSION})",
        hint="Change them, or run with backend=builtin. docs/nemo-aligner.md lists every key's mapping.",
    )
    for problem in builtin_refusals(config, who="backend=nemo_aligner"):
        refuse.problems.append(problem)
    run = {**RECIPES, **SUPERVISED}[recipe](config, refuse, job_dir, where.nodes, where.gpus_per_node)
    tracking = getattr(config, "tracking", None)  # the trainers' schemas have it; rm/serve's has not
    if tracking is not None:
        overrides, env = aligner_exp_manager(
            tracking, refuse, labels or RunLabels.from_job_dir(job_dir, step_id), Env
        )
        actor = run.groups[-1]  # the trainer: only it logs metrics (the servers keep their TensorBoard)
        actor = replace(actor, overrides=[*actor.overrides, *overrides], env={**actor.env, **env})
        run = replace(run, groups=[*run.groups[:-1], actor])
    refuse.problems += batch_problems(run, where.gpus_per_node)
    refuse.raise_any()
    return run
