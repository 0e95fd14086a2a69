"""Registries of classes named by "module:Class" strings, imported on first use (the CLI's start-up stays light)."""

from __future__ import annotations

import importlib
from typing import Any

from nemotron.errors import UserError, did_you_mean


def load(registry: dict[str, str], name: str, what: str) -> Any:
    """An instance of the class registered under `name`; an unknown name is exit 2 with a suggestion."""
    target = registry.get(name)
    if target is None:
        raise UserError(
            f"unknown {what} '{name}'{did_you_mean(name, registry)}; {what}s: {', '.join(sorted(registry))}"
        )
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()
