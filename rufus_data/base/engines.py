"""Running independent tasks over a shard folder, for decontam's scan and dedup's stages: in
this process, in a local process pool (`--workers`), or as Ray Data tasks on a cluster
(`--engine ray`). A command's work is a `TaskWorker` (picklable: its state travels to each
process once) called once per task; every engine calls the same worker on the same tasks, so
they compute the same results."""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from threadpoolctl import threadpool_limits

from rufus_data.base.errors import RufusError

AUTO_PROCESSES_FROM_ROWS = 20_000  # below this many rows, forking costs more than it saves


@dataclass(frozen=True)
class RowGroupTask:
    """One parquet row group of one shard, read in batches of `batch_rows`."""

    path: str
    row_group: int
    rows: int
    first_row: int  # global row number of its first row
    batch_rows: int

    def batches(self, columns: list[str] | None = None) -> Iterator[tuple[int, pa.Table]]:
        """(global row of the first row, rows) for each batch: only one batch is held at a time."""
        first = self.first_row
        reader = pq.ParquetFile(self.path)
        for batch in reader.iter_batches(batch_size=self.batch_rows, row_groups=[self.row_group], columns=columns):
            yield first, pa.Table.from_batches([batch])
            first += batch.num_rows


def plan_row_groups(files: list[Path], batch_rows: int) -> tuple[list[RowGroupTask], int]:
    """The tasks of every file in order, and the total number of rows."""
    tasks, total = [], 0
    for path in files:
        meta = pq.ParquetFile(path).metadata
        for group in range(meta.num_row_groups):
            rows = meta.row_group(group).num_rows
            tasks.append(RowGroupTask(str(path), group, rows, total, batch_rows))
            total += rows
    return tasks, total


def auto_workers(workers: int, rows: int, tasks: int) -> int:
    """`workers`, or for 0 one process per CPU, except that small inputs stay in-process."""
    if workers:
        return workers
    return min(os.cpu_count() or 1, tasks) if rows >= AUTO_PROCESSES_FROM_ROWS else 1


def describe_engine(engine: str, asked: int, workers: int) -> str:
    """How the work runs, for a --dry-run plan: on Ray, or in `workers` local processes (`asked`
    0: auto_workers chose them)."""
    if engine == "ray":
        return "ray (Ray Data)"
    return f"local, {workers} process{'es' if workers > 1 else ''}" + ("" if asked else " (auto: by CPUs and rows)")


class TaskWorker:
    """The work of one command's stage: `setup` runs once in each process, then the worker is
    called once per task; what it returns travels back to the parent (keep it small)."""

    def setup(self, one_cpu: bool) -> None:
        """`one_cpu` in a pool or cluster worker: there is one per CPU, so BLAS and Arrow get one
        thread each, not one per core spinning against the others."""
        if one_cpu:
            threadpool_limits(1)
            pa.set_cpu_count(1)

    def __call__(self, task: Any) -> Any:
        raise NotImplementedError


# the worker of this process, set before a pool forks or by the pool's initializer
_WORKER: TaskWorker | None = None


def _init_worker(worker_bytes: bytes | None, one_cpu: bool) -> None:
    global _WORKER
    if worker_bytes is not None:
        _WORKER = pickle.loads(worker_bytes)
    _WORKER.setup(one_cpu)


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _init_pool_worker(worker_bytes: bytes | None, one_cpu: bool) -> None:
    """A pool worker leaves Ctrl-C to the parent (which stops the pool): a worker that died of
    KeyboardInterrupt could hold the pool's queue lock, and `terminate()` then waited forever.
    SIGTERM, which `terminate()` sends, exits quietly, unwinding whatever lock it holds."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _init_worker(worker_bytes, one_cpu)


def _run(task: Any) -> tuple[Any, Any]:
    return task, _WORKER(task)


OnDone = Callable[[Any, Any], None]


def run_tasks(tasks: Sequence, worker: TaskWorker, on_done: OnDone, *, workers: int = 1, engine: str = "local") -> None:
    """Call `worker` on every task and `on_done(task, result)` in the parent as each finishes
    (in any order): in this process (workers <= 1), in a pool of `workers` processes, or on Ray."""
    if engine == "ray":
        _run_ray(tasks, worker, on_done)
    elif workers <= 1 or len(tasks) <= 1:
        global _WORKER
        _WORKER = worker
        worker.setup(False)
        for task in tasks:
            on_done(*_run(task))
    else:
        _run_pool(tasks, worker, workers, on_done)


def _run_pool(tasks: Sequence, worker: TaskWorker, workers: int, on_done: OnDone) -> None:
    global _WORKER
    with contextlib.suppress(ImportError):
        import pandas  # noqa: F401 - pyarrow's to_numpy imports it on first use: once here, not in every worker
    if "fork" in mp.get_all_start_methods():  # workers inherit the worker's state: nothing to pickle
        _WORKER, ctx, initargs = worker, mp.get_context("fork"), (None, True)
    else:
        ctx, initargs = mp.get_context("spawn"), (pickle.dumps(worker), True)
    gc.freeze()  # forked workers would otherwise copy every page the garbage collector walks
    try:
        # signals wait until a new worker has set its own handlers (a Ctrl-C in between killed it mid-start)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pool = ctx.Pool(min(workers, len(tasks)), initializer=_init_pool_worker, initargs=initargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        try:
            for task, result in pool.imap_unordered(_run, tasks):
                on_done(task, result)
        except BaseException:
            pool.terminate()
            raise
        # Done: the workers leave on their own. terminate()'s SIGTERM, here, hung about one pool in
        # a hundred: it can reach a worker's native thread (polars, tokio), not the main thread
        # waiting on the queue lock, or interrupt a worker just after it took that lock.
        pool.close()
        pool.join()
    finally:
        gc.unfreeze()


def _run_ray(tasks: Sequence, worker: TaskWorker, on_done: OnDone) -> None:
    """The same calls as Ray Data tasks (on the cluster `ray.init()` connects to)."""
    try:
        import ray  # optional and heavy: only --engine ray loads it
        import ray.data
    except ImportError:
        raise RufusError("--engine ray needs Ray Data: pip install 'rufus[ray]'") from None
    if not tasks:
        return
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, log_to_driver=False)
    worker_bytes = pickle.dumps(worker)

    class RayTasks:
        def __init__(self):
            _init_worker(worker_bytes, one_cpu=True)

        def __call__(self, batch: dict) -> dict:
            return {"result": [pickle.dumps(_run(pickle.loads(blob))) for blob in batch["task"]]}

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # Rufus shows its own progress
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.from_items([{"task": pickle.dumps(t)} for t in tasks], override_num_blocks=len(tasks))
    actors = max(1, min(len(tasks), int(ray.available_resources().get("CPU", 1))))
    results = ds.map_batches(RayTasks, batch_size=1, concurrency=actors)
    for row in results.iter_rows():
        on_done(*pickle.loads(row["result"]))
