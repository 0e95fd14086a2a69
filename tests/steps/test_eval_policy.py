"""eval/policy as a user runs it: the CLI in a subprocess on the shipped tiny artifacts, a fresh $NEMOTRON_HOME.

The tiny preset judges the tiny SFT policy against itself, so its win-rate is exactly 0.5 with every verdict
parsed; the same run twice writes the same bytes; bad inputs are refused with one line before anything is
written."""

from __future__ import annotations

import json
import runpy
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tests.assertions import refused

from nemotron.core.paths import shipped_root

TINY = shipped_root() / "tiny"
STEP = Path(__file__).resolve().parents[2] / "steps" / "eval" / "policy" / "step.py"
# the judge and the baseline off: only what the policy and the reward model need
NO_JUDGE = ("scorers.win_rate=false", "inputs.baseline=null", "inputs.judge=null")


def _reports(home: Path) -> list[Path]:
    return sorted((home / "jobs").glob("*/outputs/report"))


@pytest.mark.slow
def test_tiny_preset_registers_a_report_with_lineage_and_the_same_bytes_twice(
    home: Path, run_cli: Any
) -> None:
    first = run_cli("steps", "run", "eval/policy", "-c", "tiny", timeout=300)
    assert first.code == 0, first.err[-3000:]
    second = run_cli("steps", "run", "eval/policy", "-c", "tiny", timeout=300)
    assert second.code == 0, second.err[-3000:]
    a, b = _reports(home)
    for name in ("responses.jsonl", "summary.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs between two runs"

    summary = json.loads((a / "summary.json").read_text())
    rows = [json.loads(line) for line in (a / "responses.jsonl").read_text().splitlines()]
    assert summary["num_prompts"] == len(rows) == 16
    # the policy against itself: every pair judged in both orders, every verdict parsed, exactly one half
    assert summary["metrics"]["win_rate"] == {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 16}
    assert summary["judge"]["judge/requests"] == 32 and summary["judge"]["judge/fallbacks"] == 0
    assert all(r["response"] == r["baseline_response"] for r in rows)
    assert all(r["reward_model"] == r["baseline_reward_model"] for r in rows)
    # sampled, not greedy: the responses differ between prompts
    assert len({r["response"] for r in rows}) > 1
    for metric in (
        "reward_model",
        "task_score",
        "task_well_formed",
        "response_length",
        "distinct_1",
        "distinct_2",
    ):
        m = summary["metrics"][metric]
        assert m["low"] <= m["mean"] <= m["high"], metric
    assert summary["metrics"]["reward_model"]["low"] < summary["metrics"]["reward_model"]["high"]

    lineage = run_cli("artifacts", "lineage", "tiny_eval_report:v1")
    assert lineage.code == 0, lineage.err
    for name in ("policy", "prompts", "baseline", "reward_model", "judge"):
        assert f"{name}: " in lineage.out, lineage.out
    assert "type: eval_report" in run_cli("artifacts", "show", "tiny_eval_report:v2").out


def test_math_answers_are_scored_per_prompt(home: Path, tmp_path: Path, run_cli: Any) -> None:
    prompts = tmp_path / "math.jsonl"
    prompts.write_text(
        '{"prompt": "What is 1/4 + 1/4?", "answer": "\\\\frac{1}{2}"}\n{"prompt": "2 + 2 =", "answer": "4"}\n'
    )
    r = run_cli(
        "steps", "run", "eval/policy", "-c", "tiny", *NO_JUDGE, f"inputs.prompts={prompts}", "scorers.math=true",
        "scorers.task=null", timeout=300,
    )  # fmt: skip
    assert r.code == 0, r.err[-3000:]
    (report,) = _reports(home)
    rows = [json.loads(line) for line in (report / "responses.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["\\frac{1}{2}", "4"]
    assert all(r["math_correct"] in (0.0, 1.0) and r["math_parsed"] in (0.0, 1.0) for r in rows)
    summary = json.loads((report / "summary.json").read_text())
    assert {"math_correct", "math_parsed", "reward_model"} <= set(summary["metrics"])
    assert "task_score" not in summary["metrics"]


def _refused(r: Any, home: Path, says: str) -> None:
    refused(r, says)  # "error: ..." (with its one problem beneath)
    assert not home.exists(), "a refused job must write nothing"


def test_prompts_without_answers_are_refused_naming_the_line(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    prompts = tmp_path / "some.jsonl"
    prompts.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n\n{"prompt": "2 + 2 ="}\n')
    r = run_cli("steps", "run", "eval/policy", "-c", "tiny", f"inputs.prompts={prompts}", "scorers.math=true")
    _refused(r, home, f"input 'prompts' ({prompts}): line 3 has no 'answer'; scorers.math checks")


def test_only_the_prompts_evaluated_need_answers(home: Path, tmp_path: Path, run_cli: Any) -> None:
    """max_prompts=2 reads lines 1-2 (a blank line is no record): the answerless line 4 is never evaluated, so
    the compile passes; with max_prompts=3 it is evaluated, and refused."""
    prompts = tmp_path / "some.jsonl"
    prompts.write_text(
        '{"prompt": "1 + 1 =", "answer": "2"}\n\n{"prompt": "2 + 2 =", "answer": "4"}\n{"prompt": "3 + 3 ="}\n'
    )
    args = (
        "steps",
        "run",
        "eval/policy",
        "-c",
        "tiny",
        *NO_JUDGE,
        f"inputs.prompts={prompts}",
        "scorers.math=true",
    )
    r = run_cli(*args, "max_prompts=2", "--dry-run")
    assert r.code == 0, r.err[-2000:]
    _refused(run_cli(*args, "max_prompts=3", "--dry-run"), home, f"({prompts}): line 4 has no 'answer'")


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (("inputs.baseline=null",), "scorers.win_rate needs inputs.baseline"),
        (("inputs.judge=null",), "scorers.win_rate needs inputs.judge (or judge.url)"),
        (("inputs.reward_model=null",), "scorers.reward_model needs inputs.reward_model"),
        (("scorers.win_rate=false",), "inputs.baseline is given but no scorer reads it"),
        (("generation.greedy=true", "generation.temperature=0.7"), "act only when sampling"),
        (
            ("judge.kind=reward_model", "inputs.judge=pkg://tiny/reward_model", "judge.guided_choice=false"),
            "judge.guided_choice acts only with judge.kind=generative",
        ),
        (
            (
                "judge.kind=reward_model",
                "judge.max_retries=5",
                "judge.pairwise_template='Which? {prompt} {response_1} {response_2}'",
            ),
            "judge.pairwise_template, judge.max_retries act only with judge.kind=generative",
        ),
        (
            ("judge.kind=reward_model", "inputs.judge=pkg://tiny/reward_model", "judge.timeout_s=5"),
            "judge.timeout_s acts with judge.kind=reward_model only through judge.url",
        ),
        (
            (
                "scorers.win_rate=false",
                "inputs.baseline=null",
                "inputs.judge=null",
                "judge.kind=reward_model",
            ),
            "judge.kind: the judge acts only with scorers.win_rate=true",
        ),
    ],
)
def test_a_scorer_without_its_input_is_refused(
    overrides: tuple[str, ...], says: str, home: Path, run_cli: Any
) -> None:
    _refused(run_cli("steps", "run", "eval/policy", "-c", "tiny", *overrides, "--dry-run"), home, says)


def test_an_empty_prompt_set_is_refused(home: Path, tmp_path: Path, run_cli: Any) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r = run_cli("steps", "run", "eval/policy", "-c", "tiny", f"inputs.prompts={empty}")
    _refused(r, home, "no records (the file is empty)")


@pytest.fixture(scope="module")
def permuted(
    tmp_path_factory: pytest.TempPathFactory, make_tokenizer_variant: Any, shuffle_vocab: Any
) -> Path:
    """The tiny SFT policy with the same tokens in a shuffled order (special tokens keep ids 0-2)."""
    return make_tokenizer_variant(
        TINY / "sft_policy", tmp_path_factory.mktemp("models") / "permuted", shuffle_vocab
    )


def test_a_reward_model_with_another_tokenizer_is_refused(permuted: Path, home: Path, run_cli: Any) -> None:
    r = run_cli("steps", "run", "eval/policy", "-c", "tiny", *NO_JUDGE, f"inputs.policy={permuted}")
    _refused(
        r, home, "input 'reward_model' is given the token ids of input 'policy', but their tokenizers differ"
    )


def test_a_reward_model_judge_with_another_tokenizer_is_refused_a_generative_one_is_not(
    permuted: Path, home: Path, run_cli: Any
) -> None:
    """A reward-model judge scores the policy's token ids, so its tokenizer must read them as the policy's does;
    a generative judge reads text, so the same judge is fine there."""
    rm_judge = ("scorers.reward_model=false", "inputs.reward_model=null", "judge.kind=reward_model")
    r = run_cli(
        "steps", "run", "eval/policy", "-c", "tiny", *rm_judge, f"inputs.judge={permuted}", "--dry-run"
    )
    _refused(r, home, "input 'judge' is given the token ids of input 'policy', but their tokenizers differ")
    ok = run_cli("steps", "run", "eval/policy", "-c", "tiny", f"inputs.judge={permuted}", "--dry-run")
    assert ok.code == 0, ok.err[-2000:]


def test_a_baseline_with_another_tokenizer_is_refused(permuted: Path, home: Path, run_cli: Any) -> None:
    r = run_cli(
        "steps", "run", "eval/policy", "-c", "tiny", "scorers.reward_model=false", "inputs.reward_model=null",
        f"inputs.baseline={permuted}",
    )  # fmt: skip
    _refused(
        r, home, "input 'baseline' is given the token ids of input 'policy', but their tokenizers differ"
    )


@pytest.fixture(scope="module")
def other_policy(tmp_path_factory: pytest.TempPathFactory, make_tiny_model: Any) -> Path:
    """A tiny Llama with random weights and the shipped tokenizer: a baseline that answers differently."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "llama")


def _rank(review: str) -> int:
    """The test judge's taste: reviews starting with a-h beat those with i-p, which beat the rest."""
    first = review[:1].lower()
    return 0 if "a" <= first <= "h" else 1 if "i" <= first <= "p" else 2


class _RuleJudge(BaseHTTPRequestHandler):
    """A judge behind /v1/chat/completions with a rule a test can work out by hand: the review of the better
    `_rank` wins (scores 4 vs 2), and of two of the same rank the one shown first (a position bias: 3 vs 2)."""

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = payload["messages"][-1]["content"]
        first = content.split("Review 1: ", 1)[1].split("\nReview 2: ", 1)[0]
        second = content.split("\nReview 2: ", 1)[1].split("\nAnswer", 1)[0]
        if _rank(first) != _rank(second):
            scores = (4, 2) if _rank(first) < _rank(second) else (2, 4)
        else:
            scores = (3, 2)
        verdict = json.dumps({"score_1": scores[0], "score_2": scores[1]})
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": verdict}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_win_rate_against_another_baseline_is_what_the_judge_said_both_ways(
    other_policy: Path, home: Path, run_cli: Any
) -> None:
    """The SFT policy against a random-weight baseline, judged by a real HTTP judge (judge.url) whose verdicts
    are known: each prompt's win is 1 when the policy's review ranks better, 0 when worse, and 0.5 when they
    rank the same (the judge's preference for the first position cancels over the two orders)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RuleJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = run_cli(
            "steps", "run", "eval/policy", "-c", "tiny", "scorers.reward_model=false", "inputs.reward_model=null",
            "inputs.judge=null", f"judge.url=http://127.0.0.1:{server.server_address[1]}",
            f"inputs.baseline={other_policy}", timeout=300,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert r.code == 0, r.err[-3000:]
    (report,) = _reports(home)
    rows = [json.loads(line) for line in (report / "responses.jsonl").read_text().splitlines()]

    def expected(mine: str, theirs: str) -> float:
        return 0.5 if _rank(mine) == _rank(theirs) else float(_rank(mine) < _rank(theirs))

    wins = [expected(r["response"], r["baseline_response"]) for r in rows]
    assert set(wins) == {0.0, 0.5, 1.0}, "the case needs wins, losses and same-rank pairs to tell anything"
    assert [r["win_rate"] for r in rows] == wins
    summary = json.loads((report / "summary.json").read_text())
    assert summary["metrics"]["win_rate"]["mean"] == sum(wins) / len(wins)
    assert summary["judge"]["judge/requests"] == 2 * len(rows)


def test_a_reward_model_judge_by_hand() -> None:
    """The reward model judge's win per prompt from hand-picked scores: higher wins (1), lower loses (0), equal
    ties (0.5), asked in both orders; against itself every prompt is a tie."""
    step = runpy.run_path(str(STEP), run_name="eval_policy_step")
    wins = step["reward_model_win_rates"]([2.0, -1.0, 0.5, 3.0, -0.25], [1.0, 0.0, 0.5, -2.0, -0.5])
    assert wins == [1.0, 0.0, 0.5, 1.0, 1.0]
    assert sum(wins) / len(wins) == 0.7
    scores = [0.3, -1.2, 0.3, 7.0]
    assert step["reward_model_win_rates"](scores, scores) == [0.5] * 4


RM_JUDGE = ("judge.kind=reward_model", "inputs.judge=pkg://tiny/reward_model")


def test_a_reward_model_judge_against_itself_is_one_half_and_against_another_policy_what_its_scores_say(
    other_policy: Path, home: Path, run_cli: Any
) -> None:
    """The tiny reward model as the judge: the SFT policy against itself wins exactly half (every pair a tie);
    against a random-weight baseline each prompt's win is what the reward model's two scores say (the same model
    is scorers.reward_model, so the report carries both scores), in process and through a real reward server
    at judge.url alike."""
    from nemotron.reward.bind import TOKEN_ENV
    from nemotron.reward.sibling import sibling_server

    itself = run_cli("steps", "run", "eval/policy", "-c", "tiny", *RM_JUDGE, timeout=300)
    assert itself.code == 0, itself.err[-3000:]
    (report,) = _reports(home)
    summary = json.loads((report / "summary.json").read_text())
    assert summary["metrics"]["win_rate"] == {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 16}
    assert "judge/requests" not in summary["judge"], "no generative judge was asked"

    other = (
        "steps",
        "run",
        "eval/policy",
        "-c",
        "tiny",
        "judge.kind=reward_model",
        f"inputs.baseline={other_policy}",
    )
    r = run_cli(*other, "inputs.judge=pkg://tiny/reward_model", timeout=300)
    assert r.code == 0, r.err[-3000:]
    report = _reports(home)[-1]
    rows = [json.loads(line) for line in (report / "responses.jsonl").read_text().splitlines()]

    def expected(mine: float, theirs: float) -> float:
        return 1.0 if mine > theirs else 0.0 if mine < theirs else 0.5

    wins = [expected(r["reward_model"], r["baseline_reward_model"]) for r in rows]
    assert {0.0, 1.0} <= set(wins), "the case needs wins and losses to tell anything"
    assert [r["win_rate"] for r in rows] == wins
    in_process = json.loads((report / "summary.json").read_text())["metrics"]["win_rate"]
    assert in_process["mean"] == sum(wins) / len(wins)

    with sibling_server(TINY / "reward_model", log_path=home.parent / "rm.log", device="cpu") as (url, token):
        served = run_cli(*other, "inputs.judge=null", f"judge.url={url}", env={TOKEN_ENV: token}, timeout=300)
    assert served.code == 0, served.err[-3000:]
    rows = [json.loads(line) for line in (_reports(home)[-1] / "responses.jsonl").read_text().splitlines()]
    assert [r["win_rate"] for r in rows] == wins


@pytest.mark.slow
def test_two_ranks_share_the_batches_and_write_the_one_rank_report(home: Path, run_cli: Any) -> None:
    """The tiny preset (sampled, judge and reward model on) on 2 ranks (local_ddp) writes the bytes 1 rank does:
    each batch samples from its own seed, whichever rank answers it, and rank 0 scores the gathered answers."""
    args = ("steps", "run", "eval/policy", "-c", "tiny", "generation.batch_size=4")
    one = run_cli(*args, timeout=300)
    assert one.code == 0, one.err[-3000:]
    two = run_cli(*args, "-r", "local_ddp", timeout=300)
    assert two.code == 0, two.err[-3000:]
    # 16 prompts in 4 batches: each rank answered two of them, for the policy and for the baseline
    for rank in (0, 1):
        assert two.err.count(f"rank {rank} of 2 answers 8 prompts (2 of 4 batches)") == 2, two.err[-3000:]
    a, b = _reports(home)
    for name in ("responses.jsonl", "summary.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs between 1 and 2 ranks"
    rows = [json.loads(line) for line in (a / "responses.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and len({r["response"] for r in rows}) > 1
