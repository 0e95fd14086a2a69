"""The keys of a step's config as its schema declares them: each with its description (the docstring under the
field, read from the source: docs/reference/config.md is made from these), and the names peers give a key, which its
description states ("(TRL: beta)", "NeMo-RL: policy.train_global_batch_size"), so that an unknown key a peer's user
types is answered with ours."""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from nemotron.config.configtree import flatten
from nemotron.errors import did_you_mean


@dataclass(frozen=True)
class SchemaField:
    """One key of a step's config: a group (a nested model) or a leaf."""

    key: str
    info: FieldInfo
    group: type[BaseModel] | None
    doc: str  # the docstring under the field's declaration, "" when it has none

    @property
    def description(self) -> str:
        """The field's description (its docstring, or a `Field(description=...)`), or for a group without one
        its class docstring."""
        text = self.doc or self.info.description or (self.group.__doc__ if self.group else None)
        return " ".join(text.split()) if text else ""


def _group_of(annotation: Any) -> type[BaseModel] | None:
    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


@functools.cache
def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings under the fields `cls` itself declares (a string statement right after `name: T = ...`),
    read from its source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    return {
        field.target.id: doc.value.value
        for field, doc in itertools.pairwise(body)
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
        and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
    }  # fmt: skip


def _field_doc(model: type[BaseModel], name: str) -> str:
    own = [c for c in model.__mro__ if issubclass(c, BaseModel) and c is not BaseModel]
    return next((d[name] for c in own if name in (d := _attribute_docs(c))), "")


def schema_fields(model: type[BaseModel], prefix: str = "") -> Iterator[SchemaField]:
    """Every field of `model`, groups before their keys, depth first, in declaration order."""
    for name, info in model.model_fields.items():
        group = _group_of(info.annotation)
        yield SchemaField(prefix + name, info, group, _field_doc(model, name))
        if group is not None:
            yield from schema_fields(group, f"{prefix}{name}.")


# "(TRL: beta)", "TRL GRPO: beta", "NeMo-RL and NeMo-Aligner: dpo.sft_average_log_probs": a peer, then its name for the
# key; a name followed by anything but the end of its clause (optim.betas[0], optim.sched.min_lr / lr,
# trainer.{reinforce,ppo}.*) is a formula or a pattern, not a key a user could type, and is not taken.
_PEER_NAME = re.compile(
    r"\b(NeMo-RL|NeMo-Aligner|TRL)((?: and NeMo-RL| and NeMo-Aligner| [A-Z]{2,}[a-z]*)?): "
    r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?=[);,]|$|\s+(?:and|or)\s|\s*\()"
)


class PeerKey(NamedTuple):
    """A peer's name for one of our keys."""

    peer: str  # as the description says it: "TRL", "TRL GRPO", "NeMo-RL and NeMo-Aligner"
    name: str  # the peer's key: "beta", "policy.train_global_batch_size"
    key: str  # ours: "dpo.reference_policy_kl_penalty"


def peer_keys(model: type[BaseModel]) -> list[PeerKey]:
    """Every peer's name for a key of `model` that its description states, where it is not ours too."""
    found = []
    for field in schema_fields(model):
        for match in _PEER_NAME.finditer(field.description):
            peer, name = match.group(1) + match.group(2), match.group(3)
            if name != field.key and not field.key.endswith("." + name):  # ours too: nothing to answer
                found.append(PeerKey(peer, name, field.key))
    return found


def peer_hint(model: type[BaseModel], unknown: str) -> str:
    """` (TRL's beta is dpo.reference_policy_kl_penalty here)` for an unknown dotted key that a peer's name for one of
    ours ends (a bare name matches the key's last part, a dotted one its last parts); "" when none does. Where
    several keys match, those in the unknown key's own group are named, if any."""
    parent, _, leaf = unknown.rpartition(".")
    hits = [
        p
        for p in peer_keys(model)
        if unknown == p.name or unknown.endswith("." + p.name) or ("." not in p.name and leaf == p.name)
    ]
    hits = [p for p in hits if p.key.rpartition(".")[0] == parent] or hits
    if not hits:
        return ""
    return " (" + "; ".join(f"{p.peer}'s {p.name} is {p.key} here" for p in dict.fromkeys(hits)) + ")"


def model_at(schema: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    """The nested pydantic model that owns `path` (so its fields can be suggested), if any."""
    model: type[BaseModel] | None = schema
    for part in path:
        if model is None or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        candidates = (
            typing.get_args(ann)
            if isinstance(ann, types.UnionType) or typing.get_origin(ann) is typing.Union
            else (ann,)
        )
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def unknown_key_hint(schema: type[BaseModel], loc: list[str], value: Any) -> str:
    """What an unknown key at `loc` (its value `value`: a whole group when the group is unknown) may have meant: ours
    for a peer's name (`peer_hint`), else the close names in the group that holds it (`did you mean`)."""
    key = ".".join(loc)
    typed = [f"{key}.{k}" for k, _ in flatten(value)] if isinstance(value, dict) and value else [key]
    peers = "".join(dict.fromkeys(peer_hint(schema, k) for k in typed))
    if peers:
        return peers
    owner = model_at(schema, loc[:-1])
    hint = did_you_mean(loc[-1], owner.model_fields if owner else [])
    return hint.replace("'", "'" + ".".join(loc[:-1]) + ".", 1) if hint and len(loc) > 1 else hint
