"""A GRPO step whose prompt groups all earned equal rewards trains nothing; the run says so after
that step, with the cause it measured and the fix that applies, and stops after
`stop_after_dead_steps` such steps in a row (or every step of a shorter run), with exit 2.

GRPO's advantage is a completion's reward minus its group's mean: a group whose completions all
score the same ("dead": TRL's `frac_reward_zero_std` counts them) gives every token advantage 0,
so a step of dead groups only moves the weights through a KL term, if any. The cause is read from
the step's logged rewards, never guessed:

- no completion scored (the reward returned None for all: no gold in its column, only_label matched
  nothing): the reward's settings against the data's columns;
- its extractor found no answer in any completion (`NAME/unparsed` 1, rufus_data/rewards/contract.py):
  max_completion_length when every completion was cut there, else the extractor;
- every completion scored 0: the prompts are too hard for this model, filter them first
  (`rufus-data filter --policy MODEL`) and train on the learnable bucket;
- every completion scored 1 (the full reward): too easy, the same filter leaves all_pass out;
- any other constant: the reward does not separate this model's answers.

A log's metrics average the steps since the previous log: a dead share of 1 means each of them was
dead. GRPO stages log every step (`logging_steps: 1`). Under dynamic sampling the share trained
after refills (`dyn/dead_frac_global`) decides; async GRPO logs no `frac_reward_zero_std`, and its
`reward_std` (the mean of its groups' stds) is 0 exactly when every group was dead. A closing note
over metrics.jsonl (`closing_note`) gives the run's measured share and reward mean for the summary
and the model card."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from rich.markup import escape
from transformers import TrainerCallback

from rufus_train.grpo.config import SHAPING_REWARDS
from rufus_train.step_progress import say

log = logging.getLogger("rufus_train")

REWARD_MEAN = "rewards/{}/mean"


def number(value) -> float | None:
    """A logged value as a float; None when missing, NaN or no number (TRL logs None for a reward
    that scored nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def dead_share(logs: dict) -> float | None:
    """The share of the logged steps' prompt groups whose rewards were all equal; None for a log
    with no rewards in it (a step that reused earlier rollouts, the closing log)."""
    if "reward" not in logs:
        return None
    if number(logs["reward"]) is None:
        return 1.0  # no completion scored: every advantage is 0
    for key in ("dyn/dead_frac_global", "frac_reward_zero_std"):
        if number(logs.get(key)) is not None:
            return number(logs[key])
    std = number(logs.get("reward_std"))
    return None if std is None else float(std == 0.0)


def reward_names(logs: dict) -> list[str]:
    """The rewards a log scores correctness with (length shaping such as overlong_penalty left out,
    unless it is all there is)."""
    names = [key[len("rewards/"):-len("/mean")] for key in logs if key.startswith("rewards/") and key.endswith("/mean")]
    return [n for n in names if not n.startswith(SHAPING_REWARDS)] or names


@dataclass(frozen=True)
class Cause:
    kind: str  # unscored | cut | unparsed | too_hard | too_easy | constant
    text: str  # what was measured and the fix that applies


def measured_cause(logs: dict, model: str, data: list[str]) -> Cause:
    """Why a dead step's groups were dead, from its logged rewards (the module docstring's list)."""
    names = reward_names(logs)
    shown = ", ".join(names)
    means = [number(logs.get(REWARD_MEAN.format(n))) for n in names]
    cut = number(logs.get("completions/clipped_ratio")) == 1.0
    if number(logs.get("reward")) is None or all(v is None for v in means):
        return Cause("unscored", f"no completion was scored: {shown or 'every reward'} returned None for each (NAME/unscored "
                     "in metrics.jsonl): check each reward's answer_column and only_label against the data's columns")
    unparsed = [n for n in names if number(logs.get(f"{n}/unparsed")) == 1.0]
    if unparsed and cut:
        return Cause("cut", f"every completion was cut at max_completion_length (completions/clipped_ratio 1) before "
                     f"{unparsed[0]} found an answer in it ({unparsed[0]}/unparsed 1): raise max_completion_length")
    if unparsed:
        return Cause("unparsed", f"the reward never read an answer: {', '.join(unparsed)} found none in any completion "
                     f"({unparsed[0]}/unparsed 1): fix the extractor, set the reward's extractor to the form this "
                     "model's answers take, or ask for the answer in the form it reads")
    scored = [v for v in means if v is not None]
    filtered = (f"`rufus-data filter {' '.join(data) or 'DATA'} --policy {model} --out FILTERED`, then train with "
                "`--data FILTERED/learnable`")
    if all(v == 0.0 for v in scored):
        return Cause("too_hard", f"every completion scored 0 ({shown}): the prompts are too hard for this model; "
                     f"filter them first, {filtered}")
    if all(v == 1.0 for v in scored):
        return Cause("too_easy", f"every completion scored 1, the full reward ({shown}): the prompts are too easy for "
                     f"this model; filter them first, {filtered} (all_pass/ left out)")
    return Cause("constant", f"every completion of each group earned one reward ({shown}): the reward does not tell "
                 "this model's answers apart; raise num_generations or temperature, or use a finer reward")


def dead_step_note(logs: dict) -> str:
    """What a dead step measured: the share of dead groups and the reward's mean."""
    reward = number(logs.get("reward"))
    return (f"every prompt group was dead, its completions all scoring the same (dead groups {dead_share(logs):.0%}, "
            f"reward mean {'-' if reward is None else f'{reward:.4g}'}), so GRPO had no advantage to learn from")


def logged_steps(metrics: list[dict]) -> list[tuple[int, float, float | None, dict]]:
    """(step, dead share, reward mean, log) of every log of metrics.jsonl that holds rewards."""
    found = []
    for entry in metrics:
        share = dead_share(entry)
        if share is not None:
            found.append((entry.get("step", 0), share, number(entry.get("reward")), entry))
    return found


def closing_note(metrics: list[dict], model: str, data: list[str]) -> tuple[str | None, dict | None]:
    """(the closing warning, run.json's `dead_groups` record) from the run's logs: the measured
    dead-group share and reward mean over its steps, and the cause when every step was dead.
    The warning is None when no step was dead; both are None for a run that logged no rewards."""
    steps = logged_steps(metrics)
    if not steps:
        return None, None
    dead = [step for step, share, _, _ in steps if share >= 1.0]
    rewards = [reward for _, _, reward, _ in steps if reward is not None]
    share_mean = sum(share for _, share, _, _ in steps) / len(steps)
    reward_mean = sum(rewards) / len(rewards) if rewards else None
    shown_reward = "-" if reward_mean is None else f"{reward_mean:.4g}"
    cause = measured_cause(steps[-1][3], model, data) if dead and dead[-1] == steps[-1][0] else None
    record = {"steps": len(steps), "dead_steps": dead, "dead_share_mean": round(share_mean, 4),
              "reward_mean": None if reward_mean is None else round(reward_mean, 4), "cause": cause.kind if cause else None}
    if not dead:
        return None, record
    measured = (f"dead groups (equal rewards in every completion of a prompt's group) averaged {share_mean:.0%} over "
                f"{len(steps)} logged steps, reward mean {shown_reward}")
    if len(dead) == len(steps):
        return f"nothing was learned: every step's groups were dead ({measured}); {cause.text}", record
    tail = f"; the last steps were dead: {cause.text}" if cause else ""
    return f"{len(dead)} of {len(steps)} steps trained nothing: {measured}{tail}", record


class DeadGroupWatch(TrainerCallback):
    """Reads every trainer log: a dead step is said at once (console and train.log) with its cause;
    `stop_after` dead steps in a row, or every step of a run shorter than that, stop training, and
    `stopped` then holds the message the run ends with (exit 2, no model saved). 0 or None: warn only."""

    def __init__(self, stage: str, model: str, data: list[str], stop_after: int | None):
        self.stage, self.model, self.data, self.stop_after = stage, model, list(data), stop_after or 0
        self.streak = 0  # dead steps in a row
        self.last_logged = 0
        self.stopped: str | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_logged = state.global_step  # a resumed run counts from its checkpoint

    def on_log(self, args, state, control, logs=None, **kwargs):
        share = dead_share(logs or {})
        covered, self.last_logged = state.global_step - self.last_logged, state.global_step
        if share is None:
            return control
        if share < 1.0:
            self.streak = 0
            return control
        self.streak += max(covered, 1)  # a log's share is 1 only when each step it averages was dead
        cause = measured_cause(logs, self.model, self.data)
        step = f"step {state.global_step}{f'/{state.max_steps}' if state.max_steps > 0 else ''}"
        limit = min(self.stop_after, state.max_steps) if state.max_steps > 0 else self.stop_after
        if limit and self.streak >= limit:
            run_of = "in that step" if self.streak == 1 else f"in {self.streak} steps in a row"
            self.stopped = (f"stage {self.stage} stopped at {step}: {run_of} {dead_step_note(logs)}. "
                            f"Cause: {cause.text}. No model was saved as the result; to train on through such steps, "
                            "set stop_after_dead_steps: 0")
            control.should_training_stop = True
        elif state.is_world_process_zero:
            then = (f"{self.streak} in a row; stop_after_dead_steps stops the run at {limit}" if limit
                    else "stop_after_dead_steps: 0, training goes on")
            note = f"{step}: {dead_step_note(logs)}. Cause: {cause.text} ({then})"
            log.warning("%s", note)
            say(f"[bold yellow]warning:[/] {escape(note)}")
        return control

    def closing(self, metrics: list[dict]) -> tuple[str | None, dict | None]:
        """The run's closing warning and run.json record (closing_note), with this watch's setting."""
        warning, record = closing_note(metrics, self.model, self.data)
        if record is not None:
            record["stop_after_dead_steps"] = self.stop_after or None
        return self.stopped or warning, record
