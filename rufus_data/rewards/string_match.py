"""The exact string-match reward: extract, normalise, compare. Fast, deterministic, no dependency."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from rufus_data.base.errors import RufusError
from rufus_data.rewards.contract import RewardFunction, Row, is_missing
from rufus_data.rewards.extract import get_extractor, normalise_answer

COMPARISONS = ("string", "integer")


@lru_cache(maxsize=1 << 16)
def normalised_gold(extractor: str, gold: str) -> str:
    """The gold side, extracted (raw when extraction fails) and normalised; cached because a GRPO batch
    repeats each prompt's gold once per generation."""
    extracted = get_extractor(extractor)(gold)
    return normalise_answer(extracted if extracted is not None else gold)


def as_integer(answer: str | None) -> int | None:
    """A normalised answer read as an integer (`025`, `25.0` and `1,000` are 25, 25, 1000); None if it is none."""
    if answer is None:
        return None
    try:
        number = float(normalise_answer(answer).replace(" ", ""))
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


class StringMatchReward(RewardFunction):
    """1.0 when the extracted, normalised answer equals the gold one, else 0.0; None when unscorable.

    `gold_extractor` reads the gold side when it is written differently from the completions (GSM8K's
    worked answers: `gsm8k`, the text after `####`, while completions use `last_number`); default: `extractor`.
    `compare="integer"` compares both sides as integers (AIME: "025" == 25); a gold that is no
    integer is then unscorable (None)."""

    def __init__(self, extractor: str = "boxed", answer_column: str = "solution", only_label: str | None = None,
                 gold_extractor: str | None = None, compare: str = "string"):
        get_extractor(extractor)  # fail early on a bad name
        if gold_extractor is not None:
            get_extractor(gold_extractor)
        if compare not in COMPARISONS:
            raise RufusError(f"string_match: compare must be one of {', '.join(COMPARISONS)} (got {compare!r})")
        self.extractor = extractor
        self.answer_column = answer_column
        self.gold_extractor = gold_extractor
        self.compare = compare
        self.name = f"string_match_{extractor}"
        super().__init__(only_label=only_label)

    @property
    def answer_extractor(self) -> Callable[[str], str | None]:
        return get_extractor(self.extractor)

    def gold_answer(self, row: Row) -> str | None:
        gold = row.get(self.answer_column)
        if is_missing(gold):
            return None
        return normalised_gold(self.gold_extractor or self.extractor, str(gold))

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        self.warn_missing_column(rows, self.answer_column, "the gold answer; set answer_column to the column that holds it")
        extract = self.answer_extractor
        same = _same_integer if self.compare == "integer" else _same_string
        scores: list[float | None] = []
        for text, ok, row in zip(texts, closed, rows):
            gold = self.gold_answer(row)
            if gold is None or (self.compare == "integer" and as_integer(gold) is None):
                scores.append(None)
            elif not ok:
                scores.append(0.0)
            else:
                answer = extract(text)
                scores.append(1.0 if answer is not None and same(answer, gold) else 0.0)
        return scores


def _same_string(answer: str, gold: str) -> bool:
    return normalise_answer(answer) == gold


def _same_integer(answer: str, gold: str) -> bool:
    return as_integer(answer) == as_integer(gold)
