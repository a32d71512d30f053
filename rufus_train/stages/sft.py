"""`sft` (loss on assistant turns only, via the chat template's {% generation %} markers) and
`midtrain` (continued pretraining on long traces: packing, loss on every token). Both run
TRL's SFTTrainer on `messages` rows (midtrain also reads a plain `text` column)."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
from pydantic import Field

from rufus_data.errors import RufusError
from rufus_data.shards import KIND_COLUMNS
from rufus_train.config import StageConfig
from rufus_train.stages.base import Stage, StageContext, conversational


class SFTStageConfig(StageConfig):
    """SFT: full FT 1e-5 (the playbook's 3e-6..1e-5 range), LoRA 1e-4 (about 10x higher)."""

    full_ft_learning_rate: ClassVar[float] = 1e-5
    lora_learning_rate: ClassVar[float] = 1e-4
    trl_config: ClassVar[str] = "trl.SFTConfig"

    assistant_only_loss: bool = Field(True, description="loss on assistant turns only ({% generation %} markers)")
    packing: bool = False

    def trl_kwargs(self) -> dict[str, Any]:
        return {
            "max_length": self.max_length,
            "assistant_only_loss": self.assistant_only_loss,
            "packing": self.packing,
            "dataset_text_field": "text",
        }


class MidtrainStageConfig(SFTStageConfig):
    """Continued pretraining: every token carries loss, sequences are packed."""

    assistant_only_loss: bool = False
    packing: bool = True


class SFTStage(Stage):
    name = "sft"
    description = "supervised fine-tuning (SFTTrainer): loss on assistant tokens only, packing switchable"
    config_class = SFTStageConfig
    required_columns: ClassVar[tuple] = KIND_COLUMNS["sft"]

    def check(self, config: SFTStageConfig) -> None:
        if config.assistant_only_loss and config.packing and config.trainer.get("padding_free") is False:
            raise RufusError("sft: packing with assistant_only_loss needs padding-free batches; drop trainer.padding_free")

    def build_dataset(self, config: StageConfig, rows: pa.Table, tokenizer):
        from datasets import Dataset

        if "messages" in rows.column_names:
            columns = {"messages": conversational(rows, "messages")}
            if "tools" in rows.column_names:  # tool-use traces: SFTTrainer renders the schemas into the system turn
                columns["tools"] = rows.column("tools").to_pylist()
            return Dataset.from_dict(columns)
        return Dataset.from_dict({"text": rows.column("text").to_pylist()})

    def make_trainer(self, ctx: StageContext):
        from trl import SFTTrainer

        return SFTTrainer(**ctx.trainer_kwargs())


class MidtrainStage(SFTStage):
    name = "midtrain"
    description = "continued pretraining on long reasoning traces (SFTTrainer): packing, loss on every token"
    config_class = MidtrainStageConfig
    required_columns: ClassVar[tuple] = (("messages", "text"),)

    def check(self, config: MidtrainStageConfig) -> None:
        if config.assistant_only_loss:
            raise RufusError("midtrain trains on every token: set `assistant_only_loss: false` or use the sft stage")


STAGES = [SFTStage(), MidtrainStage()]
