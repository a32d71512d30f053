"""The shard folder: the one contract between rufus_data, rufus_train and rufus_eval.

    OUT/data/train-00000-of-000NN.parquet   canonical rows
    OUT/manifest.json                       what made it (config hash, inputs, counts, versions)
    OUT/report.md (+ *.png)                 what a person reads first

Every writer builds the folder under a temporary sibling and renames it at the end, so a
killed or failed command never leaves a half-written output behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Collection, Iterator
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.base.errors import RufusError, quoted
from rufus_data.base.redaction import redact
from rufus_data.base.version import DISTRIBUTION, rufus_version
from rufus_data.folders.run_folder import (
    CONFIG_YAML,
    EVAL_JOB,
    LINEAGE_JSON,
    MERGED_FROM,
    RESULTS_JSON,
    RUN_JSON,
    is_run_folder,
)

DATA_DIR = "data"
MANIFEST = "manifest.json"

# The columns of a canonical row. Every row has ROW_COLUMNS (a stable id, its source's name and
# label), then the columns of its kind (a catalog's `kind:`); a mixed row also keeps the id it
# had before a repeat was renamed in ORIGIN_COLUMN. A row's other columns pass through as read.
Kind = Literal["sft", "rl", "preference"]
ROW_COLUMNS = ("id", "source", "label")
KIND_COLUMNS: dict[Kind, tuple[str, ...]] = {
    "sft": ("messages",),
    "rl": ("prompt", "expected_output"),
    "preference": ("prompt", "chosen", "rejected"),
}
ORIGIN_COLUMN = "origin_id"
CANONICAL_COLUMNS = (*ROW_COLUMNS, *dict.fromkeys(c for cols in KIND_COLUMNS.values() for c in cols), ORIGIN_COLUMN)


def kind_columns_hint() -> str:
    """'sft: messages; rl: prompt, expected_output; ...': which kind of data has which columns."""
    return "; ".join(f"{kind}: {', '.join(columns)}" for kind, columns in KIND_COLUMNS.items())


def sample_indices(count: int, limit: int | None, seed: int) -> list[int]:
    """The one seeded row sample: `limit` of `count` row indices, chosen by a seeded permutation
    and kept in their original order (all of them when limit is None or not smaller). filter's and
    pairs' `--limit` and a stage's `max_rows` take their rows through it."""
    if limit is None or count <= limit:
        return list(range(count))
    return np.sort(np.random.default_rng(seed).permutation(count)[:limit]).tolist()


def as_messages(value, role: str = "user"):
    """The one rule that reads a prompt (or a reply) as chat messages: a plain string is one turn
    of `role` (a prompt's is the user's), a list of turns is the conversation as it is."""
    return [{"role": role, "content": value}] if isinstance(value, str) else value


def rufus_record(folder: Path) -> str | None:
    """The file that shows a Rufus command wrote `folder` (None: no such file): a shard folder's
    manifest, a run folder's records, an evaluation's results or job, a merged model's source."""
    for name in (MANIFEST, RUN_JSON, LINEAGE_JSON, RESULTS_JSON, EVAL_JOB, MERGED_FROM):
        if (folder / name).is_file():
            return name
    return CONFIG_YAML if is_run_folder(folder) else None


def content_text(value) -> str | None:
    """The one rule that reads a turn's content as text: a string stays, a list of parts keeps its
    text parts joined with a newline (as vLLM's chat layer joins them for a text model's template,
    which takes a string; templates that walk the parts themselves, Qwen2.5-VL's or SmolVLM's,
    put nothing between them, which runs the words of two parts together), null stays null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(str(part.get("text") or "") if isinstance(part, dict) else str(part) for part in value
                         if not isinstance(part, dict) or part.get("type", "text") == "text")
    return str(value)


def refuse_existing_output(out: Path, overwrite: bool) -> None:
    """The one rule of every writer for an output that exists: without --overwrite it is refused;
    with it, only a folder a Rufus command wrote (rufus_record) or an empty one is replaced; a
    file, or a folder of anything else (a user's own files, a parent folder), never is."""
    out = Path(out)
    if not out.exists():
        return
    if not overwrite:
        raise RufusError(f"output folder {out} already exists: pass --overwrite to replace it, or choose another --out")
    if not out.is_dir():
        raise RufusError(f"output {out} is a file, not a folder a Rufus command wrote: --overwrite replaces only "
                         "those. Move or remove it yourself, or choose another output")
    entries = sorted(path.name for path in out.iterdir())
    if entries and rufus_record(out) is None:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise RufusError(f"output folder {out} was not written by Rufus (no {MANIFEST}, {RUN_JSON} or {RESULTS_JSON} "
                         f"in it): it holds {shown}. --overwrite replaces only a folder a Rufus command wrote; "
                         "move or remove these files yourself, or choose another output")


def move_into_place(tmp: Path, out: Path, overwrite: bool) -> None:
    """`tmp` renamed to `out`; an existing `out` (refuse_existing_output allowed it) is moved aside
    first and removed only once `tmp` is in its place."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    try:
        if out.exists() and overwrite:
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)  # refused (not empty) when another writer's output appeared meanwhile
    except OSError as err:  # a writer that holds no lock (output_lock.py) put its folder there first
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)  # replaced by the other writer's folder
        raise RufusError(f"output folder {out} appeared while this run wrote it ({err.strerror}): another process "
                         "wrote the same output at the same time; this run's result is discarded, the other's "
                         "is kept. Run again (with --overwrite to replace it) or choose another output") from None


@contextlib.contextmanager
def atomic_output_dir(out: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder that becomes `out` only if the block finishes without error."""
    out = Path(out)
    refuse_existing_output(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    move_into_place(tmp, out, overwrite)


def shard_name(index: int, total: int, split: str = "train") -> str:
    return f"{split}-{index:05d}-of-{total:05d}.parquet"


def write_shards(table: pa.Table, folder: Path, shard_rows: int = 50_000, split: str = "train") -> list[Path]:
    """Write `table` as parquet shards under folder/data/; same table gives byte-identical files."""
    total = max(1, -(-table.num_rows // shard_rows))
    return [write_shard(table.slice(i * shard_rows, shard_rows), folder, i, total, split) for i in range(total)]


def write_shard(table: pa.Table, folder: Path, index: int, total: int, split: str = "train") -> Path:
    """One shard file, for writers that produce shards one at a time (mix's pass 3)."""
    data = Path(folder) / DATA_DIR
    data.mkdir(parents=True, exist_ok=True)
    path = data / shard_name(index, total, split)
    pq.write_table(table, path, compression="zstd", write_statistics=True)
    return path


_SHARD_NAME = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-\d{5}-of-\d{5}\.parquet$")


def split_files(folder: str | Path) -> dict[str, list[Path]]:
    """Every split of a shard folder (train first, then holdout and any other, by name), each
    with its files in order. decontam and dedup read and write all of them: a split left
    behind would be a silent hole in the output folder."""
    splits: dict[str, list[Path]] = {"train": shard_files(folder, "train")}  # the clear errors
    for path in sorted((Path(folder) / DATA_DIR).glob("*.parquet")):
        match = _SHARD_NAME.match(path.name)
        if match and match["split"] != "train":
            splits.setdefault(match["split"], []).append(path)
    return splits


def shard_files(folder: str | Path, split: str = "train") -> list[Path]:
    """The parquet files of one split of a shard folder, in order; a clear error if there are none."""
    folder = Path(folder)
    if not folder.exists():
        raise RufusError(f"shard folder {folder} does not exist: pass a folder written by rufus-data (mix, decontam, filter)")
    files = sorted((folder / DATA_DIR).glob(f"{split}-*.parquet"))
    if not files:
        inner = sorted(path.name for path in folder.iterdir() if (path / DATA_DIR).is_dir()) if folder.is_dir() else []
        if inner:
            # a folder of shard folders: `rufus-data filter` writes one per bucket
            best = "learnable" if "learnable" in inner else inner[0]
            raise RufusError(
                f"{folder} holds shard folders, not shards: {', '.join(f'{folder}/{name}' for name in inner)} "
                f"(a `rufus-data filter` output has one per bucket). Pass one of them, e.g. {folder}/{best}"
                + (" (the prompts to train on)" if best == "learnable" else "")
            )
        raise RufusError(f"no {split} shards in {folder}/{DATA_DIR}/: is this a folder written by rufus-data?")
    return files


def read_shards(folder: str | Path, split: str = "train") -> pa.Table:
    """All rows of one split as one arrow table (schemas unified, missing columns filled with null)."""
    tables = [read_shard(p) for p in shard_files(folder, split)]
    return pa.concat_tables(tables, promote_options="default")


def read_shard(path: Path, **options) -> pa.Table:
    """One parquet file's rows (`options`: pq.read_table's); a truncated or corrupt file is an error
    naming it, not a traceback from inside the reader."""
    try:
        return pq.read_table(path, **options)
    except (pa.ArrowException, OSError) as err:
        raise unreadable_shard(path, err) from None


def unreadable_shard(path: Path, err: Exception) -> RufusError:
    return RufusError(f"{path} is not a readable parquet shard ({type(err).__name__}: {quoted(str(err))}): it is "
                      "truncated or corrupt. Write it again (run the step that made it again) or remove it; "
                      "nothing was written")


def shard_row_counts(files: list[Path]) -> list[int]:
    """The rows of each parquet file, read from its footer; a file that is not readable parquet
    is an error naming it, raised before anything is written."""
    counts = []
    for path in files:
        try:
            counts.append(pq.ParquetFile(path).metadata.num_rows)
        except (pa.ArrowException, OSError) as err:
            raise unreadable_shard(path, err) from None
    return counts


def write_without_rows(files: list[Path], drop: Collection[int], folder: Path) -> None:
    """Copy `files` into folder/data/ under their own names, without the rows whose global
    number (counted over all `files` in order) is in `drop` (a set, or an array of row numbers):
    decontam and dedup drop whole rows."""
    (Path(folder) / DATA_DIR).mkdir(parents=True, exist_ok=True)
    dropped = np.unique(np.fromiter(drop, np.int64, len(drop)) if isinstance(drop, (set, frozenset))
                        else np.asarray(drop, dtype=np.int64))
    first = 0
    for path in files:
        table = read_shard(path)
        lo, hi = np.searchsorted(dropped, [first, first + table.num_rows])
        keep = np.ones(table.num_rows, dtype=bool)
        keep[dropped[lo:hi] - first] = False
        pq.write_table(table.filter(pa.array(keep)), Path(folder) / DATA_DIR / path.name, compression="zstd",
                       write_statistics=True)
        first += table.num_rows


def folder_fingerprint(folder: str | Path, files: list[Path]) -> dict:
    """A shard folder as a manifest input: its path and the sha256 of each of its files."""
    return {"path": str(folder), "files": {path.name: file_sha256(path) for path in files}}


def write_manifest(folder: Path, manifest: dict) -> None:
    """manifest.json, credentials in its URLs hidden (redaction.py)."""
    (Path(folder) / MANIFEST).write_text(json.dumps(redact(manifest), indent=2, sort_keys=True, default=str) + "\n")


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def package_versions(*names: str) -> dict[str, str]:
    """Versions of the packages that shaped an output, for the manifest: Rufus's identifies the
    commit (version.py), the others are their installed versions."""
    found = {DISTRIBUTION: rufus_version()}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
