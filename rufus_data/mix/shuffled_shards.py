"""Pass 3 of `mix`: write the chosen rows as shuffled shards without holding the mix in memory.

The train split is a seeded permutation of every pick (row, repeat) of every source. Rows are
read part by part (the 1,024-row parquet parts of pass 1), routed to the bucket of the output
shard their shuffled position falls in, and each bucket is then sorted and written as one
shard. Memory holds one part plus one shard, whatever the size of the mix."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.folders.shards import write_shard

POSITION = "__rufus_position"


def unified_schema(part_files: list[Path]) -> tuple[pa.Schema, set[str]]:
    """The union of the parts' columns, as `datasets.concatenate_datasets` aligns them; a column
    whose types disagree (an int id here, a string id there) becomes text (the second value)."""
    schemas = [pq.read_schema(p) for p in part_files]
    try:
        return pa.unify_schemas(schemas, promote_options="permissive"), set()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    types: dict[str, set] = {}
    for schema in schemas:
        for f in schema:
            if not pa.types.is_null(f.type):
                types.setdefault(f.name, set()).add(f.type)
    clashing = {name for name, kinds in types.items() if len(kinds) > 1}
    texted = [pa.schema([pa.field(f.name, pa.string()) if f.name in clashing else f for f in s]) for s in schemas]
    return pa.unify_schemas(texted, promote_options="permissive"), clashing


def conform(table: pa.Table, schema: pa.Schema, clashing: set[str]) -> pa.Table:
    """`table` with exactly `schema`'s columns, in its order (missing ones null)."""
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, f.type))
        elif f.name in clashing:
            columns.append(pa.array([_as_text(v) for v in table.column(f.name).to_pylist()], pa.string()))
        else:
            columns.append(table.column(f.name).cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _as_text(value):
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def shuffled_positions(n: int, seed: int) -> np.ndarray:
    """positions[k] = where the k-th pick (sources in catalog order) lands in the train split."""
    digest = hashlib.sha256(f"{seed}:shuffle".encode()).digest()
    order = np.random.default_rng(int.from_bytes(digest[:8], "little")).permutation(n)
    positions = np.empty(n, dtype=np.int64)
    positions[order] = np.arange(n, dtype=np.int64)
    return positions


def _parts_with_offsets(parts: list[Path]) -> Iterator[tuple[Path, int, int]]:
    start = 0
    for part in parts:
        rows = pq.ParquetFile(part).metadata.num_rows
        yield part, start, start + rows
        start += rows


def _picked_rows(parts: list[Path], rows: np.ndarray) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """(table of the picked rows of one part, indices into `rows` they answer), part by part."""
    by_row = np.argsort(rows, kind="stable")
    sorted_rows = rows[by_row]
    for part, start, stop in _parts_with_offsets(parts):
        lo, hi = np.searchsorted(sorted_rows, [start, stop])
        if lo == hi:
            continue
        table = pq.read_table(part)
        yield table.take(pa.array(sorted_rows[lo:hi] - start)), by_row[lo:hi]


def write_train(sources: list[tuple[list[Path], list[tuple[int, int]]]], folder: Path, seed: int,
                shard_rows: int, schema: pa.Schema, clashing: set[str]) -> int:
    """Shuffle every (row, repeat) pick of every source into `train-*.parquet` shards; returns the rows.

    `sources`: per source, its parts and its picks. Repeats get their own id (`<id>#rep<r>`),
    the original stays in `origin_id`."""
    total = sum(len(picks) for _, picks in sources)
    positions = shuffled_positions(total, seed)
    n_shards = max(1, -(-total // shard_rows))
    out_schema = schema.append(pa.field("origin_id", pa.string()))
    bucket_schema = out_schema.append(pa.field(POSITION, pa.int64()))
    buckets = folder / "_buckets"
    buckets.mkdir()
    writers: dict[int, pq.ParquetWriter] = {}
    try:
        base = 0
        for parts, picks in sources:
            rows = np.fromiter((i for i, _ in picks), dtype=np.int64, count=len(picks))
            repeats = np.fromiter((r for _, r in picks), dtype=np.int64, count=len(picks))
            for table, which in _picked_rows(parts, rows):
                ids = table.column("id").to_pylist()
                new_ids = [rid if r == 0 else f"{rid}#rep{r}" for rid, r in zip(ids, repeats[which].tolist(), strict=True)]
                table = conform(table, schema, clashing)
                table = table.set_column(table.schema.get_field_index("id"), "id", pa.array(new_ids, pa.string()))
                table = table.append_column("origin_id", pa.array(ids, pa.string()))
                where = positions[base + which]
                table = table.append_column(POSITION, pa.array(where))
                shard_of = where // shard_rows
                for shard in np.unique(shard_of).tolist():
                    if shard not in writers:
                        writers[shard] = pq.ParquetWriter(buckets / f"{shard:06d}.parquet", bucket_schema)
                    writers[shard].write_table(table.filter(pa.array(shard_of == shard)))
            base += len(picks)
    finally:
        for writer in writers.values():
            writer.close()
    for shard in range(n_shards):
        path = buckets / f"{shard:06d}.parquet"
        table = pq.read_table(path, schema=bucket_schema) if path.exists() else bucket_schema.empty_table()
        table = table.sort_by(POSITION).drop_columns([POSITION])
        write_shard(table, folder, shard, n_shards, "train")
        path.unlink(missing_ok=True)
    buckets.rmdir()
    return total


def read_picked_holdout(sources: list[tuple[list[Path], list[int]]], schema: pa.Schema, clashing: set[str]) -> pa.Table | None:
    """The held-out rows of every source, in source order (a few per source: fits in memory)."""
    tables = []
    for parts, held in sources:
        rows = np.asarray(sorted(held), dtype=np.int64)
        for table, _ in _picked_rows(parts, rows):
            table = conform(table, schema, clashing)
            tables.append(table.append_column("origin_id", table.column("id").cast(pa.string())))
    return pa.concat_tables(tables) if tables else None
