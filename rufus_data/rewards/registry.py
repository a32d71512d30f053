"""Name rewards in configs: `"string_match:boxed"`, `{name: string_match, extractor: gsm8k, only_label: math}`.

A string spec is `name` or `name:positional` (the reward's first parameter, e.g. the extractor);
a mapping spec is `name` plus keyword parameters, and an optional `weight` (default 1.0) used by
`build_rewards` for TRL's `reward_weights`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from rufus_data.errors import RufusError


def _factories() -> dict[str, Callable]:
    from rufus_data.rewards.code_execution import make_code_execution_reward
    from rufus_data.rewards.ifeval import make_ifeval_reward
    from rufus_data.rewards.llm_judge import make_llm_judge_reward
    from rufus_data.rewards.math_equivalence import make_math_equivalence_reward
    from rufus_data.rewards.overlong import make_overlong_penalty
    from rufus_data.rewards.string_match import make_string_match_reward

    return {
        "string_match": make_string_match_reward,
        "math_equivalence": make_math_equivalence_reward,
        "ifeval": make_ifeval_reward,
        "code_execution": make_code_execution_reward,
        "llm_judge": make_llm_judge_reward,
        "overlong_penalty": make_overlong_penalty,
    }


REWARD_NAMES = ("string_match", "math_equivalence", "ifeval", "code_execution", "llm_judge", "overlong_penalty")


def parse_spec(spec: str | dict[str, Any]) -> tuple[str, dict[str, Any], float]:
    """(name, parameters, weight) from a string or mapping spec."""
    factories = _factories()
    if isinstance(spec, str):
        name, _, positional = spec.partition(":")
        name = name.strip()
        params: dict[str, Any] = {}
        if positional:
            factory = factories.get(name)
            if factory is None:
                raise RufusError(f"unknown reward {name!r} in spec {spec!r}: use one of {', '.join(REWARD_NAMES)}")
            first = next(iter(inspect.signature(factory).parameters))
            params[first] = positional.strip()
        weight = 1.0
    elif isinstance(spec, dict):
        params = dict(spec)
        name = params.pop("name", None)
        if not isinstance(name, str):
            raise RufusError(f"reward spec {spec!r} has no 'name': add name: one of {', '.join(REWARD_NAMES)}")
        weight = float(params.pop("weight", 1.0))
    else:
        raise RufusError(f"reward spec must be a string or a mapping, got {type(spec).__name__}: {spec!r}")
    if name not in factories:
        raise RufusError(f"unknown reward {name!r} in spec {spec!r}: use one of {', '.join(REWARD_NAMES)}")
    allowed = inspect.signature(factories[name]).parameters
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise RufusError(f"reward {name!r} has no parameter(s) {unknown} (spec {spec!r}); allowed: {', '.join(allowed)}")
    return name, params, weight


def build_reward(spec: str | dict[str, Any]):
    """One reward-function instance from a spec."""
    name, params, _ = parse_spec(spec)
    return _factories()[name](**params)


def build_rewards(specs: Iterable[str | dict[str, Any]] | str | dict[str, Any]) -> tuple[list, list[float]]:
    """(reward functions, weights) for GRPOConfig(reward_weights=...) and GRPOTrainer(reward_funcs=...)."""
    if isinstance(specs, (str, dict)):
        specs = [specs]
    funcs, weights = [], []
    for spec in specs:
        name, params, weight = parse_spec(spec)
        funcs.append(_factories()[name](**params))
        weights.append(weight)
    if not funcs:
        raise RufusError("no rewards given: name at least one, e.g. 'string_match:boxed'")
    return funcs, weights
