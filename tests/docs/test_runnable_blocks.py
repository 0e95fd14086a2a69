"""Every block of README.md and docs/ marked runnable runs on CPU with the installed `nemotron`, page by page,
in order, in a fresh $NEMOTRON_HOME (the marker: src/nemotron/docs/blocks.py). A failing block fails its page's
test."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nemotron.core.paths import bundled_root
from nemotron.docs.blocks import parse_blocks, run_page, runnable_pages, write_outputs

ROOT = bundled_root()
PAGES = runnable_pages(ROOT)
PAGE_BUDGET_S = 45.0  # per page on a busy 2-core machine: the runnable blocks are meant to be cheap


def test_the_new_pages_have_runnable_blocks() -> None:
    names = {p.name for p in PAGES}
    assert {"artifacts.md", "cluster.md", "reward-server.md", "troubleshooting.md"} <= names, names


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_runnable_blocks_of_the_page_succeed(page: Path) -> None:
    start = time.monotonic()
    run = run_page(page)
    report = "\n".join(
        f"{o.block.where} exit {o.code}: $ {o.command}\n{o.output[-3000:]}" for o in run.failures
    )
    assert not run.failures, report
    commands = sum(len(b.commands) for b in parse_blocks(page))
    assert len(run.outcomes) == commands
    assert time.monotonic() - start < PAGE_BUDGET_S * 2, "the page's runnable blocks are too slow for CI"


PAGE = """# A page

```console runnable
$ echo one > one.txt
$ cat one.txt \\
    one.txt
one
one
```

Not runnable:

```console
$ false
```

```toml runnable file=conf/x.toml
[a]
b = 1
```

```bash runnable timeout=5
grep -q 'b = 1' conf/x.toml
test "$NEMOTRON_HOME" = "$PWD/home"
command -v nemotron
```
"""


def test_the_marker_is_parsed(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(PAGE)
    blocks = parse_blocks(page)
    assert [(b.line, b.language, b.file) for b in blocks] == [
        (3, "console", None),
        (17, "toml", "conf/x.toml"),
        (22, "bash", None),
    ]
    assert blocks[0].commands == ("echo one > one.txt", "cat one.txt \\\n    one.txt")
    assert blocks[2].timeout_s == 5.0
    run = run_page(page)
    assert [o.code for o in run.outcomes] == [0, 0, 0]
    assert run.outcomes[1].output == "one\none\n"


@pytest.mark.parametrize("failing", ["$ false", "$ exit 3", "$ sleep 5"])
def test_a_failing_or_hanging_block_fails_the_page(tmp_path: Path, failing: str) -> None:
    page = tmp_path / "p.md"
    page.write_text(f"```console runnable timeout=1\n$ true\n{failing}\n$ echo never\n```\n")
    run = run_page(page)
    assert [o.code != 0 for o in run.outcomes] == [False, True]  # stops at the first failure
    assert run.failures[0].code in (1, 3, 124)


def test_a_runnable_block_without_a_way_to_run_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("```toml runnable\n[a]\n```\n")
    with pytest.raises(ValueError, match="needs file=NAME"):
        parse_blocks(page)


def test_write_puts_each_commands_real_output_under_it(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        'Intro\n\n```console runnable\n$ x=2; echo $x\nstale output\n$ echo "a\n> b"\n$ echo $x \\\n'
        "    again\n```\n\nEnd\n"
    )
    run = run_page(page)
    assert not run.failures
    page.write_text(write_outputs(page, run.outcomes))
    assert page.read_text() == (
        'Intro\n\n```console runnable\n$ x=2; echo $x\n2\n$ echo "a\n> b"\na\nb\n'
        "$ echo $x \\\n    again\n2 again\n```\n\nEnd\n"
    )
