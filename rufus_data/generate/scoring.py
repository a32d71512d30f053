"""Scoring sampled completions with rufus_data.rewards, the way TRL calls them during RL.

Each reward is called with the prompt, the conversational completions, and the row's dataset
columns (expected_output, solution, label, ...) broadcast over the samples; the per-function
scores are combined with TRL's weighted nansum (`combine_rewards`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
        return [getattr(f, "__name__", type(f).__name__) for f in self.funcs]

    def score(self, row: dict, messages: list[dict], texts: list[str]) -> tuple[list[float | None], dict[str, list]]:
        """(combined reward per text, {reward name: per-text scores})."""
        count = len(texts)
        columns = {key: [value] * count for key, value in row.items() if key not in ("prompt", "prompts", "completions")}
        completions = [[{"role": "assistant", "content": text}] for text in texts]
        per_function = {}
        for name, func in zip(self.names, self.funcs):
            scores = func(prompts=[messages] * count, completions=completions, **columns)
            per_function[name] = [None if s is None or math.isnan(s) else float(s) for s in scores]
        combined = combine_rewards(list(per_function.values()), self.weights)
        return combined, per_function
