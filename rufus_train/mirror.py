"""`checkpoint_mirror`: every complete checkpoint copied to a second place (a local folder, or any
URL fsspec opens with its backend installed: s3://, gs://, ...), so a preempted job restarts on a
new machine from where it stopped.

- After a checkpoint is marked complete (rufus_train/checkpoints.py), rank 0 snapshots it with
  hard links (`_mirror_staging/checkpoint-N`: save_total_limit may delete the folder while it is
  copied) and a background thread copies it to `MIRROR/checkpoint-N.tmp-PID`, the marker last,
  then renames it `checkpoint-N`; training never waits for it. On an object store the rename is
  a copy, which is why the marker, written last and checked on restore, decides completeness.
- `save_total_limit` holds in the mirror too: after each copy, complete checkpoints beyond the
  newest `save_total_limit` are deleted (never the best one), and leftovers of a killed copy.
- The run's end waits for pending copies (at most MIRROR_END_TIMEOUT_S) and reports each failed
  or unfinished one, on the console, in train.log and in run.json.
- `restore`: `latest` with no complete checkpoint in output_dir copies the mirror's newest complete
  one into it (under a temporary name, renamed when whole and every file matches its recorded
  sha256: a damaged mirror copy is refused, naming the file)."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from pathlib import Path

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.paths import link_or_copy
from rufus_data.folders.run_folder import COMPLETE_MARKER, MIRROR_STAGING, checkpoint_name, checkpoint_step_of
from rufus_train.checkpoints import (
    changed_file,
    checkpoint_problem,
    checkpoint_steps,
    listing,
    local_storage,
    newest_complete,
    storage,
)

log = logging.getLogger("rufus_train")
MIRROR_END_TIMEOUT_S = 3600.0


def marker_last(names) -> list[str]:
    """Copy order: the marker after every file it vouches for."""
    return sorted(names, key=lambda name: (name == COMPLETE_MARKER, name))


class Mirror:
    """Rank 0's copier: `start`, `submit` each complete checkpoint, `finish` at the end."""

    def __init__(self, location: str):
        self.location = location
        self.fs, self.root = storage(location)
        self.copied: list[int] = []
        self.failed: dict[int, str] = {}
        self._pending: list[int] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._snapshots: Path | None = None
        self._keep: int | None = None

    def start(self, output_dir: Path, save_total_limit: int | None) -> None:
        self.fs.makedirs(self.root, exist_ok=True)
        self._snapshots = output_dir / MIRROR_STAGING
        shutil.rmtree(self._snapshots, ignore_errors=True)  # a killed job's snapshots
        self._keep = save_total_limit
        self._thread = threading.Thread(target=self._work, name="checkpoint-mirror", daemon=True)
        self._thread.start()

    def submit(self, folder: Path, step: int, protect: str | None = None, only_if_missing: bool = False) -> None:
        """Snapshot `folder` now and copy it in the background (`only_if_missing`: unless the
        mirror already holds it complete, as after a resume from a local checkpoint)."""
        snapshot = self._snapshots / folder.name
        shutil.rmtree(snapshot, ignore_errors=True)
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            target = snapshot / file.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(file, target)
        self._pending.append(step)
        self._queue.put((step, snapshot, protect, only_if_missing))

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            step, snapshot, protect, only_if_missing = item
            try:
                final = f"{self.root}/{checkpoint_name(step)}"
                if not (only_if_missing and checkpoint_problem(self.fs, final) is None):
                    self._copy(snapshot, final)
                    self.copied.append(step)
                self._rotate(protect)
            except Exception as err:  # noqa: BLE001 - a failed copy is reported, training goes on
                self.failed[step] = f"{type(err).__name__}: {err}"
                log.error("checkpoint mirror: copying checkpoint-%d to %s failed: %s", step, self.location, err)
                console.print(f"[red]mirror:[/] copying checkpoint-{step} to {self.location} failed: {err}",
                              highlight=False, soft_wrap=True)
            finally:
                shutil.rmtree(snapshot, ignore_errors=True)
                self._pending.remove(step)

    def _copy(self, snapshot: Path, final: str) -> None:
        tmp = f"{final}.tmp-{os.getpid()}"
        if self.fs.exists(tmp):
            self.fs.rm(tmp, recursive=True)
        for name in marker_last(listing(local_storage(), str(snapshot.resolve()))):
            target = f"{tmp}/{name}"
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(snapshot / name), target)
        if self.fs.exists(final):
            self.fs.rm(final, recursive=True)
        self.fs.mv(tmp, final, recursive=True)
        problem = checkpoint_problem(self.fs, final)
        if problem:
            raise RufusError(f"{final} is incomplete after the copy: {problem}")
        log.info("checkpoint mirror: %s copied to %s", Path(final).name, self.location)

    def _rotate(self, protect: str | None) -> None:
        """save_total_limit in the mirror, and the leftovers of killed copies (this thread is the
        only writer, and nothing is being copied now)."""
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            head, _, tail = name.partition(".tmp-")
            if checkpoint_step_of(head) is not None and tail.isdigit():
                self.fs.rm(entry, recursive=True)
        complete = [path for _, path in checkpoint_steps(self.fs, self.root) if checkpoint_problem(self.fs, path) is None]
        if self._keep:
            for path in complete[self._keep:]:
                if path.rsplit("/", 1)[-1] != protect:
                    self.fs.rm(path, recursive=True)

    def finish(self, timeout_s: float = MIRROR_END_TIMEOUT_S) -> dict:
        """Wait for the pending copies (bounded), report what failed or is unfinished; the report."""
        if self._thread is not None:
            if self._pending:
                console.print(f"mirror: waiting for {len(self._pending)} checkpoint copies to {self.location} "
                              f"(at most {timeout_s:.0f} s)", highlight=False, soft_wrap=True)
            started = time.monotonic()
            self._queue.put(None)
            self._thread.join(timeout_s)
            log.info("checkpoint mirror: waited %.1f s for pending copies at the end", time.monotonic() - started)
        report = self.report()
        problems = [f"checkpoint-{step} failed ({error})" for step, error in sorted(self.failed.items())]
        problems += [f"checkpoint-{step} still copying after {timeout_s:.0f} s (not mirrored)" for step in report["pending"]]
        if problems:
            message = f"checkpoint mirror {self.location}: " + "; ".join(problems)
            log.error(message)
            console.print(f"[bold red]mirror:[/] {message}", highlight=False, soft_wrap=True)
        elif self.copied:
            console.print(f"[green]mirror:[/] {len(self.copied)} checkpoints copied to {self.location}",
                          highlight=False, soft_wrap=True)
        return report

    def report(self) -> dict:
        return {"location": self.location, "copied": list(self.copied), "failed": dict(self.failed),
                "pending": list(self._pending)}


def open_mirror(location: str) -> None:
    """Create the mirror's folder now, so that a mirror this machine cannot write to stops the run
    before any model loads rather than at its first checkpoint."""
    fs, root = storage(location)
    try:
        fs.makedirs(root, exist_ok=True)
    except OSError as err:
        raise RufusError(f"checkpoint_mirror {location}: cannot create it ({err}); check the path and its permissions") from None


def restore(location: str, out: Path) -> str | None:
    """Copy the mirror's newest complete checkpoint into `out` (temporary name, checked, then
    renamed); its local path, or None when the mirror holds none."""
    fs, root = storage(location)
    found, _ = newest_complete(fs, root, f"the mirror {location}")
    if found is None:
        return None
    name = found.rsplit("/", 1)[-1]
    target, tmp = out / name, out / f"{name}.restoring"
    shutil.rmtree(tmp, ignore_errors=True)
    for relative in marker_last(listing(fs, found)):
        (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(f"{found}/{relative}", str(tmp / relative))
    problem = checkpoint_problem(local_storage(), str(tmp.resolve()))
    if problem:
        raise RufusError(f"restoring {found} from the mirror {location}: the copy is incomplete ({problem}); run again")
    changed = changed_file(tmp)
    if changed:  # the mirror's copy differs from what was saved: nothing restored, the mirror left as it is
        shutil.rmtree(tmp, ignore_errors=True)
        raise RufusError(f"the mirror's {found}/{changed} does not match the sha256 recorded when {name} was saved: "
                         f"the copy in {location} was changed or damaged, so nothing was restored. Remove {found} "
                         "from the mirror to restore the checkpoint before it, or start again with --overwrite")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    console.print(f"resume: restored {name} from the mirror {location} into {out}",
                  highlight=False, soft_wrap=True)
    return str(target)
