"""Reading RL prompts (canonical `rl` rows) from shard folders into generation prompts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from rufus_data.errors import RufusError
from rufus_data.generate.base import Prompt
from rufus_data.shards import folder_fingerprint, read_shards, shard_files


def normalise_prompt(value, where: str) -> list[dict]:
    """A canonical prompt: a list of {role, content}; a plain string becomes one user turn."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, Sequence) and value and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return [{"role": str(m["role"]), "content": "" if m["content"] is None else str(m["content"])} for m in value]
    raise RufusError(f"{where}: `prompt` must be a list of {{role, content}} messages or a string, got {value!r:.120}")


def read_prompt_rows(folders: Sequence[str | Path]) -> tuple[list[dict], list[Prompt], list[dict], pa.Schema]:
    """(canonical rows, prompts, input fingerprints, arrow schema of the rows) of one or more rl
    shard folders; ids must be unique across them."""
    rows, prompts, inputs, seen, schemas = [], [], [], {}, []
    for folder in folders:
        files = shard_files(folder)
        inputs.append(folder_fingerprint(folder, files))
        table = read_shards(folder)
        schemas.append(table.schema)
        for column in ("id", "prompt"):
            if column not in table.column_names:
                raise RufusError(
                    f"{folder}: rows have no `{column}` column (columns: {', '.join(table.column_names)}); "
                    "filter and pairs take rl-kind shard folders (id, prompt, expected_output)"
                )
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
    return rows, prompts, inputs, pa.unify_schemas(schemas, promote_options="permissive")


def content_fingerprint(inputs: Sequence[dict]) -> list[dict[str, str]]:
    """The input part of a run's configuration hash: each input folder's {file name: sha256},
    without its path, so the same shards copied or reached from another directory resume."""
    return [dict(sorted(entry["files"].items())) for entry in inputs]
