"""Results: one `results.json` per run, and the table of all runs read from them.

results.json: {run, suite, checkpoint, step, step_from, backend, created, versions, training_run, tasks:
{task: {status, metric, value, stderr, k, docs, scored_docs, unscored, unclosed_think, role, kind,
data_check}}, judges: {task: {model, base_url, server_version, threshold, max_tokens}}}. `status`
is `ran` or `skipped`; a skipped task (its data is not here) has `reason` and `fetch` (the command
that gets its data) and value null. `value` is null too when no sample of the task could be scored
(`unscored` 1.0), never 0.0. `data_check` ({status, rows_removed, why}: data_check.py) says whether
the training data of `training_run` was checked against the task's benchmark.

The table `results` (one row per run and task, COLUMNS) is built when it is queried, in an
in-memory DuckDB, from the results.json of every run under a folder (`rufus-eval results`,
`connect_results`): a run writes only its own folder, so no run waits on, or fails at the end
for, a database another run or a notebook holds open.
The summary table is a result: it goes to stdout, messages to stderr; report.md repeats it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from rich.table import Table

from rufus_data.base.console import console, print_result, print_rows
from rufus_data.base.errors import RufusError
from rufus_data.base.redaction import redact, redact_text
from rufus_data.folders.lineage import DataCheck
from rufus_data.folders.run_folder import RESULTS_JSON
from rufus_eval.data_check import check_of, check_text, flagged_notes

REPORT = "report.md"
COLUMNS = ("run", "suite", "checkpoint", "step", "task", "metric", "value", "stderr", "k", "docs", "role", "backend",
           "created", "results_path", "status", "data_check")
TYPES = ("VARCHAR", "VARCHAR", "VARCHAR", "BIGINT", "VARCHAR", "VARCHAR", "DOUBLE", "DOUBLE", "INTEGER", "INTEGER",
         "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR")
DEFAULT_QUERY = ("SELECT run, step, task, metric, value, stderr, k, docs, status FROM results "
                 "ORDER BY step NULLS FIRST, run, task")


def default_runs_root() -> Path:
    """Where `rufus-eval suite` puts its runs by default: outputs/eval."""
    return Path("outputs/eval")


def write_results(record: dict, out_dir: Path) -> Path:
    path = out_dir / RESULTS_JSON
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(redact(record), indent=2, sort_keys=False, default=str))
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


def result_rows(record: dict, results_path: Path) -> list[tuple]:
    """The run's rows of the `results` table: one per task, in COLUMNS order."""
    return [
        (
            record["run"], record["suite"], record["checkpoint"], record.get("step"), task, t["metric"],
            t["value"], t.get("stderr"), t.get("k"), t.get("docs"), t.get("role"), record.get("backend"),
            record.get("created"), str(Path(results_path).resolve()), t.get("status", "ran"),
            (t.get("data_check") or {}).get("status"),
        )
        for task, t in record["tasks"].items()
    ]


def results_files(roots: list[str | Path]) -> list[Path]:
    """Every finished run's results.json under the roots (a run folder, or a folder of them, at any
    depth); folders being written (hidden: `.RUN.tmp-*`, a suite's resume work) are not runs yet."""
    found: list[Path] = []
    for root in map(Path, roots):
        if not root.exists():
            raise RufusError(f"{root} does not exist: give folders that hold eval runs (default outputs/eval)")
        if root.is_file():
            found.append(root)
            continue
        for path in sorted(root.rglob(RESULTS_JSON)):
            if not any(part.startswith(".") for part in path.relative_to(root).parts):
                found.append(path)
    return list(dict.fromkeys(found))


def connect_results(roots: list[str | Path] | None = None):
    """An in-memory DuckDB connection whose table `results` (one row per run and task) is read
    from the runs' results.json now. Nothing on disk is opened for writing: runs finishing while
    a notebook holds this connection, or two runs finishing together, never wait for a lock; a
    new connection sees the runs finished since. A results.json that cannot be read is skipped
    with a warning naming it."""
    import duckdb  # heavy: only to query

    rows = []
    for path in results_files(roots or [default_runs_root()]):
        try:
            record = json.loads(path.read_text())
            rows += result_rows(record, path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            console.print(f"warning: {path} is not a readable results.json ({type(err).__name__}: {err}): skipped",
                          style="yellow", highlight=False, markup=False, soft_wrap=True)
    con = duckdb.connect()
    con.execute(f"CREATE TABLE results ({', '.join(f'{c} {t}' for c, t in zip(COLUMNS, TYPES))})")
    if rows:
        con.executemany(f"INSERT INTO results VALUES ({', '.join('?' for _ in COLUMNS)})", rows)
    return con


def query_results(sql: str | None = None, roots: list[str | Path] | None = None,
                  params: list | None = None) -> tuple[list[str], list[tuple]]:
    """(columns, rows) of a query over the `results` table of the runs under `roots`."""
    import duckdb  # heavy: only to query

    con = connect_results(roots)
    try:
        cursor = con.execute(sql or DEFAULT_QUERY, params or [])
    except duckdb.Error as err:
        raise RufusError(f"query failed: {err}. The table is `results`, columns {', '.join(COLUMNS)}") from None
    columns = [d[0] for d in cursor.description or []]
    return columns, cursor.fetchall()


def query_runs(roots: list[str | Path] | None = None, runs: list[str] | None = None) -> list[dict]:
    """The `results` rows (as dicts) of the runs under `roots`, of the named runs only when given."""
    where = f" WHERE run IN ({', '.join('?' for _ in runs)})" if runs else ""
    columns, rows = query_results(f"SELECT * FROM results{where} ORDER BY step NULLS FIRST, run, task", roots,
                                  list(runs or []))
    return [dict(zip(columns, row)) for row in rows]


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


# the summary as CSV / JSON: the same rows, every value whole (numbers as numbers, nulls as nulls)
SUMMARY_FIELDS = ("task", "status", "metric", "value", "stderr", "k", "docs", "unclosed_think", "unscored",
                  "data_check", "reason", "fetch")


def summary_records(record: dict) -> list[tuple]:
    """The summary's rows for files and pipes, in SUMMARY_FIELDS order."""
    return [(name, t.get("status", "ran"), t["metric"], t.get("value"), t.get("stderr"), t.get("k"), t.get("docs"),
             t.get("unclosed_think"), t.get("unscored"), (t.get("data_check") or {}).get("status"), t.get("reason"),
             t.get("fetch")) for name, t in record["tasks"].items()]


def print_summary(record: dict, fmt: str = "table") -> None:
    """The run's table on stdout (CSV or JSON with `fmt`); why tasks were skipped and how to fetch
    their data, and why a task's training data is not checked, on stderr."""
    if fmt != "table":
        print_rows(list(SUMMARY_FIELDS), summary_records(record), fmt)
    else:
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
    print_left_out(record.get("not_run") or {})
    for note in flagged_notes(record):
        console.print(note, style="red", highlight=False, markup=False, soft_wrap=True)


def print_left_out(not_run: dict[str, str]) -> None:
    """The suite's tasks a run left out (plan.left_out), one line each on stderr."""
    for name, why in not_run.items():
        console.print(f"not run {name}: {why}", highlight=False, markup=False, soft_wrap=True)


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
    path.write_text(redact_text("\n".join(lines) + "\n"))
    return path
