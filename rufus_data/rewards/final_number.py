"""The final-number scorer of the GSM8K and GSM-Plus eval tasks, as published evaluations score them.

The answer is the number after the last `####`, "The answer is" or `\\boxed{}`, else the last number
(`extract.extract_final_number`), and the two sides are compared as numbers: `#### $16.00` is right
against 16, `#### 7 dozen eggs in 4 weeks.` reads 7. The training reward `string_match` stays
narrower on purpose (docs/rewards.md says why the two differ).

A gold of "None" is GSM-Plus's critical-thinking item, a question missing a fact it needs (the
GSM-Plus authors also relabelled ten flawed GSM8K test questions so). It is scored as their
evaluation code does (qtli/GSM-Plus, `scripts/utils/extract_ans.py`, `extract_pred_ans_none`): right
when the response, lowercased and without commas, says the question cannot be answered (one of
their phrases below, "none" among them) or commits to no final answer (no answer marker); wrong
when it gives a final answer without saying so.
"""

from __future__ import annotations

from collections.abc import Callable

from rufus_data.rewards.contract import RewardFunction, Row, is_missing
from rufus_data.rewards.extract import extract_final_number, final_answer_text, format_number, number_value

UNANSWERABLE_GOLD = "none"
# The GSM-Plus authors' phrases for "the question does not say" (their list, in their order).
UNANSWERABLE_PHRASES = (
    "does not provide enough information", "does not specify", "does not provide", "can't provide",
    "can not provide", "don't know", "do not know", "doesn't specify", "not specify", "not mention",
    "doesn't mention", "don't have enough information", "do not have enough", "not provide",
    "doesn't provide", "cannot calculate", "can't calculate", "can't determine", "cannot determine",
    "missing necessary information", "none",
)


def says_unanswerable(text: str) -> bool:
    """GSM-Plus's critical-thinking verdict: the response says information is missing, or gives no final answer."""
    plain = text.rstrip(".").replace(",", "").lower()
    return any(phrase in plain for phrase in UNANSWERABLE_PHRASES) or final_answer_text(text) is None


def final_number(text: str) -> str | None:
    """The final answer's number in one spelling per value (`16.00` and `16` both `16`): what maj@ votes on."""
    value = number_value(extract_final_number(text))
    return None if value is None else format_number(value)


class FinalNumberReward(RewardFunction):
    """1.0 when the response's final number equals the gold's (or, for a "None" gold, when it says the
    question cannot be answered), else 0.0; None when the gold holds no number."""

    answer_extractor: Callable[[str], str | None] = staticmethod(final_number)

    def __init__(self, answer_column: str = "answer", only_label: str | None = None):
        self.answer_column = answer_column
        self.name = "final_number"
        super().__init__(only_label=only_label)

    def gold_answer(self, row: Row) -> str | None:
        """The gold's final number (GSM8K's worked answer: after `####`), or "none" for an unanswerable item."""
        gold = row.get(self.answer_column)
        if is_missing(gold):
            return None
        gold = str(gold)
        marked = final_answer_text(gold)
        if (marked if marked is not None else gold).strip().rstrip(".").lower() == UNANSWERABLE_GOLD:
            return UNANSWERABLE_GOLD
        return final_number(gold)

    def score_rows(self, prompts, texts, closed, rows, log_metric):
        self.warn_missing_column(rows, self.answer_column, "the gold answer; set answer_column to the column that holds it")
        scores: list[float | None] = []
        for text, ok, row in zip(texts, closed, rows):
            gold = self.gold_answer(row)
            if gold is None:
                scores.append(None)
            elif not ok:
                scores.append(0.0)
            elif gold == UNANSWERABLE_GOLD:
                scores.append(1.0 if says_unanswerable(text) else 0.0)
            else:
                scores.append(1.0 if final_number(text) == gold else 0.0)
        return scores
