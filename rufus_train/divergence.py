"""A run whose loss or gradient norm turns NaN or infinite stops there, with a non-zero exit.

Left alone, a diverged run trains to its last step on NaN weights, saves them as the result and
exits 0; transformers' `logging_nan_inf_filter` even logs the NaN loss as the running average
(0.0 at the start). Rufus turns that filter off (trl_args.py), and `DivergenceGuard` reads every
trainer log: the first non-finite loss or grad norm stops training before that step's checkpoint
is written. A checkpoint step always logs first (`on_step_end`), and a logged loss averages every
step since the previous log, so no NaN step reaches a checkpoint unseen. The runner then saves no
model, writes the card and run.json saying what happened, and stops with the message."""

from __future__ import annotations

import math

from transformers import TrainerCallback

WATCHED = ("loss", "grad_norm")


def non_finite(logs: dict) -> tuple[str, float] | None:
    """The first watched metric of a trainer log that is NaN or infinite."""
    for key in WATCHED:
        value = logs.get(key)
        if isinstance(value, (int, float)) and not math.isfinite(value):
            return key, float(value)
    return None


class DivergenceGuard(TrainerCallback):
    """Stops training at the first non-finite loss or grad norm; `diverged` says where."""

    def __init__(self):
        self.diverged: dict | None = None
        self.last_saved: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save:  # the checkpoint's weights are checked by a log first
            control.should_log = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        found = non_finite(logs or {})
        if found and self.diverged is None:
            metric, value = found
            self.diverged = {"step": state.global_step, "metric": metric, "value": str(value),
                             "last_checkpoint": self.last_saved, "learning_rate": args.learning_rate}
        if self.diverged is not None:
            control.should_training_stop = True
            control.should_save = False  # the diverged weights never become a checkpoint
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last_saved = state.global_step


def divergence_message(diverged: dict, stage: str) -> str:
    """The one paragraph a diverged run ends with."""
    before = diverged["last_checkpoint"]
    resume = (f"checkpoint-{before}, the last checkpoint before it, is kept: resume from it with a lower "
              f"--learning_rate (--resume_from_checkpoint OUT/checkpoint-{before})" if before else
              "no checkpoint was saved before it")
    return (f"stage {stage} diverged: {diverged['metric']} was {diverged['value']} at step {diverged['step']} "
            f"(learning_rate {diverged['learning_rate']:g}), so training stopped there and no model was saved as "
            f"the result; {resume}. Lower the learning rate, or check the data and dtype, and run again")
