"""Group statistics for GRPO: which prompts can teach anything (learnability) and the advantages."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rufus_data.errors import RufusError


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


@dataclass
class GroupOutcome:
    outcome: str  # learnable | all_pass | all_fail | constant | unscored
    p: float | None  # mean of the scored rewards (the pass rate for 0/1 rewards)
    scored: int
    k: int


def group_outcomes(
    rewards, k: int, weights: Sequence[float] | None = None, max_reward: float = 1.0, min_reward: float = 0.0
) -> list[GroupOutcome]:
    """Bucket each prompt from its k consecutive completions' rewards.

    `rewards` is a flat list (one reward per completion, None = unscored) or a list of per-function lists
    (combined first with `combine_rewards`). Its length must be a multiple of k.
    """
    rewards = list(rewards)
    if rewards and isinstance(rewards[0], (list, tuple)):
        rewards = combine_rewards(rewards, weights)
    if k <= 0 or len(rewards) % k:
        raise RufusError(f"group_outcomes: {len(rewards)} rewards is not a multiple of k={k}")
    outcomes = []
    for start in range(0, len(rewards), k):
        scored = [float(r) for r in rewards[start:start + k] if _is_scored(r)]
        if not scored:
            outcomes.append(GroupOutcome("unscored", None, 0, k))
            continue
        p = sum(scored) / len(scored)
        if max(scored) != min(scored):
            outcome = "learnable"
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
        std = math.sqrt(sum((r - mean) ** 2 for r in scored) / (len(scored) - 1)) if len(scored) > 1 else 0.0
        for r in group:
            if not _is_scored(r) or std == 0.0:
                advantages.append(0.0)
            else:
                advantages.append((float(r) - mean) / (std + eps) if scale else float(r) - mean)
    return advantages
