"""`orpo`: odds-ratio preference optimisation, preference learning inside SFT without a
reference model. TRL 1.16 keeps ORPOTrainer in `trl.experimental.orpo` (no longer in the stable
API), so this stage uses it from there."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from rufus_train.config import StageConfig
from rufus_train.stage_base import StageContext
from rufus_train.stages.dpo import PreferenceStage


class ORPOStageConfig(StageConfig):
    """ORPO replaces SFT, so SFT-sized learning rates: full 8e-6 (the ORPO paper), LoRA 8e-5."""

    full_ft_learning_rate: ClassVar[float] = 8e-6
    lora_learning_rate: ClassVar[float] = 8e-5
    trl_config: ClassVar[str] = "trl.experimental.orpo.ORPOConfig"

    beta: float = Field(0.1, gt=0, description="weight of the odds-ratio term (lambda in the paper)")

    def trl_kwargs(self) -> dict[str, Any]:
        return {"max_length": self.max_length, "beta": self.beta}


class ORPOStage(PreferenceStage):
    name = "orpo"
    description = "ORPO (trl.experimental ORPOTrainer): preference inside SFT, no reference model"
    config_class = ORPOStageConfig

    def make_trainer(self, ctx: StageContext):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "experimental" notice, said in the docs
            from trl.experimental.orpo import ORPOTrainer

            return ORPOTrainer(**ctx.trainer_kwargs())


STAGE = ORPOStage()
