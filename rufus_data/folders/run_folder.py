"""The run folder: the contract between rufus-train, which writes it, and rufus-eval and
`rufus-train export`, which read it (as shards.py is for shard folders). Every name of its files
and folders, and of a checkpoint's, is spelled here and nowhere else (tests/test_run_folder_contract.py),
and every reader of run.json is here:

    RUN/config.yaml          the resolved stage config (what --dry-run prints)
    RUN/train.log            the run's log
    RUN/metrics.jsonl        one JSON line per trainer log
    RUN/data/NAME/           the catalogs the run mixed when it started (shard folders)
    RUN/lineage.json         the data's lineage (lineage.py), written once the data is ready, so an
                             evaluation during training can read it
    RUN/checkpoint-N/        trainer checkpoints (rufus_train/checkpoints.py): the model files
                             below, the training state, rufus_complete.json written last
    RUN/_eval_staging/checkpoint-N/   checkpoints being evaluated (rufus_eval/staging.py)
    RUN/_mirror_staging/checkpoint-N/ checkpoints being copied to the mirror (rufus_train/mirror.py)
    RUN/eval_logs/           checkpoint evaluations (rufus_eval/checkpoint_eval/): metrics.jsonl,
                             staging.jsonl, and step-N/ (job.json, eval.log, results.json) each
    RUN/run.json             written last: the summary of a finished run, lineage included
    RUN/README.md            the model card (rufus_train/model_card.py); RUN/train_curves.png
    RUN/merged/              the adapter merged into its base, made on demand (merged_model.py),
                             with rufus-merged.json saying from what

A run folder, a checkpoint and RUN/merged are model folders too: config.json, the tokenizer, and
the weights (model.safetensors, or for LoRA adapter_config.json + adapter_model.safetensors).

A model reference belongs to a run when it is the run folder, one of its checkpoints (staged or
not) or its merged copy: `run_of` finds the run, so an evaluation can say what it trained on."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rufus_data.base.errors import RufusError
from rufus_data.base.paths import atomic_file
from rufus_data.base.redaction import redact

# ------------------------------------------------------------------ the run folder
CONFIG_YAML = "config.yaml"
TRAIN_LOG = "train.log"
METRICS = "metrics.jsonl"  # RUN/ (the trainer's logs) and RUN/eval_logs/ (the eval/step curve)
MIXED_DATA = "data"
LINEAGE_JSON = "lineage.json"
RUN_JSON = "run.json"
MODEL_CARD = "README.md"
TRAIN_CURVES = "train_curves.png"
MERGED_DIR = "merged"
MERGED_FROM = "rufus-merged.json"  # in RUN/merged: the adapter it was made from
STAGING = "_eval_staging"
MIRROR_STAGING = "_mirror_staging"
CHECKPOINT_PREFIX = "checkpoint-"
CHECKPOINT_GLOB = "checkpoint-*"
CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}(\d+)")

# ------------------------------------------------------------------ RUN/eval_logs/
EVAL_LOGS = "eval_logs"
EVAL_STEP_PREFIX = "step-"  # eval_logs/step-N/: the evaluation of checkpoint N, a rufus-eval run folder
EVAL_JOB = "job.json"  # its request and model, written before it starts
EVAL_LOG = "eval.log"  # its output
RESULTS_JSON = "results.json"  # its results, as every rufus-eval run writes them (rufus_eval/results.py)
STAGING_LOG = "staging.jsonl"  # the disk each staged checkpoint used

# ------------------------------------------------------------------ a model folder
# (a checkpoint, a full fine-tuning run, RUN/merged): what transformers and peft save
MODEL_CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
MODEL_WEIGHTS = "model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
WEIGHT_PATTERNS = ("model.safetensors", "model-*.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model-*.bin", "adapter_model.safetensors", "adapter_model.bin")
# sharded weights, no loadable file: accelerate's FSDP SHARDED_STATE_DICT folder (torch DCP) and
# DeepSpeed's ZeRO partition folder (global_stepN/, which the file `latest` names)
FSDP_SHARDED_PREFIX = "pytorch_model_fsdp_"
ZERO_PREFIX = "global_step"
ZERO_LATEST = "latest"

# ------------------------------------------------------------------ a checkpoint's training state
# what transformers writes to resume from, beside the model files (pytorch_model_fsdp.bin: FSDP's
# FULL_STATE_DICT copy, beside the model.safetensors that save_model writes)
TRAINER_STATE = "trainer_state.json"
TRAINING_STATE_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt", "training_args.bin", TRAINER_STATE)
OPTIMIZER_PREFIX = "optimizer"  # optimizer.pt, FSDP's optimizer_0/
RNG_STATE_PREFIX = "rng_state"  # rng_state.pth, rng_state_RANK.pth
TRAINING_STATE_PREFIXES = (RNG_STATE_PREFIX, OPTIMIZER_PREFIX, ZERO_PREFIX, "pytorch_model_fsdp")
# and Rufus's own, beside them
COMPLETE_MARKER = "rufus_complete.json"  # written last: every file of the checkpoint, its size and sha256
DYNAMIC_SAMPLING_STATE = "dynamic_sampling_state.json"  # sync GRPO's resampling buffer
ROLLOUT_STATE = "rollout_state.json"  # async GRPO's rollout position


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step}"


def checkpoint_dir(run: str | Path, step: int) -> Path:
    return Path(run) / checkpoint_name(step)


def checkpoint_step_of(path: str | Path) -> int | None:
    """N of a `checkpoint-N` folder (its last path part); None for any other name."""
    match = CHECKPOINT_NAME.fullmatch(Path(str(path).rstrip("/")).name)
    return int(match[1]) if match else None


def eval_step_dir(run: str | Path, step: int) -> Path:
    """RUN/eval_logs/step-N: the evaluation of checkpoint N (0: the starting model)."""
    return Path(run) / EVAL_LOGS / f"{EVAL_STEP_PREFIX}{step}"


def eval_step_of(folder: str | Path) -> int | None:
    """N of an `eval_logs/step-N` folder; None for any other name."""
    number = Path(folder).name.removeprefix(EVAL_STEP_PREFIX)
    return int(number) if Path(folder).name.startswith(EVAL_STEP_PREFIX) and number.isdigit() else None


def eval_step_dirs(run: str | Path) -> list[tuple[int, Path]]:
    """(N, folder) of every eval_logs/step-N of a run, in step order."""
    found = [(eval_step_of(folder), folder) for folder in (Path(run) / EVAL_LOGS).glob(f"{EVAL_STEP_PREFIX}*")]
    return sorted((step, folder) for step, folder in found if step is not None)


def mixed_data_dir(run: str | Path, name: str) -> Path:
    """Where a run mixes the catalog NAME when it starts."""
    return Path(run) / MIXED_DATA / name


def is_run_folder(path: str | Path) -> bool:
    """A folder rufus-train wrote: finished (run.json), or started (lineage.json, or config.yaml
    beside train.log)."""
    path = Path(path)
    return (path / RUN_JSON).is_file() or (path / LINEAGE_JSON).is_file() or (
        (path / CONFIG_YAML).is_file() and (path / TRAIN_LOG).is_file())


def finished_steps(run: str | Path) -> list[str]:
    """What in a run folder shows a finished step: its checkpoint-N folders, run.json, a saved
    model. A run folder without any (config.yaml, train.log, data/ of a run that stopped before
    its first checkpoint) holds nothing to resume or keep: the next run takes it over."""
    run = Path(run)
    found = sorted(p.name for p in run.glob(CHECKPOINT_GLOB) if p.is_dir() and checkpoint_step_of(p) is not None)
    found += [RUN_JSON] if (run / RUN_JSON).is_file() else []
    return found + sorted({p.name for pattern in WEIGHT_PATTERNS for p in run.glob(pattern)})


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
        tmp.write_text(json.dumps(redact(summary), indent=2, default=str) + "\n")
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
