"""What a stage is: a config class, a one-line description, and three hooks the runner calls
(`check` before anything loads, `build_dataset` from canonical shard rows, `make_trainer`), and
`loss_mask`, the tokens it trains on, which the run prints once and records.

It sits on rufus_train's ground floor, below grpo/ and stages/, so the GRPO stage and the
registry's stages subclass it without grpo/ importing the registry above it.

Stage modules import TRL inside their hooks, not at module level, so that listing the stages
and `--dry-run` stay fast."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import as_messages, content_text
from rufus_data.models.loss_mask import LossMask
from rufus_train.config import StageConfig, trl_config_class

if TYPE_CHECKING:
    from datasets import Dataset


@dataclass
class StageContext:
    """Everything a stage needs to build its trainer; filled by the runner."""

    config: StageConfig
    model: Any  # the policy (a PeftModel when LoRA is on)
    tokenizer: Any
    args: Any  # the TRL config dataclass instance
    train_dataset: Dataset
    output_dir: Path
    callbacks: list = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. the distillation teacher

    def trainer_kwargs(self) -> dict[str, Any]:
        """The arguments every TRL trainer takes the same way; a stage adds its own beside them."""
        return {"model": self.model, "args": self.args, "train_dataset": self.train_dataset,
                "processing_class": self.tokenizer, "callbacks": self.callbacks}


class Stage:
    """Base class of the stages in the registry (one instance per stage module)."""

    name: ClassVar[str]
    description: ClassVar[str]
    config_class: ClassVar[type[StageConfig]]
    # Columns the shard rows must have (checked from the parquet schema before anything loads);
    # a tuple inside the tuple means "one of these".
    required_columns: ClassVar[tuple] = ()

    def trl_config_class(self) -> type:
        return trl_config_class(self.config_class)

    def check(self, config: StageConfig) -> None:
        """Stage-specific guards that need no model or data (raise RufusError)."""

    def build_dataset(self, config: StageConfig, rows: pa.Table, tokenizer) -> Dataset:
        """Canonical rows -> the dataset format the TRL trainer reads."""
        raise NotImplementedError

    def loss_mask(self, config: StageConfig, tokenizer) -> LossMask | None:
        """How the stage finds the tokens that carry loss (rufus_data/models/loss_mask.py); None:
        it masks no conversation tokens itself (every token trains, or TRL's prompt/completion split)."""
        return None

    def prepare(self, ctx: StageContext) -> None:
        """Load what the stage needs besides the policy (a teacher, reward models) into ctx.extras."""

    def make_trainer(self, ctx: StageContext):
        raise NotImplementedError

    def watch(self, config: StageConfig):
        """A trainer callback that reads the run's logs for a reason to stop that the stage
        measures (GRPO: steps whose prompt groups all had equal rewards), or None. It has
        `stopped` (the message the run ends with: no model saved, exit 2, or None) and
        `closing(metrics)` (the closing warning and run.json's `dead_groups` record)."""


def conversational(rows: pa.Table, column: str) -> list:
    """A messages column as python lists of plain {role, content, ...} dicts (null fields dropped,
    a list of content parts read as text by shards.content_text); a plain-string prompt becomes
    one user turn (rufus_data.folders.shards.as_messages)."""
    return [[{k: content_text(v) if k == "content" else v for k, v in m.items() if v is not None}
             for m in (as_messages(value) or [])] for value in rows.column(column).to_pylist()]


def empty_reply(turn: dict) -> bool:
    """An assistant turn with no text and no tool call: trained on, it would teach an empty reply."""
    return turn.get("role") == "assistant" and not (turn.get("content") or "").strip() and not turn.get("tool_calls")


def without_empty_replies(columns: dict[str, list], replies: tuple[str, ...], stage: str) -> dict[str, list]:
    """The examples (rows of `columns`) whose `replies` columns hold no empty assistant turn; the
    ones dropped are counted on the console and in train.log, and none left is an error."""
    total = len(columns[replies[0]])
    empty = {i for i in range(total) if any(empty_reply(turn) for column in replies for turn in columns[column][i])}
    if not empty:
        return columns
    first = ", ".join(str(i) for i in sorted(empty)[:5])
    message = (f"{len(empty)} of {total} examples dropped before training: an assistant turn in "
               f"{' or '.join(replies)} has no content (null or empty), which would train an empty reply "
               f"(rows {first}{', ...' if len(empty) > 5 else ''})")
    if len(empty) == total:
        raise RufusError(f"{stage}: {message}; no example is left to train on: fix the data")
    logging.getLogger("rufus_train").warning("%s: %s", stage, message)
    console.print(f"[yellow]{stage}:[/] {message}", highlight=False, soft_wrap=True)
    return {name: [value for i, value in enumerate(values) if i not in empty] for name, values in columns.items()}
