"""The known-error hint after a failed run matches the failure's own lines, not ordinary progress lines."""

from nemotron.launch.local_executor import known_errors

RULES = [
    ("Judge unreachable", "reward server", "check judge.url"),
    ("Judge output unparseable", "parse", "tighten it"),
]


def test_a_progress_line_that_names_the_server_does_not_blame_it() -> None:
    log = "reward server (pid 4242) ready at http://127.0.0.1:5555\nstep 1/3 rewards=0.1\nerror: trainer.lr must be > 0\n"
    assert known_errors(RULES, log) == []


def test_the_failure_line_run_step_prints_is_matched() -> None:
    log = "reward server (pid 4242) ready\nerror: reward server at http://127.0.0.1:5555 unreachable after 3 retries\n"
    assert known_errors(RULES, log) == [("Judge unreachable", "check judge.url")]


def test_an_uncaught_exception_line_is_matched_too() -> None:
    log = 'Traceback (most recent call last):\n  File "x.py", line 1\njson.decoder.JSONDecodeError: cannot parse the answer\n'
    assert known_errors(RULES, log) == [("Judge output unparseable", "tighten it")]
