"""The local process pool that decontam's scan and dedup's stages run on (rufus_data/base/engines.py):
a finished pool lets its workers leave on their own; only an error or a stop terminates it.

terminate() after every pool hung about one pool in a hundred (a decontam run, and a loop of
pools whose workers use polars): its SIGTERM can reach a worker's native thread rather than the
main thread waiting on the queue lock, or interrupt a worker just after it took that lock, and
the parent then waits for that worker forever."""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.pool
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

from rufus_data.base.engines import TaskWorker, run_tasks


class Doubler(TaskWorker):
    def __call__(self, task: int) -> int:
        return 2 * task


@pytest.fixture
def terminations(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = multiprocessing.pool.Pool.terminate

    def counted(pool):
        calls.append(1)
        original(pool)

    monkeypatch.setattr(multiprocessing.pool.Pool, "terminate", counted)
    return calls


def test_a_finished_pool_is_closed_not_terminated(terminations):
    results: dict[int, int] = {}
    run_tasks(list(range(12)), Doubler(), results.__setitem__, workers=2)
    assert results == {t: 2 * t for t in range(12)}
    assert terminations == []
    assert mp.active_children() == []


def test_an_error_in_the_parent_terminates_the_pool(terminations):
    def fails(task, result):
        raise ValueError("on_done failed")

    with pytest.raises(ValueError, match="on_done failed"):
        run_tasks(list(range(12)), Doubler(), fails, workers=2)
    assert terminations == [1]
    assert mp.active_children() == []


@pytest.mark.slow
def test_three_hundred_pools_with_polars_workers_all_finish():
    """The loop that hung within 100 pools before the change (5 runs of 100: 3 hung)."""
    script = textwrap.dedent("""
        from rufus_data.base.engines import TaskWorker, run_tasks

        class Polars(TaskWorker):
            def __call__(self, task):
                import polars as pl
                return int(pl.DataFrame({"a": list(range(1000))}).select(pl.col("a").sum()).item()) + task

        for _ in range(300):
            out = []
            run_tasks(list(range(8)), Polars(), lambda task, result: out.append(result), workers=2)
            assert len(out) == 8
        print("done")
    """)
    run = subprocess.run([sys.executable, "-c", script], check=False, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0 and "done" in run.stdout, run.stderr[-2000:]
