"""deep_merge, the merge of every config layer (schema defaults < presets < profile < CLI): what wins, in which key
order, and that the merged tree shares nothing with its layers."""

from __future__ import annotations

from typing import Any

import pytest

from nemotron.config.configtree import deep_merge


@pytest.mark.parametrize(
    ("base", "top", "merged"),
    [
        # top wins a leaf; base's keys keep their order, top's new keys follow in top's order
        ({"a": 1, "b": 2, "c": 3}, {"z": 9, "b": 5, "y": 8}, {"a": 1, "b": 5, "c": 3, "z": 9, "y": 8}),
        # dicts merge at every depth
        ({"t": {"u": {"v": 1, "w": 2}}}, {"t": {"u": {"w": 3, "x": 4}}}, {"t": {"u": {"v": 1, "w": 3, "x": 4}}}),
        # a list or a scalar replaces whatever was there, and a dict replaces a scalar
        ({"l": [1, 2], "s": 1, "d": {"k": 1}}, {"l": [3], "s": {"k": 2}, "d": None}, {"l": [3], "s": {"k": 2}, "d": None}),
    ],
)  # fmt: skip
def test_top_wins_and_keys_keep_their_order(base: dict[str, Any], top: dict[str, Any], merged: Any) -> None:
    out = deep_merge(base, top)
    assert out == merged
    assert repr(out) == repr(merged)  # the order of the keys too, at every depth (the dry run prints it)


def test_the_merged_tree_shares_nothing_with_its_layers() -> None:
    base = {"g": {"kept": [1], "both": {"x": [2]}}}
    top = {"g": {"both": {"y": [3]}}, "new": {"z": [4]}}
    out = deep_merge(base, top)
    out["g"]["kept"].append(0)
    out["g"]["both"]["x"].append(0)
    out["g"]["both"]["y"].append(0)
    out["new"]["z"].append(0)
    assert base == {"g": {"kept": [1], "both": {"x": [2]}}}
    assert top == {"g": {"both": {"y": [3]}}, "new": {"z": [4]}}
