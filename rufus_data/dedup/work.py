"""The work folder of a dedup run: every stage's output, one file per task, so a killed run
resumes where it stopped. It sits beside the output folder (`.OUT.dedup-work`; a dry run uses a
temporary folder), is keyed by the inputs and the settings that shape the result (a run with
other inputs or settings starts afresh), used under the output's lock (rufus_data/folders/output_lock.py,
which also removes a killed run's half-written output), and removed once the output folder is
in place. Every file is written under a temporary name and renamed, so a file
under its real name is always whole; a task is done when its last file exists."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

FORMAT = 2  # bump when the layout of the work files changes: older folders then start afresh
KEY_FILE = "key.json"


def work_key(files: list[Path], settings: dict) -> str:
    """What a work folder is for: the input files (path, size, modification time) and settings."""
    stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    text = json.dumps({"format": FORMAT, "files": stats, "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@contextlib.contextmanager
def work_folder(out: Path | None, key: str) -> Iterator[Path]:
    """The work folder (the caller holds the output's lock): with an earlier run's work in it when
    that run had the same key. A report-only run (no `out`) works in a temporary folder, removed at the end; a real
    run leaves its folder for the caller to remove once the output is in place (`remove_work`)."""
    if out is None:
        folder = Path(tempfile.mkdtemp(prefix="rufus-dedup-"))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    folder = out.parent / f".{out.name}.dedup-work"
    folder.mkdir(parents=True, exist_ok=True)
    for leftover in folder.rglob("*.tmp-*"):  # half-written by a run that was killed
        leftover.unlink(missing_ok=True)
    if _read_key(folder) != key:  # other inputs or settings, or a folder of an older layout: start afresh
        for path in folder.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        write_atomic(folder / KEY_FILE, lambda tmp: tmp.write_text(json.dumps({"key": key})))
    yield folder


def remove_work(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _read_key(folder: Path) -> str | None:
    try:
        return json.loads((folder / KEY_FILE).read_text())["key"]
    except (OSError, ValueError, KeyError):
        return None


def write_atomic(path: Path, write) -> None:
    """`write(tmp)` writes the file under a temporary name; it gets its real name when whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_arrays(path: Path, **arrays: np.ndarray) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
    write_atomic(path, write)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


@contextlib.contextmanager
def batch_file(path: Path, schema: pa.Schema) -> Iterator[pa.ipc.RecordBatchFileWriter]:
    """An Arrow IPC file of record batches, written batch by batch (and read back one batch at a
    time, by index); it gets its real name when the block ends without error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            yield writer
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
