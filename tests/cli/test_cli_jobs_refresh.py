"""`jobs ls` refreshes unfinished jobs from their executor, but not one whose state a scheduler gave moments ago."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nemotron.cli.jobs import checked_recently

AT = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def test_a_state_checked_within_the_ttl_is_not_asked_for_again() -> None:
    assert checked_recently({"checked_at": (AT - timedelta(seconds=29)).isoformat()}, AT, ttl_s=30)
    assert not checked_recently({"checked_at": (AT - timedelta(seconds=31)).isoformat()}, AT, ttl_s=30)


def test_a_status_never_checked_or_unreadable_is_asked_for() -> None:
    assert not checked_recently({}, AT)
    assert not checked_recently({"checked_at": "yesterday"}, AT)
