"""`if_rl`: GRPO on instruction-following prompts scored by the IFEval verifiers (rows carry
`instruction_id_list` and `kwargs`, as IFEval's input data does)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rufus_train.grpo.config import GRPOStageConfig
from rufus_train.grpo.stage import GRPOStage


class IFRLConfig(GRPOStageConfig):
    rewards: list[str | dict[str, Any]] = Field(
        default_factory=lambda: [{"name": "ifeval", "mode": "strict", "level": "instruction"}],
        description="reward specs (rewards registry); default: the fraction of the row's instructions followed "
        "(IFEval's strict checkers)",
    )


class IFRLStage(GRPOStage):
    name = "if_rl"
    description = "GRPO with the IFEval instruction verifiers (share of instructions followed)"
    config_class = IFRLConfig
    required_columns = ("prompt", "instruction_id_list")


STAGE = IFRLStage()
