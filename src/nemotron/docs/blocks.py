"""Runnable blocks in the docs: shell blocks a test runs, so the pages cannot drift from the code.

A fenced block is runnable when its info string carries the word `runnable`:

- ```` ```console runnable ````: each line starting with `$ ` is a command (a line ending in `\\` continues
  on the next, and so does a line starting with `> `, bash's prompt inside a quoted string); the other lines
  are the output it printed when the page was written, shown to the reader, not compared.
  The block's commands run in one bash session (a variable set by one is seen by the next), each must exit 0;
  show an expected failure as `cmd || echo "exit $?"`.
- ```` ```bash runnable ```` (or `sh`): the whole block is one `bash -e -o pipefail` script.
- ```` ```toml runnable file=env.toml ```` (any language): the block's text is written to that file,
  relative to the page's working directory, before the blocks after it run.

`timeout=SECONDS` in the info string bounds the block (default 120). The blocks of a page run in
order, in one fresh working directory with `NEMOTRON_HOME=<dir>/home`, no env.toml from outside, and the
interpreter's `bin/` (the installed `nemotron`) first on PATH: later blocks may use the files earlier ones
made.
Jobs a page leaves running (a server started with `-b local`) are killed when the page ends.

`python -m nemotron.docs.blocks docs/artifacts.md` runs a page's blocks and prints each command with its output;
`--write` puts that output under each command of the page's console blocks, so what a page shows is what the
commands printed. tests/docs/test_runnable_blocks.py runs every page's blocks (it does not compare the output:
job ids, times and hashes change from run to run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TIMEOUT_S = 120.0
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """One runnable block of a page: the commands to run (or the file to write) and where it starts."""

    page: Path
    line: int  # 1-based line of the opening fence
    end: int  # 1-based line of the closing fence
    language: str
    text: str
    commands: tuple[str, ...] = ()
    file: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"


@dataclass
class Outcome:
    block: Block
    command: str
    code: int
    output: str
    seconds: float


@dataclass
class PageRun:
    page: Path
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.code != 0]


def _console_commands(text: str) -> tuple[str, ...]:
    commands: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if current is not None:  # a continuation of the previous command
            current.append(line)
            if not line.rstrip().endswith("\\"):
                commands.append("\n".join(current))
                current = None
            continue
        if line.startswith("> ") and commands:  # a continuation line of a quoted string (bash's PS2 prompt)
            commands[-1] += "\n" + line[2:]
            continue
        if line.startswith("$ "):
            command = line[2:]
            if command.rstrip().endswith("\\"):
                current = [command]
            else:
                commands.append(command)
    if current is not None:
        commands.append("\n".join(current))
    return tuple(commands)


def parse_blocks(page: Path, text: str | None = None) -> list[Block]:
    """The runnable blocks of a Markdown page, in order."""
    lines = (page.read_text() if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m["fence"], m["info"].split()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(m["indent"]) :] if lines[j].startswith(m["indent"]) else lines[j])
            j += 1
        if "runnable" in info:
            options = dict(w.split("=", 1) for w in info if "=" in w)
            language = info[0] if info and info[0] != "runnable" else ""
            text_ = "\n".join(body) + "\n"
            file = options.get("file")
            if file is not None:
                commands: tuple[str, ...] = ()
            elif language == "console":
                commands = _console_commands(text_)
            elif language in ("bash", "sh", "shell"):
                commands = (text_,)
            else:
                raise ValueError(f"{page.name}:{i + 1}: a runnable '{language}' block needs file=NAME")
            blocks.append(
                Block(
                    page,
                    i + 1,
                    j + 1,
                    language,
                    text_,
                    commands,
                    file,
                    float(options.get("timeout", DEFAULT_TIMEOUT_S)),
                )
            )
        i = j + 1
    return blocks


def runnable_pages(root: Path) -> list[Path]:
    """README.md and every page under docs/ that has at least one runnable block."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return [p for p in pages if p.is_file() and "runnable" in p.read_text() and parse_blocks(p)]


def page_env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NEMOTRON_ENV_FILE", "NEMOTRON_STEPS_PATH")}
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        NEMOTRON_HOME=str(workdir / "home"),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        COLUMNS="110",
        TERM="dumb",
        PYTHONUNBUFFERED="1",
    )
    env.pop("NO_COLOR", None)
    return env


_MARK = "@@docblocks-exit@@"


def _session_script(commands: tuple[str, ...]) -> str:
    """One bash session for a block's commands (variables carry from one to the next): after each, a marker
    line with its exit code; the session stops at the first that fails."""
    check = f'__rc=$?; printf \'\\n{_MARK}%d\\n\' "$__rc"; [ "$__rc" = 0 ] || exit "$__rc"\n'
    return "set -o pipefail\n" + "".join(f"{command}\n{check}" for command in commands)


def _split_session(block: Block, output: str, seconds: float, code: int) -> list[Outcome]:
    """The session's output cut at its markers: one Outcome per command that ran. A command with no marker
    after it ended the session itself (`exit`, a timeout): it gets the session's exit code."""
    pieces = output.split(f"\n{_MARK}")
    codes = [int(p.partition("\n")[0]) for p in pieces[1:]]
    outputs = [pieces[0], *(p.partition("\n")[2] for p in pieces[1:])]
    outcomes = [
        Outcome(block, c, rc, out, seconds)
        for c, rc, out in zip(block.commands, codes, outputs, strict=False)
    ]
    if len(codes) < len(block.commands) and code != 0 and not any(codes):
        outcomes.append(Outcome(block, block.commands[len(codes)], code, outputs[len(codes)], seconds))
    return outcomes


def run_blocks(blocks: list[Block], workdir: Path, stop_on_failure: bool = True) -> Iterator[Outcome]:
    """Run `blocks` in order in `workdir`; yields one Outcome per command that ran (a timeout: exit 124).

    A console block's commands run in one bash session, a bash block as one `bash -e -o pipefail` script."""
    env = page_env(workdir)
    for block in blocks:
        if block.file is not None:
            target = workdir / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
            continue
        console = block.language == "console"
        argv = (
            ["bash", "-c", _session_script(block.commands)]
            if console
            else ["bash", "-e", "-o", "pipefail", "-c", block.commands[0]]
        )
        start = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                cwd=workdir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=block.timeout_s,
                start_new_session=True,
            )
            code, output = done.returncode, done.stdout
        except subprocess.TimeoutExpired as e:
            out = e.output.decode() if isinstance(e.output, bytes) else (e.output or "")
            code, output = 124, out + f"\n(timed out after {block.timeout_s:g} s)"
        seconds = time.monotonic() - start
        outcomes = (
            _split_session(block, output, seconds, code)
            if console
            else [Outcome(block, block.commands[0], code, output, seconds)]
        )
        yield from outcomes
        if any(o.code != 0 for o in outcomes) and stop_on_failure:
            return


def stop_leftover_jobs(home: Path) -> None:
    """Stop what a page's blocks left running (a server started with -b local): each running job's process
    group."""
    killed = []
    for status in home.glob("jobs/*/status.json"):
        try:
            record = json.loads(status.read_text())
            if record.get("state") in ("pending", "running") and record.get("pgid"):
                os.killpg(int(record["pgid"]), signal.SIGKILL)
                killed.append(int(record["pgid"]))
        except (OSError, ValueError):
            continue
    deadline = time.monotonic() + 10.0
    for pgid in killed:  # gone before the page's home is removed: a dying job still writes its status
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)


def run_page(page: Path, workdir: Path | None = None) -> PageRun:
    """Run every runnable block of `page` in a fresh working directory; stops at the first failing command."""
    result = PageRun(page)
    # ignore_cleanup_errors: a detached launcher may record a killed job's end while the home is removed
    with tempfile.TemporaryDirectory(prefix="docblocks-", ignore_cleanup_errors=True) as tmp:
        where = workdir or Path(tmp)
        try:
            result.outcomes = list(run_blocks(parse_blocks(page), where))
        finally:
            stop_leftover_jobs(where / "home")
    return result


def write_outputs(page: Path, outcomes: list[Outcome]) -> str:
    """The page with the output under each command of its `console runnable` blocks replaced by the
    `outcomes`'."""
    lines = page.read_text().splitlines()
    by_block: dict[int, list[Outcome]] = {}
    for o in outcomes:
        by_block.setdefault(o.block.line, []).append(o)
    for block in sorted(
        parse_blocks(page), key=lambda b: -b.line
    ):  # from the bottom: line numbers stay valid
        if block.language != "console" or block.line not in by_block:
            continue
        indent = lines[block.line - 1][: len(lines[block.line - 1]) - len(lines[block.line - 1].lstrip())]
        body: list[str] = []
        for o in by_block[block.line]:
            first, *rest = o.command.splitlines()
            continued = first.rstrip().endswith("\\")
            for line in rest:  # a backslash-continued line stays as it is; a quoted newline gets bash's `> `
                body.append(line if continued else f"> {line}")
                continued = line.rstrip().endswith("\\")
            body.insert(len(body) - len(rest), f"$ {first}")
            body += [line.rstrip() for line in o.output.rstrip("\n").splitlines()]
        lines[block.line : block.end - 1] = [indent + line if line else line for line in body]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nemotron.docs.blocks",
        description="Run the runnable blocks of Markdown pages and print their output.",
    )
    parser.add_argument("pages", nargs="+", type=Path, help="Markdown pages")
    parser.add_argument("--workdir", type=Path, help="run here instead of a fresh temporary directory (kept)")
    parser.add_argument("--list", action="store_true", help="only list the commands")
    parser.add_argument(
        "--write",
        action="store_true",
        help="write each command's output under it in the page's console blocks (all must succeed)",
    )
    args = parser.parse_args(argv)
    failed = 0
    for page in args.pages:
        blocks = parse_blocks(page)
        if args.list:
            for b in blocks:
                print(f"{b.where}: {'write ' + b.file if b.file else '; '.join(b.commands)}")
            continue
        if args.workdir:
            args.workdir.mkdir(parents=True, exist_ok=True)
        run = run_page(page, args.workdir.resolve() if args.workdir else None)
        for o in run.outcomes:
            print(f"# {o.block.where} exit {o.code} in {o.seconds:.1f} s\n$ {o.command}\n{o.output}", end="")
            print("" if o.output.endswith("\n") or not o.output else "\n", end="")
        failed += len(run.failures)
        if args.write and not run.failures:
            page.write_text(write_outputs(page, run.outcomes))
            print(f"wrote the output of {len(run.outcomes)} commands into {page}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
