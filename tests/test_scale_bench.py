"""The rows of bench/scale_bench.py, at a test's size: every row distinct to dedup except the
planted copies, which it drops (and nothing else)."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pyarrow as pa
from conftest import REPO

from rufus_data.dedup import dedup
from rufus_data.folders.shards import write_shards
from rufus_data.sources.source_formats import read_turns


def scale_bench():
    spec = importlib.util.spec_from_file_location("scale_bench", REPO / "bench" / "scale_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_rows_are_distinct_but_for_the_planted_copies(data_root, tmp_path):
    bench = scale_bench()
    n = 10_000  # more than the 9,490 base rows: some bases come back, made distinct
    bases = bench.base_rows(data_root)
    rows = pa.concat_tables([bench.make_rows(bases, 0, 7000), bench.make_rows(bases, 7000, n - 7000)])
    assert rows.slice(8000, 1).to_pylist() == bench.make_rows(bases, 8000, 1).to_pylist()  # chunks join seamlessly
    assert len(set(rows.column("id").to_pylist())) == n
    write_shards(rows, tmp_path / "rows", shard_rows=5000)
    result = dedup(tmp_path / "rows", report_only=True)
    dropped = {(c["duplicate_row"], c["kept_row"]) for c in result.clusters.to_pylist()}
    copied = bench.copied_rows(np.arange(n))
    planted = {(i, c) for i, c in enumerate(copied.tolist()) if c != i}
    assert len(planted) == bench.planted(n) and dropped == planted


def test_bench_rows_read_as_mix_reads_them(data_root):
    """Code Alpaca 2k has two rows with an empty output; mix refuses such a row (it would train
    on an empty reply), so the bench leaves them out of its bases rather than failing at 250k."""
    bench = scale_bench()
    bases = bench.base_rows(data_root)
    assert all(answer.strip() for _, _, answer in bases)
    rows = bench.make_rows(bases, 0, len(bases))
    for conversation in rows.column("messages").to_pylist():
        read_turns(conversation)  # raises BadRow on what mix would refuse


def test_measure_counts_the_cpu_of_the_command_by_sampling_too(tmp_path):
    """The sampled CPU seconds (what counts the workers of a server process nobody reaps, as
    datatrove's forkserver has) see the command's own work."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.8:\n    pass"
    run = scale_bench().measure([sys.executable, "-c", burn], dict(os.environ), tmp_path)
    assert run["cpu_seconds"] >= 0.8
    assert 0.4 <= run["sampled_cpu_seconds"] <= run["cpu_seconds"] + 0.1
