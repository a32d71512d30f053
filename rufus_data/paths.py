"""Where Rufus keeps things: the model cache and the data root of local benchmark copies."""

from __future__ import annotations

import os
from pathlib import Path

from rufus_data.errors import RufusError


def cache_dir() -> Path:
    """`$RUFUS_CACHE`, default `~/.cache/rufus`: converted models and downloaded wheels."""
    root = Path(os.environ.get("RUFUS_CACHE") or Path.home() / ".cache" / "rufus")
    root.mkdir(parents=True, exist_ok=True)
    return root


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
