"""`rlhf`: GRPO against learned preferences: the async LLM-judge reward (an OpenAI-compatible
judge server, `judge_url`), or a reward model given as a sequence-classification checkpoint
(`reward_model`), or both (weights: the judge's in its spec, `reward_model_weight`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rufus_train.grpo.config import GRPOStageConfig
from rufus_train.grpo.stage import GRPOStage


class RLHFConfig(GRPOStageConfig):
    rewards: list[str | dict[str, Any]] = Field(
        default_factory=lambda: [{"name": "llm_judge"}],
        description="reward specs (rewards registry); default: llm_judge, 1 when the judge (judge_url) scores the "
        "answer 7 or more of 10")


class RLHFStage(GRPOStage):
    name = "rlhf"
    description = "GRPO with the async LLM judge, or a sequence-classification reward model"
    config_class = RLHFConfig


STAGE = RLHFStage()
