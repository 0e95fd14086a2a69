"""The artifact store: versions, `latest`, content hashes, verify, concurrent writers, and gc that keeps ancestors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nemotron.artifacts.gc import gc_plan
from nemotron.artifacts.refs import parse_ref
from nemotron.artifacts.store import ArtifactStore, content_hash, open_store
from nemotron.errors import NotFound


def _file(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def test_register_resolve_and_latest(tmp_path: Path, store_backend: str) -> None:
    store = open_store(tmp_path / "a")
    a1 = store.register(
        [("prompts", "prompt_jsonl", _file(tmp_path, "p1.jsonl", '{"prompt": "a"}\n'), {})], job_id="j1"
    )[0]
    a2 = store.register(
        [("prompts", "prompt_jsonl", _file(tmp_path, "p2.jsonl", '{"prompt": "b"}\n'), {})], job_id="j2"
    )[0]
    assert (a1.ref, a2.ref) == ("prompts:v1", "prompts:v2")
    assert store.resolve("prompts").id == a2.id  # latest
    assert store.resolve("prompts", "v1").id == a1.id
    with pytest.raises(NotFound, match="has no version v9"):
        store.resolve("prompts", "v9")
    with pytest.raises(NotFound, match="did you mean 'prompts'"):
        store.resolve("prompt")
    assert [a.ref for a in store.list_artifacts(type_="prompt_jsonl")] == ["prompts:v1", "prompts:v2"]


def test_refs_parse_the_forms_users_write(tmp_path: Path) -> None:
    assert parse_ref("sft:v3").kind == "store" and parse_ref("art://sft:latest").version == "latest"
    assert parse_ref("meta-llama/Llama-3.2-1B-Instruct").kind == "hub"
    existing = _file(tmp_path, "x.jsonl", "{}")
    assert parse_ref(str(existing)).kind == "path"
    assert parse_ref("pkg://tiny/prompts.jsonl").path is not None


def test_content_hash_covers_names_sizes_and_bytes(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "a.bin").write_bytes(b"\x00\x01")
    (d / "b.txt").write_text("hi")
    h1, files = content_hash(d)
    assert [f["path"] for f in files] == ["a.bin", "b.txt"]
    (d / "a.bin").write_bytes(b"\x00\x02")  # same size, one byte flipped
    assert content_hash(d)[0] != h1


def test_verify_catches_a_flipped_byte(home: Path, run_cli: Any, tmp_path: Path, store_backend: str) -> None:
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(bytes(range(256)))
    (d / "config.json").write_text("{}")
    open_store(home / "artifacts").register([("m", "checkpoint_hf", d, {})], job_id="j")
    assert run_cli("artifacts", "verify", "m:v1").code == 0
    data = bytearray((d / "model.safetensors").read_bytes())
    data[100] ^= 0xFF
    (d / "model.safetensors").write_bytes(bytes(data))
    r = run_cli("artifacts", "verify", "m:v1")
    assert r.code == 1 and "model.safetensors" in r.out and "content changed" in r.out


WORKER = """
import sys
import time
from pathlib import Path
from nemotron.artifacts.store import open_store
root, worker, count, src = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = open_store(Path(root))
for i in range(count):
    store.register([("shared", "prompt_jsonl", Path(src), {"worker": worker, "i": i})], job_id=f"w{worker}-{i}")
    store.resolve("shared")
"""


def test_concurrent_registration_from_processes_loses_and_duplicates_nothing(
    tmp_path: Path, store_backend: str
) -> None:
    src = _file(tmp_path, "s.jsonl", '{"prompt": "x"}\n')
    workers, per = 6, 15
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "a"), str(w), str(per), str(src)])
        for w in range(workers)
    ]
    assert all(p.wait(120) == 0 for p in procs)
    arts = open_store(tmp_path / "a").list_artifacts(name="shared")
    assert sorted(a.version for a in arts) == list(range(1, workers * per + 1))  # no gap, no duplicate
    assert len({(a.metadata["worker"], a.metadata["i"]) for a in arts}) == workers * per  # no lost write


def test_gc_keeps_ancestors_of_kept_artifacts(run_cli: Any, job_outputs: tuple[ArtifactStore, Path]) -> None:
    store, owned = job_outputs
    data_v1 = store.register([("data", "prompt_jsonl", _file(owned, "d1.jsonl", "{}"), {})], "j1")[0]
    data_v2 = store.register([("data", "prompt_jsonl", _file(owned, "d2.jsonl", "{}\n{}"), {})], "j2")[0]
    # the only model was made from data:v1, so data:v1 must survive although data:v2 is newer
    model = store.register(
        [("model", "prompt_jsonl", _file(owned, "m.jsonl", "{}"), {})], "j3", parents=[("data", data_v1.id)]
    )[0]
    kept, removable = gc_plan(store, keep=1)
    assert {a.ref for a in kept} == {"data:v1", "data:v2", "model:v1"} and removable == []
    store.register(
        [("model", "prompt_jsonl", _file(owned, "m2.jsonl", "{}{}"), {})],
        "j4",
        parents=[("data", data_v2.id)],
    )
    r = run_cli("artifacts", "gc")
    assert r.code == 0 and "would remove model:v1" in r.out and "would remove data:v1" in r.out
    assert (owned / "m.jsonl").exists()  # a dry run by default
    r = run_cli("artifacts", "gc", "--verbose")
    assert "would remove model:v1 (prompt_jsonl): delete files + index entry" in r.out
    r = run_cli("artifacts", "gc", "--yes")
    assert r.code == 0
    left = {a["ref"] for a in json.loads(run_cli("artifacts", "ls", "--json").out)}
    assert left == {"data:v2", "model:v2"}
    assert not (owned / "m.jsonl").exists() and not (owned / "d1.jsonl").exists()
    assert model.id not in {a.id for a in store.list_artifacts()}


EXTERNAL_WORKER = """
import sys, time
from pathlib import Path
from nemotron.artifacts.store import open_store
root, src, go = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
store = open_store(root)
time.sleep(max(0.0, go - time.time()))  # every process looks the file up at the same moment
print(store.register_external("prompt_jsonl", src).ref)
"""


def test_jobs_binding_one_plain_file_at_once_register_it_once(tmp_path: Path, store_backend: str) -> None:
    """Two jobs started together bind the same shipped prompts file: one `external.*` artifact, not :v1 and :v2
    (the lookup and the insert are one transaction)."""
    src = _file(tmp_path, "p.jsonl", '{"prompt": "x"}\n')
    open_store(tmp_path / "a")  # the schema exists before the race
    go = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", EXTERNAL_WORKER, str(tmp_path / "a"), str(src), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    refs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert refs == {"external.p.jsonl:v1"}
    assert [a.ref for a in open_store(tmp_path / "a").list_artifacts(name="external.p.jsonl")] == [
        "external.p.jsonl:v1"
    ]
