"""What all three CLIs share: one rich console, bad-input errors as one paragraph and exit 2,
and progress bars that show rate and ETA."""

from __future__ import annotations

import functools
from collections.abc import Callable

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from rufus_data.errors import RufusError

# Two streams, as a shell expects: what a command was asked for (tables of results, query rows,
# paths it reports) goes to stdout, so `rufus-data sql ... > f` captures it; everything else
# (progress, warnings, errors, status lines) goes to stderr.
console = Console(stderr=True)  # diagnostics
results_console = Console()  # results


def print_result(renderable, **options) -> None:
    """Print a result to stdout. Into a file or pipe, a table keeps its natural width: rich would
    fold or cut its cells at 80 columns there, and a value cut short is a wrong value."""
    if results_console.is_terminal:
        results_console.print(renderable, **options)
        return
    width = results_console.width
    unbounded = results_console.options.update(max_width=1_000_000)
    results_console.width = max(width, Measurement.get(results_console, unbounded, renderable).maximum)
    try:
        results_console.print(renderable, soft_wrap=isinstance(renderable, str), **options)
    finally:
        results_console.width = width


def cli_errors(fn: Callable) -> Callable:
    """Wrap a typer command: a RufusError prints its message and exits with its code (2)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RufusError as err:
            console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
            raise typer.Exit(err.exit_code) from None

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
    """A rich progress bar with count, rate and ETA; extra columns (tokens/s, ...) go after the rate."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(unit),
        *extra_columns,
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )


def not_yet(command: str, issue: str) -> None:
    """For commands that a later issue adds: say so clearly, produce nothing, exit 2."""
    raise RufusError(f"`{command}` is not available yet ({issue}); nothing was run")
