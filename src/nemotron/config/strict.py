"""The base of every config group: strict keys, finite floats (plain pydantic, no torch).

The modules of config groups do without `from __future__ import annotations`: pydantic would compile and evaluate
every field's annotation string when each group class is defined, on the start-up path of every dry run."""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Every config group rejects unknown keys, so a typo is an error with a suggestion, never silently ignored,
    and every float is finite (nan and inf are refused, whatever the key).
    A key's description is the docstring under it: `config.fields` reads it from the source, for the config reference
    and the hints of an unknown key (pydantic's use_attribute_docstrings would parse every schema's source on each
    run, ~30 ms of a dry-run)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False, defer_build=True)
