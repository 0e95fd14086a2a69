"""Step runs a test module starts with itself, on a thread beside its in-process tests (the `runs_beside` fixture of
tests/vllm/conftest.py): each test that reads one waits for its result, and a run whose test the session did not
select is not started."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

Run = Future[subprocess.CompletedProcess[str]]


class RunsBeside:
    """One module's runs, queued one after another on a thread of their own, each in a home of its own."""

    def __init__(
        self,
        cli_in: Callable[..., subprocess.CompletedProcess[str]],
        pool: ThreadPoolExecutor,
        tmp_path_factory: pytest.TempPathFactory,
        items: Sequence[pytest.Item],
    ) -> None:
        self.cli_in, self.pool, self.tmp_path_factory, self.items = cli_in, pool, tmp_path_factory, items

    def selected(self, test: str) -> list[pytest.Function]:
        """This session's items of the test function `test`, one per parameter set: none when it is deselected."""
        return [
            item for item in self.items if isinstance(item, pytest.Function) and item.originalname == test
        ]

    def start(self, name: str, *args: str, timeout: float) -> tuple[Path, Run]:
        """`nemotron ARGS` in a fresh folder named after `name` (its root, and the queued run)."""
        root = self.tmp_path_factory.mktemp(name)
        return root, self.pool.submit(self.cli_in, root, *args, timeout=timeout)
