"""The tokenizer the preflight compares is the one transformers loads: for each file that names special or added
tokens, a copy of the shipped tiny tokenizer is edited, loaded with the locked transformers
(PreTrainedTokenizerFast.from_pretrained, what nemotron.models.checkpoint.load_tokenizer calls) and read by
nemotron.models.tokenizer_match; the special tokens by role and every id's token text must agree. Issue 42: a
special_tokens_map.json that made <unk> the EOS passed the check, transformers loaded <unk>, and the run never
stopped a response."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from nemotron.core.paths import shipped_root
from nemotron.models.tokenizer_match import SPECIAL_ROLES, read_tokenizer

SHIPPED = shipped_root() / "tiny" / "sft_policy"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _write(path: Path, tree: object) -> None:
    path.write_text(json.dumps(tree, indent=2))


def _config(d: Path) -> dict[str, object]:
    tree: dict[str, object] = json.loads((d / "tokenizer_config.json").read_text())
    return tree


def special_map_sets_eos_and_pad(d: Path) -> None:
    """The old way of saving: special_tokens_map.json beside a tokenizer_config.json without added_tokens_decoder;
    transformers reads the map last, so its roles win."""
    _write(d / "special_tokens_map.json", {"eos_token": "<unk>", "pad_token": "<unk>"})


def special_map_ignored_beside_added_tokens_decoder(d: Path) -> None:
    """A tokenizer_config.json with added_tokens_decoder (how transformers 5 saves): special_tokens_map.json is not
    read at all."""
    decoder = {str(i): {"content": t, "special": True} for i, t in enumerate(("<pad>", "<eos>", "<unk>"))}
    _write(d / "tokenizer_config.json", {**_config(d), "added_tokens_decoder": decoder})
    _write(d / "special_tokens_map.json", {"eos_token": "<unk>", "pad_token": "<unk>"})


def config_sets_eos_as_a_dict(d: Path) -> None:
    """A role written as a serialized AddedToken in tokenizer_config.json (as transformers 4 saved them)."""
    token = {"__type": "AddedToken", "content": "<unk>", "lstrip": False, "rstrip": False, "special": True}
    _write(d / "tokenizer_config.json", {**_config(d), "eos_token": token})


def special_map_as_dicts(d: Path) -> None:
    """special_tokens_map.json's roles as AddedToken dicts, with a bos transformers would otherwise lack."""
    _write(d / "special_tokens_map.json", {"bos_token": {"content": "<eos>", "lstrip": False}})


def added_tokens_json_in_the_old_way(d: Path) -> None:
    """added_tokens.json (the old way) naming a token past the vocabulary: transformers adds it at its id."""
    size = len(json.loads((d / "tokenizer.json").read_text())["model"]["vocab"])
    _write(d / "added_tokens.json", {"<extra>": size})


EDITS: list[Callable[[Path], None]] = [
    special_map_sets_eos_and_pad,
    special_map_ignored_beside_added_tokens_decoder,
    config_sets_eos_as_a_dict,
    special_map_as_dicts,
    added_tokens_json_in_the_old_way,
]


@pytest.mark.parametrize("edit", EDITS, ids=[e.__name__ for e in EDITS])
def test_the_preflight_reads_what_transformers_loads(edit: Callable[[Path], None], tmp_path: Path) -> None:
    d = tmp_path / "tokenizer"
    d.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(SHIPPED / name, d / name)
    edit(d)
    loaded = PreTrainedTokenizerFast.from_pretrained(str(d), local_files_only=True)
    ours = read_tokenizer(d)
    assert ours is not None
    theirs = {
        role: str(getattr(loaded, role)) for role in SPECIAL_ROLES if getattr(loaded, role, None) is not None
    }
    assert ours.specials == theirs
    vocabulary = ours.vocabulary()
    assert len(vocabulary) == len(loaded)
    assert list(vocabulary) == loaded.convert_ids_to_tokens(list(range(len(loaded))))


def test_the_unchanged_shipped_tokenizer_reads_alike(tmp_path: Path) -> None:
    loaded = PreTrainedTokenizerFast.from_pretrained(str(SHIPPED), local_files_only=True)
    ours = read_tokenizer(SHIPPED)
    assert ours is not None and ours.specials == {
        role: str(getattr(loaded, role)) for role in SPECIAL_ROLES if getattr(loaded, role, None) is not None
    }
