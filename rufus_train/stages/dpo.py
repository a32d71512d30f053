"""`dpo`: preference optimisation with TRL's DPOTrainer on `prompt`/`chosen`/`rejected` rows.

With LoRA the reference is a frozen `ref` adapter TRL 1.16 adds, a copy of the fresh adapter (so
its scores are the base model's, as with the adapter off; one adapter more, not a second model);
with full fine-tuning TRL keeps a frozen copy."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from rufus_data.folders.shards import KIND_COLUMNS
from rufus_train.config import StageConfig
from rufus_train.stage_base import Stage, StageContext, conversational, without_empty_replies


class DPOStageConfig(StageConfig):
    """DPO: learning rate about 10x below SFT (full 1e-6, LoRA 1e-5), beta 0.1."""

    full_ft_learning_rate: ClassVar[float] = 1e-6
    lora_learning_rate: ClassVar[float] = 1e-5
    trl_config: ClassVar[str] = "trl.DPOConfig"

    beta: float = Field(0.1, gt=0, description="strength of the pull toward the reference model")
    loss_type: Literal["sigmoid", "sigmoid_norm", "apo_zero"] = Field(
        "sigmoid", description="sigmoid: the DPO paper's loss; sigmoid_norm: length-normalised (log-ratios averaged "
        "per token, as Tulu 3 trains); apo_zero: anchored (pushes chosen up, rejected down)")

    def trl_kwargs(self) -> dict[str, Any]:
        return {"max_length": self.max_length, "beta": self.beta, "loss_type": [self.loss_type]}


def preference_dataset(rows: pa.Table, stage: str):
    from datasets import Dataset

    columns = {col: conversational(rows, col) for col in KIND_COLUMNS["preference"]}
    return Dataset.from_dict(without_empty_replies(columns, ("chosen", "rejected"), stage))


class PreferenceStage(Stage):
    """Stages that train on prompt / chosen / rejected rows (dpo, orpo)."""

    required_columns: ClassVar[tuple] = KIND_COLUMNS["preference"]

    def build_dataset(self, config: StageConfig, rows: pa.Table, tokenizer):
        return preference_dataset(rows, self.name)


class DPOStage(PreferenceStage):
    name = "dpo"
    description = "direct preference optimisation (DPOTrainer): sigmoid, length-normalised or apo_zero loss"
    config_class = DPOStageConfig

    def make_trainer(self, ctx: StageContext):
        from trl import DPOTrainer

        trainer = DPOTrainer(**ctx.trainer_kwargs())
        if ctx.config.lora.continue_adapter and "ref" in getattr(trainer.model, "peft_config", {}):
            # TRL copies a loaded adapter as a frozen "ref" one; without it the reference is the base with
            # the adapter off (TRL's use_adapter(None)): the original model, as one adapter through a pipeline means
            trainer.model.delete_adapter("ref")
        return trainer


STAGE = DPOStage()
