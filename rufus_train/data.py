"""What a stage's `data:` names: shard folders written by rufus-data, or rufus-data mixture
catalogs (`*.yaml`), which the run builds into OUT/data/NAME/ with `rufus_data.mix` first.

Checks read only parquet footers or the catalog file, so they run before anything loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.catalog import load_catalog
from rufus_data.errors import RufusError
from rufus_data.mix import mix
from rufus_data.shards import KIND_COLUMNS, ROW_COLUMNS, kind_columns_hint, read_shards, shard_files


def is_catalog(entry: str) -> bool:
    return entry.endswith((".yaml", ".yml"))


def check_data(entries: list[str], stage: str) -> None:
    """Every entry is a shard folder with shards, or a valid mixture catalog."""
    if not entries:
        raise RufusError(f"stage {stage} has no `data`: set `data: [SHARD_FOLDER or CATALOG.yaml, ...]`")
    for entry in entries:
        if is_catalog(entry):
            load_catalog(entry)  # strict validation, names file/line/key
        else:
            shard_files(Path(entry))  # raises a RufusError naming the folder


def columns_of(entry: str) -> set[str]:
    """The columns the entry's rows have: a shard folder's schema, or what its catalog's kind makes."""
    if is_catalog(entry):
        return {*ROW_COLUMNS, *KIND_COLUMNS[load_catalog(entry).kind]}
    return set(pq.read_schema(shard_files(entry)[0]).names)


def check_columns(entries: list[str], required: tuple, stage: str) -> None:
    """The data must have the columns the stage reads (a tuple inside `required` = one of these)."""
    for entry in entries:
        names = columns_of(entry)
        for need in required:
            options = need if isinstance(need, tuple) else (need,)
            if not names & set(options):
                wanted = " or ".join(f"'{o}'" for o in options)
                raise RufusError(
                    f"stage {stage} reads column {wanted}, but the data in {entry} has {sorted(names)}: "
                    f"give data of the right kind ({kind_columns_hint()})"
                )


def mix_catalog_entries(entries: list[str], output_dir: Path) -> list[str]:
    """Shard folders for every entry: catalogs are mixed into OUT/data/NAME/ (rebuilt each run)."""
    folders = []
    for entry in entries:
        if is_catalog(entry):
            out = Path(output_dir) / "data" / Path(entry).stem
            mix(entry, out=out, overwrite=True)
            folders.append(str(out))
        else:
            folders.append(entry)
    return folders


def read_rows(folders: list[str], max_rows: int | None, seed: int, stage: str) -> pa.Table:
    """All rows of the folders; `max_rows` takes a seeded sample (in the original order)."""
    table = pa.concat_tables([read_shards(f) for f in folders], promote_options="default")
    if max_rows is not None and table.num_rows > max_rows:
        order = np.random.default_rng(seed).permutation(table.num_rows)[:max_rows]
        table = table.take(pa.array(np.sort(order)))
    if table.num_rows == 0:
        raise RufusError(f"stage {stage}: the shards in {folders} hold no rows")
    return table
