"""The agent stages: GRPO with tools, through TRL's tool / environment support. The model sees
the tools' schemas in its system turn; a `<tool_call>` in a completion is executed, its result
appended as a `tool` turn, and generation continues (up to `max_tool_calling_iterations`); tool
output tokens carry no loss.

- `general_agent`: a calculator and a sandboxed python tool.
- `coding_agent`: a per-rollout coding environment: sandboxed `run_python` and `run_tests`
  against the row's own tests; rewarded by the code-execution reward.
- `search_agent`: a per-rollout search environment over a local duckdb BM25 index (offline)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rufus_train.grpo.config import GRPOStageConfig
from rufus_train.grpo.stage import GRPOStage

ANSWER_REWARD = {"name": "string_match", "extractor": "last_number", "answer_column": "expected_output"}


ANSWER_REWARD_HELP = "reward specs (rewards registry); default: the last number of the answer against expected_output"


class GeneralAgentConfig(GRPOStageConfig):
    rewards: list[str | dict[str, Any]] = Field(default_factory=lambda: [dict(ANSWER_REWARD)],
                                                description=ANSWER_REWARD_HELP)
    tools: list[Literal["calculator", "run_python"]] = Field(
        default_factory=lambda: ["calculator", "run_python"],
        description="tools the model may call: calculator (exact arithmetic), run_python (sandboxed code)")


class CodingAgentConfig(GRPOStageConfig):
    rewards: list[str | dict[str, Any]] = Field(
        default_factory=lambda: [{"name": "code_execution", "pass_fraction": True}],
        description="reward specs (rewards registry); default: the fraction of the row's tests the code passes",
    )
    environment: Literal["coding", "search"] | None = Field(
        "coding", description="coding: run_python and run_tests against the row's own tests, per rollout")


class SearchAgentConfig(GRPOStageConfig):
    rewards: list[str | dict[str, Any]] = Field(default_factory=lambda: [dict(ANSWER_REWARD)],
                                                description=ANSWER_REWARD_HELP)
    environment: Literal["coding", "search"] | None = Field(
        "search", description="search: a `search` tool over a local BM25 index (search_index or search_corpus)")


class GeneralAgentStage(GRPOStage):
    name = "general_agent"
    description = "GRPO with tools: a calculator and a sandboxed python tool"
    config_class = GeneralAgentConfig


class CodingAgentStage(GRPOStage):
    name = "coding_agent"
    description = "GRPO with a sandboxed code-execution environment (run_python, run_tests)"
    config_class = CodingAgentConfig


class SearchAgentStage(GRPOStage):
    name = "search_agent"
    description = "GRPO with a search tool over a local corpus (duckdb BM25 index, offline)"
    config_class = SearchAgentConfig


STAGES = [GeneralAgentStage(), CodingAgentStage(), SearchAgentStage()]
