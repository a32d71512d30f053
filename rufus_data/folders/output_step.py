"""Running a step into an output folder: the one way mix, decontam, dedup, filter and pairs
write a shard folder (rufus_data/folders/shards.py has the layout).

An `OutputStep` is made before any work, so a wrong `--out` is refused before a model, a
tokenizer or a benchmark loads, and it takes the output's lock then (output_lock.py: a second
command on the same output stops at once), held while the step lives: a command's whole run, a
library caller's until it drops the step. The folder is built under a temporary sibling and renamed into
place only when the block ends without error. It is finished with `report.md` and a
`manifest.json` whose core every command fills the same way:

    command      the command line's name, e.g. "rufus-data decontam"
    config       every setting that shaped the output, and config_hash, its short hash
    inputs       what was read, each with its fingerprint (sha256 or hub revision)
    counts       the command's counts (rows in and out, buckets, pairs, ...)
    versions     Rufus and the packages that shaped the output
    seconds      wall time from the step's start

Each command adds its own keys beside the core.

Called from Python, every step returns a `StepResult` (a step may add fields to it); printing
what it found is the CLI's part."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rufus_data.base.errors import RufusError, write_failure
from rufus_data.base.redaction import redact_text
from rufus_data.folders.dataset_card import write_dataset_card
from rufus_data.folders.output_lock import OutputLock
from rufus_data.folders.shards import (
    atomic_output_dir,
    folder_fingerprint,
    package_versions,
    refuse_existing_output,
    write_manifest,
    write_without_rows,
)

REPORT = "report.md"
CORE_KEYS = frozenset({"command", "config", "config_hash", "inputs", "counts", "versions", "seconds"})


@dataclass(kw_only=True)
class StepResult:
    """What a data step returns: the folder it wrote (None: a report-only run), the manifest it
    wrote there ({} when it wrote none) and its counts (the manifest's `counts`, also when none)."""

    out: Path | None
    manifest: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)


def hash_config(config: dict) -> str:
    """A short hash of a configuration (its keys in sorted order)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_output(command: str, out: Path | None, *, overwrite: bool = False, report_only: bool = False) -> None:
    """The refusals of an output that a step makes before any work, made without its lock: what a
    --dry-run plan checks in the step's place (a plan takes no lock and writes nothing)."""
    _needs_out(command, out, report_only)
    if out is not None and not report_only:
        refuse_existing_output(out, overwrite)


def _needs_out(command: str, out: Path | None, report_only: bool) -> None:
    if out is None and not report_only:
        raise RufusError(f"{command} needs --out DIR (or --report-only to scan and report without writing)")


class OutputStep:
    """One command writing one output folder (or, with `report_only`, computing everything and
    writing nothing: decontam's and dedup's --report-only)."""

    def __init__(self, command: str, out: str | Path | None, *, overwrite: bool = False, report_only: bool = False):
        self.command = command
        self.out = None if out is None else Path(out)
        self.overwrite, self.report_only = overwrite, report_only
        self.started = time.time()
        _needs_out(command, self.out, report_only)
        if self.out is not None and not report_only:  # the lock first: a live writer is named, not its folder
            try:  # a read-only or full folder is refused here, before any work
                weakref.finalize(self, OutputLock(self.out, command).acquire().release)
            except OSError as err:
                raise write_failure(err, f"output {self.out}") or err from None
            refuse_existing_output(self.out, overwrite)

    @property
    def seconds(self) -> float:
        return time.time() - self.started

    @contextlib.contextmanager
    def folder(self) -> Iterator[Path]:
        """The temporary folder to write into; it becomes `out` when the block ends without error."""
        if self.report_only:
            raise RuntimeError(f"{self.command}: a report-only run writes no folder")
        try:
            with atomic_output_dir(self.out, self.overwrite) as tmp:
                yield tmp
        except OSError as err:  # the temporary folder is gone already (atomic_output_dir)
            raise write_failure(err, f"output {self.out}") or err from None

    def manifest(self, *, config: dict, inputs, counts: dict, versions: Sequence[str] = (),
                 config_hash: str | None = None, **own) -> dict:
        """The manifest: the common core (`config_hash` overrides the hash of `config`, e.g. a
        run hash that also covers the inputs) plus the command's own keys."""
        clash = CORE_KEYS & own.keys()
        if clash:
            raise ValueError(f"{self.command}: manifest keys {sorted(clash)} belong to the common core")
        core = {
            "command": self.command, "config": config, "config_hash": config_hash or hash_config(config),
            "inputs": inputs, "counts": counts, "versions": package_versions(*versions),
            "seconds": round(self.seconds, 2),
        }
        return {**core, **own}

    def finish(self, folder: Path, manifest: dict, report: str) -> None:
        """Write report.md, manifest.json and the dataset card (README.md) into the (temporary) folder."""
        (Path(folder) / REPORT).write_text(redact_text(report))
        write_manifest(folder, manifest)
        write_dataset_card(folder, manifest, self.out.name)

    def write_without_rows(self, shards: str | Path, files: list[Path], rows_in: int, drop: Collection[int], *,
                           why: tuple[str, pa.Table], config: dict, versions: Sequence[str], report: str,
                           counts: dict | None = None, copy: Callable[[list[Path], Collection[int], Path], None] = write_without_rows,
                           pages: dict[str, str] | None = None, **own) -> dict:
        """The whole output of a step that drops rows (decontam, dedup): the input shards without
        the `drop` rows (global row numbers over `files`, `rows_in` in all; `copy` writes them,
        e.g. over many processes), `why` (file name, table: which rows went and why), `pages`
        (file name -> text, e.g. hits.html), and the manifest, whose counts start with rows in, out
        and dropped. Returns the manifest."""
        with self.folder() as tmp:
            copy(files, drop, tmp)
            pq.write_table(why[1], tmp / why[0])
            for name, text in (pages or {}).items():
                (tmp / name).write_text(text)
            manifest = self.manifest(
                config=config, inputs=[folder_fingerprint(shards, files)],
                counts={"rows_in": rows_in, "rows_out": rows_in - len(drop), "rows_dropped": len(drop), **(counts or {})},
                versions=versions, rows_dropped=len(drop),  # also at the top, where earlier manifests had it
                **own,
            )
            self.finish(tmp, manifest, report)
        return manifest
