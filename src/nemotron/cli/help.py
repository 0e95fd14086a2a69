"""The closing lines of every command's --help: an example and what the exit codes mean. Help is click's plain
format (cli.app), which rewraps each paragraph to the terminal: the `\b` line keeps the example on one line, as it
is typed."""

EXIT_CODES = "Exit codes: 0 done, 2 bad input, 3 a needed service failed after its retries, 130 cancelled."


def epilog(example: str) -> str:
    return f"\b\nExample: {example}\n\n{EXIT_CODES}"
