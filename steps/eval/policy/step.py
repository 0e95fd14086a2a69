"""eval/policy: answer every prompt with a policy (and a baseline), score the answers, register an
eval_report.

`main()` reads top to bottom: setup -> prompts (refused before any model loads when a scorer lacks what it
needs) -> generate (`nemotron.policy_eval.answers`; the ranks share the batches) -> on rank 0: score (reward
model, task, math, judge, length, distinct-n) -> summarise -> write and register.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemotron.data.jsonl import read_jsonl
from nemotron.data.records import PromptRecord, prompt_text
from nemotron.errors import UserError
from nemotron.policy_eval.answers import Answers, generate
from nemotron.policy_eval.report import METRICS, corpus_metrics, summarise, write_report
from nemotron.policy_eval.stats import distinct_n, pairwise_win, preference_from_scores
from nemotron.rl import distributed
from nemotron.runtime.devices import DevicePlan
from nemotron.runtime.step import StepRun, required

if TYPE_CHECKING:  # mypy reads steps/ as a package root; at run time StepRun loads schema.py beside this file
    from eval.policy.schema import Config, Judge

log = logging.getLogger("nemotron")


@dataclass
class Prompts:
    records: list[PromptRecord]
    lines: list[int]  # each record's line number in the file (blank lines are skipped)
    texts: list[str]


def load_prompts(path: str, max_prompts: int, needs_answers: bool) -> Prompts:
    """The prompts to evaluate; exit 2 when there are none, or when scorers.math is on and one has no
    answer (the preflight refused those at compile time; a file changed since is refused here)."""
    records = read_jsonl(path, PromptRecord)  # DataError (exit 2) for an empty file or a bad line
    with open(path, encoding="utf-8") as handle:
        lines = [number for number, line in enumerate(handle, 1) if line.strip()]
    if max_prompts:
        records, lines = records[:max_prompts], lines[:max_prompts]
    if not records:
        raise UserError(f"{path}: no prompts to evaluate")
    if needs_answers:
        lacking = [line for record, line in zip(records, lines, strict=True) if record.answer is None]
        if lacking:
            raise UserError(
                f"{path}: line {lacking[0]} has no 'answer' ({len(lacking)} of {len(records)} records "
                "lack one); scorers.math checks each response against its prompt's answer"
            )
    return Prompts(records, lines, [prompt_text(r.prompt) for r in records])


def reward_model_scores(path: str, rows: list[list[int]], device: str) -> list[float]:
    """inputs.reward_model's score of each prompt + response, in process (the preflight checked that it reads
    the policy's token ids as the policy does)."""
    from nemotron.rl.reward_source import reward_source

    with reward_source("in_process", path, None, None, 1.0, 0, device=device) as (score, _):
        return [float(s) for s in score(rows, [], [])]


@contextmanager
def judge_client(j: Judge, model: str | None, run: StepRun[Any], plan: DevicePlan) -> Iterator[Any]:
    """rl/rlhf's generative judge: `judge.url`, or inputs.judge served by our chat server beside this step."""
    from nemotron.reward.judge import JudgeClient
    from nemotron.reward.server import TOKEN_ENV
    from nemotron.reward.sibling import external_url, sibling_server

    def client(url: str, token: str | None) -> JudgeClient:
        return JudgeClient(
            url,
            token=token,
            timeout=j.timeout_s,
            parse_retries=j.max_retries,
            guided_choice=j.guided_choice,
            pairwise_template=j.pairwise_template,
            concurrency=1,
        )

    given = external_url(j.url)
    if given:
        yield client(given, os.environ.get(TOKEN_ENV))
        return
    device = "cuda" if plan.device.type == "cuda" else "cpu"
    judge_log = run.job_dir / "logs" / "judge.log"
    with sibling_server(
        required(model, "inputs.judge"),
        module="nemotron.reward.chat_server",
        log_path=judge_log,
        device=device,
    ) as (url, token):
        yield client(url, token)


def win_rates(
    client: Any, prompts: Sequence[str], policy: Sequence[str], baseline: Sequence[str]
) -> list[float]:
    """Per prompt, how much the policy's response beats the baseline's (0, 0.5 or 1 per order, averaged over
    both orders); a verdict that never parses is a tie."""

    def prefer(prompt: str, first: str, second: str) -> float:
        verdict = client.verdict(prompt, first, second)
        return 0.5 if verdict is None else preference_from_scores(*verdict)

    return [pairwise_win(p, a, b, prefer) for p, a, b in zip(prompts, policy, baseline, strict=True)]


def reward_model_judge_scores(
    j: Judge, model: str | None, rows: list[list[int]], run: StepRun[Any], plan: DevicePlan
) -> list[float]:
    """judge.kind=reward_model: the judge's score of each prompt + response token ids, from rm/serve at
    judge.url or inputs.judge loaded here. Each distinct row is scored once, so a response that is the same
    on both sides of a pair gets one score and ties, whatever the batch it would have been padded in."""
    from nemotron.reward.server import TOKEN_ENV
    from nemotron.rl.reward_source import reward_source

    distinct = list(dict.fromkeys(tuple(row) for row in rows))
    if j.url:
        source = reward_source(
            "server", None, j.url, os.environ.get(TOKEN_ENV), j.timeout_s, 5,
            log_path=run.job_dir / "logs" / "judge.log",
        )  # fmt: skip
    else:
        source = reward_source(
            "in_process", required(model, "inputs.judge"), None, None, 1.0, 0, device=str(plan.device)
        )
    with source as (score, _):
        scored = dict(
            zip(distinct, (float(s) for s in score([list(r) for r in distinct], [], [])), strict=True)
        )
    return [scored[tuple(row)] for row in rows]


def reward_model_win_rates(policy: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per prompt, the reward model judge's preference for the policy's response: asked in both orders as the
    generative judge is (pairwise_win), each order's verdict the higher of the two scores. A scalar reward
    model scores a response without seeing the other, so the second order's verdict is always one minus the
    first's: the two orders agree by construction, and the win is 1, 0 or 0.5 (equal scores)."""
    wins = []
    for mine, theirs in zip(policy, baseline, strict=True):
        score = {"policy": mine, "baseline": theirs}

        def prefer(_prompt: str, first: str, second: str, score: dict[str, float] = score) -> float:
            return preference_from_scores(score[first], score[second])

        wins.append(pairwise_win("", "policy", "baseline", prefer))
    return wins


def judge_win_rates(
    cfg: Config, run: StepRun[Any], plan: DevicePlan, prompts: Prompts, answers: Answers, baseline: Answers
) -> tuple[list[float], dict[str, float]]:
    """scorers.win_rate: each prompt's win of the policy over the baseline, and the judge's counters."""
    if cfg.judge.kind == "reward_model":
        scores = reward_model_judge_scores(
            cfg.judge, cfg.inputs.judge, answers.rows + baseline.rows, run, plan
        )
        n = len(answers.rows)
        wins = reward_model_win_rates(scores[:n], scores[n:])
        return wins, {"judge/scored": float(len(set(map(tuple, answers.rows + baseline.rows))))}
    with judge_client(cfg.judge, cfg.inputs.judge, run, plan) as client:
        wins = win_rates(client, prompts.texts, answers.texts, baseline.texts)
        return wins, client.metrics()


def score_rows(
    cfg: Config,
    run: StepRun[Any],
    plan: DevicePlan,
    prompts: Prompts,
    answers: Answers,
    baseline: Answers | None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One row per prompt with its response and every enabled score; and the judge's counters."""
    s = cfg.scorers
    rows: list[dict[str, Any]] = []
    for i, (record, line) in enumerate(zip(prompts.records, prompts.lines, strict=True)):
        row: dict[str, Any] = {
            "index": i,
            "line": line,
            "prompt": prompts.texts[i],
            "response": answers.texts[i],
        }
        if record.answer is not None:
            row["answer"] = record.answer
        if baseline is not None:
            row["baseline_response"] = baseline.texts[i]
        if s.length:
            row["response_length"] = len(answers.ids[i])
            row["truncated"] = float(answers.truncated[i])
        for n in s.distinct_n:
            row[f"distinct_{n}"] = distinct_n(answers.texts[i], n)
        rows.append(row)
    if s.reward_model:
        # one pass over both policies' answers: the model loads once
        theirs = baseline.rows if baseline is not None else []
        rm = reward_model_scores(
            required(cfg.inputs.reward_model, "inputs.reward_model"), answers.rows + theirs, str(plan.device)
        )
        for i, row in enumerate(rows):
            row["reward_model"] = rm[i]
            if theirs:
                row["baseline_reward_model"] = rm[len(rows) + i]
    if s.task is not None:
        from nemotron.tasks import get_task

        task = get_task(s.task)
        truth = task.score(prompts.texts, answers.texts)
        for row, value, text in zip(rows, truth, answers.texts, strict=True):
            row["task_score"] = float(value)
            row["task_well_formed"] = float(task.is_well_formed(text))
    if s.math:
        from nemotron.policy_eval.math_answers import verify_answer

        for row, record, text in zip(rows, prompts.records, answers.texts, strict=True):
            verdict = verify_answer(text, required(record.answer, "answer"))
            row["math_correct"], row["math_parsed"] = float(verdict.correct), float(verdict.parsed)
    judge_stats: dict[str, float] = {}
    if s.win_rate:
        assert baseline is not None  # the schema refuses win_rate without inputs.baseline
        wins, judge_stats = judge_win_rates(cfg, run, plan, prompts, answers, baseline)
        for row, value in zip(rows, wins, strict=True):
            row["win_rate"] = value
    return rows, judge_stats


def main() -> None:
    # ---- setup: validated config (scorers without their inputs are refused there), device, threads, seeds
    run: StepRun[Config] = StepRun.start(__file__)
    cfg = run.config
    run.progress.unwatched("evaluation")  # no training steps to time: progress is not watched
    plan, world = distributed.start(cfg.runtime)

    # ---- prompts: exit 2 before any model loads when there are none or scorers.math lacks answers
    prompts_path = required(cfg.inputs.prompts, "inputs.prompts")
    prompts = load_prompts(prompts_path, cfg.max_prompts, cfg.scorers.math)
    log.info("evaluating on %d prompts of %s", len(prompts.records), prompts_path)

    # ---- generate: the policy, then the baseline from the same batch seeds; with several ranks each answers
    # whole batches, and rank 0 gathers the answers (in prompt order) and does the rest alone
    policy_path = required(cfg.inputs.policy, "inputs.policy")
    mine = generate(policy_path, prompts.records, cfg.generation, cfg.runtime.seed, plan, world)
    theirs = None
    if cfg.inputs.baseline:
        theirs = generate(cfg.inputs.baseline, prompts.records, cfg.generation, cfg.runtime.seed, plan, world)
    gathered = distributed.gather_on_main((mine, theirs), world)
    if not world.is_main:
        distributed.close(world)
        return
    answers = Answers.joined([a for a, _ in gathered])
    baseline = Answers.joined([b for _, b in gathered if b is not None]) if theirs is not None else None

    # ---- score and summarise
    rows, judge_stats = score_rows(cfg, run, plan, prompts, answers, baseline)
    names = [*METRICS, *(f"distinct_{n}" for n in cfg.scorers.distinct_n)]
    metrics = summarise(
        rows, names, resamples=cfg.summary.resamples, level=cfg.summary.level, seed=cfg.summary.seed
    )
    for name, m in metrics.items():
        log.info("%s = %.4f [%.4f, %.4f]", name, m["mean"], m["low"], m["high"])
    summary = {
        "metrics": metrics,
        "corpus": corpus_metrics(answers.texts, cfg.scorers.distinct_n),
        "num_prompts": len(rows),
        "interval": cfg.summary.model_dump(mode="json"),
        "generation": cfg.generation.model_dump(mode="json"),
        "seed": cfg.runtime.seed,
        "scorers": cfg.scorers.model_dump(mode="json"),
        "judge": judge_stats,
        # as bound: the paths of registered artifacts (their refs are in the lineage)
        "inputs": cfg.inputs.model_dump(mode="json"),
    }

    # ---- write and register (lineage to every input comes from the job record)
    directory = run.output_dir("report")
    write_report(directory, rows, summary)
    means = {name: m["mean"] for name, m in metrics.items()}
    run.register_outputs({"report": directory}, {"num_prompts": len(rows), "means": means})
    distributed.close(world)


if __name__ == "__main__":
    main()
