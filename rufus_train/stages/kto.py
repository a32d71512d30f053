"""`kto`: preference optimisation from unpaired good/bad examples (TRL's KTOTrainer).

Rows are either `prompt`/`completion` with a boolean column saying whether the completion is
desirable (`desirable_column`, default `desirable`), or preference rows (`prompt`/`chosen`/
`rejected`) that TRL unpairs (chosen = desirable). The canonical `label` column is the source's
own label (a category, not a judgement) and is never read as the KTO label."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from rufus_data.base.errors import RufusError
from rufus_train.config import StageConfig
from rufus_train.stage_base import Stage, StageContext, conversational, without_empty_replies
from rufus_train.stages.dpo import preference_dataset


class KTOStageConfig(StageConfig):
    """KTO: same learning rates as DPO (full 1e-6, LoRA 1e-5), beta 0.1."""

    full_ft_learning_rate: ClassVar[float] = 1e-6
    lora_learning_rate: ClassVar[float] = 1e-5
    trl_config: ClassVar[str] = "trl.KTOConfig"

    beta: float = Field(0.1, gt=0, description="strength of the pull toward the reference model")
    desirable_column: str = Field("desirable", description="boolean column: true = good completion")
    desirable_weight: float = Field(1.0, gt=0, description="loss weight of desirable examples (to balance unequal counts)")
    undesirable_weight: float = Field(1.0, gt=0, description="loss weight of undesirable examples")

    def trl_kwargs(self) -> dict[str, Any]:
        return {
            "max_length": self.max_length,
            "beta": self.beta,
            "desirable_weight": self.desirable_weight,
            "undesirable_weight": self.undesirable_weight,
        }


class KTOStage(Stage):
    name = "kto"
    description = "KTO (KTOTrainer): unpaired good/bad completions, labels from their own column"
    config_class = KTOStageConfig
    required_columns: ClassVar[tuple] = ("prompt", ("completion", "chosen"))

    def check(self, config: KTOStageConfig) -> None:
        if config.desirable_column == "label":
            raise RufusError(
                "kto: desirable_column is 'label', but `label` is the source's own label (a category, not a "
                "judgement of the completion). Put good/bad in its own boolean column (e.g. `desirable`) and set "
                "`desirable_column` to it"
            )
        if config.per_device_train_batch_size < 2:
            raise RufusError("kto: per_device_train_batch_size must be >= 2 (the KL term pairs each completion with another prompt)")

    def build_dataset(self, config: KTOStageConfig, rows: pa.Table, tokenizer):
        from datasets import Dataset

        if "chosen" in rows.column_names and "completion" not in rows.column_names:
            return preference_dataset(rows, self.name)
        if config.desirable_column not in rows.column_names:
            raise RufusError(
                f"kto: the shards have no column '{config.desirable_column}' (columns: {rows.column_names}); "
                "set `desirable_column` to the boolean good/bad column"
            )
        labels = rows.column(config.desirable_column)
        if not pa.types.is_boolean(labels.type) or labels.null_count:
            raise RufusError(f"kto: column '{config.desirable_column}' must be boolean without nulls (got {labels.type})")
        if pc.all(labels).as_py() or not pc.any(labels).as_py():
            raise RufusError(f"kto: column '{config.desirable_column}' is all true or all false: KTO needs both kinds")
        columns = {"prompt": conversational(rows, "prompt"), "completion": conversational(rows, "completion"),
                   "label": labels.to_pylist()}
        return Dataset.from_dict(without_empty_replies(columns, ("completion",), self.name))

    def make_trainer(self, ctx: StageContext):
        from trl import KTOTrainer

        return KTOTrainer(**ctx.trainer_kwargs())


STAGE = KTOStage()
