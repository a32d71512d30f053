"""One error type for bad input (the CLI prints its message as one paragraph and exits 2), the
warnings the CLIs handle themselves, and `quoted`: how a message shows a value the user wrote."""

import errno
import reprlib

QUOTE_LIMIT = 200  # characters of a user's value a message quotes


class RufusError(Exception):
    """A user-facing error: say what is wrong (file, row, key) and what to change."""

    exit_code = 2


# the errors of writing that the user fixes (space, quota, permissions), not a bug of the command
WRITE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up",
                errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted"}


def write_failure(err: OSError, where: str | None = None) -> RufusError | None:
    """The one-paragraph error of a write that failed for want of space or permission (None for any
    other OSError): what could not be written, why, and what to do."""
    why = WRITE_ERRNOS.get(err.errno)
    if why is None:
        return None
    target = where or (f"{err.filename}" if err.filename else "the output")
    detail = f" at {err.filename}" if err.filename and where else ""
    return RufusError(f"cannot write {target}: {why} ({errno.errorcode[err.errno]}{detail}). Free space there or "
                      "fix its permissions, or choose another --out; nothing was written (a partial folder is "
                      "removed, work kept to resume stays)")


class SaidWarning(UserWarning):
    """A warning the console has already printed: the CLIs do not print its Python copy a second
    time (cli_options.CliApp); library callers and tests still catch it."""


class UnpinnedRevision(SaidWarning):
    """A hub revision that is a branch or tag."""


_QUOTING = reprlib.Repr()
_QUOTING.maxlevel, _QUOTING.maxdict, _QUOTING.maxlist, _QUOTING.maxtuple = 3, 8, 8, 8
_QUOTING.maxstring, _QUOTING.maxother, _QUOTING.maxlong = QUOTE_LIMIT, QUOTE_LIMIT, 60


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`value`'s repr for a message, bounded in depth, items and length: a value from a user's file
    may be huge, or a YAML alias graph that a plain repr would expand without end."""
    text = _QUOTING.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
