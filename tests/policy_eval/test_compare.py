"""`artifacts compare` as pure functions: the difference rule against hand-worked values, how prompts pair, the
config diff's masking and leaving out, the rendered table and the --json keys, and the --plot image."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemotron.errors import UserError
from nemotron.policy_eval.compare import (
    JobConfig,
    Report,
    Rule,
    align,
    compare,
    config_diff,
    difference,
    load_job_config,
    plot_metric,
)
from nemotron.policy_eval.compare_render import as_json, render_text
from nemotron.policy_eval.report import summarise
from nemotron.policy_eval.stats import bootstrap_interval

RULE = Rule("paired", resamples=1000, level=0.95, seed=0)


def rows(
    scores: list[float], metric: str = "reward_model", prompts: list[str] | None = None
) -> list[dict[str, Any]]:
    texts = prompts or [f"prompt {i}" for i in range(len(scores))]
    return [{"index": i, "prompt": p, metric: s} for i, (p, s) in enumerate(zip(texts, scores, strict=True))]


def report(
    ref: str, scores: list[float], texts: list[str] | None = None, prompts: str = "external.prompts.jsonl:v1"
) -> Report:
    r = rows(scores, prompts=texts)
    summary = {"metrics": summarise(r, ["reward_model"], resamples=1000, level=0.95, seed=0),
               "interval": {"resamples": 1000, "level": 0.95, "seed": 0}, "corpus": {"distinct_1": 0.5}}  # fmt: skip
    return Report(ref, summary, r, eval_job=None, policy=f"{ref}-policy", policy_job=None, policy_step=None,
                  prompts=prompts)  # fmt: skip


# ------------------------------------------------------------------------------------------ the difference rule


def test_a_shift_of_every_prompt_is_found_though_the_two_intervals_overlap() -> None:
    """Scores spread over 0..9 twice (n=20), the other report half a point higher on every prompt: each report's
    own interval is about ±1.3 wide, so they overlap; the per-prompt differences are all exactly +0.5, so every
    resample's mean is 0.5 and the paired interval is [0.5, 0.5]. Unpaired, the same data cannot tell."""
    a = [float(i % 10) for i in range(20)]
    b = [x + 0.5 for x in a]
    ia, ib = bootstrap_interval(a), bootstrap_interval(b)
    assert ia.high > ib.low  # the non-overlap rule would call this noise
    d = difference("reward_model", rows(a), rows(b), list(range(20)), RULE)
    assert d is not None and (d.mean, d.low, d.high, d.n, d.verdict) == (0.5, 0.5, 0.5, 20, "higher")
    u = difference("reward_model", rows(a), rows(b), None, RULE)
    assert u is not None and u.verdict == "inconclusive" and u.low < 0 < u.high and u.mean == 0.5


def test_lower_is_the_mirror_of_higher() -> None:
    a = [float(i % 10) for i in range(20)]
    d = difference("reward_model", rows(a), rows([x - 0.25 for x in a]), list(range(20)), RULE)
    assert d is not None and (d.mean, d.low, d.high, d.verdict) == (-0.25, -0.25, -0.25, "lower")


def test_two_prompts_that_move_in_opposite_directions_are_inconclusive() -> None:
    """Differences [+1, -1]: a resample of two has mean -1, 0 or +1 with chances 1/4, 1/2, 1/4, so the 2.5% and
    97.5% quantiles of 1000 resample means are -1 and +1 (each end holds ~250 of them)."""
    d = difference("reward_model", rows([0.0, 1.0]), rows([1.0, 0.0]), [0, 1], RULE)
    assert d is not None and (d.mean, d.low, d.high, d.verdict) == (0.0, -1.0, 1.0, "inconclusive")


def test_the_level_comes_from_the_rule() -> None:
    """Differences [0, 1]: resample means 0, 0.5, 1 with chances 1/4, 1/2, 1/4. At 95% the interval is [0, 1]
    (touches 0: inconclusive); at 40% its quantiles 0.3 and 0.7 both fall among the ~500 means of 0.5, so it is
    [0.5, 0.5]: higher."""
    a, b = rows([0.0, 0.0]), rows([0.0, 1.0])
    wide = difference("reward_model", a, b, [0, 1], RULE)
    narrow = difference("reward_model", a, b, [0, 1], Rule("paired", 1000, 0.4, 0))
    assert wide is not None and (wide.low, wide.high, wide.verdict) == (0.0, 1.0, "inconclusive")
    assert narrow is not None and (narrow.low, narrow.high, narrow.verdict) == (0.5, 0.5, "higher")


def test_one_prompt_against_nineteen_still_counts_as_higher() -> None:
    """19 differences of +1 and one of -1 (mean 0.9): a resample's mean is <= 0 only if it drew the -1 at least
    10 times in 20 draws, a chance of about 1e-8, so the interval lies above 0."""
    a = [0.0] * 20
    b = [1.0] * 19 + [-1.0]
    d = difference("reward_model", rows(a), rows(b), list(range(20)), RULE)
    assert d is not None and d.mean == pytest.approx(0.9) and d.low > 0 and d.verdict == "higher"


def test_unpaired_by_hand() -> None:
    d = difference("reward_model", rows([0.0] * 8), rows([1.0] * 8), None, RULE)
    assert d is not None and (d.mean, d.low, d.high, d.n, d.verdict) == (1.0, 1.0, 1.0, 8, "higher")
    same = difference("reward_model", rows([0.0, 1.0] * 4), rows([1.0, 0.0] * 4), None, RULE)
    assert same is not None and same.mean == 0.0 and same.verdict == "inconclusive"


def test_prompts_without_the_metric_are_left_out_of_the_pairs() -> None:
    a = rows([1.0, 2.0, 3.0])
    b = rows([2.0, 3.0, 4.0])
    b[1]["reward_model"] = None
    d = difference("reward_model", a, b, [0, 1, 2], RULE)
    assert d is not None and (d.mean, d.n) == (1.0, 2)
    assert difference("task_score", a, b, [0, 1, 2], RULE) is None  # neither report has it


# ----------------------------------------------------------------------------------------------- prompts


def test_prompts_pair_by_text_whatever_their_order() -> None:
    assert align(["a", "b", "c"], ["c", "a", "b"]) == [1, 2, 0]
    assert align(["a", "b", "a"], ["a", "a", "b"]) == [0, 2, 1]  # the k-th repeat pairs with the k-th
    assert align(["a", "b"], ["a", "c"]) is None
    assert align(["a", "b"], ["a", "b", "b"]) is None
    assert align([("a", "1")], [("a", "2")]) is None  # same text, another reference answer


def test_a_reordered_prompt_file_is_compared_paired() -> None:
    first = report("r:v1", [0.0, 1.0, 2.0, 3.0], texts=["p0", "p1", "p2", "p3"])
    second = report("r:v2", [4.0, 3.0, 2.0, 1.0], texts=["p3", "p2", "p1", "p0"])  # each prompt +1
    c = compare(
        [first, second], [JobConfig(None, None, None, "x")] * 2, [JobConfig(None, None, None, "x")] * 2
    )
    (d,) = c.metrics[0].differences[1:]
    assert c.rule.test == "paired" and d is not None and (d.mean, d.low, d.high) == (1.0, 1.0, 1.0)


def test_different_prompt_sets_are_refused_unless_allowed() -> None:
    first = report("r:v1", [0.0, 1.0], texts=["p0", "p1"])
    other = report("r:v2", [0.0, 1.0], texts=["p0", "q1"], prompts="external.other.jsonl:v1")
    none = [JobConfig(None, None, None, "x")] * 2
    with pytest.raises(UserError) as e:
        compare([first, other], none, none)
    assert "r:v1 and r:v2 were made on different prompt sets" in str(e.value)
    assert "external.prompts.jsonl:v1" in str(e.value) and "external.other.jsonl:v1" in str(e.value)
    assert "--allow-different-prompts" in str(e.value)
    c = compare([first, other], none, none, allow_different_prompts=True)
    assert c.rule.test == "unpaired"


def test_the_same_prompts_with_other_reference_answers_are_another_prompt_set() -> None:
    first, second = report("r:v1", [0.0, 1.0]), report("r:v2", [0.0, 1.0])
    second.rows[1]["answer"] = "42"
    none = [JobConfig(None, None, None, "x")] * 2
    with pytest.raises(UserError, match="were made on different prompt sets"):
        compare([first, second], none, none)


def test_one_report_is_refused() -> None:
    with pytest.raises(UserError, match="at least two eval reports, got 1"):
        compare([report("r:v1", [1.0])], [], [])


# ------------------------------------------------------------------------------------------- the config diff


def test_the_config_diff_shows_what_differs_and_leaves_out_output_names_and_run_ids() -> None:
    one = {"optim.lr": 0.001, "outputs.policy": "a", "checkpoint.resume_from": "/h/jobs/rl-x-20261126-223945-9504/c",
           "trainer.max_steps": 2, "runtime.seed": 1}  # fmt: skip
    two = {"optim.lr": 0.002, "outputs.policy": "b", "checkpoint.resume_from": "/h/jobs/rl-x-20261127-101010-ab12/c",
           "trainer.max_steps": 2, "generation.top_k": 5}  # fmt: skip
    d = config_diff([JobConfig("j1", "rl/x", one), JobConfig("j2", "rl/x", two), JobConfig(None, None, None, "no job")],
                    ["outputs"])  # fmt: skip
    assert [k.key for k in d.keys] == ["generation.top_k", "optim.lr", "runtime.seed"]
    lr = d.keys[1]
    assert lr.values == [0.001, 0.002, None] and lr.set == [True, True, False]
    assert d.keys[0].set == [False, True, False] and d.keys[2].set == [True, False, False]
    assert d.left_out == ["outputs.policy"]
    assert [j.note for j in d.jobs] == ["", "", "no job"]


def test_inputs_are_compared_by_their_content() -> None:
    """The same files registered twice (two runs started at once each registered the shipped policy) are the same
    input; a different checkpoint is a different one, whatever its name."""
    same = [JobConfig(f"j{i}", "s", {"inputs.policy": f"external.sft_policy:v{i}"}, identity={"inputs.policy": "abc"})
            for i in (1, 2)]  # fmt: skip
    assert config_diff(same, ["outputs"]).keys == []
    other = [
        *same[:1],
        JobConfig("j3", "s", {"inputs.policy": "external.sft_policy:v1"}, identity={"inputs.policy": "def"}),
    ]
    (key,) = config_diff(other, ["outputs"]).keys
    assert key.key == "inputs.policy" and key.values == ["external.sft_policy:v1"] * 2


def test_a_job_config_shows_each_input_as_the_artifact_it_was_bound_to(tmp_path: Path) -> None:
    from nemotron.artifacts.store import ArtifactStore
    from nemotron.jobs.record import dump_record, parse_record

    store = ArtifactStore(tmp_path / "artifacts")
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.json").write_text("{}")
    (sft,) = store.register(
        [("sft_policy", "checkpoint_hf", tmp_path / "sft", {})], "sft-20261126-000000-abcd"
    )
    record = parse_record(
        {"job_id": "rl-x-20261126-010101-beef", "step": "rl/x", "preset": "tiny", "created_at": "now",
         "mode": "attached", "executor": "local", "profile": {}, "config_hash": "h", "launch": "",
         "config": {"inputs": {"policy": "sft_policy:latest"}, "optim": {"lr": 0.001, "betas": [0.9, 0.99]}},
         "inputs": [{"name": "policy", "expected_type": "checkpoint_hf", "ref": "sft_policy:latest", "kind": "store",
                     "artifact_id": sft.id, "artifact": sft.ref}]},
        tmp_path / "job.yaml",
    )  # fmt: skip
    jobs = tmp_path / "jobs"
    (jobs / record.job_id).mkdir(parents=True)
    (jobs / record.job_id / "job.yaml").write_text(dump_record(record))
    job = load_job_config(record.job_id, jobs, store)
    assert job.step == "rl/x" and job.note == ""
    assert job.config == {"inputs.policy": "sft_policy:v1", "optim.lr": 0.001, "optim.betas": [0.9, 0.99]}
    assert job.identity == {"inputs.policy": sft.sha256}
    gone = load_job_config("rl-x-20261126-020202-cafe", jobs, store)
    assert gone.config is None and "record is not in" in gone.note
    assert load_job_config(None, jobs, store).note == "was registered from a path: no job made it"


def test_identical_configs_differ_in_nothing() -> None:
    cfg = {"optim.lr": 0.001, "outputs.policy": "a"}
    d = config_diff([JobConfig("j1", "s", cfg), JobConfig("j2", "s", dict(cfg))], ["outputs"])
    assert d.keys == [] and d.left_out == []


# ------------------------------------------------------------------------------------------ text, JSON, plot


def _comparison() -> Any:
    a = [float(i % 10) for i in range(20)]
    first, second = report("r:v1", a), report("r:v2", [x + 0.5 for x in a])
    train = [
        JobConfig("rl-a", "rl/reinforce", {"optim.lr": 0.001, "outputs.policy": "a"}),
        JobConfig("rl-b", "rl/reinforce", {"optim.lr": 0.002, "outputs.policy": "b"}),
    ]
    evals = [JobConfig("ev-a", "eval/policy", {"inputs.policy": "p:v1"}), JobConfig("ev-b", "eval/policy", {"inputs.policy": "p:v2"})]  # fmt: skip
    return compare([first, second], train, evals)


def test_the_table_shows_each_metric_its_difference_and_the_config_diff() -> None:
    text = render_text(_comparison())
    assert "r:v1" in text and "r:v2" in text and "r:v1-policy" in text
    assert "4.500 [" in text and "5.000 [" in text  # the summaries' means
    assert "Δ +0.500 [+0.500, +0.500] higher" in text
    assert "corpus distinct_1" in text
    assert "training config: the keys that differ between the jobs that made the policies" in text
    line = next(ln for ln in text.splitlines() if "optim.lr" in ln)
    assert "0.001" in line and "0.002" in line
    assert "eval config: no key differs between the eval jobs" in text
    assert "left out (they differ by design): inputs.policy" in text


def test_json_has_the_documented_keys() -> None:
    data = json.loads(json.dumps(as_json(_comparison())))
    assert list(data) == ["format", "reports", "rule", "metrics", "corpus", "training", "evaluation"]
    assert list(data["reports"][0]) == [
        "ref",
        "policy",
        "policy_step",
        "policy_job",
        "eval_job",
        "prompts",
        "num_prompts",
    ]
    assert data["rule"] == {"test": "paired", "resamples": 1000, "level": 0.95, "seed": 0}
    metric = data["metrics"][0]
    assert metric["name"] == "reward_model" and metric["differences"][0] is None
    assert list(metric["values"][0]) == ["mean", "low", "high", "n"]
    assert metric["differences"][1] == {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 20, "verdict": "higher"}
    assert data["corpus"] == [{"name": "distinct_1", "values": [0.5, 0.5]}]
    assert list(data["training"]) == ["jobs", "keys", "left_out"]
    assert data["training"]["keys"] == [{"key": "optim.lr", "values": [0.001, 0.002], "set": [True, True]}]
    assert data["training"]["left_out"] == ["outputs.policy"]
    assert data["evaluation"]["left_out"] == ["inputs.policy"]
    assert data["training"]["jobs"][0] == {"job_id": "rl-a", "step": "rl/reinforce", "note": ""}


def test_the_plotted_metric_is_one_every_report_has() -> None:
    a, b = report("r:v1", [1.0]), report("r:v2", [2.0])
    assert plot_metric([a, b], None) == "reward_model"
    with pytest.raises(UserError, match="--plot-metric task_score: not a metric of every report"):
        plot_metric([a, b], "task_score")


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_the_plot_is_a_valid_image(tmp_path: Path, suffix: str) -> None:
    from PIL import Image

    from nemotron.cli.plotting import plot_distributions

    path = tmp_path / f"dist{suffix}"
    plot_distributions([("r:v1", [0.0, 1.0, 2.0, 2.5]), ("r:v2", [1.0, 2.0, 3.0])], "reward_model", path)
    if suffix == ".png":
        with Image.open(path) as image:
            image.verify()
            assert image.format == "PNG" and image.size[0] > 500
    else:
        assert path.read_text().lstrip().startswith("<?xml") and "</svg>" in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_a_plot_file_of_unknown_format_is_refused_and_nothing_written(tmp_path: Path) -> None:
    from nemotron.cli.plotting import plot_distributions

    with pytest.raises(UserError, match=r"name a file ending in one of .*\.png"):
        plot_distributions([("r:v1", [0.0])], "reward_model", tmp_path / "dist.xyz")
    assert list(tmp_path.iterdir()) == []
