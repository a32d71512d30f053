"""The run folder: the contract between rufus-train, which writes it, and rufus-eval and
`rufus-train export`, which read it (as shards.py is for shard folders). Every name of its files
and every reader of run.json is here:

    RUN/config.yaml          the resolved stage config (what --dry-run prints)
    RUN/train.log            the run's log
    RUN/metrics.jsonl        one JSON line per trainer log
    RUN/data/NAME/           the catalogs the run mixed when it started (shard folders)
    RUN/lineage.json         the data's lineage (lineage.py), written once the data is ready, so an
                             evaluation during training can read it
    RUN/checkpoint-N/        trainer checkpoints (rufus_train/checkpoints.py)
    RUN/_eval_staging/checkpoint-N/   checkpoints being evaluated (rufus_eval/staging.py)
    RUN/eval_logs/           checkpoint evaluations (rufus_eval/checkpoint_eval/)
    RUN/run.json             written last: the summary of a finished run, lineage included
    RUN/merged/              the adapter merged into its base, made on demand (merged_model.py)

A model reference belongs to a run when it is the run folder, one of its checkpoints (staged or
not) or its merged copy: `run_of` finds the run, so an evaluation can say what it trained on."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rufus_data.errors import RufusError
from rufus_data.paths import atomic_file

CONFIG_YAML = "config.yaml"
TRAIN_LOG = "train.log"
METRICS = "metrics.jsonl"
MIXED_DATA = "data"
LINEAGE_JSON = "lineage.json"
RUN_JSON = "run.json"
MERGED_DIR = "merged"
STAGING = "_eval_staging"
EVAL_LOGS = "eval_logs"
CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def checkpoint_name(step: int) -> str:
    return f"checkpoint-{step}"


def checkpoint_dir(run: str | Path, step: int) -> Path:
    return Path(run) / checkpoint_name(step)


def checkpoint_step_of(path: str | Path) -> int | None:
    """N of a `checkpoint-N` folder (its last path part); None for any other name."""
    match = CHECKPOINT_NAME.fullmatch(Path(str(path).rstrip("/")).name)
    return int(match[1]) if match else None


def mixed_data_dir(run: str | Path, name: str) -> Path:
    """Where a run mixes the catalog NAME when it starts."""
    return Path(run) / MIXED_DATA / name


def is_run_folder(path: str | Path) -> bool:
    """A folder rufus-train wrote: finished (run.json), or started (lineage.json, or config.yaml
    beside train.log)."""
    path = Path(path)
    return (path / RUN_JSON).is_file() or (path / LINEAGE_JSON).is_file() or (
        (path / CONFIG_YAML).is_file() and (path / TRAIN_LOG).is_file())


def run_of(model: str | Path) -> Path | None:
    """The run folder a model reference belongs to (the run itself, RUN/checkpoint-N,
    RUN/_eval_staging/checkpoint-N, RUN/merged); None for a built-in, a hub id or another folder."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return None
    candidates = [path]
    if checkpoint_step_of(path) is not None or path.name == MERGED_DIR:
        parent = path.parent
        candidates.append(parent.parent if parent.name == STAGING else parent)
    return next((c.resolve() for c in candidates if is_run_folder(c)), None)


def read_run_json(run: str | Path, remedy: str = "train it again") -> dict:
    """The summary of a finished run; {} while it trains (run.json is written last)."""
    path = Path(run) / RUN_JSON
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RufusError(f"{path} is not valid JSON ({err}): did the training run finish? {remedy}") from None


def write_run_json(run: str | Path, summary: dict) -> Path:
    """run.json, written under a temporary name and renamed: a reader never sees half of it."""
    path = Path(run) / RUN_JSON
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return path


def run_step(run: str | Path) -> int | None:
    """run.json's `global_step` (None when there is no run.json); a run.json without an integer
    step is an error that names it."""
    if not (Path(run) / RUN_JSON).is_file():
        return None
    step = read_run_json(run, remedy="give --step N").get("global_step")
    if not isinstance(step, int):
        raise RufusError(f"{Path(run) / RUN_JSON} has no integer global_step ({step!r}): give --step N")
    return step


def write_lineage(run: str | Path, lineage: dict) -> Path:
    path = Path(run) / LINEAGE_JSON
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(lineage, indent=2, sort_keys=True, default=str) + "\n")
    return path


def read_lineage(run: str | Path) -> dict | None:
    """The run's data lineage: run.json's (a finished run), else lineage.json (a run in training);
    None when the run recorded none (a run from before lineage was recorded)."""
    found = read_run_json(run).get("lineage")
    if found is not None:
        return found
    path = Path(run) / LINEAGE_JSON
    return json.loads(path.read_text()) if path.is_file() else None
