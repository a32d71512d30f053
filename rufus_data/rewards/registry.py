"""Name rewards in configs: `"string_match:boxed"`, `{name: string_match, extractor: gsm8k, only_label: math}`.

`REWARDS` is the one table of names; a spec's parameters are the reward class's own `__init__`
parameters, checked against its signature (so a class's defaults are written once, in the class).
A string spec is `name` or `name:positional` (the class's first parameter, e.g. the extractor);
a mapping spec is `name` plus keyword parameters, and an optional `weight` (default 1.0) used by
`build_rewards` for TRL's `reward_weights`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from rufus_data.base.errors import RufusError, quoted
from rufus_data.rewards.bfcl import BFCLASTReward
from rufus_data.rewards.code_execution import CodeExecutionReward
from rufus_data.rewards.contract import RewardFunction
from rufus_data.rewards.final_number import FinalNumberReward
from rufus_data.rewards.ifeval import IFEvalReward
from rufus_data.rewards.llm_judge import LLMJudgeReward
from rufus_data.rewards.math_equivalence import MathEquivalenceReward
from rufus_data.rewards.overlong import OverlongPenalty
from rufus_data.rewards.string_match import StringMatchReward

REWARDS: dict[str, type[RewardFunction]] = {
    "string_match": StringMatchReward,
    "math_equivalence": MathEquivalenceReward,
    "final_number": FinalNumberReward,
    "ifeval": IFEvalReward,
    "code_execution": CodeExecutionReward,
    "llm_judge": LLMJudgeReward,
    "overlong_penalty": OverlongPenalty,
    "bfcl_ast": BFCLASTReward,
}


def _reward_class(name: str, spec) -> type[RewardFunction]:
    try:
        return REWARDS[name]
    except KeyError:
        raise RufusError(f"unknown reward {name!r} in spec {quoted(spec)}: use one of {', '.join(REWARDS)}") from None


def parse_spec(spec: str | dict[str, Any]) -> tuple[str, dict[str, Any], float]:
    """(name, parameters, weight) from a string or mapping spec, its parameters checked against the class."""
    if isinstance(spec, str):
        name, _, positional = spec.partition(":")
        name = name.strip()
        params: dict[str, Any] = {}
        if positional:
            first = next(iter(inspect.signature(_reward_class(name, spec)).parameters))
            params[first] = positional.strip()
        weight = 1.0
    elif isinstance(spec, dict):
        params = dict(spec)
        name = params.pop("name", None)
        if not isinstance(name, str):
            raise RufusError(f"reward spec {quoted(spec)} has no 'name': add name: one of {', '.join(REWARDS)}")
        weight = float(params.pop("weight", 1.0))
    else:
        raise RufusError(f"reward spec must be a string or a mapping, got {type(spec).__name__}: {quoted(spec)}")
    allowed = inspect.signature(_reward_class(name, spec)).parameters
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise RufusError(f"reward {name!r} has no parameter(s) {unknown} (spec {quoted(spec)}); allowed: {', '.join(allowed)}")
    required = [p for p, info in allowed.items() if info.default is inspect.Parameter.empty and p not in params]
    if required:
        raise RufusError(f"reward {name!r} needs parameter(s) {required} (spec {quoted(spec)}): add them to the spec")
    return name, params, weight


def build_reward(spec: str | dict[str, Any]) -> RewardFunction:
    """One reward-function instance from a spec."""
    name, params, _ = parse_spec(spec)
    return REWARDS[name](**params)


def build_rewards(specs: Iterable[str | dict[str, Any]] | str | dict[str, Any]) -> tuple[list, list[float]]:
    """(reward functions, weights) for GRPOConfig(reward_weights=...) and GRPOTrainer(reward_funcs=...)."""
    if isinstance(specs, (str, dict)):
        specs = [specs]
    funcs, weights = [], []
    for spec in specs:
        name, params, weight = parse_spec(spec)
        funcs.append(REWARDS[name](**params))
        weights.append(weight)
    if not funcs:
        raise RufusError("no rewards given: name at least one, e.g. 'string_match:boxed'")
    return funcs, weights
