"""What all three CLIs share: one rich console, bad-input errors as one paragraph and exit 2,
and progress bars that show rate and ETA - or, when stderr is no terminal (CI logs, `nohup`),
where rich would draw nothing until the end, a plain progress line per task every
$RUFUS_PROGRESS_SECONDS (default 30)."""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from rufus_data.base.errors import RufusError, write_failure
from rufus_data.base.redaction import redact_text

# Two streams, as a shell expects: what a command was asked for (tables of results, query rows,
# paths it reports) goes to stdout, so `rufus-data sql ... > f` captures it; everything else
# (progress, warnings, errors, status lines) goes to stderr.


class RedactingConsole(Console):
    """A console whose every line has the credentials in its URLs hidden (redaction.py): what
    Rufus says on stderr ends in logs (eval.log, a job's captured stderr)."""

    def _render_buffer(self, buffer) -> str:
        return redact_text(super()._render_buffer(buffer))


console = RedactingConsole(stderr=True)  # diagnostics
results_console = Console()  # results: what was asked for (rows of the user's data), printed as it is


def print_result(renderable, **options) -> None:
    """Print a result to stdout. Into a file or pipe, a table keeps its natural width: rich would
    fold or cut its cells at 80 columns there, and a value cut short is a wrong value."""
    print_whole(results_console, renderable, **options)


def print_whole(target: Console, renderable, **options) -> None:
    """Print on `target` (stdout's or stderr's console): on a terminal as rich fits it, into a file
    or pipe at the renderable's natural width (a table squeezed to 80 columns reads as nonsense)."""
    if target.is_terminal:
        target.print(renderable, **options)
        return
    width = target.width
    unbounded = target.options.update(max_width=1_000_000)
    target.width = max(width, Measurement.get(target, unbounded, renderable).maximum)
    try:
        target.print(renderable, soft_wrap=isinstance(renderable, str), **options)
    finally:
        target.width = width
def rows_as_text(columns: list[str], rows: list[tuple], fmt: str) -> str:
    """Rows as CSV (a header line, then one line per row) or JSON (a list of objects, one per
    row), for files and pipes. Nested values (lists, structs) are written as JSON in both; dates
    and decimals as their text."""
    if fmt == "json":
        return json.dumps([dict(zip(columns, row, strict=True)) for row in rows], indent=2, default=str) + "\n"
    if fmt != "csv":
        raise RufusError(f"--format {fmt!r} is not one of table, csv, json")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([json.dumps(v, default=str) if isinstance(v, (list, dict)) else v for v in row])
    return buffer.getvalue()


def print_rows(columns: list[str], rows: list[tuple], fmt: str = "table", title: str | None = None) -> None:
    """Result rows on stdout, in every command that prints a table a script may read (`--format`):
    a table for people (`title` above it), or CSV / JSON (rows_as_text) for files and pipes."""
    if fmt != "table":
        sys.stdout.write(rows_as_text(columns, rows, fmt))
        return
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*(v if isinstance(v, Text) else Text("" if v is None else str(v)) for v in row))  # data, never markup
    print_result(table)


PROGRESS_SECONDS_ENV = "RUFUS_PROGRESS_SECONDS"
DEFAULT_PROGRESS_SECONDS = 30.0


def let_go(err: BaseException | None) -> None:
    """Clear the frames of a failed command's exception (and of those it chains): what they held,
    an output's lock (output_lock.py) above all, is let go now, not when the exception is collected
    (an in-process caller such as typer's CliRunner keeps it)."""
    while err is not None:
        traceback.clear_frames(err.__traceback__)
        err = err.__cause__ or err.__context__


INTERRUPTED_EXIT = 130  # what a shell reports for a command ended by Ctrl-C
TERMINATED_EXIT = 143  # ... and by SIGTERM


def exit_on_sigterm() -> None:
    """SIGTERM unwinds the command as an exception would (exit 143): an output's temporary folder
    and lock go, a server the command started is stopped by its `with` block. The default action
    would end the process where it stands and leave them behind."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(TERMINATED_EXIT))


def cli_errors(fn: Callable) -> Callable:
    """Wrap a typer command: a RufusError prints its message and exits with its code (2), as does a
    write that failed for want of space or permission (any command's safety net); Ctrl-C
    says what was kept and exits 130, its frames let go (the output's lock with them)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RufusError as err:
            # escaped: a message's own brackets (an extra, `.[gpu]`; a list) are text, not rich markup
            console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            let_go(err)
            raise typer.Exit(err.exit_code) from None
        except OSError as err:
            failure = write_failure(err)
            if failure is None:
                raise
            console.print(f"[bold red]error:[/] {escape(str(failure))}", highlight=False, soft_wrap=True)
            let_go(err)
            raise typer.Exit(failure.exit_code) from None
        except KeyboardInterrupt as err:
            console.print("[bold red]interrupted:[/] nothing was written to the output; work kept to resume "
                          "(a journal, a work folder) stays for the next run", highlight=False, soft_wrap=True)
            let_go(err)
            raise typer.Exit(INTERRUPTED_EXIT) from None

    return wrapper


class RateColumn(ProgressColumn):
    """Items per second of a task, with its unit."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-" if speed is None else f"{speed:,.1f} {self.unit}/s", style="cyan")


def progress(unit: str = "rows", *extra_columns: ProgressColumn) -> Progress:
    """A rich progress bar with count, rate and ETA; extra columns (tokens/s, ...) go after the rate.
    Without a terminal: the same, plus periodic progress lines (ProgressLines)."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(unit),
        *extra_columns,
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    if console.is_terminal:
        return Progress(*columns, console=console)
    return ProgressLines(*columns, console=console, unit=unit, extra_columns=extra_columns, interval=progress_seconds())


def progress_seconds() -> float:
    value = os.environ.get(PROGRESS_SECONDS_ENV)
    try:
        return float(value) if value else DEFAULT_PROGRESS_SECONDS
    except ValueError:
        raise RufusError(f"{PROGRESS_SECONDS_ENV}={value!r} is not a number of seconds") from None


class ProgressLines(Progress):
    """A progress display for a stderr that is no terminal: rich would draw the bar only when the job
    ends there, so it draws none, and each visible task prints one plain line when it
    starts, at most one every `interval` seconds while it advances, and one when the display stops, e.g.
    `progress filter k=8: 120/384 prompts (31%), 0.4 prompts/s, 410 tok/s, elapsed 0:05:00, ETA 0:11:00`."""

    def __init__(self, *columns, unit: str, extra_columns: tuple = (), interval: float, **options):
        super().__init__(*columns, **options)
        self.unit, self.extra_columns, self.interval = unit, extra_columns, interval
        self._rate = RateColumn(unit)
        self._printed: dict[TaskID, float] = {}

    def start(self) -> None:
        """No live display: off a terminal rich would draw the bar only at the end, beside the lines."""

    def stop(self) -> None:
        for task_id in list(self._printed):  # where each task ended, once: no bar repeats it
            self._print_line(task_id, force=True)
        self._printed.clear()

    def add_task(self, description: str, *args, **kwargs) -> TaskID:
        task_id = super().add_task(description, *args, **kwargs)
        self._print_line(task_id, force=True)
        return task_id

    def update(self, task_id: TaskID, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._print_line(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._print_line(task_id)

    def _print_line(self, task_id: TaskID, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._printed.get(task_id, now) < self.interval:
            return
        task = next(t for t in self.tasks if t.id == task_id)
        if not task.visible:
            return
        self._printed[task_id] = now
        self.console.print(progress_line(task, self.unit, [self._rate, *self.extra_columns]), highlight=False,
                           markup=False, soft_wrap=True)


def progress_line(task, unit: str, columns) -> str:
    """One line of a task's progress: count, share, the columns' rates, elapsed time and ETA."""
    total = f"/{task.total:,.0f}" if task.total is not None else ""
    share = f" ({task.percentage:.0f}%)" if task.total else ""
    rates = ", ".join(str(column.render(task)) for column in columns)
    elapsed = clock(task.elapsed)
    eta = clock(task.time_remaining) if task.total is not None else "?"
    return f"progress {task.description}: {task.completed:,.0f}{total} {unit}{share}, {rates}, elapsed {elapsed}, ETA {eta}"


def clock(seconds: float | None) -> str:
    """h:mm:ss, or ? when unknown (a progress line's elapsed time and ETA)."""
    if seconds is None or math.isnan(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
