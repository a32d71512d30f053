"""Resuming async GRPO: where TRL's AsyncGRPOTrainer left its rollouts (`rollout_state.json`
beside a checkpoint), read and explained before the trainer starts (see docs/train_rl.md)."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.folders.run_folder import ROLLOUT_STATE


@dataclass
class RolloutState:
    """What TRL's AsyncGRPOTrainer saved beside a checkpoint (rollout_state.json)."""

    prompt_index: int  # low-water mark: the smallest prompt-group index not yet trained
    model_version: int  # weight-sync counter (adapter names keep counting across a resume)
    start_row: int  # where the rollout worker restarts: prompt_index modulo the dataset length


def read_rollout_state(checkpoint: str | Path, dataset_rows: int) -> RolloutState | None:
    """Read and explain the rollout position a resume starts from; None (with a warning) when missing.

    `prompt_index` is a low-water mark: groups above it may already have been trained before the
    checkpoint, so a resume can redo them (duplicated work, never lost data)."""
    path = Path(checkpoint) / ROLLOUT_STATE
    if not path.exists():
        warnings.warn(
            f"{path} is missing: the async rollout worker restarts from prompt 0 (prompts seen before the checkpoint "
            "are trained again)",
            UserWarning,
            stacklevel=2,
        )
        return None
    try:
        data = json.loads(path.read_text())
        prompt_index = int(data["prompt_index"])
    except (ValueError, KeyError, TypeError) as err:
        raise RufusError(f"{path} is not a TRL rollout state ({err}): expected {{'prompt_index': N, 'model_version': M}}")
    if prompt_index < 0 or dataset_rows <= 0:
        raise RufusError(f"{path}: prompt_index {prompt_index} / dataset of {dataset_rows} rows cannot be resumed")
    state = RolloutState(prompt_index, int(data.get("model_version", 0)), prompt_index % dataset_rows)
    console.print(
        f"async resume: rollouts restart at prompt {state.start_row} (prompt_index {prompt_index}, a low-water mark: "
        f"groups after it may be generated again), weights version {state.model_version}; the trainer reconnects to "
        "the vLLM server and pushes the resumed weights before the first generation"
    )
    return state
