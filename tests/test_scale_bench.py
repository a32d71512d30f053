"""The rows of bench/scale_bench.py, at a test's size: every row distinct to dedup except the
planted copies, which it drops (and nothing else)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pyarrow as pa
from conftest import REPO

from rufus_data.dedup import dedup
from rufus_data.folders.shards import write_shards


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
