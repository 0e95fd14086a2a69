"""Plain nested-dict helpers for configs: dotted keys, deep merge, flattening. No OmegaConf objects leak out."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` wins; dicts merge recursively, everything else (lists included) is replaced. A new tree in `base`'s key
    order, then `top`'s new keys; each value copied once (copying all of `base` at every level copied a subtree once
    per level above it, on every compile)."""
    out: dict[str, Any] = {}
    for k, v in base.items():
        if k not in top:
            out[k] = copy.deepcopy(v)
        elif isinstance(top[k], Mapping) and isinstance(v, Mapping):
            out[k] = deep_merge(v, top[k])
        else:
            out[k] = copy.deepcopy(top[k])
    for k, v in top.items():
        if k not in base:
            out[k] = copy.deepcopy(v)
    return out


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf value) pairs; an empty dict is a leaf."""
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            yield from flatten(v, key + ".")
        else:
            yield key, v


def unflatten(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}}; nested dict values are merged in too."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = node[p] = {}
            node = nxt
        if isinstance(value, Mapping) and isinstance(node.get(parts[-1]), dict):
            node[parts[-1]] = deep_merge(node[parts[-1]], value)
        else:
            node[parts[-1]] = value
    return out


def get_dotted(tree: Mapping[str, Any], key: str) -> Any:
    node: Any = tree
    for p in key.split("."):
        if not isinstance(node, Mapping) or p not in node:
            return None
        node = node[p]
    return node


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def _interpolates(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, Mapping):
        return any(_interpolates(v) for v in value.values())
    if isinstance(value, list):
        return any(_interpolates(v) for v in value)
    return False


def resolve_interpolations(tree: dict[str, Any]) -> dict[str, Any]:
    """`${...}` resolved by OmegaConf. A tree without one is returned as it is, and OmegaConf is not imported: it is
    a quarter of a dry run's start-up (docs/benchmarks.md, "CLI latency")."""
    if not _interpolates(tree):
        return tree
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from nemotron.errors import UserError

    try:
        resolved = OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except OmegaConfBaseException as e:
        raise UserError(f"cannot resolve config interpolation: {str(e).splitlines()[0]}") from None
    assert isinstance(resolved, dict)
    return {str(k): v for k, v in resolved.items()}
