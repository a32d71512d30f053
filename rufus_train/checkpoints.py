"""Checkpoints a killed run resumes from, exactly, on the same machine or a new one.

Complete: transformers writes a checkpoint file by file (weights, optimizer, scheduler, every
rank's RNG state, trainer_state.json, then the stage's own state: dynamic_sampling_state.json,
rollout_state.json), so a job killed part-way leaves a folder that looks like a checkpoint.
Once every process has saved (a barrier in `on_save`), rank 0 writes `rufus_complete.json` last:
the step, the number of processes and every file with its size and sha256. A folder is complete
when all the files its marker lists are there with those sizes (a half-copied folder is not);
before a run resumes from it, every file's sha256 is checked too (`verify_checksums`): same-size
damage or an edited trainer_state.json - on shared storage or in the mirror - is refused, naming
the file, never resumed from and never removed. Where no
checkpoint of the folder has a marker (transformers alone wrote them, or a Rufus from before the
marker), a checkpoint is judged by its files: trainer state, optimizer state, RNG state, weights.

`resume_from_checkpoint: latest` takes the newest complete checkpoint of output_dir, else of the
mirror (copied into output_dir first, rufus_train/mirror.py), else starts fresh, each with a
message, so one command line is the first run and every restart (rufus_train/resume.py). Incomplete folders newer than
the one chosen are reported and removed: the resumed run writes those steps again. A resumed
run's metrics.jsonl is rewritten from the checkpoint's trainer state (its log_history): every
line up to the checkpoint's step, none after it, whatever the killed job had appended."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import warnings
from collections.abc import Collection
from pathlib import Path

from transformers import TrainerCallback

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.base.paths import atomic_file
from rufus_data.folders.run_folder import (
    COMPLETE_MARKER,
    FSDP_SHARDED_PREFIX,
    OPTIMIZER_PREFIX,
    RNG_STATE_PREFIX,
    TRAINER_STATE,
    WEIGHT_PATTERNS,
    ZERO_PREFIX,
    checkpoint_dir,
    checkpoint_step_of,
)

LATEST = "latest"  # resume_from_checkpoint: latest


def storage(location: str, key: str = "checkpoint_mirror"):
    """(fsspec file system, path) of a local folder or a URL whose fsspec backend is installed."""
    import fsspec  # installed with datasets; only runs that name a mirror or resume need it

    try:
        return fsspec.core.url_to_fs(location)
    except (ImportError, ValueError) as err:
        raise RufusError(
            f"{key} {location!r}: fsspec cannot open it ({err}). Give a local folder, or install the fsspec "
            "backend of its protocol (s3fs for s3://, gcsfs for gs://, adlfs for az://)"
        ) from None


def local_storage():
    from fsspec.implementations.local import LocalFileSystem  # see storage()

    return LocalFileSystem()


def listing(fs, folder: str) -> dict[str, int]:
    """Every file under `folder` (path relative to it) with its size."""
    root = folder.rstrip("/") + "/"
    return {name[len(root):]: info["size"] for name, info in fs.find(folder, detail=True).items()
            if info.get("type") != "directory"}


def missing_parts(names: Collection[str]) -> list[str]:
    """What a checkpoint needs to resume from, by the names transformers writes: trainer state,
    optimizer state (optimizer.pt; FSDP's optimizer_0/, DeepSpeed's global_stepN/), the RNG state
    and the weights (plain, adapter, or FSDP/DeepSpeed shards)."""
    top = {name.split("/", 1)[0] for name in names}
    weights = (*WEIGHT_PATTERNS, f"{FSDP_SHARDED_PREFIX}*", f"{ZERO_PREFIX}*")
    needs = {
        "trainer state": TRAINER_STATE in top,
        "optimizer state": any(t.startswith((OPTIMIZER_PREFIX, ZERO_PREFIX)) for t in top),
        "RNG state": any(t.startswith(RNG_STATE_PREFIX) for t in top),
        "weights": any(fnmatch.fnmatch(t, pattern) for t in top for pattern in weights),
    }
    return [part for part, present in needs.items() if not present]


def checkpoint_steps(fs, root: str) -> list[tuple[int, str]]:
    """(step, path) of the checkpoint-N folders under `root`, newest first."""
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        path = entry["name"].rstrip("/")
        step = checkpoint_step_of(path)
        if step is not None and entry.get("type") == "directory":
            found.append((step, path))
    return sorted(found, reverse=True)


def checkpoint_problem(fs, folder: str, markers_expected: bool = True) -> str | None:
    """Why `folder` cannot be resumed from (None when it is complete)."""
    try:
        files = listing(fs, folder)
    except FileNotFoundError:
        return "it does not exist"
    if COMPLETE_MARKER not in files:
        if markers_expected:
            return f"no {COMPLETE_MARKER} (written last): it was being written when the job stopped"
        missing = missing_parts(files)
        return f"no {', '.join(missing)}: it was being written when the job stopped" if missing else None
    try:
        recorded = recorded_files(fs, folder)
    except (ValueError, KeyError, TypeError):
        return f"its {COMPLETE_MARKER} is unreadable"
    wrong = sorted(name for name, entry in recorded.items() if files.get(name) != entry["size"])
    if wrong:
        return f"{len(wrong)} of its {len(recorded)} files are missing or cut short ({wrong[0]}, ...): a half-copied folder"
    return None


def recorded_files(fs, folder: str) -> dict[str, dict]:
    """{file: {size, sha256}} as the checkpoint's marker records them (ValueError when it records
    no checksum for a file: a marker written before checksums were, or edited)."""
    recorded = json.loads(fs.cat_file(f"{folder}/{COMPLETE_MARKER}"))["files"]
    for name, entry in recorded.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or not entry.get("sha256"):
            raise ValueError(f"no size and sha256 recorded for {name}")
    return recorded


def file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def changed_file(folder: Path) -> str | None:
    """The first file of a marked checkpoint whose sha256 is not the one recorded when it was
    saved; None when every file matches (or no marker: transformers alone wrote it, judged by
    its files)."""
    if not (folder / COMPLETE_MARKER).exists():
        return None
    recorded = recorded_files(local_storage(), str(folder.resolve()))
    return next((name for name, entry in sorted(recorded.items()) if file_sha256(folder / name) != entry["sha256"]), None)


def verify_checksums(folder: Path) -> None:
    """Refuse a complete-looking checkpoint whose files differ from what was saved (same-size
    damage, an edited trainer_state.json), naming the file and what to do; never removed."""
    changed = changed_file(folder)
    if changed:
        raise RufusError(
            f"{folder / changed} does not match the sha256 recorded when {folder.name} was saved "
            f"({COMPLETE_MARKER}): the file was changed or damaged since, so nothing was resumed from it. Move "
            f"{folder.name} out of the run folder to resume from the checkpoint before it with `latest`, name an "
            "earlier checkpoint, restore it from the checkpoint_mirror, or start again with --overwrite"
        )


def markers_expected(fs, found: list[tuple[int, str]]) -> bool:
    """True when a Rufus run wrote these checkpoints (one has a marker): then every one needs it."""
    return any(fs.exists(f"{path}/{COMPLETE_MARKER}") for _, path in found)


def newest_complete(fs, root: str, where: str) -> tuple[str | None, list[str]]:
    """The newest complete checkpoint under `root` and the incomplete ones newer than it; each
    skipped one is reported, with `where` naming the place (output_dir, the mirror)."""
    found = checkpoint_steps(fs, root)
    expected = markers_expected(fs, found)
    skipped = []
    for step, path in found:
        problem = checkpoint_problem(fs, path, expected)
        if problem is None:
            return path, skipped
        console.print(f"[yellow]resume:[/] skipping checkpoint-{step} in {where}: {problem}",
                      highlight=False, soft_wrap=True)
        skipped.append(path)
    return None, skipped


def mark_complete(folder: Path, step: int, world_size: int) -> list[str]:
    """Write the marker of a saved checkpoint (rank 0, after every rank saved); the parts it lacks
    (then no marker is written: `latest` never resumes from it), empty when it is complete."""
    files = listing(local_storage(), str(folder.resolve()))
    files.pop(COMPLETE_MARKER, None)
    missing = missing_parts(files)
    if not missing:  # each file hashed as saved: resuming checks it (verify_checksums)
        recorded = {name: {"size": size, "sha256": file_sha256(folder / name)} for name, size in files.items()}
        record = {"step": step, "world_size": world_size, "files": recorded}
        with atomic_file(folder / COMPLETE_MARKER) as tmp:
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return missing


def trained_steps(checkpoint: str) -> tuple[int, int]:
    """(global_step, max_steps) of a checkpoint, as its trainer_state.json records them."""
    state = json.loads((Path(checkpoint) / TRAINER_STATE).read_text())
    return int(state["global_step"]), int(state["max_steps"])


def rewrite_metrics(metrics: Path, checkpoint: str) -> int:
    """metrics.jsonl as it stood when `checkpoint` was saved: one line per trainer log of its
    log_history (checkpoint evaluations, which live in eval_logs/, left out). Returns the lines."""
    state = json.loads((Path(checkpoint) / TRAINER_STATE).read_text())
    lines = [{"step": entry["step"], **{k: v for k, v in entry.items() if k != "step"}}
             for entry in state.get("log_history", []) if "eval/step" not in entry]
    with atomic_file(metrics) as tmp:
        tmp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return len(lines)


class CompleteCheckpoints(TrainerCallback):
    """Marks each checkpoint complete once every process has saved its part, then hands it to
    the mirror. First among the run's callbacks, so a checkpoint is marked before an evaluation
    or a slow callback starts."""

    def __init__(self, mirror=None):
        self.mirror = mirror  # a rufus_train.mirror.Mirror, or None
        self.unmarked: list[int] = []

    def on_train_begin(self, args, state, control, **kwargs):
        if self.mirror is None or not state.is_world_process_zero:
            return
        self.mirror.start(Path(args.output_dir), args.save_total_limit)
        resumed = checkpoint_dir(args.output_dir, state.global_step)
        if state.global_step > 0 and resumed.is_dir():  # the mirror may have lost it with the killed job
            self.mirror.submit(resumed, state.global_step, only_if_missing=True)

    def on_save(self, args, state, control, **kwargs):
        wait_for_every_process()  # each rank writes its own RNG state (and shards) into the folder
        if not state.is_world_process_zero:
            return
        folder = checkpoint_dir(args.output_dir, state.global_step)
        missing = mark_complete(folder, state.global_step, args.world_size)
        if missing:
            if not self.unmarked:
                message = (f"{folder.name} has no {', '.join(missing)} (trainer.save_only_model?): it is not marked "
                           "complete, so `resume_from_checkpoint: latest` will not resume from it")
                console.print(f"[yellow]WARNING:[/] {message}", highlight=False, soft_wrap=True)
                warnings.warn(message, stacklevel=2)
            self.unmarked.append(state.global_step)
            return
        if self.mirror is not None:
            best = state.best_model_checkpoint
            self.mirror.submit(folder, state.global_step, protect=Path(best).name if best else None)

    def on_train_end(self, args, state, control, **kwargs):
        if self.mirror is not None and state.is_world_process_zero:
            self.mirror.finish()


def wait_for_every_process() -> None:
    import torch.distributed as dist  # heavy: loaded with the trainer anyway

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
