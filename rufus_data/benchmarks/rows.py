"""A benchmark's rows: the one reader of registry benchmarks, for eval and decontam alike. A set
loads path -> local -> hub through the shared loader (rufus_data.sources.dataset_source) and is converted
(convert.py); BFCL reads the bfcl-eval wheel (bfcl.py). DatasetUnavailable, naming every place
tried, when none loads. Each row has one id (`row_ids`): eval names its samples by it and decontam
its items, so a flagged item is the evaluated one.

RULER's haystacks are files, not rows: `haystack_files` finds the copies `data pull` kept under
$RUFUS_DATA_ROOT."""

from __future__ import annotations

from pathlib import Path

from rufus_data.base.catalog_files import is_shipped
from rufus_data.base.errors import RufusError
from rufus_data.base.paths import data_root
from rufus_data.benchmarks.bfcl import bfcl_rows
from rufus_data.benchmarks.convert import convert_rows
from rufus_data.benchmarks.registry import BenchmarkSpec, benchmark_spec, load_registry
from rufus_data.benchmarks.suite import Task
from rufus_data.folders.shards import file_sha256
from rufus_data.rewards.bfcl import wheel_path
from rufus_data.sources.dataset_source import DatasetUnavailable, IdRange, LoadedRows, load_rows

# the id of a row of a task's inline data (no registry `id_field`): the first of these it has, else its index
INLINE_ID_FIELDS = ("id", "key", "task_id", "unique_id", "question_id")


def _locate(name: str, spec: BenchmarkSpec, registry_path: Path, what: str) -> LoadedRows:
    """The raw rows of one benchmark (its `id_range` applied) and where they came from, through the shared
    loader: `path`, then `local`, then `hub`. DatasetUnavailable (naming every place tried) when none loads;
    `what` names the reader in messages."""
    source = spec
    if spec.id_range:
        if not isinstance(spec.id_field, str):
            raise RufusError(f"benchmark `{name}`: id_range needs a single integer `id_field`; fix it in {registry_path}")
        source = spec.model_copy(update={"ids": IdRange(field=spec.id_field, within=[tuple(spec.id_range)])})
    return load_rows(source, what, base=registry_path.parent, pin_hint=f" in {registry_path.name}",
                     shipped=is_shipped(registry_path))


def benchmark_rows(name: str, what: str | None = None, registry_file: str | Path | None = None) -> tuple[list[dict], dict]:
    """(converted rows, provenance) of a benchmark of the registry (default catalogs/benchmarks.yaml);
    DatasetUnavailable when none of its places loads."""
    registry, registry_path = load_registry(registry_file)
    spec = registry.benchmarks[name]
    what = what or f"benchmark `{name}`"
    if spec.wheel:
        try:
            wheel = wheel_path(spec.wheel)
        except RufusError as err:
            raise DatasetUnavailable(f"{what}: the wheel {spec.wheel} is not here: {err}") from None
        digest = file_sha256(wheel)
        provenance = {"origin": "wheel", "from": str(wheel), "wheel": spec.wheel, "category": spec.category,
                      "sha256": digest, "fingerprint": f"sha256:{digest}"}
        return bfcl_rows(spec.wheel, spec.category), provenance
    try:
        loaded = _locate(name, spec, registry_path, what)
    except DatasetUnavailable as err:
        gated = (f" {spec.hub.id} is gated: accept its terms on https://huggingface.co/datasets/{spec.hub.id} "
                 "and set HF_TOKEN to a token of that account." if spec.gated and spec.hub else "")
        raise DatasetUnavailable(f"{err}.{gated}") from None
    rows = list(convert_rows(spec.convert, loaded.rows))
    return rows, {**loaded.provenance, **({"converted": spec.convert} if spec.convert else {})}


def row_ids(name: str, spec: BenchmarkSpec, rows: list[dict]) -> list[str]:
    """Each row's stable id: its `id_field` value(s) joined by '/', else its 0-based index. A missing
    field or a repeated id is an error naming the row."""
    if spec.id_field is None:
        return [str(index) for index in range(len(rows))]
    keys = [spec.id_field] if isinstance(spec.id_field, str) else spec.id_field
    ids: list[str] = []
    seen: set[str] = set()
    for index, row in enumerate(rows):
        missing = [k for k in keys if k not in row]
        if missing:
            raise RufusError(f"benchmark `{name}` row {index}: id field {missing[0]!r} is missing "
                             f"(fields seen: {', '.join(sorted(row))}); fix `id_field` in the registry")
        item_id = "/".join(str(row[k]) for k in keys)
        if item_id in seen:
            raise RufusError(f"benchmark `{name}`: eval item id {item_id!r} repeats (row {index}); "
                             f"choose a unique `id_field` or leave it null for row indices")
        seen.add(item_id)
        ids.append(item_id)
    return ids


def task_source_rows(task: Task) -> tuple[list[dict], list[str]]:
    """(rows, their ids) of a suite task: its benchmark's converted rows, or its inline `data:`.
    DatasetUnavailable when they are not here."""
    what = f"task {task.name}"
    if task.benchmark:
        rows = benchmark_rows(task.benchmark, what)[0]
        return rows, row_ids(task.benchmark, benchmark_spec(task.benchmark)[0], rows)
    rows = list(load_rows(task.data, what).rows)
    ids = [next((str(row[f]) for f in INLINE_ID_FIELDS if row.get(f) is not None), str(index))
           for index, row in enumerate(rows)]
    return rows, ids


def haystack_files(spec: BenchmarkSpec) -> dict[str, Path]:
    """The haystacks `data pull` kept under $RUFUS_DATA_ROOT (only those that are there)."""
    root = data_root(required=False)
    if root is None:
        return {}
    return {name: root / h.local for name, h in spec.haystacks.items() if (root / h.local).is_file()}
