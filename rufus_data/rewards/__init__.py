"""Rewards and verifiers: one implementation used by TRL trainers, `rufus-data filter`/`pairs` and rufus-eval.

Every reward follows TRL's reward-function contract (see `contract.py`) and returns a float or None
(= not scored) per completion. Pick rewards in configs by name through `build_reward(s)`.

- registry.py: the table of reward names and their specs; data_rewards.py: rewards that travel
  with the rows (`reward_spec`).
- extract.py: what "the answer" of a completion is; response_schema.py: a completion as
  reasoning, content and tool calls.
- string_match.py, final_number.py, math_equivalence.py: answers compared as strings, numbers,
  maths; ifeval.py: IFEval's checkers; bfcl.py: BFCL's AST checker; llm_judge.py: a judge server.
- code_execution.py: code run against the row's tests, in sandbox.py, by harness.py inside it.
- overlong.py: DAPO's soft overlong penalty; groups.py: GRPO group statistics (which prompts teach).
"""

from rufus_data.rewards.bfcl import BFCLASTReward, parse_calls, score_bfcl
from rufus_data.rewards.code_execution import CodeExecutionReward, extract_code
from rufus_data.rewards.contract import RewardFunction
from rufus_data.rewards.extract import (
    EXTRACTORS,
    completion_text,
    extract_boxed,
    extract_final_number,
    extract_full,
    extract_gsm8k,
    extract_last_number,
    normalise_answer,
    number_value,
    split_reasoning,
    strip_reasoning,
)
from rufus_data.rewards.final_number import FinalNumberReward, says_unanswerable
from rufus_data.rewards.groups import (
    AGGREGATIONS,
    GroupOutcome,
    combine_rewards,
    group_outcomes,
    group_signal,
    grpo_advantages,
    teaches_nothing,
)
from rufus_data.rewards.ifeval import IFEvalReward, ensure_punkt, ifeval_scores
from rufus_data.rewards.llm_judge import LLMJudgeReward, parse_score
from rufus_data.rewards.math_equivalence import MathEquivalenceReward
from rufus_data.rewards.overlong import OverlongPenalty, overlong_penalty
from rufus_data.rewards.registry import REWARDS, build_reward, build_rewards, parse_spec
from rufus_data.rewards.response_schema import (
    RUFUS_RESPONSE_TEMPLATE,
    ParsedResponse,
    add_response_fields,
    add_response_schema,
    parse_response,
)
from rufus_data.rewards.sandbox import (
    SandboxConfig,
    SandboxResult,
    namespaces_available,
    run_many,
    run_program,
)
from rufus_data.rewards.string_match import StringMatchReward

__all__ = [
    "AGGREGATIONS",
    "EXTRACTORS",
    "REWARDS",
    "RUFUS_RESPONSE_TEMPLATE",
    "BFCLASTReward",
    "CodeExecutionReward",
    "FinalNumberReward",
    "GroupOutcome",
    "IFEvalReward",
    "LLMJudgeReward",
    "MathEquivalenceReward",
    "OverlongPenalty",
    "ParsedResponse",
    "RewardFunction",
    "SandboxConfig",
    "SandboxResult",
    "StringMatchReward",
    "add_response_fields",
    "add_response_schema",
    "build_reward",
    "build_rewards",
    "combine_rewards",
    "completion_text",
    "ensure_punkt",
    "extract_boxed",
    "extract_code",
    "extract_final_number",
    "extract_full",
    "extract_gsm8k",
    "extract_last_number",
    "group_outcomes",
    "group_signal",
    "grpo_advantages",
    "ifeval_scores",
    "namespaces_available",
    "normalise_answer",
    "number_value",
    "overlong_penalty",
    "parse_calls",
    "parse_response",
    "parse_score",
    "parse_spec",
    "run_many",
    "run_program",
    "says_unanswerable",
    "score_bfcl",
    "split_reasoning",
    "strip_reasoning",
    "teaches_nothing",
]
