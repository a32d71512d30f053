"""Where a dataset's rows come from: one loader for catalog sources and benchmarks alike.

A dataset names up to three places, tried in this order; the first that loads wins:

    path   a file of your own (.jsonl, .json, .parquet, .csv)
    local  a copy under $RUFUS_DATA_ROOT (a folder laid out like shared/data)
    hub    a Hugging Face dataset {id, config, split, revision}, loaded with `datasets` at the
           pinned revision (`id` may also be a local folder holding a download of the hub repo)

`ids` keeps the rows of a split by an integer id column, for a file that holds more than the
split (MBPP's sanitized file holds its train, test, validation and prompt rows). The provenance
of loaded rows says which place answered, with the file's sha256 or the hub commit."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, field_validator, model_validator

from rufus_data.base.errors import RufusError
from rufus_data.base.jsonl import read_jsonl
from rufus_data.base.paths import data_root
from rufus_data.base.yaml_config import StrictModel
from rufus_data.folders.shards import file_sha256
from rufus_data.models.hub import (
    COMMIT,
    hub_commit,
    hub_unreachable,
    offline_honoured,
    offline_mode,
    warn_if_unpinned,
)

FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")
PROVIDE_HINT = (
    "Provide it in one of three ways: use `path:` for a file of your own (.jsonl, .json, .parquet, .csv), "
    "`local:` for a copy under $RUFUS_DATA_ROOT (export RUFUS_DATA_ROOT=DIR, a folder laid out like shared/data), "
    "or `hub:` {id, config, split, revision} with access to the Hugging Face hub (offline: HF_HUB_OFFLINE=1 "
    "reads the datasets cache)"
)


class HubDataset(StrictModel):
    """A Hugging Face dataset at a revision; `split` may join splits ("train+validation")."""

    id: str
    config: str | None = None
    split: str = "train"
    revision: str | None = None
    # files of the repo read as they are (json/jsonl/parquet/csv), for a dataset whose hub loader is a
    # script that `datasets` no longer runs (LiveCodeBench); `config` and `split` do not apply then
    data_files: list[str] | None = None

    def describe(self) -> str:
        files = f" files {', '.join(self.data_files)}" if self.data_files else ""
        return f"{self.id} ({self.config or 'default'}/{self.split}@{self.revision or 'unpinned'}){files}"


class IdRange(StrictModel):
    """Keep the rows whose integer `field` lies `within` [first, last], or `outside` it; either
    may list several ranges ([[11, 510], [569, 569]])."""

    field: str
    within: list[tuple[int, int]] | None = None
    outside: list[tuple[int, int]] | None = None

    @field_validator("within", "outside", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], int) else value

    @model_validator(mode="after")
    def _one_kind(self) -> IdRange:
        ranges = [r for r in (self.within, self.outside) if r is not None]
        if len(ranges) != 1:
            raise ValueError("`ids` needs exactly one of `within: [first, last]` or `outside: [first, last]`")
        if any(first > last for first, last in ranges[0]):
            raise ValueError("an id range is [first, last] with first <= last")
        return self

    def keeps(self, value: int) -> bool:
        inside = any(first <= value <= last for first, last in self.within or self.outside)
        return inside == (self.within is not None)

    def describe(self) -> str:
        ranges = ", ".join(f"[{a}, {b}]" for a, b in self.within or self.outside)
        return f"{self.field} {'in' if self.within else 'outside'} {ranges}"


def under_data_root(local: str) -> str:
    """A `local:` path as written, when it names a file under $RUFUS_DATA_ROOT: relative, with no
    `..` (a catalog must not read whatever the process can, /etc or a user's home, through it)."""
    parts = Path(local).parts
    if Path(local).is_absolute() or ".." in parts or local.startswith("~") or not parts:
        raise ValueError(f"`local: {local}` must be a path under $RUFUS_DATA_ROOT (relative, without `..`); "
                         "for a file elsewhere write `path:` instead")
    return local


class DatasetSource(StrictModel):
    """The places a dataset may load from (see the module docstring); at least one is needed."""

    path: str | None = None
    local: str | None = None
    hub: HubDataset | None = None
    ids: IdRange | None = None
    rows: tuple[int, int] | None = Field(
        default=None, description="keep only the rows at positions [first, last] of the place's order (0-based, both "
        "kept): a recipe's slice, e.g. its first 192 training rows = [0, 191]")

    @field_validator("rows")
    @classmethod
    def _rows_ordered(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 0 <= value[0] <= value[1]:
            raise ValueError(f"`rows: [{value[0]}, {value[1]}]` is positions [first, last] with 0 <= first <= last")
        return value

    @field_validator("local")
    @classmethod
    def _local_stays_under_the_root(cls, value: str | None) -> str | None:
        return None if value is None else under_data_root(value)

    @field_validator("hub", mode="before")
    @classmethod
    def _hub_id_alone(cls, value: Any) -> Any:
        return {"id": value} if isinstance(value, str) else value  # `hub: ORG/NAME` = its train split

    def written_origin(self) -> str | None:
        """The first place as the config writes it (a label for its rows)."""
        return self.path or self.local or (self.hub.id if self.hub else None)


class DatasetUnavailable(RufusError):
    """None of a dataset's places loaded (a fallback may take over; any other error may not)."""


@dataclass
class LoadedRows:
    rows: Iterator[dict]
    provenance: dict  # origin (path/local/hub), from, fingerprint, and sha256 or hub/config/split/revision/commit
    count: int | None = None  # rows to expect, when known without reading them (None with `ids`)


def load_rows(source: DatasetSource, what: str, base: Path | None = None, pin_hint: str = "",
              shipped: bool = False, bad_lines: list[tuple[int, str]] | None = None) -> LoadedRows:
    """The rows of the first place that loads: `path` (relative to `base`), `local`, then `hub`.
    Raises DatasetUnavailable naming `what`, every place tried and the three ways to provide it.
    `shipped`: the source is in a shipped catalog, so an unpinned revision is logged, not shown."""
    if source.path is None and source.local is None and source.hub is None:
        raise DatasetUnavailable(f"{what} names no place to load from. {PROVIDE_HINT}")
    tried: list[str] = []
    loaded: LoadedRows | None = None
    if source.path is not None:
        path = Path(source.path).expanduser()
        path = path if path.is_absolute() or base is None else base / path
        if path.is_file():
            loaded = _file_rows(path, "path", what, bad_lines)
        else:
            tried.append(f"file {path} does not exist")
    if loaded is None and source.local is not None:
        root = data_root(required=False)
        if root is not None and (root / source.local).is_file():
            loaded = _file_rows(root / source.local, "local", what, bad_lines)
        else:
            tried.append(f"$RUFUS_DATA_ROOT/{source.local} " + ("(RUFUS_DATA_ROOT is not set)" if root is None
                                                               else f"(not in {root})"))
    if loaded is None and source.hub is not None:
        loaded = _hub_rows(source.hub, what, tried, pin_hint, shipped)
    if loaded is None:
        raise DatasetUnavailable(f"{what} could not be loaded; tried: {'; '.join(tried)}. {PROVIDE_HINT}")
    if source.ids is not None:
        loaded.rows = _keep_ids(loaded.rows, source.ids, what, loaded.provenance["from"])
        loaded.provenance["ids"] = source.ids.describe()
        loaded.count = None
    if source.rows is not None:
        loaded.rows = _keep_positions(loaded.rows, source.rows, what, loaded.provenance["from"])
        loaded.provenance["rows"] = list(source.rows)
        loaded.count = None
    return loaded


def read_file_rows(path: Path, what: str, bad_lines: list[tuple[int, str]] | None = None) -> Iterator[dict]:
    """The records of a .jsonl/.ndjson, .json (an array, or an object holding one), .parquet or .csv file."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        yield from read_jsonl(path, what, bad_lines)
    elif suffix == ".json":
        yield from _json_records(path, what)
    elif suffix == ".parquet":
        try:
            batches = pq.ParquetFile(path).iter_batches(batch_size=2048)
            for batch in batches:
                yield from batch.to_pylist()
        except (pa.ArrowException, OSError) as err:
            raise RufusError(f"{what}: {path} is not a readable parquet file ({err}); write it again or "
                             "point the config at another file") from None
    elif suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as fh:
            try:
                yield from csv.DictReader(fh)
            except UnicodeDecodeError as err:
                raise RufusError(f"{what}: {path} is not UTF-8 ({err}); re-encode it as UTF-8") from None
    else:
        raise RufusError(f"{what}: cannot read {path.name}: supported files are {', '.join(FILE_SUFFIXES)}")


def _json_records(path: Path, what: str) -> Iterator[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise RufusError(f"{what}: {path} is not valid UTF-8 ({err.reason}); re-encode it") from None
    except json.JSONDecodeError as err:
        raise RufusError(f"{what}: {path} is not valid JSON (line {err.lineno}: {err.msg})") from None
    if isinstance(data, dict):
        data = next((v for v in data.values() if isinstance(v, list)), None)
    if not isinstance(data, list):
        raise RufusError(f"{what}: {path} must hold a JSON array of objects (or use .jsonl)")
    yield from data


def _file_rows(path: Path, origin: str, what: str, bad_lines: list | None = None) -> LoadedRows:
    if path.suffix.lower() not in FILE_SUFFIXES:
        raise RufusError(f"{what}: cannot read {path.name}: supported files are {', '.join(FILE_SUFFIXES)}")
    digest = file_sha256(path)
    provenance = {"origin": origin, "from": str(path), "path": str(path), "sha256": digest,
                  "fingerprint": f"sha256:{digest}"}
    return LoadedRows(read_file_rows(path, what, bad_lines), provenance, _count_rows(path))


def _count_rows(path: Path) -> int | None:
    """Rows in a file, read cheaply (parquet footer, lines of JSONL/CSV); None for JSON."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pq.ParquetFile(path).metadata.num_rows
        if suffix in (".jsonl", ".ndjson", ".csv"):
            with open(path, "rb") as fh:
                return sum(1 for line in fh if line.strip()) - (1 if suffix == ".csv" else 0)
    except (pa.ArrowException, OSError):
        return None  # reading the rows says what is wrong
    return None


def _hub_rows(hub: HubDataset, what: str, tried: list[str], pin_hint: str, shipped: bool = False) -> LoadedRows | None:
    """Rows of a hub dataset at its revision, or None (with the reason in `tried`)."""
    folder = Path(hub.id).expanduser().is_dir()  # a download of the hub repo: no network, no pin needed
    if not folder:
        warn_if_unpinned(what, hub.id, hub.revision, "its rows can change when the dataset does", pin_hint, shipped)
        unreachable = None if offline_mode() else hub_unreachable()
        if unreachable:
            tried.append(f"hub dataset {hub.describe()}: the hub is not reachable here ({unreachable}; with a "
                         "datasets cache of it, set HF_HUB_OFFLINE=1)")
            return None
    import datasets  # heavy: only when a dataset really comes from the hub

    builder = _builder_of(hub.data_files, what) if hub.data_files else None
    try:
        with offline_honoured(datasets):
            if builder:
                dataset = datasets.load_dataset(builder, split="train",
                                                data_files=[_hub_file(hub, name, folder) for name in hub.data_files])
            else:
                dataset = datasets.load_dataset(hub.id, hub.config, split=hub.split, revision=hub.revision)
    except Exception as err:  # noqa: BLE001 - offline, gated, missing split, bad revision: all end the same way
        first_line = str(err).splitlines()[0][:200] if str(err) else ""
        tried.append(f"could not load hub dataset {hub.describe()}: {type(err).__name__}: {first_line}")
        return None
    pinned = bool(hub.revision and COMMIT.fullmatch(hub.revision))
    commit = hub.revision if pinned else (None if folder or offline_mode() else hub_commit(hub.id, hub.revision))
    provenance = {"origin": "hub", "from": f"hub:{hub.id}", "hub": hub.id, "config": hub.config, "split": hub.split,
                  "revision": hub.revision or "unpinned", "commit": commit,
                  "fingerprint": f"revision:{commit or hub.revision or 'unpinned'}",
                  "datasets_fingerprint": getattr(dataset, "_fingerprint", None)}
    return LoadedRows(iter(dataset), provenance, len(dataset))


def _builder_of(files: list[str], what: str) -> str:
    """The `datasets` builder that reads files of this kind (one kind per dataset)."""
    kinds = {{".jsonl": "json", ".ndjson": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(
        Path(name).suffix.lower(), "") for name in files}
    if len(kinds) != 1 or "" in kinds:
        raise RufusError(f"{what}: hub data_files {files} must all be one kind of .jsonl/.json, .parquet or .csv file")
    return kinds.pop()


def _hub_file(hub: HubDataset, name: str, folder: bool) -> str:
    """A repo file as `datasets` reads it: in the local download folder, or hf:// at the revision."""
    if folder:
        return str(Path(hub.id).expanduser() / name)
    return f"hf://datasets/{hub.id}@{hub.revision or 'main'}/{name}"


def _keep_ids(rows: Iterator[dict], ids: IdRange, what: str, origin: str) -> Iterator[dict]:
    for index, row in enumerate(rows):
        if ids.field not in row:
            raise RufusError(f"{what} ({origin}) row {index}: the id field {ids.field!r} of `ids` is not in its rows "
                             f"(fields: {', '.join(sorted(row))}); name an id column that every row has")
        value = row[ids.field]
        if not isinstance(value, int) or isinstance(value, bool):
            raise RufusError(f"{what} ({origin}) row {index}: `ids` needs integer ids, but {ids.field!r} is "
                             f"{value!r}; name an integer id column")
        if ids.keeps(value):
            yield row


def _keep_positions(rows: Iterator[dict], positions: tuple[int, int], what: str, origin: str) -> Iterator[dict]:
    """The rows at `positions` [first, last]; a place with fewer rows is an error, not a shorter slice."""
    first, last = positions
    index = -1
    for index, row in enumerate(rows):
        if index > last:
            return
        if index >= first:
            yield row
    if index == last:
        return
    raise RufusError(f"{what} ({origin}) has {index + 1} rows, and `rows: [{first}, {last}]` asks for positions up to "
                     f"{last}: give a range inside the data, or the complete file")
