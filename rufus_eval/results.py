"""Results: one `results.json` per run, and a DuckDB file that holds every run's rows.

results.json: {run, suite, checkpoint, step, step_from, backend, created, versions, training_run, tasks:
{task: {status, metric, value, stderr, k, docs, scored_docs, unscored, unclosed_think, role, kind,
data_check}}, judges: {task: {model, base_url, server_version, threshold, max_tokens}}}. `status`
is `ran` or `skipped`; a skipped task (its data is not here) has `reason` and `fetch` (the command
that gets its data) and value null. `value` is null too when no sample of the task could be scored
(`unscored` 1.0), never 0.0. `data_check` ({status, rows_removed, why}: data_check.py) says whether
the training data of `training_run` was checked against the task's benchmark. The DuckDB table
`results` has one row per (run, task), so runs can be compared across checkpoints with plain SQL.
The summary table is a result: it goes to stdout, messages to stderr; report.md repeats it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import duckdb
from rich.table import Table

from rufus_data.console import console, print_result
from rufus_data.errors import RufusError
from rufus_data.lineage import DataCheck
from rufus_eval.data_check import check_of, check_text, flagged_notes

RESULTS_JSON = "results.json"
REPORT = "report.md"
COLUMNS = ("run", "suite", "checkpoint", "step", "task", "metric", "value", "stderr", "k", "docs", "role", "backend",
           "created", "results_path", "status", "data_check")
SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    run VARCHAR, suite VARCHAR, checkpoint VARCHAR, step BIGINT, task VARCHAR, metric VARCHAR,
    value DOUBLE, stderr DOUBLE, k INTEGER, docs INTEGER, role VARCHAR, backend VARCHAR,
    created VARCHAR, results_path VARCHAR, status VARCHAR, data_check VARCHAR,
    PRIMARY KEY (run, task)
)
"""
# files written before a column existed get it (their rows: NULL; status NULL reads as ran)
MIGRATE = ("ALTER TABLE results ADD COLUMN IF NOT EXISTS status VARCHAR",
           "ALTER TABLE results ADD COLUMN IF NOT EXISTS data_check VARCHAR")



def default_db_path() -> Path:
    """`$RUFUS_EVAL_DB`, default outputs/eval/results.duckdb."""
    return Path(os.environ.get("RUFUS_EVAL_DB") or "outputs/eval/results.duckdb")


def write_results(record: dict, out_dir: Path) -> Path:
    path = out_dir / RESULTS_JSON
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False, default=str))
    tmp.replace(path)
    return path


def read_results(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_JSON
    if not path.exists():
        raise RufusError(f"{path} does not exist: give a run folder (holding results.json) or the file itself")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RufusError(f"{path} is not valid JSON ({err}): was the run interrupted? re-run it") from None


def store_run(record: dict, results_path: Path, db_path: Path | None = None) -> Path:
    """Insert (or replace) the run's rows in the DuckDB file."""
    db_path = Path(db_path or default_db_path())
    db_path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        (
            record["run"], record["suite"], record["checkpoint"], record.get("step"), task, t["metric"],
            t["value"], t.get("stderr"), t.get("k"), t.get("docs"), t.get("role"), record.get("backend"),
            record.get("created"), str(Path(results_path).resolve()), t.get("status", "ran"),
            (t.get("data_check") or {}).get("status"),
        )
        for task, t in record["tasks"].items()
    ]
    with duckdb.connect(str(db_path)) as con:
        con.execute(SCHEMA)
        for statement in MIGRATE:
            con.execute(statement)
        con.execute("DELETE FROM results WHERE run = ?", [record["run"]])
        if rows:
            con.executemany(f"INSERT INTO results ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})", rows)
    return db_path


def query_runs(db_path: Path, runs: list[str] | None = None) -> list[dict]:
    with duckdb.connect(str(db_path), read_only=True) as con:
        sql = "SELECT * FROM results"
        params: list = []
        if runs:
            sql += f" WHERE run IN ({', '.join('?' for _ in runs)})"
            params = list(runs)
        cursor = con.execute(sql + " ORDER BY step NULLS FIRST, run, task", params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


class Cell(NamedTuple):
    """One task of one run, as tables show it."""

    metric: str
    value: float | None
    stderr: float | None
    status: str = "ran"
    check: DataCheck | None = None  # was the training data checked against the task's benchmark

    @classmethod
    def of(cls, task: dict | None) -> Cell | None:
        if task is None:
            return None
        return cls(task["metric"], task.get("value"), task.get("stderr"), task.get("status", "ran"), check_of(task))

    @property
    def number(self) -> float | None:
        """The value to plot: none for a skipped or unscored task (never 0)."""
        return None if self.status == "skipped" else self.value


def cell_text(cell: Cell | None) -> str:
    """How a task's number reads in a table: value (± stderr), `skipped`, `none scored`, or `-` (not in the run)."""
    if cell is None:
        return "-"
    if cell.status == "skipped":
        return "skipped"
    if cell.value is None:
        return "none scored"
    return f"{cell.value:.4f}" + ("" if cell.stderr is None else f" ± {cell.stderr:.4f}")


SUMMARY_COLUMNS = ("task", "metric", "value", "k", "docs", "unclosed", "unscored", "training data")


def summary_rows(record: dict) -> list[list]:
    """The summary table's rows: text, and the training data's check as a styled cell."""
    rows = []
    for name, t in record["tasks"].items():
        unclosed = "-" if t.get("unclosed_think") is None else f"{t['unclosed_think']:.2f}"
        unscored = "-" if t.get("unscored") is None else f"{t['unscored']:.2f}"
        rows.append([name, t["metric"], cell_text(Cell.of(t)), str(t["k"]), str(t["docs"]), unclosed, unscored,
                     check_text(check_of(t))])
    return rows


def print_summary(record: dict) -> None:
    """The run's table on stdout; why tasks were skipped and how to fetch their data, and why a
    task's training data is not checked, on stderr."""
    table = Table(title=f"{record['suite']} on {record['checkpoint']} (step {record['step']})")
    for col in SUMMARY_COLUMNS:
        table.add_column(col)
    for row in summary_rows(record):
        table.add_row(*row)
    print_result(table)
    for name, t in record["tasks"].items():
        if t.get("status") == "skipped":
            console.print(f"skipped {name}: {t['reason']}\n  to get it: {t['fetch']}", highlight=False, markup=False,
                          soft_wrap=True)
    for note in flagged_notes(record):
        console.print(note, style="red", highlight=False, markup=False, soft_wrap=True)


def write_report(record: dict, out_dir: Path) -> Path:
    """report.md: the summary table and, per task, what the training data was checked against."""
    rows = [[str(cell) for cell in row] for row in summary_rows(record)]
    for row in rows:
        if row[-1] == "NOT CHECKED":
            row[-1] = "**NOT CHECKED**"
    lines = [
        f"# {record['suite']} on `{record['checkpoint']}` (step {record['step']})", "",
        "| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS),
        *("| " + " | ".join(row) + " |" for row in rows), "",
        "## Training data", "",
        (f"The model's run is `{record['training_run']}`; its data lineage says, per task, whether the data it trained "
         "on was checked against the task's benchmark:" if record.get("training_run") else
         "The model is not a Rufus run (a base model): it has no training data to check."), "",
    ]
    if record.get("training_run"):
        lines += [f"- {name}: {check.text}" + (f" ({check.why})" if check.why else "")
                  for name, check in ((name, check_of(t)) for name, t in record["tasks"].items()) if check]
    path = out_dir / REPORT
    path.write_text("\n".join(lines) + "\n")
    return path
