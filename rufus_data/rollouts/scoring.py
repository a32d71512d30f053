"""Scoring sampled completions with rufus_data.rewards, the way TRL calls them during RL.

Each reward is called with the prompt, the conversational completions, their token ids and the
row's dataset columns (expected_output, solution, label, ...) broadcast over the samples; an
async reward (the LLM judge) is awaited; the per-function scores are combined with TRL's
weighted nansum (`combine_rewards`)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rufus_data.base.console import console
from rufus_data.base.errors import RufusError
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

    def score(self, row: dict, messages: list[dict], texts: list[str], completion_ids: list[list[int]] | None = None,
              tally: dict[str, dict[str, float]] | None = None) -> tuple[list[float | None], dict[str, list]]:
        """(combined reward per text, {reward name: per-text scores}); `completion_ids`: the token
        ids of each text, for rewards that measure length (overlong_penalty); `tally`, when given,
        gets each reward's counts of this call ({name: {answers, unscored, failed, unparsable}}:
        what the rewards log, the LLM judge's failed requests and unparsable answers among them)."""
        count = len(texts)
        columns = {key: [value] * count for key, value in row.items() if key not in ("prompt", "prompts", "completions")}
        completions = [[{"role": "assistant", "content": text}] for text in texts]
        per_function = {}
        for name, func in zip(self.names, self.funcs):
            counts = {"answers": float(count)}
            scores = call_reward(func, prompts=[messages] * count, completions=completions,
                                 completion_ids=completion_ids, log_metric=_counter(counts), **columns)
            if tally is not None:
                tally[name] = {key: counts.get(key, 0.0) for key in TALLY_KEYS}
            per_function[name] = [None if s is None or math.isnan(s) else float(s) for s in scores]
        combined = combine_rewards(list(per_function.values()), self.weights)
        return combined, per_function


TALLY_KEYS = ("answers", "unscored", "failed", "unparsable")


def _counter(counts: dict[str, float]):
    """A `log_metric` that keeps a reward's counts (`llm_judge/failed` as `failed`)."""
    def log_metric(key: str, value: float) -> None:
        counts[key.rpartition("/")[2]] = counts.get(key.rpartition("/")[2], 0.0) + value
    return log_metric


def add_tallies(total: dict[str, dict[str, float]], tally: dict[str, dict[str, float]]) -> None:
    """Sum one call's (or prompt's) tally into `total`."""
    for name, counts in tally.items():
        into = total.setdefault(name, dict.fromkeys(TALLY_KEYS, 0.0))
        for key in TALLY_KEYS:
            into[key] += counts.get(key, 0.0)


def dead_rewards(total: dict[str, dict[str, float]], share: float = 0.5) -> list[str]:
    """The rewards whose failed requests and unparsable answers are at least `share` of the answers
    they were asked to score: a dead judge, not a hard task."""
    return [name for name, c in total.items() if c["answers"] and c["failed"] + c["unparsable"] >= share * c["answers"]]


def known_token_ids(completions) -> list[list[int]] | None:
    """The token ids of generated completions for the rewards that measure length; None when a
    server sent none for some completion (a length reward then says it cannot score)."""
    ids = [c.token_ids for c in completions]
    return ids if all(i or c.num_tokens == 0 for i, c in zip(ids, completions, strict=True)) else None


class JudgeWatch:
    """Counts what the rewards could not score, and stops a run whose judge is dead: at once when
    the first EARLY_ANSWERS answers all failed, or at the end when most did (dead_rewards)."""

    EARLY_ANSWERS = 16

    def __init__(self, scorer: Scorer):
        self.scorer, self.total = scorer, {}

    def checked(self, record: dict) -> dict:
        add_tallies(self.total, record.get("scoring", {}))
        dead = [n for n in dead_rewards(self.total, share=1.0) if self.total[n]["answers"] >= self.EARLY_ANSWERS]
        if dead:
            raise RufusError(self._message(dead, "stopped early: ") + " The prompts finished so far are kept.")
        return record

    def final(self, records: list[dict], journal: Path) -> dict:
        """The tally over every prompt (resumed ones too); a RufusError when most answers failed."""
        self.total = {}
        for record in records:
            add_tallies(self.total, record.get("scoring", {}))
        dead = dead_rewards(self.total)
        if dead:
            raise RufusError(self._message(dead, "") + f" The generated completions are kept in {journal}: run the "
                             "same command again once the judge answers, and they are scored again, not generated again.")
        for name, counts in self.total.items():
            if counts["failed"] or counts["unparsable"]:
                console.print(f"[yellow]warning:[/] {name}: {counts['failed']:.0f} failed requests and "
                              f"{counts['unparsable']:.0f} unparsable answers of {counts['answers']:.0f} "
                              "(left unscored)", highlight=False, soft_wrap=True)
        return {name: {key: int(value) for key, value in counts.items()} for name, counts in self.total.items()}

    def _message(self, dead: list[str], prefix: str) -> str:
        parts = []
        for name in dead:
            counts = self.total[name]
            func = self.scorer.funcs[self.scorer.names.index(name)]
            cause = getattr(func, "last_failure", None)
            parts.append(f"{name}: {counts['failed']:.0f} of {counts['answers']:.0f} answers failed and "
                         f"{counts['unparsable']:.0f} had no parsable score" + (f" (last failure: {cause})" if cause else ""))
        return (f"{prefix}the reward could not score most answers, so the buckets would only say 'unscored': "
                + "; ".join(parts) + ". Check the judge server (its URL, model and key); nothing was written.")
