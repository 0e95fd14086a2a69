"""The held-out records of a supervised step on an external engine, split off its data file in the job dir on the
cluster (the engines take their validation sets from files): one rule for every engine, so a requeued job and
another engine hold out the same records."""

from __future__ import annotations

import shlex


def every_nth(fraction: float) -> int:
    """Every n-th record is held out: n = round(1 / fraction), at least 2."""
    return max(2, round(1 / fraction))


def held_out_split(data: str, train: str, validation: str, fraction: float) -> str:
    """Shell: every n-th non-blank record of `data` (n = round(1 / fraction), at least 2) to `validation`, the
    rest to `train`; with fraction 0 every record trains. Deterministic, so a requeued job splits alike."""
    q = shlex.quote
    if fraction <= 0:
        return f"grep '[^[:space:]]' {q(data)} > {q(train)}"
    every = every_nth(fraction)
    program = f"NF {{ i++; if (i % {every} == 0) print > v; else print > t }}"
    split = f"awk -v t={q(train)} -v v={q(validation)} {q(program)} {q(data)}"
    # emptied first: awk writes a file only when a record goes there, and a requeued job must not read old ones
    return f": > {q(train)} && : > {q(validation)} && {split} && test -s {q(validation)}"
