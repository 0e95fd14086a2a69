"""Who may listen where: a non-loopback address needs a bearer token, from an environment variable or a 0600 file
(never argv: a command line is visible in `ps`). Light on imports, because the compiler runs `refuse_open_servers`
on the CLI's start-up path, before a job directory or a model exists; the server commands run `check_bind` at
start-up too.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from nemotron.config.stepconfig import ServerBind
from nemotron.errors import UserError

# The bearer token reaches a server process through this variable, never its command line (visible in ps).
TOKEN_ENV = "NEMOTRON_REWARD_TOKEN"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve to anything


def read_token_file(path: Path) -> str:
    """The token in `path`, a file only its owner can read (mode 0600 or 0400); else UserError (exit 2)."""
    try:
        info = path.stat()
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UserError(f"cannot read the token file {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"the token file {path} is not a regular file")
    if info.st_mode & 0o077:
        raise UserError(
            f"the token file {path} has mode {stat.S_IMODE(info.st_mode):04o}; others could read the token: "
            f"chmod 600 {path}"
        )
    if not text:
        raise UserError(f"the token file {path} is empty")
    return text


def find_token(token_env: str = TOKEN_ENV, token_file: Path | None = None) -> str | None:
    """The bearer token: from `token_file` when given, else from the variable `token_env`; None when neither."""
    if token_file is not None:
        return read_token_file(token_file)
    return os.environ.get(token_env) or None


def check_bind(host: str, token: str | None, token_env: str = TOKEN_ENV) -> None:
    """Refuse (UserError, exit 2) to serve a non-loopback address without a token: anyone who can reach it
    could use the model."""
    if token is None and not is_loopback(host):
        raise UserError(
            f"refusing to serve on {host} without a bearer token: set ${token_env} or give a token file "
            "(mode 0600), or bind 127.0.0.1"
        )


def server_groups(schema: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """The dotted keys of a step schema's `ServerBind` groups: the servers the step starts."""
    for name, info in schema.model_fields.items():
        annotation = info.annotation
        candidates = typing.get_args(annotation) or (annotation,)
        group = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if group is None:
            continue
        if issubclass(group, ServerBind):
            yield prefix + name
        else:
            yield from server_groups(group, f"{prefix}{name}.")


def refuse_open_servers(
    schema: type[BaseModel],
    config: Mapping[str, Any],
    *,
    env_vars: Mapping[str, str],
    here: bool,
    profile: str,
) -> None:
    """At compile time: refuse each server of the step that would listen beyond loopback without a token, by the
    rule the step applies when it starts (`check_bind`), so the refusal comes before a job directory exists.

    The token the job will see: `token_file` (read and checked now when the job runs `here`; on a cluster the file
    lives there), else $NEMOTRON_REWARD_TOKEN among the profile's `env_vars`, else, for a job that runs `here`
    (it inherits this environment), the variable in this process's environment."""
    for key in server_groups(schema):
        group: Any = config
        for part in key.split("."):
            group = group[part]
        host, token_file = str(group["host"]), group.get("token_file")
        if is_loopback(host):
            continue
        if token_file:
            if here:
                read_token_file(Path(token_file))  # as the step reads it
            continue
        if env_vars.get(TOKEN_ENV) or (here and os.environ.get(TOKEN_ENV)):
            continue
        if here:
            check_bind(host, None)
        raise UserError(
            f"refusing to serve on {host} without a bearer token: set {TOKEN_ENV} in profile '{profile}' env_vars "
            f"or give {key}.token_file (mode 0600), or bind 127.0.0.1"
        )
