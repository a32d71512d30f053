"""`coding_rl`: GRPO on programming prompts scored by running the completion's code against the
row's tests (HumanEval `test`/`entry_point`, MBPP `test_list`, stdin/stdout cases) in the
rewards package's sandbox."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rufus_train.grpo.config import GRPOStageConfig
from rufus_train.grpo.stage import GRPOStage


class CodingRLConfig(GRPOStageConfig):
    rewards: list[str | dict[str, Any]] = Field(
        default_factory=lambda: [{"name": "code_execution", "pass_fraction": True}],
        description="reward specs (rewards registry); default: the fraction of the row's tests the code passes",
    )


class CodingRLStage(GRPOStage):
    name = "coding_rl"
    description = "GRPO with the sandboxed code-execution reward (HumanEval / MBPP tests)"
    config_class = CodingRLConfig


STAGE = CodingRLStage()
