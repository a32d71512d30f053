"""What a stage's `data:` names: shard folders written by rufus-data, or rufus-data mixture
catalogs (`*.yaml`), which the run builds into RUN/data/NAME/ with `rufus_data.mix` first (both
resolved by rufus_data.sources.inputs). Every stage YAML names a default catalog under catalogs/data/
(real data by hub id at a pinned revision, with offline fallbacks under $RUFUS_DATA_ROOT); a
relative `catalogs/...` entry is read from the working directory when it is there, else from the
catalogs Rufus ships (rufus_data/base/catalog_files.py, as catalogs/stages/ is).

When the data is ready its lineage (rufus_data/folders/lineage.py) goes to RUN/lineage.json and, said
plainly on the console, what each entry was checked against: a catalog mixed at the start was
never decontaminated, and the note gives the commands that check it.

Checks read only parquet footers or the catalog file, so they run before anything loads."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from rich.text import Text

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.folders.lineage import chain_text, checked_benchmarks, folder_lineage, rows_text, run_lineage
from rufus_data.folders.run_folder import mixed_data_dir, write_lineage
from rufus_data.folders.shards import (
    KIND_COLUMNS,
    ROW_COLUMNS,
    kind_columns_hint,
    read_shards,
    sample_indices,
    shard_files,
    shard_row_counts,
)
from rufus_data.mix import mix_inputs
from rufus_data.models.hub import hub_unreachable, offline_mode
from rufus_data.rewards.data_rewards import REWARD_COLUMN
from rufus_data.sources.builders import BUILDERS
from rufus_data.sources.canonical import open_source
from rufus_data.sources.catalog import load_catalog
from rufus_data.sources.inputs import data_input, data_inputs

log = logging.getLogger("rufus_train")


def check_data(entries: list[str], stage: str) -> None:
    """Every entry is a shard folder with shards, or a valid mixture catalog; without the hub, each
    of its sources must be found here (a file, $RUFUS_DATA_ROOT's copy, the datasets cache): a
    missing data root is said before any work and by --dry_run, not after the run has started."""
    if not entries:
        raise RufusError(f"stage {stage} has no `data`: set `data: [SHARD_FOLDER or CATALOG.yaml, ...]`")
    for item in data_inputs(entries):
        item.check()  # names the folder, or the catalog's file/line/key
        if item.catalog and (offline_mode() or hub_unreachable()):  # online, the hub holds them: nothing downloaded here
            for source in load_catalog(item.path).sources:
                try:
                    open_source(source)  # finds its rows; reads none
                except RufusError as err:
                    raise RufusError(f"data {item.given}: {err}") from None


def columns_of(entry: str) -> set[str]:
    """The columns the entry's rows have: a shard folder's schema, or what its catalog's kind makes
    plus the columns its builder steps write (on every place a source may load from) and the
    reward column when every source declares `reward:`."""
    item = data_input(entry)
    if item.catalog:
        catalog = load_catalog(item.path)
        built: set[str] = set()
        for source in catalog.sources:
            steps = [rows.build for rows in (source, source.fallback) if rows is not None]
            if all(steps):
                built |= set.intersection(*(set(BUILDERS[step].writes) for step in steps))
        if all(source.reward is not None for source in catalog.sources):
            built.add(REWARD_COLUMN)
        return {*ROW_COLUMNS, *KIND_COLUMNS[catalog.kind], *built}
    first = shard_files(item.path)[0]
    shard_row_counts([first])  # a truncated shard is named, not a traceback
    return set(pq.read_schema(first).names)


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


def prepare_data(entries: list[str], output_dir: Path, base_model: str, suite: str) -> tuple[list[str], dict]:
    """Shard folders for every entry (catalogs mixed into RUN/data/NAME/, rebuilt each run) and the
    run's data lineage, written to RUN/lineage.json. Where each source's rows came from and what
    each entry was checked against go to the console and train.log; `suite` (the stage's eval
    suite) is what the notes suggest checking against."""
    entries_lineage = []
    mixed = mix_inputs(data_inputs(entries), lambda item: mixed_data_dir(output_dir, item.name), show_progress=True)
    for found in mixed:
        item = found.input
        for line in data_origins(found.manifest) if found.manifest else []:
            _say(f"data {item.name}: {line}")
        entry = {"entry": item.given, "name": item.name, "catalog": str(item.path) if item.catalog else None,
                 "shipped": item.shipped, "folder": folder_lineage(found.folder)}
        entries_lineage.append(entry)
        _say(lineage_note(entry, suite), warn=not checked_benchmarks(entry["folder"]))
    lineage = run_lineage(entries_lineage, base_model)
    write_lineage(output_dir, lineage)
    return [str(found.folder) for found in mixed], lineage


def lineage_note(entry: dict, suite: str) -> str:
    """One entry's lineage said plainly: what it was checked against, or that it never was and the
    commands that check it."""
    name, node = entry["name"], entry["folder"]
    if entry["catalog"]:
        whose = "the stage's default catalog" if entry["shipped"] else "your catalog"
        clean = f"outputs/{name}-clean"
        return (f"data {name}: {whose} {entry['catalog']} was mixed at the start of this run and NOT decontaminated: "
                f"its rows were never checked against any benchmark. To train on checked data: `rufus-data mix "
                f"{entry['catalog']} --out outputs/{name} && rufus-data decontam outputs/{name} --against {suite} "
                f"--out {clean}`, then `--data {clean}`")
    checked = checked_benchmarks(node)
    chain = chain_text(node)
    if not checked:
        clean = f"{node['path']}-clean"
        return (f"data {name}: {node['path']} ({chain}) was NOT decontaminated. To check it: `rufus-data decontam "
                f"{node['path']} --against {suite} --out {clean}`, then `--data {clean}`")
    found = ", ".join(f"{bench} ({f'{rows_text(rows)} removed' if rows else 'clean'})" for bench, rows in checked.items())
    return f"data {name}: {node['path']} ({chain}): checked against {found}"


def _say(line: str, warn: bool = False) -> None:
    (log.warning if warn else log.info)("%s", line)
    console.print(Text(line, style="yellow" if warn else ""), highlight=False, soft_wrap=True)


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
        table = table.take(pa.array(sample_indices(table.num_rows, max_rows, seed)))
    if table.num_rows == 0:
        raise RufusError(f"stage {stage}: the shards in {folders} hold no rows")
    return table
