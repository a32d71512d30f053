"""Per task of an evaluation: was the model's training data checked against the task's benchmark?

The model's run (rufus_data/folders/run_folder.py `run_of`: a run folder, its checkpoint-N, staged or
merged copy) holds its data's lineage; a task scores the benchmark its suite names for it (the
suite schema's `task_benchmark`). Each task gets a `data_check`: checked clean, checked with N
rows removed, NOT CHECKED (with why: a step without decontam, a decontam step against other
benchmarks, a benchmark decontam cannot check, a run that recorded no lineage), or no training
data (a base model). results.json, the summary table, report.md and `compare` carry it; a
number scored on a benchmark the data was never checked against is flagged where it is shown."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from rufus_data.benchmarks.registry import load_registry
from rufus_data.benchmarks.suite import Task, task_benchmark
from rufus_data.folders.lineage import NO_RUN, DataCheck, check_against
from rufus_data.folders.run_folder import run_of

STYLES = {"clean": "green", "removed": "yellow", "not_checked": "bold red", "no_training_data": "dim"}


def task_data_checks(tasks: list[Task], checkpoint: str) -> tuple[Path | None, dict[str, DataCheck]]:
    """(the checkpoint's run folder or None, {task: its DataCheck})."""
    run = run_of(checkpoint)
    if run is None:
        return None, {task.name: NO_RUN for task in tasks}
    registry, registry_path = load_registry()
    by_benchmark: dict[str, DataCheck] = {}
    checks = {}
    for task in tasks:
        benchmark = task_benchmark(task, registry)
        if benchmark is None:
            checks[task.name] = DataCheck("not_checked", why="the task's data is inline in its suite (`data:`), not a "
                                                             f"benchmark of {registry_path} that decontam can check")
        elif registry.benchmarks[benchmark].not_decontaminable:
            checks[task.name] = DataCheck("not_checked", why=f"benchmark {benchmark} cannot be checked by decontam: "
                                                             f"{registry.benchmarks[benchmark].not_decontaminable}")
        else:
            if benchmark not in by_benchmark:
                by_benchmark[benchmark] = check_against(run, benchmark)
            checks[task.name] = by_benchmark[benchmark]
    return run, checks


def check_of(task: dict) -> DataCheck | None:
    """A task record's DataCheck; None for results written before Rufus recorded it."""
    found = task.get("data_check")
    return DataCheck(**found) if found else None


def check_text(check: DataCheck | None) -> Text:
    """The table cell: `checked: clean`, `checked: N rows removed`, NOT CHECKED in bold red, `-`."""
    if check is None:
        return Text("-")
    return Text(check.text, style=STYLES[check.status])


def flagged_notes(record: dict) -> list[str]:
    """One line per task scored on a benchmark its training data was never checked against."""
    notes = []
    for name, task in record["tasks"].items():
        check = check_of(task)
        if check is not None and check.flagged:
            notes.append(f"NOT CHECKED {name}: {check.why}")
    return notes
