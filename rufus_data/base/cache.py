"""What `$RUFUS_CACHE` holds, its bound, and cleaning it (`rufus-data cache info`, `cache clean`).

Two kinds of things live there. Computed entries (`NAME-<hash>.pkl`, written by
paths.cached_pickle: the decontam eval indexes) are rebuilt by the next command that needs one,
so they are bounded: past `$RUFUS_CACHE_MAX_GB` (default 10) the least recently used are
removed after each write (a read marks an entry used), and `cache clean` removes them all.
Everything else (converted built-in models, wheels, unpacked checkers, word vectors) was
downloaded or converted once, and may not be fetchable again on an offline machine: listed,
never removed here.

A computed entry is read with `EntryUnpickler`, which builds nothing but numpy arrays, plain
containers and the classes its caller names: a cache others can write to (a shared or planted
file) cannot run code through `pickle.load`; such an entry is reported, computed again and replaced."""

from __future__ import annotations

import os
import pickle
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from rufus_data.base.errors import RufusError

MAX_GB_VARIABLE = "RUFUS_CACHE_MAX_GB"
DEFAULT_MAX_GB = 10.0
ENTRY = re.compile(r".+-[0-9a-f]{32}\.pkl")  # paths.cached_pickle's file names
# what numpy arrays, dtypes and scalars and Python's sets are pickled as (called with data, never code)
ARRAY_GLOBALS = frozenset({
    (f"{package}.{module}", name) for package in ("numpy.core", "numpy._core")
    for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"), ("numeric", "_frombuffer"))
} | {("numpy", "ndarray"), ("numpy", "dtype"), ("builtins", "set"), ("builtins", "frozenset")})


class ForeignEntry(pickle.UnpicklingError):
    """An entry that names something no computed entry holds: never built."""


class EntryUnpickler(pickle.Unpickler):
    """Unpickles a computed entry, building only numpy arrays, plain containers and `types`."""

    def __init__(self, file, types: tuple[type, ...]):
        super().__init__(file)
        self.allowed = ARRAY_GLOBALS | {(kind.__module__, kind.__qualname__) for kind in types}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.allowed:
            raise ForeignEntry(f"{module}.{name}")
        return super().find_class(module, name)


def max_bytes() -> int:
    """The bound on the computed entries, from $RUFUS_CACHE_MAX_GB."""
    value = os.environ.get(MAX_GB_VARIABLE)
    if not value:
        return int(DEFAULT_MAX_GB * 1e9)
    try:
        gb = float(value)
    except ValueError:
        gb = -1.0
    if gb < 0:
        raise RufusError(f"{MAX_GB_VARIABLE}={value!r} is not a size: give the gigabytes the computed cache entries may "
                         f"take (e.g. {MAX_GB_VARIABLE}=10; 0 keeps none)")
    return int(gb * 1e9)


def computed_entries(root: Path) -> list[Path]:
    """The computed entries under `root`, least recently used first."""
    found = []
    for path in root.rglob("*.pkl"):
        try:
            if ENTRY.fullmatch(path.name) and path.is_file():
                found.append((path.stat().st_mtime, path))
        except FileNotFoundError:  # removed by another process meanwhile
            continue
    return [path for _, path in sorted(found)]


def mark_used(entry: Path) -> None:
    """An entry just read becomes the most recently used (its mtime; atime is often not kept)."""
    try:
        os.utime(entry)
    except OSError:  # removed meanwhile, or a read-only cache: only the eviction order is affected
        pass


def evict(root: Path, limit: int, keep: Path | None = None) -> list[Path]:
    """Remove the least recently used computed entries until they take at most `limit` bytes
    (`keep`, the entry just written, stays); returns what was removed."""
    entries = computed_entries(root)
    sizes = {path: _size(path) for path in entries}
    total = sum(sizes.values())
    removed = []
    for path in entries:
        if total <= limit:
            break
        if path == keep:
            continue
        path.unlink(missing_ok=True)
        total -= sizes[path]
        removed.append(path)
    return removed


@dataclass
class Folder:
    """One top-level folder of the cache, as `cache info` lists it."""

    name: str
    files: int
    size: int
    computed: int  # of which computed entries (what `cache clean` removes)
    computed_size: int


def info(root: Path) -> list[Folder]:
    """Every top-level folder of the cache with its files and size, computed entries apart."""
    computed = set(computed_entries(root))
    folders = []
    for top in sorted(p for p in root.iterdir() if p.is_dir()):
        files = [p for p in top.rglob("*") if p.is_file()]
        mine = [p for p in files if p in computed]
        folders.append(Folder(top.name, len(files), sum(map(_size, files)), len(mine), sum(map(_size, mine))))
    return folders


def clean(root: Path) -> tuple[int, int]:
    """Remove every computed entry (and the folders that held only them): (entries, bytes)."""
    entries = computed_entries(root)
    size = sum(map(_size, entries))
    for path in entries:
        path.unlink(missing_ok=True)
    for folder in {path.parent for path in entries}:
        if folder != root and folder.is_dir() and not any(folder.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)
    return len(entries), size


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
