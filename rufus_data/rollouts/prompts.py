"""The inputs of `filter` and `pairs`: RL prompts (canonical `rl` rows) read from shard folders,
or from catalogs mixed on the fly, into generation prompts.

With no input the commands read the default RL mixture, `catalogs/rl.yaml`; inputs resolve
through rufus_data.sources.inputs, and a catalog is mixed into the run's working folder first,
deterministically, so a resumed run finds the same shards and the same journal."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import (
    DATA_DIR,
    as_messages,
    content_text,
    folder_fingerprint,
    read_shards,
    sample_indices,
    shard_files,
)
from rufus_data.generate.base import Prompt
from rufus_data.mix import mix_inputs
from rufus_data.sources.inputs import DataInput

DEFAULT_RL_CATALOG = "catalogs/rl.yaml"


def default_out(items: Sequence[DataInput], suffix: str) -> Path:
    """`outputs/<input name>-<suffix>`: the folder or catalog name (names joined by '+' for several)."""
    return Path("outputs") / f"{'+'.join(item.name for item in items)}-{suffix}"


def input_folders(items: Sequence[DataInput], work: Path, show_progress: bool = False) -> tuple[list[Path], dict[str, dict]]:
    """Shard folders for the inputs: each catalog is mixed into `work`/input-<name>. Returns the
    folders and, per mixed folder, its catalog (path and sha256) for the manifest."""
    found = mix_inputs(items, lambda item: Path(work) / f"input-{item.name}", show_progress)
    return [m.folder for m in found], {str(m.folder): m.input.catalog_record() for m in found if m.manifest is not None}


def normalise_prompt(value, where: str) -> list[dict]:
    """A canonical prompt as the {role, content} messages a generator takes (shards.as_messages:
    a plain string is one user turn)."""
    messages = as_messages(value)
    if isinstance(messages, Sequence) and messages and all(isinstance(m, dict) and "role" in m and "content" in m
                                                           for m in messages):
        return [{"role": str(m["role"]), "content": content_text(m["content"]) or ""} for m in messages]
    raise RufusError(f"{where}: `prompt` must be a list of {{role, content}} messages or a string, got {value!r:.120}")


def check_prompt_columns(folder: str | Path, columns: Sequence[str]) -> None:
    """Refuse a shard folder whose rows are no RL prompts (filter and pairs read `id` and `prompt`)."""
    for column in ("id", "prompt"):
        if column not in columns:
            raise RufusError(
                f"{folder}: rows have no `{column}` column (columns: {', '.join(columns)}); "
                "filter and pairs take rl-kind shard folders (id, prompt, expected_output)"
            )


def read_prompt_rows(
    folders: Sequence[str | Path], limit: int | None = None, seed: int | None = 0
) -> tuple[list[dict], list[Prompt], list[dict], pa.Schema]:
    """(canonical rows, prompts, input fingerprints, arrow schema of the rows) of one or more rl
    shard folders, or a seeded sample of `limit` of them; ids must be unique across them."""
    rows, prompts, inputs, seen, schemas = [], [], [], {}, []
    for folder in folders:
        files = shard_files(folder)
        inputs.append(folder_fingerprint(folder, files))
        table = read_shards(folder)
        schemas.append(table.schema)
        check_prompt_columns(folder, table.column_names)
        for index, row in enumerate(table.to_pylist()):
            where = f"{folder} row {index} (id {row.get('id')!r})"
            if row["id"] is None:
                raise RufusError(f"{where}: `id` is null; every row needs a stable id")
            row_id = str(row["id"])
            if row_id in seen:
                raise RufusError(f"{where}: duplicate id, first seen in {seen[row_id]}; ids must be unique across inputs")
            seen[row_id] = where
            messages = normalise_prompt(row["prompt"], where)
            rows.append(row)
            prompts.append(Prompt(row_id, messages))
    picked = sample_indices(len(rows), limit, seed or 0)
    return ([rows[i] for i in picked], [prompts[i] for i in picked], inputs,
            pa.unify_schemas(schemas, promote_options="permissive"))


def read_holdout(folders: Sequence[str | Path]) -> pa.Table | None:
    """The `holdout` split of the input folders (mix writes one), passed through by filter."""
    tables = [read_shards(folder, "holdout") for folder in folders
              if list((Path(folder) / DATA_DIR).glob("holdout-*.parquet"))]
    return pa.concat_tables(tables, promote_options="permissive") if tables else None
