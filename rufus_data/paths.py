"""Where Rufus keeps things: the model cache, the data root of local benchmark copies, and the
catalogs the repository ships."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from rufus_data.errors import RufusError

REPO_ROOT = Path(__file__).resolve().parents[1]


def shipped_path(entry: str | Path) -> Path:
    """`entry` as given when it exists; a relative path that exists only in the Rufus repository
    (`catalogs/rl.yaml`, the stage YAMLs' `catalogs/data/...`) from there, so the commands'
    defaults work from any working directory."""
    path = Path(entry)
    if path.exists() or path.is_absolute() or not (REPO_ROOT / path).exists():
        return path
    return REPO_ROOT / path


def cache_dir() -> Path:
    """`$RUFUS_CACHE`, default `~/.cache/rufus`: converted models and downloaded wheels."""
    root = Path(os.environ.get("RUFUS_CACHE") or Path.home() / ".cache" / "rufus")
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` (same suffix, this process's id: two writers at once each
    rename their own) that replaces `path` when the block ends; removed if the block raises, so
    a crash never leaves a half-written file under the real name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def data_root(required: bool = True) -> Path | None:
    """`$RUFUS_DATA_ROOT`: local copies of benchmarks laid out like the shared data folder.

    Tests and CI set it; a missing root is an error (never a silent skip)."""
    value = os.environ.get("RUFUS_DATA_ROOT")
    if not value:
        if required:
            raise RufusError(
                "RUFUS_DATA_ROOT is not set: point it at a folder laid out like shared/data "
                "(gsm8k/train.jsonl, math500/test.jsonl, ...), e.g. export RUFUS_DATA_ROOT=../shared/data"
            )
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise RufusError(f"RUFUS_DATA_ROOT={value} is not a folder: point it at a local copy of the benchmark data")
    return path
