"""One error type for bad input (the CLI prints its message as one paragraph and exits 2), and the
warnings the CLIs handle themselves."""


class RufusError(Exception):
    """A user-facing error: say what is wrong (file, row, key) and what to change."""

    exit_code = 2


class UnpinnedRevision(UserWarning):
    """A hub revision that is a branch or tag. Said on the console as well, so the CLIs do not
    print it a second time (cli_options.CliApp); library callers and tests still catch it."""
