"""`sft` (loss on assistant turns only: the tokens rufus_data/models/loss_mask.py finds),
`sft_full` (the Smol playbook's full fine-tuning SFT baseline: the same stage with its settings)
and `midtrain` (continued pretraining on long traces: packing, loss on every token). All run
TRL's SFTTrainer on `messages` rows (midtrain also reads a plain `text` column).

With the loss on assistant turns, an example whose assistant tokens all fall past `max_length`
would train on nothing: such examples are dropped before training and counted (console and
train.log), as Open Instruct's SFT filter does. A template TRL cannot mask (the loss mask's
`prefixes` route) is trained from token ids and masks Rufus hands TRL; the others TRL tokenizes
and masks itself (its training template swapped in where the loss mask says so)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import KIND_COLUMNS
from rufus_data.models.loss_mask import LossMask, decide_loss_mask
from rufus_data.sources.tokens import TokenCounter
from rufus_train.config import LoraSettings, StageConfig
from rufus_train.stage_base import Stage, StageContext, conversational, without_empty_replies

log = logging.getLogger("rufus_train")


def rows_with_loss(tokenizer, conversations: list[list[dict]], tools: list | None, max_length: int,
                   loss: LossMask | None = None) -> list[int]:
    """Indices of the conversations with at least one assistant token among their first
    `max_length` tokens (Open Instruct's SFT filter: an example whose labels are all masked after
    truncation trains nothing and only dilutes the batch). The mask is the one TRL trains with,
    found by mix's batched counter (rendered and tokenised a batch at a time, not row by row)."""
    first = TokenCounter(tokenizer, loss=loss).first_trainable(conversations, tools)
    return [i for i, position in enumerate(first) if position is not None and position < max_length]


class SFTStageConfig(StageConfig):
    """SFT: full FT 1e-5 (the playbook's 3e-6..1e-5 range), LoRA 1e-4 (about 10x higher)."""

    full_ft_learning_rate: ClassVar[float] = 1e-5
    lora_learning_rate: ClassVar[float] = 1e-4
    trl_config: ClassVar[str] = "trl.SFTConfig"

    assistant_only_loss: bool = Field(True, description="loss on assistant turns only (the chat template's "
                                      "{% generation %} markers, TRL's training template, or its rendered prefixes)")
    packing: bool = Field(False, description="pack several examples into each max_length row (packing_strategy)")
    packing_strategy: Literal["bfd", "bfd_split", "wrapped"] = Field(
        "bfd", description="bfd: whole conversations per row, padding-free (one flattened row per batch: "
        "fast with flash attention, quadratic in the batch's tokens with sdpa); wrapped: cut into max_length rows")

    def trl_kwargs(self) -> dict[str, Any]:
        return {
            "max_length": self.max_length,
            "assistant_only_loss": self.assistant_only_loss,
            "packing": self.packing,
            "packing_strategy": self.packing_strategy,
            "dataset_text_field": "text",
        }


class MidtrainStageConfig(SFTStageConfig):
    """Continued pretraining: every token carries loss, sequences are concatenated and cut into
    max_length rows (`wrapped`, as pretraining does). TRL's BFD packing would flatten each batch
    into one row of batch x max_length tokens, which sdpa (the attention Rufus loads) attends over
    whole: at 8 x 4096 about 4x the work per step, and a 2-step CPU run did not finish step 1 in
    25 minutes."""

    assistant_only_loss: bool = Field(False, description="false: every token carries loss (midtrain refuses true)")
    packing: bool = Field(True, description="pack sequences into max_length rows, as pretraining does")
    packing_strategy: Literal["bfd", "bfd_split", "wrapped"] = Field(
        "wrapped", description="wrapped: sequences concatenated and cut into max_length rows; bfd: whole "
        "conversations per row, padding-free (one flattened row per batch: slow with sdpa)")


class SFTFullStageConfig(SFTStageConfig):
    """The Smol training playbook's full fine-tuning SFT baseline (its "baby baselines": FullFT at
    learning rate 1e-5, effective batch 128, 1 epoch, no packing for small datasets), with a
    linear warmup over 3% of the steps (the playbook's 1-5% for short runs; SmolLM3's own SFT
    recipe uses 0.03). Trained at `dtype: auto`: fp32 master weights, bf16 autocast on a GPU."""

    lora: LoraSettings = Field(default_factory=lambda: LoraSettings(enabled=False),
                               description="off: the baseline is full fine-tuning")
    learning_rate: float | None = Field(1e-5, gt=0, description="the playbook's baseline (3e-6 and 1e-5 best in its sweep)")
    gradient_accumulation_steps: int = Field(16, ge=1, description="8 x 16: the playbook's 128 sequences a step, one GPU")
    max_length: int | None = Field(8192, ge=8, description="tokens per training example; longer ones are truncated")
    trainer: dict[str, Any] = Field(default_factory=lambda: {"warmup_steps": 0.03},
                                    description="extra TRL config fields, checked (warmup over 3% of the steps)")


class SFTStage(Stage):
    name = "sft"
    description = "supervised fine-tuning (SFTTrainer): loss on assistant tokens only, packing switchable"
    config_class = SFTStageConfig
    required_columns: ClassVar[tuple] = KIND_COLUMNS["sft"]

    def check(self, config: SFTStageConfig) -> None:
        if config.assistant_only_loss and config.packing and config.trainer.get("padding_free") is False:
            raise RufusError("sft: packing with assistant_only_loss needs padding-free batches; drop trainer.padding_free")
        if config.assistant_only_loss and config.packing and config.packing_strategy == "wrapped":
            raise RufusError("sft: packing_strategy wrapped cuts conversations mid-turn; with assistant_only_loss "
                             "set packing_strategy: bfd (or turn packing off)")

    def loss_mask(self, config: SFTStageConfig, tokenizer) -> LossMask | None:
        if not config.assistant_only_loss:
            return None
        return decide_loss_mask(tokenizer, f"model {config.model}")

    def build_dataset(self, config: SFTStageConfig, rows: pa.Table, tokenizer):
        from datasets import Dataset  # heavy: only when a run builds its dataset

        if "messages" not in rows.column_names:
            return Dataset.from_dict({"text": rows.column("text").to_pylist()})
        columns = {"messages": conversational(rows, "messages")}
        if "tools" in rows.column_names:  # tool-use traces: SFTTrainer renders the schemas into the system turn
            columns["tools"] = rows.column("tools").to_pylist()
        if config.assistant_only_loss:
            columns = without_empty_replies(columns, ("messages",), self.name)
        loss = self.loss_mask(config, tokenizer)
        if loss is not None and not loss.tracked:  # TRL cannot mask this template: it trains on Rufus's masks
            masks = TokenCounter(tokenizer, loss=loss).token_masks(columns["messages"], columns.get("tools"))
            columns = {"input_ids": [ids for ids, _ in masks], "assistant_masks": [mask for _, mask in masks]}
            keep = [i for i, mask in enumerate(columns["assistant_masks"]) if 1 in mask[: config.max_length]]
        elif loss is not None and config.max_length is not None:
            keep = rows_with_loss(tokenizer, columns["messages"], columns.get("tools"), config.max_length, loss)
        else:
            return Dataset.from_dict(columns)
        return Dataset.from_dict(_kept(columns, keep, config.max_length))

    def make_trainer(self, ctx: StageContext):
        from trl import SFTTrainer

        if "assistant_masks" in ctx.train_dataset.column_names:  # masks Rufus made: TRL must not swap templates
            ctx.args.assistant_only_loss = False
        return SFTTrainer(**ctx.trainer_kwargs())


def _kept(columns: dict, keep: list[int], max_length: int | None) -> dict:
    """The columns of the rows in `keep`, the dropped ones counted (console and train.log); none kept is refused."""
    total = len(next(iter(columns.values())))
    if len(keep) < total:
        message = (f"{total - len(keep)} of {total} examples dropped before training: every assistant token falls "
                   f"past max_length {max_length} (no label left to train)")
        log.info("sft: %s", message)
        console.print(f"[yellow]sft:[/] {message}")
    if not keep:
        raise RufusError(f"sft: no example has an assistant token within max_length {max_length}: raise max_length or "
                         "shorten the prompts")
    return {name: [values[i] for i in keep] for name, values in columns.items()}


class MidtrainStage(SFTStage):
    name = "midtrain"
    description = "continued pretraining on long reasoning traces (SFTTrainer): packing, loss on every token"
    config_class = MidtrainStageConfig
    required_columns: ClassVar[tuple] = (("messages", "text"),)

    def check(self, config: MidtrainStageConfig) -> None:
        if config.assistant_only_loss:
            raise RufusError("midtrain trains on every token: set `assistant_only_loss: false` or use the sft stage")


class SFTFullStage(SFTStage):
    name = "sft_full"
    description = "the Smol playbook's full fine-tuning SFT baseline: lr 1e-5, batch 128, 1 epoch, no packing"
    config_class = SFTFullStageConfig


STAGES = [SFTStage(), SFTFullStage(), MidtrainStage()]
