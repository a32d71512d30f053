"""`rufus-eval compare RUN...`: one table of every task's metric across runs (checkpoints), and a
PNG of metric vs training step per task."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_eval.results import read_results


def load_runs(runs: list[str | Path]) -> list[dict]:
    records = [read_results(r) for r in runs]
    if not records:
        raise RufusError("give at least one run folder (holding results.json)")
    return sorted(records, key=lambda r: (r.get("step") is None, r.get("step") or 0, r["run"]))


def comparison_rows(records: list[dict]) -> tuple[list[str], list[dict]]:
    """(task columns, one row per run: run, checkpoint, step, and task -> "value ± stderr")."""
    tasks = sorted({t for r in records for t in r["tasks"]})
    rows = []
    for r in records:
        row = {"run": r["run"], "checkpoint": r["checkpoint"], "step": r.get("step")}
        for task in tasks:
            t = r["tasks"].get(task)
            row[task] = None if t is None else (t["metric"], t["value"], t.get("stderr"))
        rows.append(row)
    return tasks, rows


def plot_metric_vs_step(records: list[dict], png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks, rows = comparison_rows(records)
    fig, ax = plt.subplots(figsize=(7, 4))
    for task in tasks:
        points = [(r["step"], r[task][1], r[task][2] or 0.0) for r in rows
                  if r[task] is not None and r[task][1] is not None and r["step"] is not None]
        if not points:
            continue
        steps, values, errs = zip(*points)
        metric = next(r[task][0] for r in rows if r[task] is not None)
        ax.errorbar(steps, values, yerr=errs, marker="o", capsize=3, label=f"{task} ({metric})")
    ax.set_xlabel("training step")
    ax.set_ylabel("score")
    ax.set_title("metric vs step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def compare_runs(runs: list[str | Path], png: Path | None = None) -> tuple[list[dict], Path]:
    records = load_runs(runs)
    tasks, rows = comparison_rows(records)
    table = Table(title="rufus-eval compare")
    for col in ("run", "step", *tasks):
        table.add_column(col)
    for row in rows:
        cells = []
        for task in tasks:
            cell = row[task]
            if cell is None or cell[1] is None:  # not run, or no sample scored (value null)
                cells.append("-" if cell is None else "none scored")
                continue
            cells.append(f"{cell[1]:.4f}" + ("" if cell[2] is None else f" ± {cell[2]:.4f}"))
        table.add_row(row["run"], "-" if row["step"] is None else str(row["step"]), *cells)
    console.print(table)
    first = Path(runs[0])
    png = Path(png or (first if first.is_dir() else first.parent) / "compare.png")
    plot_metric_vs_step(records, png)
    console.print(f"wrote {png}")
    return rows, png
