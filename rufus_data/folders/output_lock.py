"""One writer per output: every command that writes an output folder or a run folder (mix,
decontam, dedup, filter, pairs, `rufus-train stage`/`pipeline`/`export`, `rufus-eval suite`)
holds the output's lock from before its work starts until it ends. A second command on the same
output stops at once, told who writes it; `--overwrite` never replaces an output that another
live process is writing.

Beside an output `DIR/OUT` (never inside the folder that is renamed into place):

    DIR/.OUT.lock        the lock: filelock's FileLock, an flock(2) on this file. The kernel drops
                         an flock when its process ends, however it ends (SIGKILL included), so a
                         killed run never blocks its re-run: the lock is simply free again.
                         Removed at release (while still held; filelock retries a file that was
                         removed under it), so a finished or refused command leaves nothing.
    DIR/.OUT.lock.json   the holder: pid, command line, host and start time, written atomically
                         once the lock is held and removed at release. A record found by a new
                         holder was left by a process that no longer runs: it is reported as
                         taken over.

The holder removes what a killed writer of the output left beside it: `.OUT.tmp-PID` (a folder
being written) and `.OUT.old-PID` (an output being replaced) of pids that no longer run. What a
resumable step keeps to resume (`.OUT.partial`, `.OUT.dedup-work`) is left alone.

Within one process the lock is reentrant (a library caller may run a second step on an output
whose earlier step failed); it guards processes from each other."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shlex
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Self

from filelock import FileLock, Timeout

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.paths import atomic_file
from rufus_data.base.redaction import redact_text

ACQUIRE_WAIT_S = 0.25  # tries for this long: the lock file of a holder that is just releasing it goes away
HOLDER_WAIT_S = 2.0  # a holder writes its record right after it takes the lock: how long a loser waits for it


class OutputLocked(RufusError):
    """Another live process writes this output."""


def lock_path(out: str | Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.lock"


def holder_path(out: str | Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.lock.json"


def pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def read_holder(out: str | Path) -> dict | None:
    try:
        return json.loads(holder_path(out).read_text())
    except (OSError, ValueError):
        return None


def describe(holder: dict | None) -> str:
    """`pid 14923 (`rufus-data mix ... --out o`, since 15:04:05 UTC, 12 s ago)`."""
    if not holder:
        return "a process that has not recorded itself yet"
    since = dt.datetime.fromtimestamp(holder["started"], dt.UTC)
    host = "" if holder.get("host") == socket.gethostname() else f" on host {holder.get('host')}"
    return (f"pid {holder['pid']}{host} (`{holder['command']}`, since {since:%Y-%m-%d %H:%M:%S} UTC, "
            f"{time.time() - holder['started']:.0f} s ago)")


def locked_message(out: Path, holder: dict | None) -> str:
    stop = f"stop it (`kill {holder['pid']}`)" if holder else "stop it"
    gone = ""
    if holder and holder.get("host") == socket.gethostname() and not pid_runs(holder["pid"]):
        gone = ", which no longer runs: a process it started (a worker) holds the lock now"
    return (f"output {out} is being written by another process: {describe(holder)}{gone}. Wait for it to finish, "
            f"{stop}, or write to another output; --overwrite never replaces an output another process is writing. "
            f"(Its lock, {lock_path(out)}, is freed by the kernel when that process ends, however it ends.)")


def command_line() -> str:
    """The command line as the lock record and messages show it (credentials in URLs hidden)."""
    return redact_text(shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])) if sys.argv and sys.argv[0] else "python"


class OutputLock:
    """The lock of one output, for one command: `with OutputLock(out, command):` holds it for the
    block (OutputLocked, at once, when another process holds it); `acquire()` and `release()`
    when the hold spans more than one block (OutputStep)."""

    def __init__(self, out: str | Path, command: str):
        self.out, self.command = Path(out), command
        self._lock: FileLock | None = None
        self._made_parent = False  # the lock made the output's folder: a command refused early leaves none

    def acquire(self) -> Self:
        self._made_parent = self._made_parent or not self.out.parent.exists()
        self._lock = lock = take(self.out)
        if lock.lock_counter == 1:  # the first hold of this process: the record and the leftovers are ours now
            self._take_over()
        return self

    def release(self) -> None:
        if self._lock is None:
            return
        lock, self._lock = self._lock, None
        if lock.lock_counter == 1:  # removed while held: a process that opened the old file retries on the new one
            holder_path(self.out).unlink(missing_ok=True)
            lock_path(self.out).unlink(missing_ok=True)
        lock.release()
        if self._made_parent and lock.lock_counter == 0:
            with contextlib.suppress(OSError):  # not empty: the command wrote its output there
                self.out.parent.rmdir()

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *_exc) -> None:
        self.release()

    def _take_over(self) -> None:
        previous = read_holder(self.out)
        if previous and previous.get("pid") != os.getpid() and not pid_runs(previous["pid"]):
            console.print(f"[yellow]note:[/] taking over the lock of {self.out} from {describe(previous)}, which no "
                          "longer runs (killed or crashed)", highlight=False, soft_wrap=True)
        record = {"pid": os.getpid(), "command": command_line(), "step": self.command,
                  "host": socket.gethostname(), "started": time.time()}
        with atomic_file(holder_path(self.out)) as tmp:  # first: a process refused meanwhile waits for it
            tmp.write_text(json.dumps(record) + "\n")
        remove_stale_temporaries(self.out)


def check_unlocked(out: str | Path) -> None:
    """Refuse now when another live process holds the lock of `out` (for guards that run before
    the lock is taken, so the user hears about the writer rather than about an existing output).
    Writes nothing: a missing lock file is a free lock."""
    if lock_path(out).exists():
        take(Path(out)).release()  # the probe writes no record: a process's first hold records itself


def take(out: Path) -> FileLock:
    """The lock of `out`, held (OutputLocked, within ACQUIRE_WAIT_S, when another process holds it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # one instance per path, shared by threads: reentrant within this process (see the module docstring)
    lock = FileLock(lock_path(out), is_singleton=True, thread_local=False)
    try:
        lock.acquire(timeout=ACQUIRE_WAIT_S)
    except Timeout:
        raise OutputLocked(locked_message(out, holder_of_held(out))) from None
    return lock


def holder_of_held(out: Path) -> dict | None:
    """The record of a held lock's holder: it may lag the lock by a moment (a dead holder's record
    is missing, or still a dead holder's), so a missing or dead one is waited on briefly."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        holder = read_holder(out)
        if (holder and pid_runs(holder["pid"])) or time.monotonic() > deadline:
            return holder
        time.sleep(0.05)


def remove_stale_temporaries(out: Path) -> None:
    """`.OUT.tmp-PID` and `.OUT.old-PID` of writers that no longer run (an `.old` copy whose
    output is missing is the output itself, caught between two renames: it is put back)."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.(tmp|old)-(\d+)")
    for path in sorted(out.parent.glob(f".{out.name}.*-*")):
        match = pattern.fullmatch(path.name)
        if not match or int(match[2]) == os.getpid() or pid_runs(int(match[2])):
            continue
        if match[1] == "old" and not out.exists():
            path.rename(out)
            console.print(f"[yellow]note:[/] put back {out} from {path.name} (a replacing run was killed)",
                          highlight=False, soft_wrap=True)
            continue
        console.print(f"[yellow]note:[/] removing {path}, left by pid {match[2]}, which no longer runs",
                      highlight=False, soft_wrap=True)
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
