"""`rufus-eval compare RUN...`: one table of every task's metric across runs (checkpoints), and a
PNG of metric vs training step per task. Two runs over the same documents get the paired
comparison instead of the table (paired.py): scores, the paired delta, a verdict and pass@k.

The table is a result (stdout); a skipped task reads `skipped`, never 0, and a number scored on a
benchmark the run's training data was never checked against reads NOT CHECKED under it (why: on
stderr). The plot shows what it is given: metric vs step when every run has its own step (run
folders record it: checkpoint-N, run.json's global_step, 0 for a base model), else one point per
run in the order given, with the reason printed; tasks with no number in any run are named, not
drawn as empty lines."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table
from rich.text import Text

from rufus_data.base.console import console, print_result
from rufus_data.base.errors import RufusError
from rufus_eval.data_check import flagged_notes
from rufus_eval.paired import paired_rows, print_paired
from rufus_eval.results import Cell, cell_text, read_results

FORMATS = ("table", "csv", "json")


def load_runs(runs: list[str | Path]) -> list[dict]:
    records = [read_results(r) for r in runs]
    if not records:
        raise RufusError("give at least one run folder (holding results.json)")
    return sorted(records, key=lambda r: (r.get("step") is None, r.get("step") or 0, r["run"]))


def task_names(records: list[dict]) -> list[str]:
    """Every task of the runs, in the order the runs list them."""
    return list(dict.fromkeys(t for r in records for t in r["tasks"]))


def comparison_rows(records: list[dict]) -> tuple[list[str], list[dict]]:
    """(task columns, one row per run: run, checkpoint, step, and task -> Cell(metric, value, stderr, status) or None)."""
    tasks = task_names(records)
    rows = [{"run": r["run"], "checkpoint": r["checkpoint"], "step": r.get("step"),
             **{task: Cell.of(r["tasks"].get(task)) for task in tasks}} for r in records]
    return tasks, rows


def _value(cell: Cell | None) -> float | None:
    return None if cell is None else cell.number


@dataclass
class Plot:
    """What the comparison plot shows: the PNG (None when nothing could be drawn), the tasks drawn,
    whether the x axis is the training step, and what was said about the rest."""

    png: Path | None
    drawn: list[str] = field(default_factory=list)
    by_step: bool = False
    notes: list[str] = field(default_factory=list)


def plot_metric_vs_step(records: list[dict], png: Path) -> Plot:
    """Draw every task that has a number in some run: against the step when each run has its own, else per run."""
    tasks, rows = comparison_rows(records)
    steps = [r["step"] for r in rows]
    plot = Plot(None, by_step=None not in steps and len(set(steps)) == len(steps))
    if not plot.by_step:
        listed = ", ".join(f"{r['run']}: {r['step']}" for r in rows)
        plot.notes.append(f"the runs do not each have their own training step ({listed}): plotted one point per run, "
                          "in step order")
    plot.drawn = [t for t in tasks if any(_value(r[t]) is not None for r in rows)]
    for task in tasks:
        if task not in plot.drawn:
            plot.notes.append(f"{task} has no number in any run (skipped, not run, or none scored): not plotted")
    if not plot.drawn:
        plot.notes.append("no task has a number in these runs: no plot written")
        return plot
    import matplotlib  # heavy: only when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(7, len(rows) * 0.9), 4))
    for task in plot.drawn:
        points = [(r["step"] if plot.by_step else i, _value(r[task]), r[task].stderr or 0.0)
                  for i, r in enumerate(rows) if _value(r[task]) is not None]
        xs, ys, errs = zip(*points)
        metric = next(r[task].metric for r in rows if r[task] is not None)
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=f"{task} ({metric})")
    if plot.by_step:
        ax.set_xlabel("training step")
    else:
        ax.set_xticks(range(len(rows)), [r["run"] for r in rows], rotation=20, ha="right", fontsize=7)
        ax.set_xlabel("run")
    ax.set_ylabel("score")
    ax.set_title("metric vs step" if plot.by_step else "metric per run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    plot.png = png
    return plot


def compare_cell(cell: Cell | None) -> Text:
    """The number, and under it NOT CHECKED when the run's training data was never checked against
    the task's benchmark."""
    text = Text(cell_text(cell))
    if cell is not None and cell.check is not None and cell.check.flagged:
        text.append("\nNOT CHECKED", style="bold red")
    return text


def compare_runs(runs: list[str | Path], png: Path | None = None, fmt: str = "table") -> tuple[list[dict], Path | None]:
    """Print the comparison (stdout: a table, or CSV / JSON) and draw the plot; returns the rows
    printed (paired rows for two runs) and the PNG."""
    if fmt not in FORMATS:
        raise RufusError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    records = load_runs(runs)
    if len(runs) == 2:  # in the order given: B - A
        a, b = read_results(runs[0]), read_results(runs[1])
        rows = paired_rows(runs[0], a, runs[1], b)
        print_paired(rows, a, b, fmt)
    else:
        rows = print_across_runs(records, fmt)
    for record in records:
        for note in flagged_notes(record):
            console.print(f"{record['run']}: {note}", style="red", highlight=False, markup=False, soft_wrap=True)
    first = Path(runs[0])
    plot = plot_metric_vs_step(records, Path(png or (first if first.is_dir() else first.parent) / "compare.png"))
    for note in plot.notes:
        console.print(note, highlight=False, markup=False, soft_wrap=True)
    if plot.png is not None:
        console.print(f"wrote {plot.png}", highlight=False, markup=False, soft_wrap=True)
    return rows, plot.png


def print_across_runs(records: list[dict], fmt: str) -> list[dict]:
    """Every task's metric across the runs: a table of run x task, or one CSV / JSON row per (run, task)."""
    tasks, rows = comparison_rows(records)
    if fmt != "table":
        from rufus_data.base.console import rows_as_text

        columns = ["run", "checkpoint", "step", "task", "metric", "value", "stderr", "status"]
        flat = [(r["run"], r["checkpoint"], r["step"], t, c.metric, c.value, c.stderr, c.status)
                for r in rows for t in tasks if (c := r[t]) is not None]
        sys.stdout.write(rows_as_text(columns, flat, fmt))
        return rows
    table = Table(title="rufus-eval compare")
    table.add_column("run", no_wrap=True)
    table.add_column("step")
    for task in tasks:
        table.add_column(task)
    for row in rows:
        table.add_row(row["run"], "-" if row["step"] is None else str(row["step"]), *[compare_cell(row[t]) for t in tasks])
    print_result(table)
    return rows
