"""Reading some rows again from the shards by global row number: the ids of the rows in the
clusters, the texts of the semantic stage's candidate pairs, the tokens of dropped rows. Only
the row groups that hold such rows are read, one at a time."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.engines import RowGroupTask


def task_of(tasks: list[RowGroupTask], rows: np.ndarray) -> np.ndarray:
    """The index of the task that holds each global row."""
    starts = np.asarray([t.first_row for t in tasks], dtype=np.int64)
    return np.searchsorted(starts, rows, side="right") - 1


def rows_at(tasks: list[RowGroupTask], rows: np.ndarray, columns: list[str] | None = None) -> Iterator[tuple[np.ndarray, pa.Table]]:
    """(global rows, those rows of the shards) for each row group holding some of `rows` (sorted,
    distinct); `columns` that a shard lacks are left out of its table."""
    owner = task_of(tasks, rows)
    for index in np.unique(owner).tolist():
        task = tasks[index]
        wanted = rows[owner == index]
        source = pq.ParquetFile(task.path)
        present = None if columns is None else [c for c in columns if c in source.schema_arrow.names]
        table = source.read_row_group(task.row_group, columns=present)
        yield wanted, table.take(pa.array(wanted - task.first_row))


def ids_at(tasks: list[RowGroupTask], rows: np.ndarray) -> dict[int, str]:
    """The `id` of each of `rows` (its global row number where the shards have no id column)."""
    found: dict[int, str] = {}
    for wanted, table in rows_at(tasks, rows, ["id"]):
        values = table.column("id").to_pylist() if "id" in table.column_names else wanted.tolist()
        found.update(zip(wanted.tolist(), map(str, values)))
    return found
