"""Ctrl-C and SIGTERM on a `rufus-data` command running its process pool (issue #47, item 9):
it stops at once (130 for Ctrl-C, 143 for SIGTERM), its temporary folder and lock go, the
dedup work folder stays to resume, and no worker prints a traceback. (Resuming from that folder
is tests/test_dedup_scale.py's.)"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from rufus_data.base.engines import AUTO_PROCESSES_FROM_ROWS
from rufus_data.folders.shards import write_shards

RUFUS_DATA = str(Path(sys.executable).parent / "rufus-data")
ROWS = AUTO_PROCESSES_FROM_ROWS + 5_000  # above it, dedup runs its process pool


@pytest.fixture(scope="module")
def many_rows(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    rows = []
    for i in range(ROWS):
        text = " ".join(rng.choice(words) for _ in range(40))
        rows.append({"id": f"r{i}", "source": "s", "label": "s",
                     "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text[:60]}]})
    folder = tmp_path_factory.mktemp("interrupts") / "mix"
    write_shards(pa.Table.from_pylist(rows), folder, shard_rows=2000)
    return folder


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.spawn
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_dedups_pool_at_once_and_leaves_no_lock_or_temporary(many_rows, tmp_path, sig, code):
    out = tmp_path / "out"
    for attempt in range(3):  # different moments of the run, each from the start: a resumed run
        shutil.rmtree(tmp_path / ".out.dedup-work", ignore_errors=True)  # can end before the signal
        proc = subprocess.Popen([RUFUS_DATA, "dedup", str(many_rows), "--out", str(out), "--workers", "2"],
                                start_new_session=True, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + 120
        while len(children(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)  # the pool's workers run
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.2 * attempt)
        os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C or a scheduler's stop reaches the whole group
        started = time.monotonic()
        try:
            returncode = proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"rufus-data dedup hung after {sig.name}")
        stderr = proc.stderr.read()
        assert returncode == code and time.monotonic() - started < 15, stderr[-3000:]
        assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr[-3000:]
        left = sorted(p.name for p in tmp_path.iterdir())
        assert not out.exists() and [n for n in left if ".lock" in n or ".tmp-" in n] == [], left
        assert left in ([], [".out.dedup-work"])  # what dedup keeps to resume, and nothing else
