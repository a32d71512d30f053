"""The exact string-match reward: extract, normalise, compare. Fast, deterministic, no dependency."""

from __future__ import annotations

from functools import lru_cache

from rufus_data.rewards.contract import RewardFunction, Row, is_missing
from rufus_data.rewards.extract import get_extractor, normalize_answer


@lru_cache(maxsize=1 << 16)
def normalized_gold(extractor: str, gold: str) -> str:
    """The gold side, extracted (raw when extraction fails) and normalised; cached because a GRPO batch
    repeats each prompt's gold once per generation."""
    extracted = get_extractor(extractor)(gold)
    return normalize_answer(extracted if extracted is not None else gold)


class StringMatchReward(RewardFunction):
    """1.0 when the extracted, normalised answer equals the gold one, else 0.0; None when unscorable."""

    def __init__(self, extractor: str = "boxed", answer_column: str = "solution", only_label: str | None = None):
        get_extractor(extractor)  # fail early on a bad name
        self.extractor = extractor
        self.answer_column = answer_column
        self.name = f"string_match_{extractor}"
        super().__init__(only_label=only_label)

    def gold_answer(self, row: Row) -> str | None:
        gold = row.get(self.answer_column)
        if is_missing(gold):
            return None
        return normalized_gold(self.extractor, str(gold))

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        self.warn_missing_column(rows, self.answer_column, "the gold answer; set answer_column to the column that holds it")
        extract = get_extractor(self.extractor)
        scores: list[float | None] = []
        for text, ok, row in zip(texts, closed, rows):
            gold = self.gold_answer(row)
            if gold is None:
                scores.append(None)
            elif not ok:
                scores.append(0.0)
            else:
                answer = extract(text)
                scores.append(1.0 if answer is not None and normalize_answer(answer) == gold else 0.0)
        return scores
