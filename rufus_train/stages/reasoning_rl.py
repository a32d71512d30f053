"""`reasoning_rl`: GRPO on math/reasoning prompts with string-match (or math-equivalence) rewards,
combined by default with DAPO's soft overlong penalty: the playbook's fix for a `/no_think` run
that learned to ramble (completions near `max_completion_length` lose reward linearly).

The default follows what the playbook found to work: generation is cut at 3072 tokens and the
soft penalty runs over DAPO's buffer below that limit, the last 512 tokens (from 2560 on). A run
with a shorter `max_completion_length` keeps the proportion: the buffer is a sixth of the limit
(`overlong_cache: -1`), e.g. 33 of 200 tokens."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rufus_train.grpo.config import GRPOStageConfig
from rufus_train.grpo.stage import GRPOStage

DEFAULT_REWARDS = [{"name": "string_match", "extractor": "last_number", "answer_column": "expected_output"}]
# The playbook's length control: cut at 3072 generated tokens, soft penalty over the last 512.
PLAYBOOK_COMPLETION_LENGTH = 3072
PLAYBOOK_OVERLONG_BUFFER = 512


def default_overlong_cache(max_completion_length: int) -> int:
    """DAPO's buffer at the playbook's proportion (512 of 3072: a sixth of the limit)."""
    return max_completion_length * PLAYBOOK_OVERLONG_BUFFER // PLAYBOOK_COMPLETION_LENGTH


class ReasoningRLConfig(GRPOStageConfig):
    rewards: list[str | dict[str, Any]] = Field(
        default_factory=lambda: [dict(r) for r in DEFAULT_REWARDS], description="reward specs (rewards registry); "
        "default: the last number of the answer against expected_output, plus the overlong penalty (overlong_cache)")
    max_completion_length: int = Field(
        PLAYBOOK_COMPLETION_LENGTH, ge=1, description="tokens generated per completion at most (the playbook's 3072)")
    overlong_cache: int | None = Field(
        -1, description="DAPO overlong penalty over the last N tokens of max_completion_length; -1: a sixth "
        "(the playbook's 512 of 3072); null: off"
    )

    @model_validator(mode="after")
    def _add_overlong_penalty(self) -> ReasoningRLConfig:
        explicit = [r for r in self.rewards if _name(r) == "overlong_penalty"]
        for spec in explicit:
            if isinstance(spec, dict) and spec.get("max_length") not in (None, self.max_completion_length):
                raise ValueError(
                    f"overlong_penalty max_length {spec['max_length']} differs from max_completion_length "
                    f"{self.max_completion_length}: the penalty must end where generation is cut"
                )
        if explicit or self.overlong_cache is None:
            return self
        cache = default_overlong_cache(self.max_completion_length) if self.overlong_cache == -1 else self.overlong_cache
        penalty = {"name": "overlong_penalty", "max_length": self.max_completion_length,
                   "cache": min(cache, self.max_completion_length)}
        object.__setattr__(self, "rewards", [*self.rewards, penalty])
        object.__setattr__(self, "overlong_cache", penalty["cache"])
        return self


def _name(spec) -> str:
    return spec.get("name", "") if isinstance(spec, dict) else str(spec).partition(":")[0]


class ReasoningRLStage(GRPOStage):
    name = "reasoning_rl"
    description = "GRPO with string-match / math rewards plus the DAPO overlong penalty (GSM8K-style prompts)"
    config_class = ReasoningRLConfig


STAGE = ReasoningRLStage()
