"""What the centre knows of each engine (a config's `backend`) without loading it: one table per trait, listing the
engines that have it, and the registry of the engines themselves (they live in nemotron.engines, one folder
each); these tables sit here, below everything that reads them (the plan, the preflight,
lineage, the trackers, the RL stages), so that no module outside the registries compares engine names and none
imports upwards to ask."""

# The registry: backend name -> "module:Class" of its engine (nemotron.engines.base.Engine), imported on first use
# so the CLI's start-up stays light.
ENGINES: dict[str, str] = {
    "builtin": "nemotron.engines.builtin.engine:BuiltinEngine",
    "nemo_rl": "nemotron.engines.nemo_rl.engine:NemoRLEngine",
    "nemo_aligner": "nemotron.engines.nemo_aligner.engine:NemoAlignerEngine",
    "nemo": "nemotron.engines.nemo.engine:NemoConvertEngine",
}
# What the centre asks of an engine without loading it, answered here so that no module outside the registry
# compares engine names: each table lists the engines that have the trait.
RUNS_AS_STEP_PROCESS = (
    "builtin",
)  # runs the step's own step.py in our step process; the others run their own
KEEPS_TENSORBOARD_METRICS = ("nemo_rl",)  # logs metrics as TensorBoard events under its own names, not ours
READS_NEMO_RL_GROUP = ("nemo_rl",)  # reads a config's `nemo_rl.*` keys (the others refuse them set)
READS_TOKENIZER_JSON_ONLY = ("builtin",)  # loads a checkpoint's tokenizer from tokenizer.json alone
# engine -> "module:function" of its own preflight (nemotron.compile.preflight.EngineRules): its rules' problems and
# the GPU groups whose parallel sizes must divide their GPUs; an engine not here has neither (data parallel only)
PREFLIGHT_RULES: dict[str, str] = {
    "nemo_rl": "nemotron.engines.nemo_rl.preflight:preflight",
    "nemo_aligner": "nemotron.engines.nemo_aligner.preflight:preflight",
}
# engine -> "module:function" of its resource plan's process groups: (nemotron.plan.groups.PlanContext, validated
# config, workload) -> groups; an engine not here is planned as the built-in one (one process per device)
PLAN_GROUPS: dict[str, str] = {
    "builtin": "nemotron.engines.builtin.plan:plan_groups",
    "nemo_rl": "nemotron.engines.nemo_rl.plan:plan_groups",
    "nemo_aligner": "nemotron.engines.nemo_aligner.plan:plan_groups",
}
