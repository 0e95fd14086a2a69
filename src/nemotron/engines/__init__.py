"""Engines: who trains a compiled Job. One folder per engine (builtin/, nemo_rl/, nemo_aligner/, nemo/), each an
`engine.py` class behind `Engine` and its own compilers, chosen by the config's `backend` (the registry is
`nemotron.engines.base.ENGINES`); the traits below answer what the centre asks of an engine without loading it, so
no module outside the registries compares engine names."""

# What the centre asks of an engine without loading it, answered here so that no module outside the registry
# compares engine names: each table lists the engines that have the trait.
RUNS_AS_STEP_PROCESS = (
    "builtin",
)  # runs the step's own step.py in our step process; the others run their own
KEEPS_TENSORBOARD_METRICS = ("nemo_rl",)  # logs metrics as TensorBoard events under its own names, not ours
READS_NEMO_RL_GROUP = ("nemo_rl",)  # reads a config's `nemo_rl.*` keys (the others refuse them set)
READS_TOKENIZER_JSON_ONLY = ("builtin",)  # loads a checkpoint's tokenizer from tokenizer.json alone
# engine -> "module:function" of its own preflight rules: (manifest, validated config, bindings) -> problems
PREFLIGHT_RULES: dict[str, str] = {"nemo_rl": "nemotron.engines.nemo_rl.evaluation:preflight_problems"}
# engine -> "module:function" of its resource plan's process groups: (nemotron.plan.groups.PlanContext, validated
# config, workload) -> groups; an engine not here is planned as the built-in one (one process per device)
PLAN_GROUPS: dict[str, str] = {
    "builtin": "nemotron.engines.builtin.plan:plan_groups",
    "nemo_rl": "nemotron.engines.nemo_rl.plan:plan_groups",
    "nemo_aligner": "nemotron.engines.nemo_aligner.plan:plan_groups",
}
