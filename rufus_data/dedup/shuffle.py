"""Keyed entries written out and regrouped by key, as a MapReduce shuffle does: each task writes
its entries cut into `parts` partitions by key, and a later task reads one partition from every
task's file, so no process ever holds more than one partition. A file is an Arrow IPC file of
rounds of `parts` record batches (a task writes one round per batch of rows), so a partition is
read back batch by batch without reading the rest of the file."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from rufus_data.dedup.work import batch_file

KEYED = pa.schema([("key", pa.uint64()), ("row", pa.int64())])  # band keys and origin ids, by row
PAIRS = pa.schema([("a", pa.int64()), ("b", pa.int64())])  # candidate pairs, earlier row first
_MIX = np.uint64(0x9E3779B97F4A7C15)

# entries per partition: a partition is sorted in one process (16 bytes an entry, ~2x while sorting)
PARTITION_ENTRIES = 4_000_000


def partitions_for(entries: int) -> int:
    """How many partitions keep each near PARTITION_ENTRIES."""
    return max(1, -(-entries // PARTITION_ENTRIES))


def key_partition(keys: np.ndarray, parts: int) -> np.ndarray:
    """The partition of each hash key (its high bits: the well-mixed ones of the band keys)."""
    return ((keys >> np.uint64(32)) % np.uint64(parts)).astype(np.int64)


def pair_partition(a: np.ndarray, b: np.ndarray, parts: int) -> np.ndarray:
    """The partition of each pair of rows, by a hash of both."""
    with np.errstate(over="ignore"):
        mixed = (a.astype(np.uint64) * _MIX) ^ (b.astype(np.uint64) + _MIX)
        mixed *= _MIX
    return key_partition(mixed, parts)


@contextlib.contextmanager
def partitioned_file(path: Path, schema: pa.Schema, parts: int) -> Iterator[Callable[..., None]]:
    """One task's entries, written round by round: `add(part, **columns)` cuts a batch of entries
    into the partitions; the file gets its real name when the block ends (a killed task leaves none)."""
    with batch_file(path, schema) as writer:
        def add(part: np.ndarray, **columns: np.ndarray) -> None:
            order = np.argsort(part, kind="stable")
            bounds = np.searchsorted(part[order], np.arange(parts + 1))
            arrays = [np.asarray(columns[f.name])[order] for f in schema]
            for p in range(parts):
                lo, hi = bounds[p], bounds[p + 1]
                writer.write_batch(pa.record_batch([pa.array(a[lo:hi], f.type) for a, f in zip(arrays, schema)],
                                                   schema=schema))
        yield add


def read_partition(paths: list[Path], schema: pa.Schema, part: int, parts: int) -> dict[str, np.ndarray]:
    """Every entry of partition `part` in these files, as one numpy array per column."""
    chunks: list[pa.RecordBatch] = []
    for path in paths:
        with pa.OSFile(str(path)) as source:
            reader = pa.ipc.open_file(source)
            for k in range(reader.num_record_batches // parts):
                batch = reader.get_batch(k * parts + part)
                if batch.num_rows:
                    chunks.append(batch)
    table = pa.Table.from_batches(chunks, schema=schema)
    return {f.name: table.column(f.name).to_numpy() for f in schema}
