"""A stage's `push_to_hub: ORG/NAME`: the run folder (its adapter or full model, tokenizer,
Rufus's model card, run.json, config and metrics) uploaded once the stage has written its card,
or with `push_merged` the RUN/merged copy with its own card. TRL's `trainer.push_to_hub` would
upload inside save_model, before that card exists (config.py routes it here)."""

from __future__ import annotations

from pathlib import Path

from rufus_data.folders.hub_push import push_folder
from rufus_data.folders.run_folder import CHECKPOINT_GLOB, EVAL_LOGS, MERGED_DIR

# What stays local: checkpoints (a resume's business), the merged copy, evaluations' logs, locks.
RUN_IGNORE = [CHECKPOINT_GLOB, f"{CHECKPOINT_GLOB}/**", f"{MERGED_DIR}/**", f"{EVAL_LOGS}/**", "eval/**", ".*", "**/.*"]


def push_run(out: Path, repo_id: str, private: bool = True, merged: bool = False) -> str:
    """Upload the run (or its merged copy, made and carded here when missing) as a model repo."""
    if merged:
        from rufus_train.modeling import export_merged

        return push_folder(export_merged(out), repo_id, "model", private=private, ignore=[".*", "**/.*"])
    return push_folder(out, repo_id, "model", private=private, ignore=RUN_IGNORE)
