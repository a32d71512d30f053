"""What a stage's `data:` names: shard folders written by rufus-data, or rufus-data mixture
catalogs (`*.yaml`), which the run builds into OUT/data/NAME/ with `rufus_data.mix` first. Every
stage YAML names a default catalog under catalogs/data/ (real data by hub id at a pinned revision,
with offline fallbacks under $RUFUS_DATA_ROOT); a relative `catalogs/...` entry is read from the
working directory when it is there, else from the Rufus repository (as catalogs/stages/ is).

Checks read only parquet footers or the catalog file, so they run before anything loads."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.builders import BUILDERS
from rufus_data.catalog import load_catalog
from rufus_data.console import console
from rufus_data.errors import RufusError
from rufus_data.mix import mix
from rufus_data.paths import shipped_path
from rufus_data.rewards.data_rewards import REWARD_COLUMN
from rufus_data.shards import KIND_COLUMNS, ROW_COLUMNS, kind_columns_hint, read_shards, shard_files

log = logging.getLogger("rufus_train")


def is_catalog(entry: str) -> bool:
    return entry.endswith((".yaml", ".yml"))


def resolve_entry(entry: str) -> str:
    """`entry` as given when it exists; a relative path that exists only in the Rufus repository
    (the default catalogs/data/*.yaml of the stage YAMLs) from there."""
    return str(shipped_path(entry))


def check_data(entries: list[str], stage: str) -> None:
    """Every entry is a shard folder with shards, or a valid mixture catalog."""
    if not entries:
        raise RufusError(f"stage {stage} has no `data`: set `data: [SHARD_FOLDER or CATALOG.yaml, ...]`")
    for entry in map(resolve_entry, entries):
        if is_catalog(entry):
            load_catalog(entry)  # strict validation, names file/line/key
        else:
            shard_files(Path(entry))  # raises a RufusError naming the folder


def columns_of(entry: str) -> set[str]:
    """The columns the entry's rows have: a shard folder's schema, or what its catalog's kind makes
    plus the columns its builder steps write (on every place a source may load from) and the
    reward column when every source declares `reward:`."""
    entry = resolve_entry(entry)
    if is_catalog(entry):
        catalog = load_catalog(entry)
        built: set[str] = set()
        for source in catalog.sources:
            steps = [rows.build for rows in (source, source.fallback) if rows is not None]
            if all(steps):
                built |= set.intersection(*(set(BUILDERS[step].writes) for step in steps))
        if all(source.reward is not None for source in catalog.sources):
            built.add(REWARD_COLUMN)
        return {*ROW_COLUMNS, *KIND_COLUMNS[catalog.kind], *built}
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
    """Shard folders for every entry: catalogs are mixed into OUT/data/NAME/ (rebuilt each run);
    where each source's rows came from (a fallback, a builder step) goes to the console and train.log."""
    folders = []
    for entry in map(resolve_entry, entries):
        if is_catalog(entry):
            out = Path(output_dir) / "data" / Path(entry).stem
            result = mix(entry, out=out, overwrite=True)
            for line in data_origins(result.manifest):
                log.info("data %s: %s", Path(entry).stem, line)
                console.print(f"data {Path(entry).stem}: {line}", highlight=False)
            folders.append(str(out))
        else:
            folders.append(entry)
    return folders


def data_origins(manifest: dict) -> list[str]:
    """One line per source of a mix manifest: rows, where they came from, fallback and builder step."""
    lines = []
    for source in manifest["sources"]:
        origin = source["fingerprint"]
        where = origin.get("from", "?")
        if origin.get("build"):
            where = f"{origin['build']['step']} built from {where}"
        line = f"source {source['name']}: {source['rows_out']:,} rows from {where}"
        if origin.get("fallback", {}).get("used"):
            line += f" (offline fallback for {origin['fallback']['instead_of']})"
        lines.append(line)
    return lines


def read_rows(folders: list[str], max_rows: int | None, seed: int, stage: str) -> pa.Table:
    """All rows of the folders; `max_rows` takes a seeded sample (in the original order)."""
    table = pa.concat_tables([read_shards(f) for f in folders], promote_options="default")
    if max_rows is not None and table.num_rows > max_rows:
        order = np.random.default_rng(seed).permutation(table.num_rows)[:max_rows]
        table = table.take(pa.array(np.sort(order)))
    if table.num_rows == 0:
        raise RufusError(f"stage {stage}: the shards in {folders} hold no rows")
    return table
