"""Results: one `results.json` per run, and a DuckDB file that holds every run's rows.

results.json: {run, suite, checkpoint, step, backend, created, model_info, tasks: {task: {metric,
value, stderr, k, docs, scored_docs, unscored, unclosed_think, role, kind}}, judges: {task: {model,
base_url, server_version, threshold, max_tokens}}}. `value` is null when no sample of the task could
be scored (`unscored` 1.0), never 0.0. The DuckDB table `results` has one row per (run, task), so
runs can be compared across checkpoints with plain SQL."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb

from rufus_data.errors import RufusError

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    run VARCHAR, suite VARCHAR, checkpoint VARCHAR, step BIGINT, task VARCHAR, metric VARCHAR,
    value DOUBLE, stderr DOUBLE, k INTEGER, docs INTEGER, role VARCHAR, backend VARCHAR,
    created VARCHAR, results_path VARCHAR,
    PRIMARY KEY (run, task)
)
"""


def default_db_path() -> Path:
    """`$RUFUS_EVAL_DB`, default outputs/eval/results.duckdb."""
    return Path(os.environ.get("RUFUS_EVAL_DB") or "outputs/eval/results.duckdb")


def write_results(record: dict, out_dir: Path) -> Path:
    path = out_dir / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False, default=str))
    tmp.replace(path)
    return path


def read_results(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
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
            record.get("created"), str(Path(results_path).resolve()),
        )
        for task, t in record["tasks"].items()
    ]
    with duckdb.connect(str(db_path)) as con:
        con.execute(SCHEMA)
        con.execute("DELETE FROM results WHERE run = ?", [record["run"]])
        if rows:
            con.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
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
