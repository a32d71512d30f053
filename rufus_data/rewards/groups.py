"""Group statistics for GRPO: which prompts can teach anything (learnability) and the advantages.

`teaches_nothing` is the one predicate for a group that carries no signal: `rufus-data filter`
buckets prompts with it and the GRPO trainer's dynamic sampling drops groups with it
(rufus_train/grpo/dynamic_sampling.py), so the two agree under either of TRL's ways to combine
several rewards (`multi_objective_aggregation`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rufus_data.base.errors import RufusError

# TRL's GRPOConfig.multi_objective_aggregation: weight and sum the rewards, then normalise in the
# group (the default); or normalise each reward in the group, then weight and sum
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
FLAT_SPREAD = 1e-8  # a group whose signal varies by no more than this gives every completion one advantage
TRL_STD_EPS = 1e-4  # what TRL adds to a group's std before dividing by it


def _is_scored(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def combine_rewards(per_function: Sequence[Sequence[float | None]], weights: Sequence[float] | None = None) -> list[float | None]:
    """TRL's combination: the weighted nansum over reward functions per completion; None when all are None.

    `per_function[i][j]` = reward function i on completion j.
    """
    if not per_function:
        return []
    weights = list(weights) if weights is not None else [1.0] * len(per_function)
    combined: list[float | None] = []
    for j in range(len(per_function[0])):
        values = [(w, f[j]) for w, f in zip(weights, per_function) if _is_scored(f[j])]
        combined.append(sum(w * float(v) for w, v in values) if values else None)
    return combined


def _std(values: list[float]) -> float | None:
    """Bessel-corrected standard deviation, as TRL's nanstd (None below two values)."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def group_signal(per_function: Sequence[Sequence[float | None]], weights: Sequence[float] | None = None,
                 aggregation: str = "sum_then_normalize") -> list[float | None]:
    """Per completion of one group, the value its GRPO advantage is taken from, as TRL computes it:
    the weighted nansum of the rewards (`sum_then_normalize`), or of each reward first normalised in
    the group, (r - mean) / (std + 1e-4), a reward scored fewer than twice adding nothing
    (`normalize_then_sum`). None where no reward scored the completion: it is left out, never 0."""
    if aggregation not in AGGREGATIONS:
        raise RufusError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    combined = combine_rewards(per_function, weights)
    if aggregation == "sum_then_normalize":
        return combined
    weights = list(weights) if weights is not None else [1.0] * len(per_function)
    signal: list[float | None] = [None if c is None else 0.0 for c in combined]
    for weight, rewards in zip(weights, per_function):
        scored = [float(r) for r in rewards if _is_scored(r)]
        std = _std(scored)
        if std is None:
            continue
        mean = sum(scored) / len(scored)
        for j, r in enumerate(rewards):
            if _is_scored(r):
                signal[j] += weight * (float(r) - mean) / (std + TRL_STD_EPS)
    return signal


def teaches_nothing(per_function: Sequence[Sequence[float | None]], weights: Sequence[float] | None = None,
                    aggregation: str = "sum_then_normalize") -> bool:
    """True when a group gives each of its completions the same advantage, so training on it
    moves nothing: fewer than two scored completions, or a signal (`group_signal`) that does not
    vary. `per_function[i][j]` = reward function i on completion j of the group."""
    scored = [s for s in group_signal(per_function, weights, aggregation) if s is not None]
    return len(scored) < 2 or max(scored) - min(scored) <= FLAT_SPREAD


@dataclass
class GroupOutcome:
    outcome: str  # learnable | all_pass | all_fail | constant | unscored
    p: float | None  # mean of the scored rewards (the pass rate for 0/1 rewards)
    scored: int
    k: int


def group_outcomes(
    rewards, k: int, weights: Sequence[float] | None = None, max_reward: float = 1.0, min_reward: float = 0.0,
    aggregation: str = "sum_then_normalize",
) -> list[GroupOutcome]:
    """Bucket each prompt from its k consecutive completions' rewards: `learnable` unless the group
    teaches nothing (`teaches_nothing` under `aggregation`); else by its combined reward.

    `rewards` is a flat list (one reward per completion, None = unscored) or a list of per-function lists
    (combined with `combine_rewards` for the pass rate). Its length must be a multiple of k.
    """
    rewards = list(rewards)
    nested = bool(rewards) and isinstance(rewards[0], (list, tuple))
    per_function = [list(f) for f in rewards] if nested else [rewards]
    weights = weights if nested else None
    combined = combine_rewards(per_function, weights)
    if k <= 0 or len(combined) % k:
        raise RufusError(f"group_outcomes: {len(combined)} rewards is not a multiple of k={k}")
    outcomes = []
    for start in range(0, len(combined), k):
        scored = [float(r) for r in combined[start:start + k] if _is_scored(r)]
        if not scored:
            outcomes.append(GroupOutcome("unscored", None, 0, k))
            continue
        p = sum(scored) / len(scored)
        group = [f[start:start + k] for f in per_function]
        if not teaches_nothing(group, weights, aggregation):
            outcome = "learnable"
        elif max(scored) != min(scored):
            outcome = "constant"  # varies, yet every completion gets one advantage (normalize_then_sum)
        elif scored[0] == max_reward:
            outcome = "all_pass"
        elif scored[0] == min_reward:
            outcome = "all_fail"
        else:
            outcome = "constant"
        outcomes.append(GroupOutcome(outcome, p, len(scored), k))
    return outcomes


def grpo_advantages(rewards: Sequence[float | None], k: int, scale: bool = True, eps: float = 1e-4) -> list[float]:
    """Group-relative advantage as TRL's GRPOTrainer computes it: reward minus the group mean, divided by
    (the group's Bessel-corrected std + eps) when `scale`.

    Unscored (None/NaN) completions are left out of the group's mean and std and get advantage 0.0 (TRL
    forces them to 0). A group whose scored rewards are all equal, or with one scored reward, gets zeros.
    """
    rewards = list(rewards)
    if k <= 0 or len(rewards) % k:
        raise RufusError(f"grpo_advantages: {len(rewards)} rewards is not a multiple of k={k}")
    advantages: list[float] = []
    for start in range(0, len(rewards), k):
        group = rewards[start:start + k]
        scored = [float(r) for r in group if _is_scored(r)]
        if not scored:
            advantages.extend([0.0] * len(group))
            continue
        mean = sum(scored) / len(scored)
        std = _std(scored) or 0.0
        for r in group:
            if not _is_scored(r) or std == 0.0:
                advantages.append(0.0)
            else:
                advantages.append((float(r) - mean) / (std + eps) if scale else float(r) - mean)
    return advantages
