"""The catalog caches validated manifests by path, mtime and size: a second catalog parses no TOML and validates
nothing (so `steps list` builds no pydantic schema), an edited manifest or an edited catalog (nemotron/catalog/__init__.py) is read again, a
removed one drops out, and a cache that cannot be used costs nothing."""

from __future__ import annotations

import datetime
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from nemotron.catalog import _ADAPTERS, Catalog, ManifestCache
from nemotron.catalog import manifest_cache as catalog_cache

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "steproot" / "manifests" / "test" / "count.toml"


def user_root(tmp_path: Path, n: int) -> Path:
    root = tmp_path / "mysteps"
    for i in range(n):
        m = root / "manifests" / "user" / f"s{i}.toml"
        m.parent.mkdir(parents=True, exist_ok=True)
        m.write_text(FIXTURE.read_text().replace('id = "test/count"', f'id = "user/s{i}"'))
    return root


def test_a_second_catalog_parses_no_toml(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = user_root(tmp_path, 20)
    parsed: list[Any] = []
    real = tomllib.load
    monkeypatch.setattr(tomllib, "load", lambda f: parsed.append(f.name) or real(f))
    first = Catalog([root])
    assert len(parsed) == 20 and (tmp_path / "cache" / "manifests.json").is_file()
    parsed.clear()
    _ADAPTERS.clear()
    second = Catalog([root])
    assert parsed == [] and second.steps.keys() == first.steps.keys()
    assert not _ADAPTERS  # no pydantic schema was built: nothing was validated
    assert second.get("user/s3").manifest == first.get("user/s3").manifest
    edited = root / "manifests" / "user" / "s3.toml"
    edited.write_text(edited.read_text().replace('name = "', 'name = "Edited '))
    os.utime(edited, ns=(1, 1))  # a different mtime whatever the clock's resolution
    (root / "manifests" / "user" / "s4.toml").unlink()
    third = Catalog([root])
    assert [Path(p).name for p in parsed] == ["s3.toml"]
    assert third.get("user/s3").manifest.step.name.startswith("Edited ") and "user/s4" not in third.steps
    assert len(ManifestCache().entries) == 19  # the removed manifest left the cache too


def test_another_catalog_module_validates_anew(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a valid manifest is lives in nemotron/catalog/__init__.py: another release of it (here, another mtime) reads every file
    again rather than trust what the old one validated."""
    root = user_root(tmp_path, 3)
    module = tmp_path / "catalog.py"
    module.write_text("# stands for nemotron/catalog/__init__.py\n")
    monkeypatch.setattr(catalog_cache, "SCHEMA_MODULE", module)
    parsed: list[Any] = []
    real = tomllib.load
    monkeypatch.setattr(tomllib, "load", lambda f: parsed.append(f.name) or real(f))
    Catalog([root])
    Catalog([root])
    assert len(parsed) == 3
    os.utime(module, ns=(1, 1))
    Catalog([root])
    assert len(parsed) == 6


def test_a_manifest_json_cannot_hold_is_validated_every_time(home: Path, tmp_path: Path) -> None:
    """A TOML date (a parameter's default) would come back from JSON as a string: that manifest is not cached."""
    root = user_root(tmp_path, 2)
    dated = root / "manifests" / "user" / "s1.toml"
    dated.write_text(dated.read_text() + '\n[[parameters]]\nkey = "since"\ndefault = 2026-11-01\n')
    for _ in range(2):
        param = Catalog([root]).get("user/s1").manifest.parameters[-1]
        assert param.key == "since" and param.default == datetime.date(2026, 11, 1)
    assert [Path(p).name for p in ManifestCache().entries] == ["s0.toml"]


def test_an_unusable_cache_is_not_used(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = user_root(tmp_path, 2)
    (tmp_path / "cache").write_text("not a directory")
    assert sorted(Catalog([root]).steps) == ["user/s0", "user/s1"]
    monkeypatch.setenv("NEMOTRON_CACHE_DIR", str(tmp_path / "cache2"))
    (tmp_path / "cache2").mkdir()
    (tmp_path / "cache2" / "manifests.json").write_text("{garbage")
    assert sorted(Catalog([root]).steps) == ["user/s0", "user/s1"]


def test_steps_list_shows_every_user_step_uncut(home: Path, tmp_path: Path, run_cli: Any) -> None:
    root = user_root(tmp_path, 30)
    r = run_cli("steps", "list", env={"NEMOTRON_STEPS_PATH": str(root)})
    assert r.code == 0, r.err
    assert sum(line.startswith("user/s") for line in r.out.splitlines()) == 30 and "…" not in r.out
    assert r.out.splitlines()[1].split() == ["id", "consumes", "→", "produces", "presets", "name"]
