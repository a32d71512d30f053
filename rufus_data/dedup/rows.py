"""Reading some rows again from the shards by global row number (the ids of the rows in the
clusters, the texts of the semantic stage's candidate pairs, the tokens of dropped rows: only
the row groups that hold such rows are read, one at a time), and writing the shards again
without the dropped rows, a shard per task."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.base.engines import RowGroupTask, TaskWorker, run_tasks
from rufus_data.folders.shards import write_without_rows
from rufus_data.similarity.ngram_hash import distinct


def task_of(tasks: list[RowGroupTask], rows: np.ndarray) -> np.ndarray:
    """The index of the task that holds each global row."""
    starts = np.asarray([t.first_row for t in tasks], dtype=np.int64)
    return np.searchsorted(starts, rows, side="right") - 1


def rows_at(tasks: list[RowGroupTask], rows: np.ndarray, columns: list[str] | None = None) -> Iterator[tuple[np.ndarray, pa.Table]]:
    """(global rows, those rows of the shards) for each row group holding some of `rows` (sorted,
    distinct); `columns` that a shard lacks are left out of its table."""
    owner = task_of(tasks, rows)
    for index in distinct(owner).tolist():
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


class CopyWorker(TaskWorker):
    """Writes one shard into `folder` without its dropped rows; a task is (shard, its first global row)."""

    def __init__(self, dropped: np.ndarray, folder: Path):
        self.dropped, self.folder = dropped, folder

    def __call__(self, task: tuple[str, int, int]) -> int:
        path, first, rows = task
        lo, hi = np.searchsorted(self.dropped, [first, first + rows])
        write_without_rows([Path(path)], self.dropped[lo:hi] - first, self.folder)
        return rows


def shard_copier(counts: list[int], workers: int, engine: str):
    """A `copy` for OutputStep.write_without_rows that writes the shards in parallel."""
    def copy(files: list[Path], drop: Collection[int], folder: Path) -> None:
        starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64).tolist()
        tasks = [(str(p), first, n) for p, first, n in zip(files, starts, counts)]
        run_tasks(tasks, CopyWorker(np.sort(np.asarray(drop, dtype=np.int64)), folder), lambda *_: None,
                  workers=workers, engine=engine)
    return copy
