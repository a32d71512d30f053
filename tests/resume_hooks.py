"""Test hooks for the kill-and-resume runs of tests/test_train_resume.py, installed in every
training process by RUFUS_TEST_HOOKS=resume_hooks (rufus_train/runner.py calls `install`):

- RUFUS_TEST_RECORD=FOLDER: each process appends to FOLDER/rows-rank{R}.jsonl one line per
  micro-batch it trains, `{"step": N, "rows": [...]}`, a row being a hash of its tokens (padding
  left out), so two runs can be compared batch by batch;
- RUFUS_TEST_HOLD_AT=N: every process stops after the save of step N (once Rufus has marked the
  checkpoint complete and handed it to the mirror) and waits there to be killed, after writing
  FOLDER/held-rank{R}: the test kills the run at a known step instead of racing it."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from transformers import TrainerCallback

RECORD = "RUFUS_TEST_RECORD"
HOLD_AT = "RUFUS_TEST_HOLD_AT"


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def fingerprint(tokens) -> str:
    return hashlib.sha1(json.dumps([int(t) for t in tokens]).encode()).hexdigest()[:16]


def batch_rows(inputs) -> list[str]:
    ids, mask = inputs["input_ids"], inputs.get("attention_mask")
    return [fingerprint(row[mask[i].bool()] if mask is not None else row) for i, row in enumerate(ids)]


class HoldAfterSave(TrainerCallback):
    def __init__(self, step: int, folder: Path):
        self.step, self.folder = step, folder

    def on_save(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return
        (self.folder / f"held-rank{rank()}").write_text(str(os.getpid()))
        while True:  # killed here by the test
            time.sleep(1)


def install(trainer) -> None:
    folder = Path(os.environ[RECORD])
    folder.mkdir(parents=True, exist_ok=True)
    train_one = trainer.training_step

    def recorded(model, inputs, num_items_in_batch=None):
        with open(folder / f"rows-rank{rank()}.jsonl", "a") as fh:
            fh.write(json.dumps({"step": trainer.state.global_step + 1, "rows": batch_rows(inputs)}) + "\n")
        return train_one(model, inputs, num_items_in_batch)

    trainer.training_step = recorded
    if os.environ.get(HOLD_AT):
        trainer.add_callback(HoldAfterSave(int(os.environ[HOLD_AT]), folder))
