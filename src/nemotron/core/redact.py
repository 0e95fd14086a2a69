"""Secret redaction for everything we print or write: by key name, and by known secret value."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

MASK = "***"
# Secret-looking name parts (a name splits at _ . - and camelCase): `token`, `api_key`, `WANDB_API_KEY`, `authToken`
# are secrets; `max_new_tokens`, `token_level_loss`, `keyword` are not (a part must be one of these words).
_SECRET_PARTS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "cookie",
        "private",
        "bearer",
    }
)
_PARTS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# names that only describe how tokens are counted or handled, never hold one
_NOT_SECRET = frozenset({"token_level_loss", "tokenizer"})
# A last part that makes the name point at where a secret lives, not hold it: `token_file`, `key_path`, `token_env`.
_POINTER_PARTS = frozenset({"file", "path", "env", "dir"})
# Values shorter than this are not hunted for in free text: they would mask innocent substrings.
_MIN_VALUE_LEN = 6


@lru_cache(maxsize=4096)  # a dry run asks of every config key three times (the config, its secrets, the env)
def is_secret_name(name: str) -> bool:
    """True when one of the name's parts is a secret word: `judge.token`, `WANDB_API_KEY`, `authToken`; not
    `max_new_tokens`, `token_level_loss`, `keyword` or `monkey`, and not a name of where a secret is kept
    (`token_file`, `SSH_KEY_PATH`, `token_env`): a path or a variable's name is not a secret."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf.lower() in _NOT_SECRET:
        return False
    parts = [part.lower() for part in _PARTS.findall(leaf)]
    if parts and parts[-1] in _POINTER_PARTS:
        return False
    return any(part in _SECRET_PARTS for part in parts)


def redact_tree(tree: Any) -> Any:
    """A copy with the value of every secret-named key masked, at any depth."""
    if isinstance(tree, Mapping):
        return {
            k: (MASK if is_secret_name(str(k)) and v not in (None, "") else redact_tree(v))
            for k, v in tree.items()
        }
    if isinstance(tree, list | tuple):
        return [redact_tree(v) for v in tree]
    return tree


def secret_values(*trees: Any, environ: Mapping[str, str] | None = None) -> set[str]:
    """Every value held under a secret-looking name, in the given trees and the environment."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if is_secret_name(str(k)) and isinstance(v, str | int) and len(str(v)) >= _MIN_VALUE_LEN:
                    found.add(str(v))
                walk(v)
        elif isinstance(node, list | tuple):
            for v in node:
                walk(v)

    for t in trees:
        walk(t)
    walk(dict(os.environ if environ is None else environ))
    return found


def secret_overrides(tree: Any, prefix: str = "") -> dict[str, Any]:
    """dotted key -> value of every non-empty value held under a secret-looking name: what a step is handed
    apart from its masked config."""
    out: dict[str, Any] = {}
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            key = f"{prefix}{k}"
            if is_secret_name(str(k)) and v not in (None, ""):
                out[key] = v
            else:
                out.update(secret_overrides(v, key + "."))
    return out


def redact_values(tree: Any, values: Iterable[str]) -> Any:
    """A copy with every known secret value masked inside any string, at any depth (structure stays valid)."""
    values = sorted(set(values), key=len, reverse=True)
    if isinstance(tree, Mapping):
        return {k: redact_values(v, values) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [redact_values(v, values) for v in tree]
    if isinstance(tree, str):
        return redact_text(tree, values)
    return tree


# The password of a URL (scheme://user:PASSWORD@host): a secret wherever the URL is shown, whatever key holds it.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s'\"]+):[^@/\s'\"]*@")


# A URL's query (and a fragment's parameters, as OAuth's implicit flow puts tokens there), parameter by parameter
_URL_QUERY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^?#\s'\"]*)([?#][^\s'\"]*)")
_PARAM = re.compile(r"([?#&;])([^=&;#\s'\"]+)=([^&;#\s'\"]*)")
# parameter names that hold a secret though no part of them is a secret word (libpq's sslpassword, signed URLs)
_SECRET_PARAMS = frozenset({"sslpassword", "pwd", "sig", "signature", "x-amz-signature", "x-amz-credential"})


def _secret_param(name: str) -> bool:
    return name.lower() in _SECRET_PARAMS or is_secret_name(name.replace("-", "_"))


def redact_url_passwords(text: str) -> str:
    """`text` with the secrets of every URL in it masked: the password of its user info
    (postgresql://bob:***@db/team) and each query parameter whose name holds a secret
    (?sslmode=require&password=***, ?token=***, &X-Amz-Signature=***); the rest of the URL is shown."""
    text = _URL_PASSWORD.sub(rf"\1:{MASK}@", text)

    def query(m: re.Match[str]) -> str:
        return m.group(1) + _PARAM.sub(
            lambda p: (
                f"{p.group(1)}{p.group(2)}={MASK}" if p.group(3) and _secret_param(p.group(2)) else p.group(0)
            ),
            m.group(2),
        )

    return _URL_QUERY.sub(query, text)


def redact_text(text: str, values: Iterable[str]) -> str:
    """Mask every occurrence of a known secret value (longest first, so overlapping secrets both vanish), and the
    secrets of every URL in the text (redact_url_passwords)."""
    text = redact_url_passwords(text)
    for v in sorted(set(values), key=len, reverse=True):
        if len(v) >= _MIN_VALUE_LEN:
            text = text.replace(v, MASK)
    return text
