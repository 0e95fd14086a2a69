"""rm/serve as users run it, Triton's own client against it, the generative judge path of rl/rlhf against a real
chat server, and no reward server outliving the step that started it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nemotron.core.paths import shipped_root


def _processes_of(job_dir: Path) -> list[int]:
    """Pids that belong to this job (the step and everything it started): their environment names the job (a cold
    start), or they hold its files open (the step its TensorBoard events, its reward server its log: a warm start's
    /proc environment is the warm server's, nemotron.warm), logs/step.log aside: the launcher writes it."""
    tag = f"NEMOTRON_JOB_DIR={job_dir}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"State:\tZ" in (proc / "status").read_bytes():
                continue
            if tag in (proc / "environ").read_bytes().split(b"\0") or any(
                os.readlink(fd).startswith(f"{job_dir}/") and os.readlink(fd) != f"{job_dir}/logs/step.log"
                for fd in (proc / "fd").iterdir()
            ):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _start(args: list[str], home: Path, **extra_env: str) -> subprocess.Popen[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k != "NEMOTRON_REWARD_TOKEN"},
        "COLUMNS": "200",
        **extra_env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "nemotron", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path_glob: str, home: Path, proc: subprocess.Popen[str], timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list((home / "jobs").glob(path_glob)) if (home / "jobs").exists() else []
        if found:
            return found[0]
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    raise AssertionError(f"{path_glob} never appeared")


@pytest.mark.slow
def test_rm_serve_answers_tritonclient_and_stops_on_ctrl_c(home: Path) -> None:
    import tritonclient.http as httpclient

    # The token comes from the environment (or a 0600 file), never the command line: ps shows a command line.
    proc = _start(
        ["steps", "run", "rm/serve", "-c", "tiny", "server.port=0"],
        home,
        NEMOTRON_REWARD_TOKEN="tok-123456789",
    )
    info_file = _wait_for("*/server.json", home, proc)
    info = json.loads(info_file.read_text())
    url = info["url"].removeprefix("http://")
    client = httpclient.InferenceServerClient(url=url)
    headers = {"Authorization": "Bearer tok-123456789"}
    texts = ["the movie was => great and wonderful .", "the movie was => awful and boring ."]
    inp = httpclient.InferInput("sentences", [2], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary_data=True)
    result = client.infer(
        "reward_model",
        [inp],
        outputs=[httpclient.InferRequestedOutput("rewards", binary_data=True)],
        headers=headers,
    )
    rewards = result.as_numpy("rewards").reshape(-1)
    assert (
        rewards.shape == (2,) and rewards[0] > rewards[1]
    )  # the tiny reward model prefers the positive review

    # the same scores as the model in-process: the server adds transport, not arithmetic
    from nemotron.models.checkpoint import load_reward_model, load_tokenizer
    from nemotron.reward.scorer import scorer_from_reward_model

    path = shipped_root() / "tiny" / "reward_model"
    local = scorer_from_reward_model(load_reward_model(path), load_tokenizer(path), 32).score_sentences(texts)
    np.testing.assert_allclose(rewards, local, rtol=1e-5, atol=1e-5)

    with pytest.raises(Exception, match=r"401|[Uu]nauthori"):
        client.infer("reward_model", [inp])  # no token

    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    job_dir = info_file.parent
    assert _processes_of(job_dir) == []
    assert "server stopped" in (job_dir / "logs" / "step.log").read_text()


REFUSAL = (
    "error: refusing to serve on 0.0.0.0 without a bearer token: set $NEMOTRON_REWARD_TOKEN or give a token file "
    "(mode 0600), or bind 127.0.0.1"
)
CLUSTER_PROFILES = """
[cluster]
executor = "slurm"
partition = "batch"

[cluster_with_token]
extends = "cluster"
env_vars = { NEMOTRON_REWARD_TOKEN = "tok-from-the-profile" }
"""


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_rm_serve_refuses_a_public_address_without_a_token_when_it_compiles(
    home: Path, tmp_path: Path, dry_run: bool
) -> None:
    """As a user runs it: exit 2, one line, and nothing written (no job directory, no model loaded), dry-run or
    not; the step itself would only refuse after its job directory exists and its model has loaded."""
    args = ["steps", "run", "rm/serve", "-c", "tiny", "server.host=0.0.0.0", "server.port=0"]
    proc = _start([*args, *(["--dry-run"] if dry_run else [])], home)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err.strip().splitlines()) == (2, "", [REFUSAL])
    assert not home.exists() or list(home.rglob("*")) == []  # no job dir, no index, no store

    # A token file that others can read is refused the same way, before anything exists.
    loose = tmp_path / "token"
    loose.write_text("tok-123456789\n")
    loose.chmod(0o644)
    proc = _start([*args, f"server.token_file={loose}"], home)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and "chmod 600" in err, err
    assert not home.exists() or list(home.rglob("*")) == []


def test_a_cluster_profile_needs_the_token_among_its_env_vars(home: Path, tmp_path: Path) -> None:
    """A Slurm job does not see this shell's environment: the token must be in the profile (or a token file on
    the cluster). Dry-runs, so no cluster is needed."""
    (tmp_path / "env.toml").write_text(CLUSTER_PROFILES)
    args = ["steps", "run", "rm/serve", "-c", "tiny", "server.host=0.0.0.0", "--dry-run"]
    proc = _start([*args, "-b", "cluster"], home, NEMOTRON_REWARD_TOKEN="tok-in-this-shell-only")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == "", err
    assert err.strip().splitlines() == [
        "error: refusing to serve on 0.0.0.0 without a bearer token: set NEMOTRON_REWARD_TOKEN in profile "
        "'cluster' env_vars or give server.token_file (mode 0600), or bind 127.0.0.1"
    ]
    for accepted in (["-b", "cluster_with_token"], ["-b", "cluster", "server.token_file=/on/the/cluster"]):
        proc = _start([*args, *accepted], home)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "server:" in out, err


def test_rm_serve_refuses_a_token_on_the_command_line(home: Path) -> None:
    proc = _start(
        ["steps", "run", "rm/serve", "-c", "tiny", "server.port=0", "server.token=tok-123456789"], home
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "server.token" in err and "Traceback" not in err, err
    assert "tok-123456789" not in err  # the refusal does not echo the secret


def test_rl_steps_take_the_reward_servers_token_from_a_0600_file_never_from_the_command_line(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    from nemotron.models.checkpoint import load_reward_model, load_tokenizer
    from nemotron.reward.scorer import scorer_from_reward_model
    from nemotron.reward.server import serve
    from nemotron.reward.transport import HTTPSettings

    # A token on the command line is an unknown key (ps shows argv to every user), and its value is not echoed.
    for key in ("reward.server.token", "judge.token"):
        step = "rl/rlhf" if key.startswith("judge") else "rl/reinforce"
        r = run_cli("steps", "run", step, "-c", "tiny", f"{key}=tok-on-argv-4242", "--dry-run")
        assert r.code == 2 and f"{key}_file" in r.err and "Traceback" not in r.err, r.err
        assert "tok-on-argv-4242" not in r.out + r.err

    rm = shipped_root() / "tiny" / "reward_model"
    scorer = scorer_from_reward_model(load_reward_model(rm), load_tokenizer(rm), 32)
    token_file = tmp_path / "reward.token"
    token_file.write_text("tok-from-file-77\n")
    with serve(scorer, HTTPSettings(token="tok-from-file-77")) as handle:
        base = ["steps", "run", "rl/reinforce", "-c", "tiny", f"reward.server.url={handle.url}"]
        base += ["trainer.max_steps=1", "eval.num_prompts=0", f"reward.server.token_file={token_file}"]
        token_file.chmod(0o644)  # others could read it: refused before any work, saying how to fix it
        r = run_cli(*base, env={"NEMOTRON_REWARD_TOKEN": ""})
        assert r.code == 2 and f"chmod 600 {token_file}" in r.err and "Traceback" not in r.err, r.err
        token_file.chmod(0o600)
        r = run_cli(*base, env={"NEMOTRON_REWARD_TOKEN": ""})
        assert r.code == 0, r.err[-2000:]  # without the token every score would be a 401, and the run exit 3
        assert "tok-from-file-77" not in r.out + r.err


# rl/rlhf judged by the tiny SFT policy as a generative judge, 2 prompts x 2 responses a step, no eval
JUDGE_RUN = (
    "steps run rl/rlhf -c tiny judge.kind=generative "
    "env.nemo_gym.genrm_model.responses_api_models.vllm_model.model=pkg://tiny/sft_policy "
    "grpo.num_prompts_per_step=2 grpo.num_generations_per_prompt=2 eval.num_prompts=0"
).split()


@pytest.mark.slow
def test_rlhf_generative_judge_against_a_real_chat_server(home: Path, run_cli: Any) -> None:
    base = [*JUDGE_RUN, "grpo.max_num_steps=2"]
    # guided_choice: the judge LM must answer one of the valid JSON scores, so every answer parses
    r = run_cli(*base, "judge.guided_choice=true", timeout=600)
    assert r.code == 0, r.err[-3000:]
    job = max((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)
    last = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["judge/requests"] >= 8 and last["judge/parse_failures"] == 0
    # free text: a tiny LM writes no JSON, so answers fall back to judge.default_score and are counted
    r = run_cli(*base, "judge.max_retries=0", "judge.default_score=0.25", timeout=600)
    assert r.code == 0, r.err[-3000:]
    job = max((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)
    last = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["judge/fallbacks"] > 0 and last["judge/parse_failures"] == last["judge/fallbacks"]
    assert last["rewards"] == pytest.approx(0.25)

    # Pairwise: each prompt's 2 responses make 1 comparison, so 2 steps x 2 prompts ask the judge 4 times
    # (pointwise asks once per response: 8). The tiny judge's free text never parses -> the default score.
    r = run_cli(*base, "judge.mode=pairwise", "judge.max_retries=0", "judge.default_score=0.25", timeout=600)
    assert r.code == 0, r.err[-3000:]
    job = max((home / "jobs").iterdir(), key=lambda p: p.stat().st_mtime)
    last = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["judge/requests"] == 4 and last["judge/fallbacks"] == 4
    assert last["rewards"] == pytest.approx(0.25)


@pytest.mark.slow
def test_two_torchrun_ranks_share_one_judge_server(home: Path, run_cli: Any) -> None:
    """rl/rlhf on 2 ranks (local_ddp): local rank 0 starts the generative judge, the other rank uses it."""
    r = run_cli(
        *JUDGE_RUN, "-r", "local_ddp", "judge.guided_choice=true", "grpo.max_num_steps=1", timeout=600
    )
    assert r.code == 0, r.err[-3000:]
    (job,) = (home / "jobs").iterdir()
    assert (job / "logs" / "judge.log").read_text().count(
        "serving on"
    ) == 1  # one judge process, not one per rank
    marker = "rewards from generative judge "
    used = [
        line.split(marker)[1]
        for line in (job / "logs" / "step.log").read_text().splitlines()
        if marker in line
    ]
    assert len(used) == 2 and used[0] == used[1]  # both ranks score through the same server


@pytest.mark.slow
def test_no_reward_server_outlives_a_cancelled_rl_step(home: Path) -> None:
    proc = _start(["steps", "run", "rl/reinforce", "-c", "tiny", "trainer.max_steps=500"], home)
    metrics = _wait_for("*/metrics.jsonl", home, proc)  # the sibling server is up once metrics flow
    job_dir = metrics.parent
    assert len(_processes_of(job_dir)) >= 2  # the step and its reward server
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    deadline = time.monotonic() + 15
    while _processes_of(job_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_of(job_dir) == []
    assert json.loads((job_dir / "status.json").read_text())["state"] == "cancelled"


@pytest.mark.slow
def test_rm_serve_chat_mode_answers_chat_completions(home: Path) -> None:
    import urllib.request

    proc = _start(
        [
            "steps",
            "run",
            "rm/serve",
            "-c",
            "tiny",
            "server.mode=chat",
            "server.port=0",
            "inputs.reward_model=pkg://tiny/sft_policy",
        ],
        home,
    )
    info = json.loads(_wait_for("*/server.json", home, proc).read_text())
    assert info["mode"] == "chat"
    body = json.dumps(
        {
            "model": "reward_model",
            "messages": [{"role": "user", "content": "the movie was"}],
            "max_tokens": 4,
            "guided_choice": ["great .", "awful ."],
        }
    ).encode()
    req = urllib.request.Request(
        info["url"] + "/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer = json.loads(resp.read())
    assert answer["choices"][0]["message"]["content"] in ("great .", "awful .")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
