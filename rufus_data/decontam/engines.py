"""Running the scan over a shard folder: the input is cut into tasks (one parquet row group
each), and the shared engines (rufus_data/base/engines.py) run `scan_table` over every task: in
this process, in a local process pool (workers inherit the index by fork), or as Ray Data
tasks on a cluster. Every engine calls the same per-task function, so they find the same
candidates."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from rufus_data.base.engines import RowGroupTask, TaskWorker, plan_row_groups, run_tasks
from rufus_data.decontam.candidates import Candidate
from rufus_data.decontam.index import EvalIndex
from rufus_data.decontam.scan import scan_table
from rufus_data.similarity.ngram_hash import TokenHasher

ScanTask = RowGroupTask  # one parquet row group of one shard, scanned in batches of `batch_rows`


def plan_scan(files: list[Path], batch_rows: int) -> tuple[list[ScanTask], int]:
    """The tasks of every file in order, and the total number of rows."""
    return plan_row_groups(files, batch_rows)


class ScanWorker(TaskWorker):
    """Scans a task's rows against the eval index (inherited by fork, or pickled once per process)."""

    def __init__(self, index: EvalIndex):
        self.index = index
        self.hasher: TokenHasher | None = None

    def setup(self, one_cpu: bool) -> None:
        super().setup(one_cpu)
        self.hasher = TokenHasher()

    def __call__(self, task: ScanTask) -> list[Candidate]:
        table = pq.ParquetFile(task.path).read_row_group(task.row_group)
        found: list[Candidate] = []
        for start in range(0, table.num_rows, task.batch_rows):
            found += scan_table(table.slice(start, task.batch_rows), self.index, task.first_row + start, self.hasher)
        return found


OnDone = Callable[[ScanTask], None]


def _scan(tasks: list[ScanTask], index: EvalIndex, workers: int, engine: str, on_done: OnDone) -> list[Candidate]:
    found: list[Candidate] = []

    def collect(task: ScanTask, cands: list[Candidate]) -> None:
        found.extend(cands)
        on_done(task)

    run_tasks(tasks, ScanWorker(index), collect, workers=workers, engine=engine)
    return found


def scan_local(tasks: list[ScanTask], index: EvalIndex, workers: int, on_done: OnDone) -> list[Candidate]:
    """In this process (workers <= 1), else in a pool of `workers` processes."""
    return _scan(tasks, index, workers, "local", on_done)


def scan_ray(tasks: list[ScanTask], index: EvalIndex, on_done: OnDone) -> list[Candidate]:
    """The same per-task work as Ray Data tasks (on the cluster `ray.init()` connects to)."""
    return _scan(tasks, index, 1, "ray", on_done)
