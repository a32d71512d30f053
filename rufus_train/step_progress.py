"""The line a stage prints on the console after each logged step, the same for every stage:

    step 3/10: loss 0.0123, reward 0.25, reward std 0.43, dead groups 50%, 4.2 s/step, ETA 0:00:29

The step against max_steps, the metrics the stage names (`StageConfig.progress_metrics`: loss for
every stage; a GRPO stage adds its reward's mean and std and the share of prompt groups whose
rewards were all equal, TRL's `frac_reward_zero_std`), the seconds per step measured over the
steps this process trained, and the time left at that pace. A long step (RL generation) shows
its line as soon as it ends, not at the next `logging_steps`: GRPO stages log every step."""

from __future__ import annotations

import math
import sys
import time

from rufus_data.base.console import clock, console

SHARE = "share"  # a metric shown as a percentage


def shown_value(value, kind: str | None) -> str:
    """A logged value as the line shows it: - when missing or not a number (TRL logs None when
    a reward scored no completion), a percentage for a share, else 4 significant digits."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        return "-"
    return f"{value:.0%}" if kind == SHARE else f"{value:.4g}"


class StepClock:
    """Seconds per step over the steps trained since the first step began (a resumed run's
    earlier steps do not count), and the time left at that pace."""

    def __init__(self):
        self.started: float | None = None
        self.first_step = 0

    def step_begins(self, step: int) -> None:
        if self.started is None:
            self.started, self.first_step = time.monotonic(), step

    def seconds_per_step(self, step: int) -> float | None:
        done = step - self.first_step
        return (time.monotonic() - self.started) / done if self.started is not None and done > 0 else None


def step_line(step: int, max_steps: int, logs: dict, metrics: tuple, seconds_per_step: float | None) -> str:
    """The console line of one logged step; `metrics`: (label, key, kind) of what the stage shows."""
    shown = [f"{label} {shown_value(logs.get(key), kind)}" for label, key, kind in metrics if key in logs]
    left = (max_steps - step) * seconds_per_step if seconds_per_step is not None and max_steps > 0 else None
    pace = "-" if seconds_per_step is None else f"{seconds_per_step:.3g}"
    total = f"/{max_steps}" if max_steps > 0 else ""
    return f"step {step}{total}: " + ", ".join([*shown, f"{pace} s/step", f"ETA {clock(left)}"])


def say(text: str) -> None:
    """Print a line (rich markup) on the console between the redraws of the trainer's progress bar
    (tqdm's external write mode), so it never lands on the bar's line."""
    from tqdm import tqdm  # transformers' progress bar

    with tqdm.external_write_mode(file=sys.stderr):
        console.print(text, highlight=False, soft_wrap=True)
