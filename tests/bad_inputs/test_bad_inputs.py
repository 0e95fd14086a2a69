"""Run the bad-input corpus (cases.toml): each case exits 2 with one clear message, no traceback, nothing written."""

from __future__ import annotations

import hashlib
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from nemotron.core.paths import shipped_root

CASES = tomllib.loads((Path(__file__).parent / "cases.toml").read_text())["case"]


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp)).replace("{tiny}", str(shipped_root() / "tiny"))


def _snapshot(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def test_the_corpus_is_big_enough() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names))
    print(f"bad-input corpus: {len(CASES)} cases")
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bad_input(case: dict[str, Any], home: Path, tmp_path: Path, run_cli: Any) -> None:
    for name, text in case.get("files", {}).items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(_fill(text, tmp_path))
    for name, hexdata in case.get("hex", {}).items():
        (tmp_path / name).write_bytes(bytes.fromhex(hexdata.replace(" ", "")))
    if "big_line" in case:
        with (tmp_path / case["big_line"]).open("w") as f:
            f.write('{"prompt": "' + "a" * (100 << 20) + '"}\n')
    env = {**os.environ, **{k: _fill(v, tmp_path) for k, v in case.get("env", {}).items()}}
    if case.get("steps_root"):
        env["NEMOTRON_STEPS_PATH"] = str(tmp_path / "root")
    for setup in case.get("setup", []):
        r = run_cli(*[_fill(a, tmp_path) for a in setup], env=env, cwd=tmp_path, timeout=300)
        assert r.code == 0, f"setup failed: {r.err[-2000:]}"
    before = _snapshot(home)

    r = run_cli(*[_fill(a, tmp_path) for a in case["args"]], env=env, cwd=tmp_path, timeout=300)

    assert r.code == case.get("code", 2), f"exit {r.code}\n{r.err[-2000:]}"
    assert _fill(case["expect"], tmp_path) in r.err, r.err[-2000:]
    assert "Traceback" not in r.err and "Traceback" not in r.out
    assert r.err.startswith("error: "), r.err[:300]
    assert _snapshot(home) == before, "a failed command changed $NEMOTRON_HOME"
