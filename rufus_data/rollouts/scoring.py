"""Scoring sampled completions with rufus_data.rewards, the way TRL calls them during RL.

Each reward is called with the prompt, the conversational completions, their token ids and the
row's dataset columns (expected_output, solution, label, ...) broadcast over the samples; an
async reward (the LLM judge) is awaited; the per-function scores are combined with TRL's
weighted nansum (`combine_rewards`)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from rufus_data.rewards.contract import call_reward
from rufus_data.rewards.groups import combine_rewards
from rufus_data.rewards.registry import build_rewards, parse_spec


@dataclass
class Scorer:
    funcs: list
    weights: list[float]
    specs: list

    @classmethod
    def from_specs(cls, specs) -> Scorer:
        specs = specs if isinstance(specs, list) else [specs]
        for spec in specs:
            parse_spec(spec)  # a bad spec fails before any generation
        funcs, weights = build_rewards(specs)
        return cls(funcs, weights, specs)

    @property
    def names(self) -> list[str]:
        """One distinct name per reward: its own, `@label` for a label-scoped one, `#n` for repeats."""
        names = []
        for func in self.funcs:
            name = getattr(func, "__name__", type(func).__name__)
            label = getattr(func, "only_label", None)
            names.append(f"{name}@{label}" if label is not None else name)
        seen: Counter = Counter()
        unique = []
        for name in names:
            seen[name] += 1
            unique.append(name if names.count(name) == 1 else f"{name}#{seen[name]}")
        return unique

    def score(self, row: dict, messages: list[dict], texts: list[str],
              completion_ids: list[list[int]] | None = None) -> tuple[list[float | None], dict[str, list]]:
        """(combined reward per text, {reward name: per-text scores}); `completion_ids`: the token
        ids of each text, for rewards that measure length (overlong_penalty)."""
        count = len(texts)
        columns = {key: [value] * count for key, value in row.items() if key not in ("prompt", "prompts", "completions")}
        completions = [[{"role": "assistant", "content": text}] for text in texts]
        per_function = {}
        for name, func in zip(self.names, self.funcs):
            scores = call_reward(func, prompts=[messages] * count, completions=completions,
                                 completion_ids=completion_ids, **columns)
            per_function[name] = [None if s is None or math.isnan(s) else float(s) for s in scores]
        combined = combine_rewards(list(per_function.values()), self.weights)
        return combined, per_function


def known_token_ids(completions) -> list[list[int]] | None:
    """The token ids of generated completions for the rewards that measure length; None when a
    server sent none for some completion (a length reward then says it cannot score)."""
    ids = [c.token_ids for c in completions]
    return ids if all(i or c.num_tokens == 0 for i, c in zip(ids, completions, strict=True)) else None
