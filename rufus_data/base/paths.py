"""Where Rufus keeps things: the model cache and the data root of local benchmark copies (the
catalogs: catalog_files.py); and how a file gets there whole: `atomic_file` (written under a
temporary name, then renamed), `link_or_copy` (a hard link, a copy across file systems)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from rufus_data.base import cache
from rufus_data.base.console import console
from rufus_data.base.errors import RufusError


def cache_dir() -> Path:
    """`$RUFUS_CACHE`, else `$XDG_CACHE_HOME/rufus` (an absolute one: the XDG spec ignores a relative
    path), else `~/.cache/rufus`: converted models, downloaded wheels, computed entries (cache.py)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    root = Path(os.environ.get("RUFUS_CACHE") or base / "rufus")
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


def link_or_copy(src: Path, dst: Path) -> str:
    """Hard-link `src` as `dst` (a snapshot that outlives the deletion of `src`), or copy it
    across file systems; "link" or "copy"."""
    try:
        os.link(src, dst)
        return "link"
    except OSError:
        shutil.copy2(src, dst)
        return "copy"


T = TypeVar("T")


def cached_pickle(name: str, key: object, code: Iterable[ModuleType], compute: Callable[[], T],
                  types: tuple[type, ...]) -> T:
    """`compute()`, kept in `$RUFUS_CACHE/<name>-<hash>.pkl` for the next command: keyed by `key`
    (anything JSON can write: the inputs, the settings, library versions) and the source of the
    `code` modules that compute it, so a change to either is a new entry. An unreadable entry (a
    crashed writer, an old layout) is computed again and replaced; a new one is written under a
    temporary name and renamed (atomic_file), then the least recently used entries beyond
    `$RUFUS_CACHE_MAX_GB` are removed (cache.py). An entry is read back building only numpy
    arrays, plain containers and `types` (every class the value holds): one that names anything
    else runs nothing, is said on the console and replaced (cache.EntryUnpickler)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
    for module in code:
        digest.update(Path(module.__file__).read_bytes())
    limit = cache.max_bytes()  # a bad bound is refused before the work
    stored = cache_dir() / f"{name}-{digest.hexdigest()[:32]}.pkl"
    if stored.exists():
        try:
            with stored.open("rb") as f:
                found = cache.EntryUnpickler(f, types).load()
            cache.mark_used(stored)
            return found
        except cache.ForeignEntry as err:
            console.print(f"[yellow]note:[/] cache entry {stored} names {err}, which no Rufus cache entry holds: "
                          "not loaded (nothing in it ran); computed again and replaced", highlight=False, soft_wrap=True)
        except Exception:  # noqa: BLE001, S110 - an unreadable entry is only a cache miss
            pass
    found = compute()
    with atomic_file(stored) as tmp, tmp.open("wb") as f:
        pickle.dump(found, f, protocol=pickle.HIGHEST_PROTOCOL)
    cache.evict(cache_dir(), limit, keep=stored)
    return found


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
