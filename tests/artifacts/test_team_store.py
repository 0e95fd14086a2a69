"""The team store on PostgreSQL: 8 writer processes registering versions of the same names at once (no duplicate,
no gap, every edge), `artifacts migrate` copying a SQLite store of the tiny pipeline's shape so that every listing
reads the same, and the refusals: an unreachable server (exit 3, one line), a password in --to (exit 2), the
[postgres] extra missing (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nemotron.artifacts.aliases import move_alias
from nemotron.artifacts.store import ArtifactStore, open_store
from nemotron.core.procs import free_port
from nemotron.core.storeurl import parse_store_url

WRITER = """
import sys, time
from pathlib import Path
from nemotron.artifacts.store import open_store
root, worker, count, src, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), float(sys.argv[5])
store = open_store(Path(root))
time.sleep(max(0.0, go - time.time()))  # every writer starts at the same moment
base = store.register_external("prompt_jsonl", src)
out = src.with_name(f"out{worker}.json")  # the outputs' files: never the input's (its path and hash name it)
out.write_text(str(worker))
names, prev = ["policy", "critic", "report"], None
for i in range(count):
    order = names[i % 3:] + names[: i % 3]  # each job registers the three names, in a different order each time
    parents = [("data", base.id)] + ([("policy", prev)] if prev else [])
    arts = store.register([(n, "prompt_jsonl", out, {"worker": worker, "i": i}) for n in order], f"w{worker}-{i}",
                          parents=parents)
    prev = next(a.id for a in arts if a.name == "policy")
"""


def test_eight_writer_processes_get_gapless_unique_versions_and_every_edge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    monkeypatch.setenv("NEMOTRON_STORE_URL", postgres_url)
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "x"}\n')
    workers, per = 8, 10
    go = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "a"), str(w), str(per), str(src),
                               str(go)], stderr=subprocess.PIPE, text=True) for w in range(workers)]  # fmt: skip
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    store = open_store(tmp_path / "a")
    assert [a.ref for a in store.list_artifacts(name="external.p.jsonl")] == ["external.p.jsonl:v1"]
    base = store.resolve("external.p.jsonl")
    made = {name: store.list_artifacts(name=name) for name in ("policy", "critic", "report")}
    for name, arts in made.items():
        assert [a.version for a in arts] == list(range(1, workers * per + 1)), name  # no gap, no duplicate
        assert len({(a.metadata["worker"], a.metadata["i"]) for a in arts}) == workers * per  # no lost write
    policy_of = {(a.metadata["worker"], a.metadata["i"]): a for a in made["policy"]}
    for arts in made.values():
        for a in arts:
            w, i = a.metadata["worker"], a.metadata["i"]
            expected = {("data", base.id)} | ({("policy", policy_of[(w, i - 1)].id)} if i else set())
            assert {(n, p.id) for n, p in store.parents(a.id)} == expected, a.ref


def _tiny_pipeline_store(home: Path, tmp: Path) -> ArtifactStore:
    """A SQLite store of the tiny pipeline's shape: data -> sft -> rm, the RL steps from sft (rlhf judged by a
    policy made from sft), eval reports of each policy; an alias moved twice and one removed."""
    store = ArtifactStore(home / "artifacts")
    made: dict[str, Any] = {}

    def reg(name: str, type_: str, step: str, *parents: tuple[str, str]) -> None:
        f = tmp / f"{name}-{len(made)}.json"
        f.write_text(json.dumps({"name": name, "n": len(made)}))
        made[name] = store.register([(name, type_, f, {"step": step, "preset": "tiny"})], f"{step}-{len(made)}",
                                    [(i, made[p].id) for i, p in parents])[0]  # fmt: skip

    reg("tiny_sft_data", "sft_jsonl", "data/prep")
    reg("tiny_prompts", "prompt_jsonl", "data/prep")
    reg("tiny_sft_policy", "checkpoint_hf", "sft", ("data", "tiny_sft_data"))
    reg("tiny_rm", "checkpoint_hf", "rm/train", ("init_from", "tiny_sft_policy"))
    reg("tiny_ppo_policy", "checkpoint_hf", "rl/ppo", ("policy", "tiny_sft_policy"), ("reward_model", "tiny_rm"),
        ("prompts", "tiny_prompts"))  # fmt: skip
    reg("tiny_rlhf_policy", "checkpoint_hf", "rl/rlhf", ("policy", "tiny_sft_policy"),
        ("judge", "tiny_ppo_policy"), ("prompts", "tiny_prompts"))  # fmt: skip
    reg("tiny_sft_policy", "checkpoint_hf", "sft", ("data", "tiny_sft_data"))  # a second version
    for policy in ("sft", "ppo", "rlhf"):
        reg(f"tiny_{policy}_eval", "eval_report", "eval/policy", ("policy", f"tiny_{policy}_policy"),
            ("prompts", "tiny_prompts"))  # fmt: skip
    move_alias(store, store.resolve("tiny_sft_policy", "v1"), "best")
    move_alias(store, store.resolve("tiny_sft_policy", "v2"), "best")
    move_alias(store, store.resolve("tiny_ppo_policy", "v1"), "prod")
    move_alias(store, store.resolve("tiny_rlhf_policy", "v1"), "prod")
    from nemotron.artifacts.aliases import remove_alias

    remove_alias(store, "tiny_rlhf_policy", "prod")
    return store


def test_migrate_copies_a_store_that_then_answers_every_command_alike(
    home: Path, tmp_path: Path, run_cli: Any, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NEMOTRON_STORE_URL", raising=False)
    store = _tiny_pipeline_store(home, tmp_path)
    refs = [a.ref for a in store.list_artifacts()]
    commands = [("ls",), ("ls", "--json"), ("ls", "--alias", "best", "--json"), ("ls", "--step", "sft"),
                ("lineage", "tiny_rlhf_policy:latest"), ("lineage", "tiny_ppo_eval:v1", "--json"),
                ("show", "tiny_sft_policy@best", "--json"), ("show", "tiny_ppo_policy@prod"),
                ("show", "tiny_rlhf_policy:v1", "--json"), ("gc", "--keep", "1", "--verbose"),
                *(("show", ref) for ref in refs), ("show", "tiny_sft_policy@bset")]  # fmt: skip
    sqlite = [run_cli("artifacts", *c) for c in commands]
    assert all(r.code == 0 for r in sqlite[:-1]) and sqlite[-1].code == 2, [r.err for r in sqlite]
    r = run_cli("artifacts", "migrate", "--to", postgres_url)
    assert r.code == 0, r.err
    assert (
        "migrated 10 artifacts, 15 lineage edges, 2 aliases, 5 alias moves" in r.out and "verified" in r.out
    )
    team = {"NEMOTRON_STORE_URL": postgres_url}
    for c, before in zip(commands, sqlite, strict=True):
        after = run_cli("artifacts", *c, env=team)
        if (
            c[0] == "ls" and "--json" not in c
        ):  # the title names the index that answered; the table is the same
            title, table = after.out.split("┏", 1)
            assert " ".join(title.split()) == f"artifacts in {parse_store_url(postgres_url).shown}", after.out
            assert (after.code, table, after.err) == (before.code, before.out.split("┏", 1)[1], before.err), c
            continue
        assert (after.code, after.out, after.err) == (before.code, before.out, before.err), c
    again = run_cli("artifacts", "migrate", "--to", postgres_url)  # a re-run is a verified no-op
    assert again.code == 0 and "already holds this store" in again.out and "verified" in again.out, again.err
    store.register([("late", "prompt_jsonl", tmp_path / "tiny_sft_data-0.json", {})], "late-1")
    refused = run_cli("artifacts", "migrate", "--to", postgres_url)  # the target holds a different store now
    assert (
        refused.code == 2 and "already holds 10 artifacts" in refused.err and "Traceback" not in refused.err
    )
    assert "late" not in run_cli("artifacts", "ls", "--json", env=team).out  # nothing written


def test_an_unreachable_store_is_exit_3_in_one_line_naming_the_host(home: Path, run_cli: Any) -> None:
    url = f"postgresql://nemotron:hunter2@127.0.0.1:{free_port()}/team"
    started = time.monotonic()
    r = run_cli("artifacts", "ls", env={"NEMOTRON_STORE_URL": url})
    lines = r.err.strip().splitlines()
    assert r.code == 3 and lines[-1].startswith(
        "error: the artifact store postgresql://nemotron:***@127.0.0.1:"
    )
    assert "unreachable after 4 tries" in lines[-1] and "PGPASSWORD" in lines[-1], r.err
    assert "hunter2" not in r.err and "Traceback" not in r.err
    assert time.monotonic() - started > 3.0  # it retried with backoff (0.5 + 1 + 2 s) before giving up
    r = run_cli("artifacts", "migrate", "--to", url.replace("nemotron:hunter2", "nemotron"))
    assert r.code == 2 and "no SQLite store" in r.err  # an empty home has nothing to migrate


def test_a_step_whose_team_store_is_unreachable_is_refused_before_it_trains(home: Path, run_cli: Any) -> None:
    """Issue 42: the run trained, then failed registering (exit 3 after the work); now it is refused at submit,
    in the seconds of the store's retries, with nothing written."""
    url = f"postgresql://nemotron@127.0.0.1:{free_port()}/team"
    started = time.monotonic()
    r = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", env={"NEMOTRON_STORE_URL": url})
    assert r.code == 3 and "is unreachable after 4 tries" in r.err.strip().splitlines()[-1], r.err[-2000:]
    assert time.monotonic() - started < 30 and not home.exists()  # no job dir, no training
    dry = run_cli("steps", "run", "rl/reinforce", "-c", "tiny", "--dry-run", env={"NEMOTRON_STORE_URL": url})
    assert dry.code == 0, dry.err  # a dry run asks no service


def test_migrate_refuses_a_password_in_the_url(home: Path, run_cli: Any) -> None:
    r = run_cli("artifacts", "migrate", "--to", "postgresql://nemotron:hunter2@db.example.com/team")
    assert r.code == 2 and "a password in the URL" in r.err.splitlines()[0] and "PGPASSWORD" in r.err
    assert "hunter2" not in r.err and "Traceback" not in r.err
    r = run_cli("artifacts", "migrate", "--to", "mysql://db.example.com/team")
    assert r.code == 2 and "--to 'mysql://db.example.com/team': unsupported store" in r.err


def test_a_store_url_without_the_postgres_extra_is_exit_2(home: Path) -> None:
    blocked = (
        "import sys; sys.modules['psycopg'] = None; from nemotron.cli.app import main; main(sys.argv[1:])"
    )
    r = subprocess.run([sys.executable, "-c", blocked, "artifacts", "ls"], capture_output=True, text=True,
                       env={**__import__("os").environ, "NEMOTRON_STORE_URL": "postgresql://u@127.0.0.1/team"},
                       timeout=120, check=False)  # fmt: skip
    assert (
        r.returncode == 2 and "pip install 'nemotron[postgres]'" in r.stderr and "Traceback" not in r.stderr
    )


def test_the_cli_start_up_and_dry_run_do_not_import_the_driver(home: Path, run_cli_imports: Any) -> None:
    for args in (("steps", "list"), ("steps", "run", "sft", "-c", "tiny", "--dry-run"), ("artifacts", "ls")):
        r, modules = run_cli_imports(*args)
        assert r.code == 0, r.err
        assert not {"psycopg", "sqlalchemy"} & modules, args


def test_a_reused_connection_carries_nothing_from_the_command_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    from nemotron.artifacts.gc import gc_plan

    monkeypatch.setenv("NEMOTRON_STORE_URL", postgres_url)
    store = open_store(tmp_path / "a")
    assert list(store.newest(None)) == []  # nothing written yet: this connection's own empty tables answer
    src = tmp_path / "x.jsonl"
    src.write_text("{}\n")
    store.register([("x", "prompt_jsonl", src, {}), ("x", "prompt_jsonl", src, {})], "j")
    assert [a.ref for a in store.newest(None)] == ["x:v2", "x:v1"]  # the store's tables, not those empty ones
    for _ in range(2):  # each gc plans into temporary tables of its own
        kept, removable = gc_plan(store, keep=1)
        assert ([a.ref for a in kept], [a.ref for a in removable]) == (["x:v2"], ["x:v1"])


def _backend(store: ArtifactStore) -> int:
    with store._connect() as conn:
        return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])


def test_a_forked_child_leaves_the_parent_s_connection_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    import multiprocessing

    monkeypatch.setenv("NEMOTRON_STORE_URL", postgres_url)
    store = open_store(tmp_path / "a")
    src = tmp_path / "x.jsonl"
    src.write_text("{}\n")
    store.register([("x", "prompt_jsonl", src, {})], "j")
    parent = _backend(store)  # the connection this process keeps between commands
    assert _backend(store) == parent
    ctx = multiprocessing.get_context("fork")
    got = ctx.Queue()
    child = ctx.Process(target=lambda: got.put((store.resolve("x").ref, _backend(store))))
    child.start()
    ref, backend = got.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and ref == "x:v1"
    assert backend != parent  # the child opened its own: two processes on one socket would garble both
    assert _backend(store) == parent and store.resolve("x").ref == "x:v1"  # the parent's still works
