"""The TRL reward-function contract, implemented once for every reward.

TRL (GRPOTrainer, AsyncGRPOTrainer) calls a reward as
`f(prompts=..., completions=..., completion_ids=..., **dataset_columns, trainer_state=..., log_metric=...,
log_extra=...)` and expects one float or None per completion (None = excluded, turned into NaN).
Rewards are instances of small classes (not closures) so they pickle into the async trainer's worker
process. Subclasses implement `score_rows`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from rufus_data.rewards.extract import completion_text, strip_reasoning

TRL_CONTROL_KWARGS = ("trainer_state", "log_metric", "log_extra", "environments")


class Row(dict):
    """The dataset columns of one completion (`row["solution"]`, `row["label"]`, ...)."""


def rows_from_kwargs(count: int, kwargs: dict[str, Any]) -> list[Row]:
    """Transpose TRL's column lists into one Row per completion (control kwargs left out)."""
    columns = {k: v for k, v in kwargs.items() if k not in TRL_CONTROL_KWARGS}
    rows = [Row() for _ in range(count)]
    for key, values in columns.items():
        if isinstance(values, (list, tuple)) and len(values) == count:
            for row, value in zip(rows, values):
                row[key] = value
        else:  # a scalar column (called by hand): broadcast it
            for row in rows:
                row[key] = values
    return rows


def call_reward(reward: Callable, **kwargs) -> list[float | None]:
    """A reward's scores outside a trainer: an async reward (the LLM judge) is run to completion
    here, as TRL runs it on its own event loop. Not for use inside a running event loop."""
    scores = reward(**kwargs)
    return list(asyncio.run(scores) if inspect.isawaitable(scores) else scores)


def is_missing(value: Any) -> bool:
    """A gold value that cannot be scored against: None, NaN or an empty/blank string."""
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


class RewardFunction:
    """Base class: TRL calling convention, `only_label`, `<think>` stripping and metric counting.

    `self.name` becomes `__name__`, which TRL uses to label the reward's column and metrics.
    """

    name = "reward"
    strip_think = True
    # What the reward compares, extracted from an answer text: majority voting (rufus-eval's maj@N)
    # votes on it. None for a reward that compares no single extracted answer (code, instructions, a judge).
    answer_extractor: Callable[[str], str | None] | None = None

    def __init__(self, only_label: str | None = None):
        self.only_label = only_label
        self.__name__ = self.name
        self._warned_columns: set[str] = set()

    # -- the TRL entry point
    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float | None]:
        prompts, texts, closed, rows, applies = self.call_inputs(prompts, completions, kwargs)
        scores = self.score_rows(
            [p for p, a in zip(prompts, applies) if a],
            [t for t, a in zip(texts, applies) if a],
            [c for c, a in zip(closed, applies) if a],
            [r for r, a in zip(rows, applies) if a],
            kwargs.get("log_metric"),
        )
        results: list[float | None] = []
        it = iter(scores)
        for a in applies:
            results.append(next(it) if a else None)
        self.log_counts(kwargs.get("log_metric"), texts, closed, results)
        return results

    # -- pieces subclasses may reuse
    def call_inputs(self, prompts, completions, kwargs: dict) -> tuple[list, list[str], list[bool], list[Row], list[bool]]:
        """One TRL call, per completion: (prompt, answer text, whether its <think> closed, dataset
        row, whether this reward scores it)."""
        completions = list(completions or [])
        rows = rows_from_kwargs(len(completions), kwargs)
        prompts = list(prompts) if prompts is not None else [None] * len(completions)
        texts, closed = self.answer_texts(completions)
        return prompts, texts, closed, rows, self.applies(rows)

    def answer_texts(self, completions: Sequence) -> tuple[list[str], list[bool]]:
        texts, closed = [], []
        for completion in completions:
            text = completion_text(completion)
            if self.strip_think:
                text, ok = strip_reasoning(text)
            else:
                ok = True
            texts.append(text)
            closed.append(ok)
        return texts, closed

    def applies(self, rows: list[Row]) -> list[bool]:
        """Which rows this reward scores at all (`only_label`)."""
        if self.only_label is None:
            return [True] * len(rows)
        if rows and not any("label" in row for row in rows):
            self.warn_missing_column(rows, "label", f"only_label={self.only_label!r} needs it")
            return [False] * len(rows)
        return [row.get("label") == self.only_label for row in rows]

    def warn_missing_column(self, rows: list[Row], column: str, why: str) -> None:
        """Warn once per reward instance when a batch lacks a column the reward needs: every row
        then scores None, which is easy to miss in a training log."""
        if rows and column not in self._warned_columns and not any(column in row for row in rows):
            warnings.warn(f"reward {self.name!r}: the dataset has no {column!r} column ({why}): every sample is left "
                          "unscored (None)", stacklevel=4)
            self._warned_columns.add(column)

    def log_counts(self, log_metric: Callable | None, texts, closed, results) -> None:
        """Counts over rows the reward scored: an unclosed `<think>` on a row left None (only_label, no
        gold, no tests) is not this reward's failure. A reward that extracts an answer also logs
        `NAME/unparsed`, the share of the completions it scored in which its extractor found none:
        at 1 the reward never read an answer (rufus_train/grpo/dead_groups.py names the extractor)."""
        if log_metric is None or not results:
            return
        log_metric(f"{self.name}/unclosed_think", float(sum(not c and r is not None for c, r in zip(closed, results))))
        log_metric(f"{self.name}/unscored", float(sum(r is None for r in results)))
        scored = [text for text, result in zip(texts, results) if result is not None]
        if self.answer_extractor is not None and scored:
            log_metric(f"{self.name}/unparsed", sum(self.answer_extractor(text) is None for text in scored) / len(scored))

    def score_rows(self, prompts, texts, closed, rows, log_metric) -> list[float | None]:
        """One score per row this reward applies to. `texts` are the answers with reasoning removed;
        `closed[i]` is False for an unclosed `<think>` (score it 0.0 unless the row is unscorable)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{k}={v!r}" for k, v in vars(self).items()
            if not k.startswith("_") and k not in ("__name__", "prompt_template", "sleep", "clock")
        )
        return f"{type(self).__name__}({fields})"
