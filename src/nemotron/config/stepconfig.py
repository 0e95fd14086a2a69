"""Config groups shared by step schemas (plain pydantic, no torch: schemas load on the CLI's start-up path)."""

# ruff: noqa: RUF012  (a list or dict default below is a pydantic field default, copied for each instance; ruff
# cannot tell that Strict, imported, is a pydantic model)

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, model_validator

# the RL steps' own groups live in rlgroups and the base of every group in strict; a step schema imports them all
# from here
from nemotron.config.rlgroups import Evaluation as Evaluation
from nemotron.config.rlgroups import Generation as Generation
from nemotron.config.rlgroups import GenerationEngine as GenerationEngine
from nemotron.config.rlgroups import KLEstimator as KLEstimator
from nemotron.config.rlgroups import NemoRL as NemoRL
from nemotron.config.rlgroups import RewardServer as RewardServer
from nemotron.config.rlgroups import RewardSource as RewardSource
from nemotron.config.rlgroups import RLInputs as RLInputs
from nemotron.config.rlgroups import RLTrainer as RLTrainer
from nemotron.config.rlgroups import kl_estimator_field as kl_estimator_field
from nemotron.config.strict import Strict as Strict
from nemotron.config.workload import Rollouts, Training, Workload


def _number_as_word(value: object) -> object:
    """`convert.precision=32` on the command line is the number 32: NeMo's converter scripts take the word."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


# The families NeMo's checkpoint converters take both ways, and the dtype word their --precision takes
# (convert/hf_to_nemo, convert/nemo_to_hf).
NemoFamily = Literal["llama", "qwen2", "mistral"]
NemoPrecision = Annotated[Literal["32", "16", "bf16"], BeforeValidator(_number_as_word)]


def kv_heads(family: str, n_head: int) -> int:
    """Key/value heads of a model built from `model.*`: Llama (and GPT-2) keep one per query head; Qwen2 and
    Mistral use grouped-query attention, half as many when n_head is even, so the tiny models take the same code
    paths as the real ones."""
    return n_head if family in ("gpt2", "llama") or n_head % 2 else n_head // 2


class ModelArch(Strict):
    """Architecture of a model built from a config with random weights (no inputs.init_from): a tiny member of a
    Hugging Face causal-LM family, named in GPT-2's terms. With inputs.init_from the checkpoint's architecture is
    the model's, so a key here that differs from its default is refused (exit 2) rather than ignored."""

    family: Literal["gpt2", "llama", "qwen2", "mistral"] = "gpt2"
    """the transformers model family (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM,
    MistralForCausalLM); refused with inputs.init_from"""
    n_layer: int = Field(2, ge=1)
    """transformer blocks (GPT2Config.n_layer, num_hidden_layers); refused with inputs.init_from"""
    n_embd: int = Field(64, ge=8)
    """hidden size; must divide by n_head (GPT2Config.n_embd, hidden_size); refused with inputs.init_from"""
    n_head: int = Field(4, ge=1)
    """attention heads per block (GPT2Config.n_head, num_attention_heads); refused with inputs.init_from"""
    n_positions: int = Field(32, ge=8)
    """context length in tokens: prompt plus response must fit (GPT2Config.n_positions,
    max_position_embeddings); refused with inputs.init_from"""

    def changed(self) -> list[str]:
        """`model.KEY=VALUE` for each key that differs from its default."""
        return [
            f"model.{key}={value!r}"
            for key, value in self.model_dump().items()
            if value != type(self).model_fields[key].default
        ]


class ResourcePlan(Strict):
    """The resource plan: memory per device of each process group, checked before anything is submitted
    (docs/cluster.md, "The resource plan")."""

    on_no_fit: Literal["refuse", "warn"] = "refuse"
    """refuse: a plan whose peak exceeds a device's memory is exit 2 before anything is written, naming the
    keys that would make it fit; warn: print that as a warning and submit anyway"""
    models: dict[str, str] = {}
    """role (policy, reward_model, judge) -> a Hugging Face id from the plan's shape table, for a model whose
    checkpoint is not readable here (a path on the cluster); a readable checkpoint's own config wins"""


class SupervisedTrainer(Strict):
    """The training loop of sft and rm/train: each optimizer step learns from a random global batch of the
    training records (sft examples, rm/train preference pairs); a seeded share is held out."""

    max_steps: int = Field(300, ge=1)
    """optimizer steps (NeMo-Aligner: trainer.{sft,rm}.max_steps)"""
    global_batch_size: int = Field(64, ge=1)
    """records per optimizer step, split evenly over ranks (NeMo-Aligner: model.global_batch_size)"""
    max_length: int = Field(32, ge=4)
    """tokens per sequence (prompt + response, + EOS for sft); longer ones are cut"""
    validation_fraction: float = Field(0.05, ge=0, lt=1)
    """share of records held out (seeded split) for sft's val_loss and rm/train's val_accuracy (rm/train holds
    out at least one pair)"""
    log_interval: int = Field(25, ge=1)
    """print a summary line and validate every N steps"""


class Optim(Strict):
    """AdamW and its learning-rate schedule (NeMo-Aligner: model.optim; NeMo-RL: policy.optimizer)."""

    lr: float = Field(1e-5, gt=0)
    """peak learning rate, reached after warmup_steps (NeMo-Aligner: optim.lr; TRL: learning_rate)"""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay (NeMo-Aligner: optim.weight_decay)"""
    adam_beta1: float = 0.9
    """AdamW beta1, the gradient moving-average factor (NeMo-Aligner: optim.betas[0])"""
    adam_beta2: float = 0.999
    """AdamW beta2, the squared-gradient moving-average factor (NeMo-Aligner: optim.betas[1])"""
    clip_grad: float = Field(1.0, gt=0)
    """max global gradient norm before each step (NeMo-Aligner: gradient_clip_val; NeMo-RL: max_grad_norm)"""
    warmup_steps: int = Field(0, ge=0)
    """optimizer steps of linear warm-up from lr/warmup_steps to lr (0 = none; NeMo-Aligner:
    optim.sched.warmup_steps)"""
    min_lr_ratio: float = Field(1.0, gt=0, le=1)
    """decay linearly to lr * this by the last step (1 = constant; NeMo-Aligner: optim.sched.min_lr / lr). The
    built-in RL steps do not decay yet: there only warm-up applies"""


class Checkpointing(Strict):
    """Training checkpoints for exact resume (weights, optimizer, RNG streams, data position)."""

    save_interval: int = Field(0, ge=0)
    """save a resume checkpoint every N steps (0 = none: a crash starts over, and only Slurm's time-limit warning
    saves one); the trained model is written as the step's output at the end either way (TRL: save_steps)"""
    resume: bool | Literal["auto"] = "auto"
    """auto: the same command after a crash continues where it stopped (an earlier job of this step that did not
    succeed, made from the same config and inputs, left a checkpoint: the run resumes it and says so in one line);
    true: continue the newest earlier job of this step that has a checkpoint (or resume_from's); false: start
    afresh"""
    resume_from: str | None = None
    """job id or checkpoint dir to resume from"""
    force: bool = False
    """resume even if the checkpoint's model or config differs"""


class ServerBind(Strict):
    """Where a server the step starts listens, and where its bearer token comes from. The compiler finds every
    group of this type in a step's schema and refuses a non-loopback host without a token before a job exists
    (nemotron.reward.bind); the server refuses it again when it starts."""

    host: str = "127.0.0.1"
    """bind address; loopback unless told otherwise. Any other address (0.0.0.0) needs a bearer token, else
    the step refuses to start (exit 2, before a job directory is written)"""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port; 0 = a free port (written to the job's server.json)"""
    token_file: str | None = None
    """file (mode 0600) holding the bearer token that every request but the health probes must carry; unset:
    the token is $NEMOTRON_REWARD_TOKEN (on Slurm: a profile env_var, kept in the job's 0600 secrets file);
    neither: no auth. Never the token itself: a command line is visible in ps"""


Backend = Literal["builtin", "nemo_rl"]
AlignerBackend = Literal["builtin", "nemo_rl", "nemo_aligner"]  # the steps NeMo-Aligner's workflows cover


def engine_name(config: Mapping[str, Any] | BaseModel) -> str:
    """The engine a step config names (its `backend`, as a dict or as its validated Config); builtin for a step
    whose schema has no `backend` (sft, rm/train, data/prep, a user's step). The one place that default lives."""
    chosen = config.get("backend") if isinstance(config, Mapping) else getattr(config, "backend", None)
    return str(chosen or "builtin")


def backend_field(nemo_rl_runs: str, nemo_aligner_runs: str = "") -> Any:
    """The `backend` field of an RL step; `nemo_rl_runs` names what NeMo-RL runs for it (e.g. "PPO"), and
    `nemo_aligner_runs` what NeMo-Aligner runs (empty: the step has no NeMo-Aligner backend)."""
    aligner = (
        f"; nemo_aligner: NeMo-Aligner v0.7.0's {nemo_aligner_runs} on .nemo checkpoints, a heterogeneous Slurm job "
        "(see docs/nemo-aligner.md)"
        if nemo_aligner_runs
        else ""
    )
    return Field(
        "builtin",
        description="builtin: our torch engine (one process, or torchrun data parallel); nemo_rl: NeMo-RL v0.7.0 "
        f"{nemo_rl_runs} in its container on GPUs (see docs/nemo-rl.md){aligner}",
    )


def _no_password_in_uri(uri: str | None) -> str | None:
    if uri and urlsplit(uri).password:
        raise ValueError(
            "a password in the tracking URI would be shown by every dry-run and kept in the job record: set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the environment "
            "or the profile's env_vars instead"
        )
    return uri


class MlflowTracking(Strict):
    """MLflow: the run's config, metrics (metrics.jsonl's names) and system metrics, and each registered artifact
    as a logged model that names its inputs (docs/tracking.md). Credentials only from the environment
    (MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD), never the config."""

    enabled: bool = False
    """log this job to MLflow (NeMo-RL: logger.mlflow_enabled)"""
    tracking_uri: Annotated[str | None, AfterValidator(_no_password_in_uri)] = None
    """the tracking server (http://host:5000) or a local store (file:/path, sqlite:///path); unset:
    $MLFLOW_TRACKING_URI, and with neither the job is refused before it starts (NeMo-RL:
    logger.mlflow.tracking_uri). A password in it is refused: the config is shown by dry-runs and kept in the
    job record"""
    experiment: str = "nemotron"
    """experiment the run is logged under, created if missing (NeMo-RL: logger.mlflow.experiment_name)"""
    run_name: str | None = None
    """the run's name; unset: the job id (NeMo-RL: logger.mlflow.run_name)"""
    tags: dict[str, str] = {}
    """extra run tags; nemotron adds nemotron.job_id, nemotron.step and nemotron.preset"""


class WandbTracking(Strict):
    """Weights & Biases: the run's config, metrics (metrics.jsonl's names) and system metrics, and each
    registered artifact as a W&B artifact used by its inputs' artifacts, so W&B draws the lineage
    (docs/tracking.md). The API key only from the environment (WANDB_API_KEY) or ~/.netrc, never the config."""

    enabled: bool = False
    """log this job to W&B (NeMo-RL: logger.wandb_enabled)"""
    project: str = "nemotron"
    """W&B project (NeMo-RL: logger.wandb.project)"""
    entity: str | None = None
    """team or user that owns the project; unset: the API key's default entity"""
    name: str | None = None
    """the run's display name; unset: the job id (NeMo-RL: logger.wandb.name)"""
    mode: Literal["online", "offline"] = "online"
    """online: stream to the W&B server; offline: write the run under the job dir's wandb/ only, for `wandb
    sync` (or `nemotron jobs sync`) later"""
    tags: list[str] = []
    """extra run tags; nemotron adds the step and the preset"""


class Tracking(Strict):
    """Experiment trackers the job logs to, besides its own metrics.jsonl and TensorBoard. A tracker that is
    down never fails training: its calls are retried, then it is warned about and skipped for the rest of the
    job, and `nemotron jobs sync JOB_ID` replays the finished job into it (docs/tracking.md)."""

    mlflow: MlflowTracking = Field(default_factory=MlflowTracking)
    wandb: WandbTracking = Field(default_factory=WandbTracking)
    retries: int = Field(3, ge=0)
    """re-sends, with exponential backoff, of a tracker call that failed before the tracker is skipped"""


class DataRuntime(Strict):
    """Process settings of a step that runs no model."""

    seed: int = 1234
    """seed of everything the step draws at random"""


class Runtime(Strict):
    """Process settings: seeds, CPU threads, device and precision (docs/rl-engine.md)."""

    seed: int = 1234
    """seed of model init, data order and sampling (rank r samples with seed*1000+r)"""
    num_threads: int = Field(2, ge=1)
    """torch CPU threads per process"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """where models, optimizer state and batches live: auto = CUDA when present, else the CPU; each torchrun
    rank takes cuda:LOCAL_RANK. cuda on a machine without one is exit 2 before any work. NeMo-RL refuses
    cpu"""
    precision: Literal["fp32", "bf16", "bf16-mixed"] = "fp32"
    """fp32; bf16 (weights, gradients and optimizer state in bfloat16); bf16-mixed (fp32 master weights and
    optimizer, forwards under bfloat16 autocast). Logprobs for the loss and the KL are fp32 in every mode"""


class ServeRuntime(Strict):
    """Process settings of a server: CPU threads, device and weight precision."""

    num_threads: int = Field(2, ge=1)
    """torch CPU threads of the server process"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """where the served model runs: auto = CUDA when present (cuda:LOCAL_RANK), else the CPU; cuda on a
    machine without one is exit 2"""
    precision: Literal["fp32", "bf16"] = "fp32"
    """dtype of the served weights"""


class TrainRuntime(Runtime):
    """Process settings of a training step: Runtime plus memory controls."""

    gradient_checkpointing: bool = False
    """recompute each block's activations in the backward pass instead of storing them: less memory, about a
    third more compute (transformers' activation_checkpointing_enable)"""
    sharding: Literal["ddp", "fsdp"] = "ddp"
    """how the built-in engine spreads a trained model over its ranks: ddp (every rank holds the whole model, its
    gradients and AdamW state; gradients summed over ranks) or fsdp (FSDP2: each decoder layer, then the root,
    sharded over the ranks, so each holds 1/N of all three and gathers a layer at a time; mixed precision as
    runtime.precision says). The final checkpoint is gathered into one Hugging Face checkpoint either way; fsdp's
    resume state is sharded (torch.distributed.checkpoint). Pick fsdp when the plan refuses ddp for memory
    (docs/cluster.md). NeMo-RL and NeMo-Aligner shard by their own settings (nemo_rl.*)"""
    fsdp_cpu_offload: bool = False
    """with sharding fsdp on GPUs: keep the weight shards and AdamW state in host memory between uses (FSDP2's
    CPUOffloadPolicy; the optimizer steps on the CPU). Refused with ddp and on the CPU, where there is nothing to
    offload from"""

    @model_validator(mode="after")
    def _offload_needs_fsdp_on_gpu(self) -> Self:
        """Accepted-but-ignored is refused: CPU offload acts only on FSDP shards that live on a GPU."""
        if self.fsdp_cpu_offload and self.sharding != "fsdp":
            raise ValueError("fsdp_cpu_offload acts only with sharding: fsdp")
        if self.fsdp_cpu_offload and self.device == "cpu":
            raise ValueError("fsdp_cpu_offload offloads GPU memory; with device: cpu there is none")
        return self


class NemoRLTraining(Strict):
    """Settings only `backend: nemo_rl` reads in a step that trains one model on a dataset (NeMo-RL v0.7.0's
    run_sft.py, run_rm.py). The built-in backend refuses non-default values here, because there they would do
    nothing."""

    policy_backend: Literal["dtensor", "megatron"] = "dtensor"
    """NeMo-RL's training backend: PyTorch DTensor (FSDP2) or Megatron-Core"""
    tensor_parallel_size: int = Field(1, ge=1)
    """tensor-parallel size of the training"""
    pipeline_parallel_size: int = Field(1, ge=1)
    """pipeline-parallel size; Megatron-Core only"""
    context_parallel_size: int = Field(1, ge=1)
    """context-parallel size of the training"""
    sequence_packing: bool = False
    """pack several sequences into one row (NeMo-RL: policy.sequence_packing.enabled)"""


class RLConfig(Strict):
    """The groups rl/reinforce and rl/ppo share, in NeMo-Aligner's layout; each step adds its outputs and its
    algorithm's group."""

    backend: AlignerBackend = backend_field(
        "GRPO run as RLOO (rl/reinforce) or PPO (rl/ppo)",
        "REINFORCE (reward server + actor; rl/reinforce) or PPO (critic server, reward server + actor; rl/ppo)",
    )
    inputs: RLInputs = Field(default_factory=RLInputs)
    trainer: RLTrainer = Field(default_factory=RLTrainer)
    optim: Optim = Field(default_factory=Optim)
    """the policy's (actor's) optimizer"""
    generation: Generation = Field(default_factory=Generation)
    reward: RewardSource = Field(default_factory=RewardSource)
    checkpoint: Checkpointing = Field(default_factory=Checkpointing)
    eval: Evaluation = Field(default_factory=Evaluation)
    runtime: TrainRuntime = Field(default_factory=TrainRuntime)
    tracking: Tracking = Field(default_factory=Tracking)
    nemo_rl: NemoRL = Field(default_factory=NemoRL)
    plan: ResourcePlan = Field(default_factory=ResourcePlan)
    """the resource plan's model hints and what a plan that cannot fit does"""

    def rollouts(self, per_prompt: int) -> Rollouts:
        """The work of one step as the resource plan reads it, `per_prompt` responses to each prompt."""
        micro_batch = ("trainer.micro_batch_size", self.trainer.micro_batch_size)
        prompts = ("trainer.num_prompts_per_step", self.trainer.num_prompts_per_step)
        return self.generation.rollouts(micro_batch, prompts, per_prompt)


class SupervisedConfig(Strict):
    """The groups sft and rm/train share, in the order their references list them. Each step narrows `inputs` and
    `outputs` to its own, says what `model` builds and gives its optimizer's defaults; `rows_per_record` is how
    many rows one of its records becomes in a forward pass (2: a preference pair's two responses)."""

    backend: AlignerBackend = backend_field(
        "SFT (run_sft.py) or Bradley-Terry reward-model training (run_rm.py), from a pretrained model",
        "SFT (train_gpt_sft.py) or reward-model training (train_reward_model.py) on .nemo checkpoints",
    )
    inputs: Strict = Field(default_factory=Strict)
    outputs: Strict = Field(default_factory=Strict)
    model: ModelArch = Field(default_factory=ModelArch)
    trainer: SupervisedTrainer = Field(default_factory=SupervisedTrainer)
    optim: Optim = Field(default_factory=Optim)
    checkpoint: Checkpointing = Field(default_factory=Checkpointing)
    runtime: TrainRuntime = Field(default_factory=TrainRuntime)
    tracking: Tracking = Field(default_factory=Tracking)
    nemo_rl: NemoRLTraining = Field(default_factory=NemoRLTraining)
    plan: ResourcePlan = Field(default_factory=ResourcePlan)
    """the resource plan's model hints and what a plan that cannot fit does"""

    rows_per_record: ClassVar[int] = 1

    @model_validator(mode="after")
    def _model_builds_only_without_init_from(self) -> Self:
        """Accepted-but-ignored is refused: model.* builds a random init, which inputs.init_from replaces."""
        changed = self.model.changed()
        if getattr(self.inputs, "init_from", None) and changed:
            raise ValueError(
                f"{', '.join(changed)}: model.* builds a random init, which inputs.init_from replaces (the "
                "checkpoint's architecture is the model's); unset model.* or inputs.init_from"
            )
        return self

    def workload(self) -> Workload:
        t = self.trainer
        return Training(
            "trainer.global_batch_size",
            t.global_batch_size,
            t.max_length,
            rows_per_record=self.rows_per_record,
        )
