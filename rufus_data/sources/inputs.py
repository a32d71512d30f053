"""What a command reads: a shard folder written by rufus-data, or a mixture catalog (`*.yaml`) that
is mixed into a shard folder first. One resolver for every command that takes inputs: filter and
pairs mix catalogs into their work folder, a training stage's `data:` into RUN/data/NAME (both
through rufus_data.mix `mix_inputs`), and the commands that read one shard folder as it is
(decontam, dedup, inspect, sql) refuse a catalog with the command that mixes it.

A relative `catalogs/...` path the working folder lacks is read from the catalogs Rufus ships
(catalog_files.py: the stage YAMLs' default `catalogs/data/...`, filter's default
`catalogs/rl.yaml`): such a catalog is `shipped`, one of Rufus's own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rufus_data.base.catalog_files import is_shipped, resolve_entry
from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import shard_files
from rufus_data.sources.catalog import catalog_hash, load_catalog

CATALOG_SUFFIXES = (".yaml", ".yml")


def is_catalog(entry: str | Path) -> bool:
    return str(entry).endswith(CATALOG_SUFFIXES)


@dataclass(frozen=True)
class DataInput:
    """One input as given, and what it resolves to: a catalog file or a shard folder."""

    given: str
    path: Path
    catalog: bool

    @property
    def name(self) -> str:
        """The catalog's stem or the folder's name: outputs and mixed folders are named after it."""
        return self.path.stem if self.catalog else self.path.resolve().name

    @property
    def shipped(self) -> bool:
        """A catalog Rufus ships (a stage's default data), not the user's own."""
        return self.catalog and is_shipped(self.path)

    def catalog_record(self) -> dict:
        """The catalog as a manifest input: its path and sha256."""
        return {"path": str(self.path), "sha256": catalog_hash(self.path)}

    def check(self) -> None:
        """A valid catalog (strict validation names file, line and key) or a folder with shards."""
        if self.catalog:
            load_catalog(self.path)
        else:
            shard_files(self.path)


def data_input(entry: str | Path) -> DataInput:
    catalog = is_catalog(entry)
    return DataInput(str(entry), resolve_entry(entry) if catalog else Path(entry), catalog)


def data_inputs(entries: Sequence[str | Path] | None, default: str | None = None) -> list[DataInput]:
    """The inputs as given, or `default` when none are."""
    return [data_input(entry) for entry in (entries or ([default] if default else []))]


def shard_folder(entry: str | Path, command: str) -> Path:
    """The input of a command that reads one shard folder as it is; a catalog is refused with the
    command that mixes it (a missing or empty folder is shards.shard_files's error)."""
    item = data_input(entry)
    if item.catalog:
        raise RufusError(f"{command} reads a shard folder, and {entry} is a mixture catalog: mix it first "
                         f"(`rufus-data mix {entry} --out outputs/{item.name}`), then pass outputs/{item.name}")
    return item.path
