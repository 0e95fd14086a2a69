"""The closing lines of every command's --help: an example and what the exit codes mean."""

EXIT_CODES = "Exit codes: 0 done, 2 bad input, 3 a needed service failed after its retries, 130 cancelled."


def epilog(example: str) -> str:
    return f"Example: {example}\n\n{EXIT_CODES}"
