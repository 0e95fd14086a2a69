"""Shared fixtures of the reliability tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture(scope="session")
def report(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """`report(line)` shows a figure on the terminal even though output is captured (e.g. cases tried)."""

    def write(line: str) -> None:
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)

    return write
