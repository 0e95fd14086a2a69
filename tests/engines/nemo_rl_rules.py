"""NeMo-RL v0.7.0's rules as the engine tests apply them: its config loader (nemo_rl/utils/config.py,
re-implemented from its description: `defaults:` parents merged depth-first, `_override_: true` sections replacing
the base's), and the rules that find which config keys a line of its source reads (`keys_read_on`, `reads`), which
test_nemo_rl_config.py::test_the_source_reading_rules_tell_a_wrong_path checks on lines written there."""

from __future__ import annotations

import ast
import copy
from typing import Any

from tests.engines import nemo_rl_v070 as tag
from tests.engines.mirrors import git_show

from nemotron.config.configtree import get_dotted


def _omegaconf_merge(base: Any, over: Any) -> Any:
    """OmegaConf.merge of plain trees: mappings merge key by key; anything else (lists too) replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _omegaconf_merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


def _merge_with_override(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A top-level section marked `_override_: true` replaces the base's section instead of merging into it."""
    base, over = copy.deepcopy(base), copy.deepcopy(over)
    for key, value in over.items():
        if isinstance(value, dict) and value.pop("_override_", False):
            base.pop(key, None)
    merged: dict[str, Any] = _omegaconf_merge(base, over)
    return merged


def load_config(tree: dict[str, Any], files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`defaults:` (a path or a list) names parents, loaded depth-first and merged in order; the file last."""
    tree = copy.deepcopy(tree)
    parents = tree.pop("defaults", None)
    if parents is None:
        return tree
    base: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        base = _merge_with_override(base, load_config(files[parent], files))
    return _merge_with_override(base, tree)


def has(tree: dict[str, Any], dotted: str) -> bool:
    """Whether the key is there, even with a null value (which get_dotted alone cannot tell from absent)."""
    parent, _, last = dotted.rpartition(".")
    node = get_dotted(tree, parent) if parent else tree
    return isinstance(node, dict) and last in node


def show(path: str) -> str:
    """A file of NeMo-RL's mirror at the tag."""
    return git_show(tag.MIRROR, tag.TAG, path)


def walks(tree: Any, dotted: str) -> bool:
    """Whether the YAML tree has the key at this very dotted path (its value may be null)."""
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


# NeMo-RL's whole config: `master_config` everywhere, `config` in the example scripts (as `config.policy`).
ROOT = "master_config"
SCRIPT_ROOT = "config"
Chain = tuple[tuple[str, ...], bool]  # (keys, outermost last; whether the first key is a top-level section)


def _chain(node: ast.AST, names: dict[str, Chain]) -> Chain:
    """The keys an expression reads: `master_config.policy["generation"]` -> (("policy", "generation"), True);
    `cfg["a"]` -> (("a",), False) for a `cfg` not assigned from the config in this function."""
    if isinstance(node, ast.Name):
        return names.get(node.id, ((), node.id == ROOT))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id in (ROOT, SCRIPT_ROOT):
            return (node.attr,), True
        return (), False
    if isinstance(node, ast.Subscript):
        keys, rooted = _chain(node.value, names)
        key = node.slice.value if isinstance(node.slice, ast.Constant) else None
        return (*keys, key if isinstance(key, str) else "*"), rooted
    if isinstance(node, ast.Call) and _is_get(node):
        assert isinstance(node.func, ast.Attribute) and isinstance(node.args[0], ast.Constant)
        keys, rooted = _chain(node.func.value, names)
        return (*keys, str(node.args[0].value)), rooted
    return (), False


def _is_get(node: ast.Call) -> bool:
    return (isinstance(node.func, ast.Attribute) and node.func.attr == "get" and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))  # fmt: skip


def _last_key_line(node: ast.AST) -> int | None:
    """The line of the last key `node` reads, when it reads one."""
    if isinstance(node, ast.Subscript):
        return node.slice.lineno
    if isinstance(node, ast.Call) and _is_get(node):
        return node.args[0].lineno
    if (
        isinstance(node, ast.Compare)
        and isinstance(node.ops[0], ast.In)
        and isinstance(node.left, ast.Constant)
    ):
        return node.left.lineno if isinstance(node.left.value, str) else None
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.lineno  # a field of a config class
    return None


class _KeyReads(ast.NodeVisitor):
    """Every key read in a module, by the line of its last key, with names resolved within their function: a name
    assigned (only) from a chain rooted at the config stands for that chain (`grpo_config = master_config.grpo`)."""

    def __init__(self) -> None:
        self.names: list[dict[str, Chain]] = [{}]
        self.by_line: dict[int, list[Chain]] = {}

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        found: dict[str, set[Chain]] = {}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                chain = _chain(sub.value, self.names[-1])
                if chain[1]:
                    found.setdefault(sub.targets[0].id, set()).add(chain)
        self.names.append({**self.names[-1], **{n: next(iter(c)) for n, c in found.items() if len(c) == 1}})
        self.generic_visit(node)
        self.names.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def generic_visit(self, node: ast.AST) -> None:
        line = _last_key_line(node)
        if line is not None:
            names = self.names[-1]
            if isinstance(node, ast.Compare):  # `"b" in cfg[k]` reads b of cfg[k]
                keys, rooted = _chain(node.comparators[0], names)
                chain: Chain = ((*keys, str(node.left.value)), rooted)  # type: ignore[attr-defined]
            elif isinstance(node, ast.AnnAssign):
                chain = ((node.target.id,), False)  # type: ignore[union-attr]
            else:
                chain = _chain(node, names)
            self.by_line.setdefault(line, []).append(chain)
        super().generic_visit(node)


def keys_read_on(module: ast.Module, line: int) -> list[Chain]:
    """Every chain of keys whose last key is read on `line` of the parsed source."""
    visitor = _KeyReads()
    visitor.visit(module)
    return visitor.by_line.get(line, [])


def reads(chain: Chain, dotted: str) -> bool:
    """Whether a chain read in the source is the dotted key: all of it when the chain starts at the config's top,
    else its end ("*" stands for any one part)."""
    keys, rooted = chain
    parts = dotted.split(".")
    if rooted and len(keys) != len(parts):
        return False
    tail = parts[-len(keys) :] if keys else []
    return 0 < len(keys) <= len(parts) and all(k in ("*", p) for k, p in zip(keys, tail, strict=True))
