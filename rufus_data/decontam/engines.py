"""Running the scan over a shard folder: the input is cut into tasks (one parquet row group
each), and an engine runs `scan_table` over every task: in this process, in a local process
pool (workers inherit the index by fork), or as Ray Data tasks on a cluster. Every engine
calls the same per-task function, so they find the same candidates."""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from threadpoolctl import threadpool_limits

from rufus_data.decontam.candidates import Candidate
from rufus_data.decontam.index import EvalIndex
from rufus_data.decontam.scan import scan_table
from rufus_data.errors import RufusError
from rufus_data.ngram_hash import TokenHasher


@dataclass(frozen=True)
class ScanTask:
    """One parquet row group of one shard: read once, scanned in batches of `batch_rows`."""

    path: str
    row_group: int
    rows: int
    first_row: int  # global row number of its first row
    batch_rows: int


def plan_scan(files: list[Path], batch_rows: int) -> tuple[list[ScanTask], int]:
    """The tasks of every file in order, and the total number of rows."""
    tasks, total = [], 0
    for path in files:
        meta = pq.ParquetFile(path).metadata
        for group in range(meta.num_row_groups):
            rows = meta.row_group(group).num_rows
            tasks.append(ScanTask(str(path), group, rows, total, batch_rows))
            total += rows
    return tasks, total


def _scan_task(task: ScanTask, index: EvalIndex, hasher: TokenHasher) -> list[Candidate]:
    table = pq.ParquetFile(task.path).read_row_group(task.row_group)
    found: list[Candidate] = []
    for start in range(0, table.num_rows, task.batch_rows):
        found += scan_table(table.slice(start, task.batch_rows), index, task.first_row + start, hasher)
    return found


# one index and hasher per worker process, set by the pool's initializer
_WORKER_INDEX: EvalIndex | None = None
_WORKER_HASHER: TokenHasher | None = None


def _init_worker(index_bytes: bytes | None, one_cpu: bool = False) -> None:
    """Set up a worker; `one_cpu` for a pool or cluster worker: there is one per CPU, so BLAS (the
    semantic stage's matrix products) gets one thread, not one per core spinning against the others."""
    global _WORKER_INDEX, _WORKER_HASHER
    if index_bytes is not None:
        _WORKER_INDEX = pickle.loads(index_bytes)
    _WORKER_HASHER = TokenHasher()
    if one_cpu:
        threadpool_limits(1)


def _run_task(task: ScanTask) -> tuple[ScanTask, list[Candidate]]:
    return task, _scan_task(task, _WORKER_INDEX, _WORKER_HASHER)


OnDone = Callable[[ScanTask], None]


def scan_local(tasks: list[ScanTask], index: EvalIndex, workers: int, on_done: OnDone) -> list[Candidate]:
    """In this process (workers <= 1), else in a pool of `workers` processes."""
    global _WORKER_INDEX
    found: list[Candidate] = []
    if workers <= 1 or len(tasks) <= 1:
        _WORKER_INDEX = index
        _init_worker(None)
        for task in tasks:
            _, cands = _run_task(task)
            found += cands
            on_done(task)
        return found
    if "fork" in mp.get_all_start_methods():  # workers inherit the index: nothing to pickle
        _WORKER_INDEX, ctx, initargs = index, mp.get_context("fork"), (None, True)
    else:
        ctx, initargs = mp.get_context("spawn"), (pickle.dumps(index), True)
    gc.freeze()  # forked workers would otherwise copy every page the garbage collector walks
    try:
        with ctx.Pool(workers, initializer=_init_worker, initargs=initargs) as pool:
            for task, cands in pool.imap_unordered(_run_task, tasks):
                found += cands
                on_done(task)
    finally:
        gc.unfreeze()
    return found


def scan_ray(tasks: list[ScanTask], index: EvalIndex, on_done: OnDone) -> list[Candidate]:
    """The same per-task work as Ray Data tasks (on the cluster `ray.init()` connects to)."""
    try:
        import ray  # optional and heavy: only --engine ray loads it
        import ray.data
    except ImportError:
        raise RufusError("--engine ray needs Ray Data: pip install 'rufus[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, log_to_driver=False)
    index_bytes = pickle.dumps(index)

    class ScanTasks:
        def __init__(self):
            _init_worker(index_bytes, one_cpu=True)

        def __call__(self, batch: dict) -> dict:
            return {"result": [pickle.dumps(_run_task(pickle.loads(blob))) for blob in batch["task"]]}

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # Rufus shows its own progress
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.from_items([{"task": pickle.dumps(t)} for t in tasks], override_num_blocks=len(tasks))
    results = ds.map_batches(ScanTasks, batch_size=1, concurrency=max(1, int(ray.available_resources().get("CPU", 1))))
    found: list[Candidate] = []
    for row in results.iter_rows():
        task, cands = pickle.loads(row["result"])
        found += cands
        on_done(task)
    return found
