"""One error type for bad input: the CLI prints its message as one paragraph and exits 2."""


class RufusError(Exception):
    """A user-facing error: say what is wrong (file, row, key) and what to change."""

    exit_code = 2
